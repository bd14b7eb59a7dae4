// Conformance driver for the cluster-autoscaler HEAD externalgrpc client. The client code is
// still in k8s.io/autoscaler/cluster-autoscaler; the CloudProvider interfaces, the builder
// registry and the options it is built with now come from sigs.k8s.io/cluster-autoscaler. The
// checks themselves live in ../checks and are shared with the other CA versions.
package main

import (
	"caconformance/checks"

	// Imported for its init(): the provider registers itself with the builder.
	_ "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"sigs.k8s.io/cluster-autoscaler/pkg/cloudprovider"
	"sigs.k8s.io/cluster-autoscaler/pkg/cloudprovider/builder"
	"sigs.k8s.io/cluster-autoscaler/pkg/config"
	coreoptions "sigs.k8s.io/cluster-autoscaler/pkg/core/options"
)

func main() {
	// Build through the registry, as the CA's main does for --cloud-provider=externalgrpc, so a
	// commit that stopped registering the provider fails here instead of being bypassed.
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
	checks.Main("HEAD")
}
