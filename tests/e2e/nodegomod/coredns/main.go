// The cluster DNS of the node scenarios (tests/e2e/node.py): CoreDNS at the version kubeadm 1.36
// deploys, with only the plugins its Corefile there uses. CoreDNS's own main imports every plugin it
// ships (clouds' DNS APIs, etcd, tracing ...); a build that names its plugins is CoreDNS's documented
// way to a smaller binary, and here it saves minutes of cold build. The Corefile serves the cluster's
// zone from the API server (kubernetes) and nothing else: no forward plugin, so no query ever leaves
// the machine.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
