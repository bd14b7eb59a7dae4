"""Conformance: the upstream cluster-autoscaler externalgrpc client and grpcurl against our server."""
