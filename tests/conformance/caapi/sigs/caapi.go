// Package caapi, CA HEAD flavour: the core types come from sigs.k8s.io/cluster-autoscaler/pkg
// (see ../intree for why this package exists).
package caapi

import (
	"sigs.k8s.io/cluster-autoscaler/pkg/cloudprovider"
	"sigs.k8s.io/cluster-autoscaler/pkg/config"
)

// CoreModule is the Go module the CA core packages come from.
const CoreModule = "sigs.k8s.io/cluster-autoscaler"

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
