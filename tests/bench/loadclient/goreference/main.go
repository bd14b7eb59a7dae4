// Command goreference is a stand-in for the upstream example server when the upstream module cannot
// be fetched: a grpc-go CloudProvider server that does the work the upstream example does with the
// in-tree Scaleway provider, written from the facts in docs/scaleway.md and docs/protocol.md (it
// shares no upstream code):
//
//   - configured by CLUSTER_ID, SCW_SECRET_KEY, SCW_REGION, SCW_API_URL;
//   - refreshes before it listens, then inside Refresh when the ListPools Cache-Control max-age has
//     passed (60 s without one): ListPools and one cluster-wide ListNodes, 100 per page, a page is
//     asked for until one comes back short;
//   - node-group RPCs find the group by a linear scan over the groups, as the example wrapper does;
//     NodeGroupForNode looks the node up by providerID in a map;
//   - GetOptions answers UNIMPLEMENTED (the provider's ErrNotImplemented), TemplateNodeInfo too
//     (the upstream builds a Node from pool data; that cost is left out here, ten calls per loop).
//
// Its loop time is therefore a close lower bound of the upstream example's: same language, same gRPC
// stack, same lookups, minus the upstream's template encoding. The bench labels it "goref".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "cabench/pb"
)

const pageSize = 100

type pool struct {
	ID          string `json:"id"`
	Autoscaling bool   `json:"autoscaling"`
	Size        int    `json:"size"`
	MinSize     int    `json:"min_size"`
	MaxSize     int    `json:"max_size"`
	Status      string `json:"status"`
	Version     string `json:"version"`
}

type node struct {
	ID         string `json:"id"`
	PoolID     string `json:"pool_id"`
	ProviderID string `json:"provider_id"`
	Status     string `json:"status"`
}

type api struct {
	base, region, cluster, token, agent string
	client                              *http.Client
}

func (a *api) get(path string, page int, into any) (http.Header, error) {
	url := fmt.Sprintf("%s/k8s/v1/regions/%s/autoscaler/%s?page=%d&page_size=%d", a.base, a.region, path, page, pageSize)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Auth-Token", a.token)
	req.Header.Set("User-Agent", a.agent)
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp.Header, json.NewDecoder(resp.Body).Decode(into)
}

func maxAge(h http.Header) time.Duration {
	for _, part := range strings.Split(h.Get("Cache-Control"), ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(part), "max-age="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return time.Duration(n) * time.Second
			}
		}
	}
	return 60 * time.Second
}

type group struct {
	pool  pool
	nodes []node
}

type server struct {
	pb.UnimplementedCloudProviderServer
	api *api

	mu          sync.Mutex
	groups      []*group
	byProvider  map[string]*group
	lastRefresh time.Time
	interval    time.Duration
	lastErr     error
}

func (s *server) refresh() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lastRefresh.IsZero() && time.Since(s.lastRefresh) < s.interval {
		return s.lastErr
	}
	var pools []pool
	var header http.Header
	for page := 1; ; page++ {
		var body struct {
			Pools []pool `json:"pools"`
		}
		h, err := s.api.get("clusters/"+s.api.cluster+"/pools", page, &body)
		if err != nil {
			s.lastRefresh, s.lastErr = time.Now(), err
			return err
		}
		header = h
		pools = append(pools, body.Pools...)
		if len(body.Pools) < pageSize {
			break
		}
	}
	s.interval = maxAge(header)
	var nodes []node
	for page := 1; ; page++ {
		var body struct {
			Nodes []node `json:"nodes"`
		}
		if _, err := s.api.get("clusters/"+s.api.cluster+"/nodes", page, &body); err != nil {
			s.lastRefresh, s.lastErr = time.Now(), err
			return err
		}
		nodes = append(nodes, body.Nodes...)
		if len(body.Nodes) < pageSize {
			break
		}
	}
	byPool := map[string]*group{}
	groups := []*group{}
	for _, p := range pools {
		if p.Autoscaling {
			g := &group{pool: p}
			byPool[p.ID] = g
			groups = append(groups, g)
		}
	}
	byProvider := map[string]*group{}
	for _, n := range nodes {
		if g, ok := byPool[n.PoolID]; ok {
			g.nodes = append(g.nodes, n)
			byProvider[n.ProviderID] = g
		}
	}
	s.groups, s.byProvider, s.lastRefresh, s.lastErr = groups, byProvider, time.Now(), nil
	return nil
}

