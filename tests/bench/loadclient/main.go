// Command loadclient replays the Cluster Autoscaler's per-loop externalgrpc call pattern (CA >= 1.35)
// against one or more servers, one call after another as the CA main loop issues them, and writes
// the timings as JSON. It is driven by tests/bench/run.py; tests/bench/README.md describes one loop
// and docs/explanation/performance.md the CA functions each call comes from. With several -target flags the
// loops alternate between the targets (A, B, A, B, ...) so that machine drift affects all alike.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "cabench/pb"
)

// Node is one Kubernetes node as the CA would present it to NodeGroupForNode.
type Node struct {
	ProviderID  string            `json:"providerID"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type rpcStats struct {
	lat           []time.Duration
	unimplemented int // answered UNIMPLEMENTED: a valid answer the CA maps to ErrNotImplemented
	errors        int
	first         string
}

type target struct {
	name     string
	addr     string
	clearURL string
	conn     *grpc.ClientConn
	client   pb.CloudProviderClient
	rpcs     map[string]*rpcStats
	warmup   []float64
	loops    []float64
	calls    []int
	unknown  int // nodes answered with an empty node-group id (nodes of no group)
	groups   int
	zeroGrps int
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

var rpcNames = []string{
	"Refresh", "NodeGroups", "NodeGroupForNode", "NodeGroupGetOptions",
	"NodeGroupTargetSize", "NodeGroupNodes", "NodeGroupTemplateNodeInfo",
}

func (t *target) record(rpc string, d time.Duration, err error) {
	s := t.rpcs[rpc]
	if status.Code(err) == codes.Unimplemented {
		// The upstream Scaleway provider answers GetOptions with ErrNotImplemented, which the example
		// wrapper turns into UNIMPLEMENTED; it is a complete answer, so its latency counts.
		s.unimplemented++
		s.lat = append(s.lat, d)
		return
	}
	if err != nil {
		s.errors++
		if s.first == "" {
			s.first = err.Error()
		}
		return
	}
	s.lat = append(s.lat, d)
}

// CA 1.36 sends only the new-generation duration fields in the defaults.
var defaults = &pb.NodeGroupAutoscalingOptions{
	ScaleDownUtilizationThreshold:    0.5,
	ScaleDownGpuUtilizationThreshold: 0.5,
	ScaleDownUnneededDuration:        durationpb.New(10 * time.Minute),
	ScaleDownUnreadyDuration:         durationpb.New(20 * time.Minute),
	MaxNodeProvisionDuration:         durationpb.New(15 * time.Minute),
}

// groupOf answers which node group node i belongs to the way the CA's externalgrpc client does: an
// answer naming a group is cached until the next Refresh (the client's nodeGroupForNodeCache), an
// empty answer is not, so every lookup of a node of no group is an RPC.
func (t *target) groupOf(i int, n *pb.ExternalGrpcNode, cache []string, call callFunc) string {
	if cache[i] != "" {
		return cache[i]
	}
	_ = call("NodeGroupForNode", func(ctx context.Context) error {
		r, err := t.client.NodeGroupForNode(ctx, &pb.NodeGroupForNodeRequest{Node: n})
		if err == nil {
			cache[i] = r.GetNodeGroup().GetId()
		}
		return err
	})
	return cache[i]
}

type callFunc func(rpc string, f func(ctx context.Context) error) error

// loop runs one CA loop and returns its wall time and the number of RPCs issued. The order and the
// counts follow one RunOnce of CA 1.36.1 in a steady cluster with scale-down enabled; the source
// functions are named in docs/explanation/performance.md ("The call pattern of CA 1.35 and later").
func (t *target) loop(nodes []*pb.ExternalGrpcNode, timeout time.Duration, measure bool) (time.Duration, int) {
	calls := 0
	call := func(rpc string, f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		err := f(ctx)
		d := time.Since(start)
		cancel()
		calls++
		if measure {
			t.record(rpc, d, err)
		}
		return err
	}
	c := t.client
	getOptions := func(id string) {
		_ = call("NodeGroupGetOptions", func(ctx context.Context) error {
			_, err := c.NodeGroupGetOptions(ctx, &pb.NodeGroupAutoscalingOptionsRequest{Id: id, Defaults: defaults})
			return err
		})
	}
	targetSizes := func(groups []*pb.NodeGroup, sizes map[string]int32) {
		for _, g := range groups {
			_ = call("NodeGroupTargetSize", func(ctx context.Context) error {
				r, err := c.NodeGroupTargetSize(ctx, &pb.NodeGroupTargetSizeRequest{Id: g.GetId()})
				if err == nil && sizes != nil {
					sizes[g.GetId()] = r.GetTargetSize()
				}
				return err
			})
		}
	}
	start := time.Now()
	// Refresh empties the client's caches; NodeGroups is then cached for the rest of the loop.
	_ = call("Refresh", func(ctx context.Context) error {
		_, err := c.Refresh(ctx, &pb.RefreshRequest{})
		return err
	})
	var groups []*pb.NodeGroup
	_ = call("NodeGroups", func(ctx context.Context) error {
		r, err := c.NodeGroups(ctx, &pb.NodeGroupsRequest{})
		if err == nil {
			groups = r.GetNodeGroups()
		}
		return err
	})
	cache := make([]string, len(nodes))
	// 1. Template node infos: the group of every ready node, then a template for every group none
	//    of whose nodes could serve as one (here: the groups at size 0).
	seen := map[string]bool{}
	for i, n := range nodes {
		if id := t.groupOf(i, n, cache, call); id != "" {
			seen[id] = true
		}
	}
	for _, g := range groups {
		if !seen[g.GetId()] {
			_ = call("NodeGroupTemplateNodeInfo", func(ctx context.Context) error {
				_, err := c.NodeGroupTemplateNodeInfo(ctx, &pb.NodeGroupTemplateNodeInfoRequest{Id: g.GetId()})
				return err
			})
		}
	}
	// 2. Cluster state: target sizes, the cloud's instances, then readiness per node (two group
	//    lookups for a node of no group; two GetOptions for a node of a group).
	sizes := map[string]int32{}
	targetSizes(groups, sizes)
	for _, g := range groups {
		_ = call("NodeGroupNodes", func(ctx context.Context) error {
			_, err := c.NodeGroupNodes(ctx, &pb.NodeGroupNodesRequest{Id: g.GetId()})
			return err
		})
	}
	for i, n := range nodes {
		id := t.groupOf(i, n, cache, call)
		if id != "" {
			getOptions(id) // readiness of the node's group
		}
		if id = t.groupOf(i, n, cache, call); id != "" {
			getOptions(id) // readiness of the whole cluster
		}
	}
	// 3. Upcoming nodes: target sizes again.
	targetSizes(groups, nil)
	// 4. Scale-down: target sizes for the pre-filter, which also looks up every node's group; then
	//    the eligibility check (two GetOptions) of the candidates, every second node of a group.
	targetSizes(groups, nil)
	candidate := 0
	for i, n := range nodes {
		id := t.groupOf(i, n, cache, call)
		if id == "" {
			continue
		}
		if candidate%2 == 0 {
			getOptions(id) // IgnoreDaemonSetsUtilization
			getOptions(id) // the scale-down utilization threshold
		}
		candidate++
	}
	elapsed := time.Since(start)
	unknown, zero := 0, 0
	for _, id := range cache {
		if id == "" {
			unknown++
		}
	}
	for _, g := range groups {
		if sizes[g.GetId()] == 0 {
			zero++
		}
	}
	t.unknown, t.groups, t.zeroGrps = unknown, len(groups), zero
	return elapsed, calls
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted)-1) + 0.5)
	return float64(sorted[i].Nanoseconds()) / 1e3
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func clearRequestLog(url string) error {
	if url == "" {
		return nil
	}
	req, err := http.NewRequest(http.MethodDelete, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("DELETE %s: %s", url, resp.Status)
	}
	return nil
}

func main() {
	var targets, clears multiFlag
	flag.Var(&targets, "target", "NAME=HOST:PORT (repeatable; loops alternate between targets)")
	flag.Var(&clears, "clear", "NAME=URL: DELETE this URL (the simulator request log) after the warm-up loops of NAME")
	nodesFile := flag.String("nodes", "", "JSON file: list of {providerID, name, labels, annotations}")
	loops := flag.Int("loops", 20, "measured loops per target")
	warmup := flag.Int("warmup", 2, "unmeasured warm-up loops per target")
	timeout := flag.Duration("timeout", 5*time.Second, "per-call deadline (CA grpc_timeout default)")
	out := flag.String("out", "", "write the JSON result here (default stdout)")
	dumpDescriptor := flag.Bool("dump-descriptor", false, "write the compiled-in externalgrpc FileDescriptorProto (binary) to stdout and exit")
	flag.Parse()
	if *dumpDescriptor {
		// Lets the Python side check that pb/ was generated from the current protos/externalgrpc.proto.
		raw, err := proto.Marshal(protodesc.ToFileDescriptorProto(pb.File_externalgrpc_proto))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(raw)
		return
	}
	if len(targets) == 0 || *nodesFile == "" {
		fmt.Fprintln(os.Stderr, "usage: loadclient -target NAME=ADDR [-target ...] -nodes FILE [-loops N] [-warmup N] [-out FILE]")
		os.Exit(2)
	}
	raw, err := os.ReadFile(*nodesFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var nodeList []Node
	if err := json.Unmarshal(raw, &nodeList); err != nil {
		fmt.Fprintln(os.Stderr, "nodes file:", err)
		os.Exit(1)
	}
	nodes := make([]*pb.ExternalGrpcNode, len(nodeList))
	for i, n := range nodeList {
		nodes[i] = &pb.ExternalGrpcNode{ProviderID: n.ProviderID, Name: n.Name, Labels: n.Labels, Annotations: n.Annotations}
	}
	clearURL := map[string]string{}
	for _, c := range clears {
		k, v, _ := strings.Cut(c, "=")
		clearURL[k] = v
	}
	var ts []*target
	for _, spec := range targets {
		name, addr, ok := strings.Cut(spec, "=")
		if !ok {
			fmt.Fprintln(os.Stderr, "bad -target", spec)
			os.Exit(2)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		t := &target{name: name, addr: addr, clearURL: clearURL[name], conn: conn, client: pb.NewCloudProviderClient(conn), rpcs: map[string]*rpcStats{}}
		for _, r := range rpcNames {
			t.rpcs[r] = &rpcStats{}
		}
		ts = append(ts, t)
	}
	for i := 0; i < *warmup; i++ {
		for _, t := range ts {
			d, _ := t.loop(nodes, *timeout, false)
			t.warmup = append(t.warmup, ms(d))
		}
	}
	for _, t := range ts {
		if err := clearRequestLog(t.clearURL); err != nil {
			fmt.Fprintln(os.Stderr, "clear request log:", err)
		}
	}
	measureStart := time.Now()
	for i := 0; i < *loops; i++ {
		for _, t := range ts {
			d, n := t.loop(nodes, *timeout, true)
			t.loops = append(t.loops, ms(d))
			t.calls = append(t.calls, n)
		}
	}
	result := map[string]any{
		"nodes":              len(nodes),
		"loops":              *loops,
		"warmup":             *warmup,
		"measure_seconds":    time.Since(measureStart).Seconds(),
		"measure_start_unix": float64(measureStart.UnixNano()) / 1e9,
	}
	tres := map[string]any{}
	for _, t := range ts {
		rpcs := map[string]any{}
		for _, r := range rpcNames {
			s := t.rpcs[r]
			sort.Slice(s.lat, func(i, j int) bool { return s.lat[i] < s.lat[j] })
			var sum time.Duration
			for _, d := range s.lat {
				sum += d
			}
			mean := 0.0
			if len(s.lat) > 0 {
				mean = float64(sum.Nanoseconds()) / float64(len(s.lat)) / 1e3
			}
			rpcs[r] = map[string]any{
				"ok": len(s.lat), "unimplemented": s.unimplemented, "errors": s.errors, "first_error": s.first,
				"p50_us": percentile(s.lat, 50), "p90_us": percentile(s.lat, 90),
				"p99_us": percentile(s.lat, 99), "mean_us": mean,
				"total_ms": ms(sum),
			}
		}
		tres[t.name] = map[string]any{
			"addr": t.addr, "loops_ms": t.loops, "warmup_ms": t.warmup, "calls_per_loop": t.calls,
			"rpc": rpcs, "unknown_nodes": t.unknown, "groups": t.groups, "groups_at_zero": t.zeroGrps,
		}
		t.conn.Close()
	}
	result["targets"] = tres
	enc, _ := json.MarshalIndent(result, "", "  ")
	if *out == "" {
		os.Stdout.Write(append(enc, '\n'))
		return
	}
	if err := os.WriteFile(*out, append(enc, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
