// The private image registry of the tutorials' walk (tests/e2e/test_node_tutorials.py): an operator
// pushes the server's image to their registry with a login, and the cluster pulls it with a pull
// secret. The registry protocol is go-containerregistry's in-memory registry (pkg/registry), the one its
// own tests and crane's run against; it has no authentication, so this program adds HTTP basic
// authentication in front of it, as a private registry asks for it: every request without the right
// user and password is answered 401 with a Basic challenge, which is how docker, podman and
// containerd learn to send their credentials. Each request is logged with its user, so the test can
// tell that the node's pull used the pull secret.
//
// Usage: node-registry -listen 127.0.0.1:0 (the address it listens on is the first line it prints);
// the user and password come from REGISTRY_USER and REGISTRY_PASSWORD.
package main

import (
	"crypto/subtle"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/registry"
)

type basicAuth struct {
	user, password string
	next           http.Handler
}

func (a basicAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, password, ok := r.BasicAuth()
	if !ok || subtle.ConstantTimeCompare([]byte(user), []byte(a.user)) != 1 ||
		subtle.ConstantTimeCompare([]byte(password), []byte(a.password)) != 1 {
		log.Printf("refused %s %s from %s (user %q) agent %q", r.Method, r.URL.Path, r.RemoteAddr, user, r.UserAgent())
		w.Header().Set("WWW-Authenticate", `Basic realm="node-registry"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	log.Printf("served %s %s from %s (user %q) agent %q", r.Method, r.URL.Path, r.RemoteAddr, user, r.UserAgent())
	a.next.ServeHTTP(w, r)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address to listen on")
	flag.Parse()
	user, password := os.Getenv("REGISTRY_USER"), os.Getenv("REGISTRY_PASSWORD")
	if user == "" || password == "" {
		log.Fatal("REGISTRY_USER and REGISTRY_PASSWORD must be set")
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	handler := basicAuth{user: user, password: password, next: registry.New(registry.Logger(log.New(os.Stderr, "", log.LstdFlags)))}
	log.Fatal(http.Serve(listener, handler))
}
