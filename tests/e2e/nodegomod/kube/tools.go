//go:build tools

// Package tools pins, in this module's go.mod and go.sum, the programs of the real node the node
// scenarios run (tests/e2e/node.py): the kubelet, kube-proxy and kube-controller-manager, and kubectl,
// with which a scenario deploys our manifests as an operator does. They come from the Kubernetes
// release whose kube-apiserver the e2e control plane runs (tests/e2e/gomod), and this go.mod started
// as a copy of that one, so both builds resolve every shared library to the same version and Go's
// build cache compiles each package once for both.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
