//go:build tools

// Package tools pins etcd's server in this module's go.mod and go.sum; build.toml builds its main
// package.
package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"
