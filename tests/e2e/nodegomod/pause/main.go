// The pod sandbox's process for the real node (tests/e2e/node.py): PID 1 of every pod, holding the
// pod's namespaces while its containers come and go. No image registry is reachable from the test
// machines, so the usual pause image cannot be pulled; this is built by `make build` and packed into
// an image locally. It reaps the children re-parented to it and exits on SIGTERM or SIGINT.
// Only os/signal and syscall: the Go linker makes it a static binary, so the image holds nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
