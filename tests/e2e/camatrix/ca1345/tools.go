//go:build tools

// Package tools pins, in this module's go.mod and go.sum, the programs of this CA release's row of
// the compatibility matrix (tests/e2e/test_ca_matrix.py): the cluster-autoscaler, and kube-apiserver
// and kube-scheduler from the Kubernetes release that autoscaler pins. The build tag keeps this file
// out of every real build; the binaries are built from their own main packages (see build.toml).
package tools

import (
	_ "k8s.io/autoscaler/cluster-autoscaler"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
