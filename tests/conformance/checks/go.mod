// Shared conformance checks, compiled once per cluster-autoscaler version by the
// modules in ../ca1341, ../ca1361 and ../cahead (each pins its own CA commit and replaces
// this module with this directory, and caconformance/caapi with ../caapi/intree or
// ../caapi/sigs, wherever that version keeps its core types). This go.mod deliberately carries
// no requirements: the version modules supply every dependency.
module caconformance/checks

go 1.24.0
