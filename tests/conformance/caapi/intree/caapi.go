// Package caapi names the cluster-autoscaler core types the checks are written against, so one
// set of checks compiles against every CA version. Up to 1.36 the core lives inside
// k8s.io/autoscaler/cluster-autoscaler (this directory); on CA HEAD it moved to
// sigs.k8s.io/cluster-autoscaler/pkg (../sigs). Both directories are the module caconformance/caapi
// and each CA version module picks one with a replace directive. The interfaces and names are
// the same in both places; only the import path differs.
package caapi

import (
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/config"
)

// CoreModule is the Go module the CA core packages come from.
const CoreModule = "k8s.io/autoscaler/cluster-autoscaler"

type (
	CloudProvider               = cloudprovider.CloudProvider
	NodeGroup                   = cloudprovider.NodeGroup
	Instance                    = cloudprovider.Instance
	InstanceState               = cloudprovider.InstanceState
	NodeGroupAutoscalingOptions = config.NodeGroupAutoscalingOptions
)

const (
	ExternalGrpcProviderName = cloudprovider.ExternalGrpcProviderName
	InstanceRunning          = cloudprovider.InstanceRunning
	InstanceCreating         = cloudprovider.InstanceCreating
	InstanceDeleting         = cloudprovider.InstanceDeleting
	OutOfResourcesErrorClass = cloudprovider.OutOfResourcesErrorClass
	OtherErrorClass          = cloudprovider.OtherErrorClass
)

// ErrNotImplemented is the very error value the client returns, so errors.Is matches it.
var ErrNotImplemented = cloudprovider.ErrNotImplemented
