module ca-externalgrpc/tests/e2e/nodegomod/pause

go 1.26.0
