// The CA core types the shared checks use, taken from k8s.io/autoscaler/cluster-autoscaler (CA up to 1.36).
// No requirements: the CA version module that replaces caconformance/caapi with this directory
// supplies them.
module caconformance/caapi

go 1.24.0
