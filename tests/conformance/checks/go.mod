// Shared conformance checks, compiled once per cluster-autoscaler version by the
// modules in ../ca1341 and ../ca1361 (each pins its own CA commit and replaces this
// module with this directory). This go.mod deliberately carries no requirements:
// the version modules supply every dependency.
module caconformance/checks

go 1.24.0
