//go:build tools

// Package tools pins, in this module's go.mod and go.sum, every program the end-to-end tests run:
// the cluster-autoscaler (built once with the externalgrpc tag, and once with the scaleway and
// bizflycloud tags for the migration scenario), kube-apiserver and kube-scheduler from the
// Kubernetes release that autoscaler pins, and etcd at the version that Kubernetes release pins.
// The build tag keeps this file out of every real build; the binaries are built from their own
// main packages (see build.toml).
package tools

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/autoscaler/cluster-autoscaler"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