func (g *group) proto() *pb.NodeGroup {
	p := g.pool
	return &pb.NodeGroup{
		Id: p.ID, MinSize: int32(p.MinSize), MaxSize: int32(p.MaxSize),
		Debug: fmt.Sprintf("id:%s,status:%s,version:%s,autoscaling:%t,size:%d,min_size:%d,max_size:%d",
			p.ID, p.Status, p.Version, p.Autoscaling, p.Size, p.MinSize, p.MaxSize),
	}
}

// find scans the groups linearly, as the example wrapper does for every node-group RPC.
func (s *server) find(id string) (*group, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.groups {
		if g.pool.ID == id {
			return g, nil
		}
	}
	return nil, fmt.Errorf("NodeGroup %q, not found", id)
}

func (s *server) Refresh(context.Context, *pb.RefreshRequest) (*pb.RefreshResponse, error) {
	return &pb.RefreshResponse{}, s.refresh()
}

func (s *server) NodeGroups(context.Context, *pb.NodeGroupsRequest) (*pb.NodeGroupsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*pb.NodeGroup, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, g.proto())
	}
	return &pb.NodeGroupsResponse{NodeGroups: out}, nil
}

func (s *server) NodeGroupForNode(_ context.Context, req *pb.NodeGroupForNodeRequest) (*pb.NodeGroupForNodeResponse, error) {
	s.mu.Lock()
	g, ok := s.byProvider[req.GetNode().GetProviderID()]
	s.mu.Unlock()
	if !ok {
		return &pb.NodeGroupForNodeResponse{NodeGroup: &pb.NodeGroup{}}, nil
	}
	return &pb.NodeGroupForNodeResponse{NodeGroup: g.proto()}, nil
}

func (s *server) NodeGroupTargetSize(_ context.Context, req *pb.NodeGroupTargetSizeRequest) (*pb.NodeGroupTargetSizeResponse, error) {
	g, err := s.find(req.GetId())
	if err != nil {
		return nil, err
	}
	return &pb.NodeGroupTargetSizeResponse{TargetSize: int32(g.pool.Size)}, nil
}

func (s *server) NodeGroupNodes(_ context.Context, req *pb.NodeGroupNodesRequest) (*pb.NodeGroupNodesResponse, error) {
	g, err := s.find(req.GetId())
	if err != nil {
		return nil, err
	}
	out := make([]*pb.Instance, 0, len(g.nodes))
	for _, n := range g.nodes {
		state := pb.InstanceStatus_instanceCreating
		switch n.Status {
		case "ready":
			state = pb.InstanceStatus_instanceRunning
		case "deleting":
			state = pb.InstanceStatus_instanceDeleting
		}
		out = append(out, &pb.Instance{Id: n.ProviderID, Status: &pb.InstanceStatus{InstanceState: state, ErrorInfo: &pb.InstanceErrorInfo{}}})
	}
	return &pb.NodeGroupNodesResponse{Instances: out}, nil
}

func (s *server) NodeGroupGetOptions(_ context.Context, req *pb.NodeGroupAutoscalingOptionsRequest) (*pb.NodeGroupAutoscalingOptionsResponse, error) {
	if _, err := s.find(req.GetId()); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unimplemented, "Not implemented")
}

func (s *server) NodeGroupTemplateNodeInfo(_ context.Context, req *pb.NodeGroupTemplateNodeInfoRequest) (*pb.NodeGroupTemplateNodeInfoResponse, error) {
	if _, err := s.find(req.GetId()); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unimplemented, "Not implemented")
}

func main() {
	address := flag.String("address", "127.0.0.1:8086", "listen address")
	flag.Parse()
	a := &api{
		base: os.Getenv("SCW_API_URL"), region: os.Getenv("SCW_REGION"), cluster: os.Getenv("CLUSTER_ID"),
		token: os.Getenv("SCW_SECRET_KEY"), agent: "ca-bench-goreference/1 cluster-id/" + os.Getenv("CLUSTER_ID"),
		client: &http.Client{Timeout: 30 * time.Second},
	}
	s := &server{api: a}
	if err := s.refresh(); err != nil {
		log.Fatalf("first refresh: %v", err)
	}
	lis, err := net.Listen("tcp", *address)
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterCloudProviderServer(g, s)
	log.Fatal(g.Serve(lis))
}
