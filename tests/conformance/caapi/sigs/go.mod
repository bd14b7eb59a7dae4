// The CA core types the shared checks use, taken from sigs.k8s.io/cluster-autoscaler (CA HEAD).
// No requirements: the CA version module that replaces caconformance/caapi with this directory
// supplies them.
module caconformance/caapi

go 1.24.0
