// Conformance driver for the cluster-autoscaler 1.34.1 generation of the externalgrpc client:
// the old field generation (template only in NodeGroupTemplateNodeInfoResponse field 1, options
// durations as meta.v1.Duration fields 3/4/5, pricing fields 1/2/3), which a server must keep
// serving (docs/reference/protocol.md, "Field generations by CA release").
//
// The pinned CA commit is named in go.mod together with why it stands for 1.34.1. The checks
// themselves live in ../checks and are shared with the other CA versions.
package main

import (
	"caconformance/checks"

	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
)

func main() {
	// In this generation the provider is not self-registering: the CA's builder calls
	// BuildExternalGrpc directly, and so do we. Discovery options are ignored by the client
	// (the server alone defines the node groups) and the resource limiter is never consulted
	// by the checks.
	checks.DefaultBuilder = func(path string) cloudprovider.CloudProvider {
		opts := config.AutoscalingOptions{CloudProviderName: cloudprovider.ExternalGrpcProviderName, CloudConfig: path}
		rl := cloudprovider.NewResourceLimiter(map[string]int64{}, map[string]int64{})
		return externalgrpc.BuildExternalGrpc(opts, cloudprovider.NodeGroupDiscoveryOptions{}, rl)
	}
	checks.Main("1.34.1")
}
