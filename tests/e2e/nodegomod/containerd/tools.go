//go:build tools

// Package tools pins the node's container runtime: containerd (its CRI plugin is what the kubelet
// talks to), the runc shim containerd starts for every pod, and ctr, with which the node scenarios
// import images saved from podman. Kubernetes 1.36 needs containerd 2.2 or later (containerd's own
// support table; the 1.x line is not supported any more), and Debian bookworm packages 1.6, hence
// this build; runc itself and the CNI plugins come from Debian.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
