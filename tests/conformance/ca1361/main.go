// Conformance driver for the cluster-autoscaler 1.36.1 externalgrpc client (the new field
// generation). The checks themselves live in ../checks and are shared with the other CA versions.
package main

import (
	"caconformance/checks"

	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/builder"
	// Imported for its init(): from 1.36 on the provider registers itself with the builder.
	_ "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	coreoptions "k8s.io/autoscaler/cluster-autoscaler/core/options"
)

func main() {
	// Build through the registry, as the CA's main does for --cloud-provider=externalgrpc, so a
	// release that stopped registering the provider fails here instead of being bypassed.
	checks.DefaultBuilder = func(path string) cloudprovider.CloudProvider {
		build, ok := builder.GetCloudProviderBuilder(cloudprovider.ExternalGrpcProviderName)
		if !ok {
			panic("the externalgrpc provider is not registered with the cloud provider builder")
		}
		opts := &coreoptions.AutoscalerOptions{AutoscalingOptions: config.AutoscalingOptions{
			CloudProviderName: cloudprovider.ExternalGrpcProviderName, CloudConfig: path}}
		rl := cloudprovider.NewResourceLimiter(map[string]int64{}, map[string]int64{})
		// The client ignores discovery options and the informer factory (the server alone defines
		// the node groups).
		return build(opts, cloudprovider.NodeGroupDiscoveryOptions{}, rl, nil)
	}
	checks.Main("1.36.1")
}
