//go:build tools

// Package tools pins, in this module's go.mod and go.sum, the cluster-autoscaler of CA HEAD's row of
// the compatibility matrix (tests/e2e/test_ca_matrix.py). The build tag keeps this file out of every
// real build; the binary is built from the CA's main package (see build.toml).
package tools

import _ "k8s.io/autoscaler/cluster-autoscaler"
