// Package checks drives the upstream cluster-autoscaler externalgrpc client (the real
// CloudProvider / NodeGroup implementation of one CA release) against a running server and
// compares what the CA sees with an expectations file written by tests/conformance/run.py.
//
// The same source is compiled once per CA version (modules ../ca1341 and ../ca1361). It only
// uses API that is identical in those releases: caapi.CloudProvider/NodeGroup,
// framework.NodeInfo.Node(), caapi.NodeGroupAutoscalingOptions' common fields.
package checks

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	versionpkg "k8s.io/autoscaler/cluster-autoscaler/version"

	"caconformance/caapi"
)

// Expectations is the JSON contract with run.py. Every field is optional: a check whose
// inputs are absent is not run at all (run.py decides what the scenario covers).
type Expectations struct {
	// Backends maps a label (e.g. "scaleway") to what that simulated cloud should look like.
	Backends []Backend `json:"backends"`
	// UnmanagedProviderID is a providerID no backend owns: NodeGroupForNode must say "not autoscaled".
	UnmanagedProviderID string   `json:"unmanaged_provider_id"`
	GPULabel            *string  `json:"gpu_label"`
	GPUTypes            []string `json:"gpu_types"`
	// Mutations: when false the run is read-only (e.g. a second run against the same state).
	Mutate bool `json:"mutate"`
}

type Backend struct {
	Name   string  `json:"name"`
	Groups []Group `json:"groups"`
}

type Group struct {
	ID string `json:"id"`
	// Name is the cloud's pool name, only used to make check names readable.
	Name       string `json:"name"`
	Min        int    `json:"min"`
	Max        int    `json:"max"`
	TargetSize *int   `json:"target_size"`
	// ManagedNode: a node of this group as the kubelet would register it.
	ManagedNode *NodeRef `json:"managed_node"`
	// Instances expected from Nodes() (subset match by id; absent ids are an error).
	Instances []Instance `json:"instances"`
	// Template: nil => expect ErrNotImplemented ("template_unimplemented": true) or skip.
	Template              *Template `json:"template"`
	TemplateUnimplemented bool      `json:"template_unimplemented"`
	// Options: nil with OptionsEmpty => expect (nil, nil).
	OptionsEmpty bool     `json:"options_empty"`
	Options      *Options `json:"options"`
	// Mutation plan for this group (only one group per backend needs one).
	IncreaseBy     int      `json:"increase_by"`
	DecreaseBy     int      `json:"decrease_by"`
	DeleteNode     *NodeRef `json:"delete_node"`
	NodePrice      *float64 `json:"node_price"`
	NodePriceUnimp bool     `json:"node_price_unimplemented"`
}

type NodeRef struct {
	ProviderID string            `json:"provider_id"`
	Name       string            `json:"name"`
	Labels     map[string]string `json:"labels"`
}

type Instance struct {
	ID    string `json:"id"`
	State string `json:"state"` // running | creating | deleting
	// ErrorCode: "" = no error expected; AnyErrorCode = any non-empty code (the cloud
	// backend picks its own codes; the CA only needs one to be present).
	ErrorCode string `json:"error_code"`
	// ErrorClass: 1 out-of-resources, 99 other, 0 = either of those.
	ErrorClass int `json:"error_class"`
}

// AnyErrorCode in an expectation accepts any non-empty InstanceErrorInfo.errorCode.
const AnyErrorCode = "*"

func errorClassMatches(got, want int) bool {
	if want == 0 {
		return got == int(caapi.OutOfResourcesErrorClass) || got == int(caapi.OtherErrorClass)
	}
	return got == want
}

func describeClass(want int) string {
	if want == 0 {
		return "1 (out of resources) or 99 (other)"
	}
	return fmt.Sprintf("%d", want)
}

type Template struct {
	Labels      map[string]string `json:"labels"`
	Taints      []Taint           `json:"taints"`
	Allocatable map[string]string `json:"allocatable"`
}

type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

type Options struct {
	ScaleDownUtilizationThreshold    *float64 `json:"scale_down_utilization_threshold"`
	ScaleDownGpuUtilizationThreshold *float64 `json:"scale_down_gpu_utilization_threshold"`
	ScaleDownUnneededTime            string   `json:"scale_down_unneeded_time"`
	ScaleDownUnreadyTime             string   `json:"scale_down_unready_time"`
	MaxNodeProvisionTime             string   `json:"max_node_provision_time"`
	ZeroOrMaxNodeScaling             *bool    `json:"zero_or_max_node_scaling"`
	IgnoreDaemonSetsUtilization      *bool    `json:"ignore_daemonsets_utilization"`
}

// Runner collects results.
type Runner struct {
	Version        string
	passed, failed int
	failures       []string
}

func (r *Runner) Pass(name, detail string) {
	r.passed++
	fmt.Printf("PASS %s %s\n", name, detail)
}

func (r *Runner) Fail(name, detail string) {
	r.failed++
	r.failures = append(r.failures, name)
	fmt.Printf("FAIL %s %s\n", name, detail)
}

// Check records a pass when err is nil.
func (r *Runner) Check(name string, err error, okDetail string) {
	if err != nil {
		r.Fail(name, err.Error())
	} else {
		r.Pass(name, okDetail)
	}
}

// Guard runs one check and turns a panic inside the CA client into a failure of that check
// (the client dereferences absent option durations up to 1.34.5, docs/reference/protocol.md, "What crashes
// the CA or stops its loop"), so the
// remaining checks still run and the report names the RPC that crashed.
func (r *Runner) Guard(name string, check func()) {
	defer func() {
		if p := recover(); p != nil {
			r.Fail(name, fmt.Sprintf("the CA client panicked: %v", p))
		}
	}()
	check()
}

// Builder builds the provider from a cloud-config path (version specific glue).
type Builder func(cloudConfigPath string) caapi.CloudProvider

// DefaultBuilder is set by each version module's main package.
var DefaultBuilder Builder

// moduleVersion reports which version of a module this binary was linked against, read from
// the build info rather than repeated by hand ("" when the module is not linked in).
func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return ""
}

// Summary is the last stdout line, parsed by run.py.
type Summary struct {
	Version  string `json:"version"`
	Label    string `json:"label"`
	CAModule string `json:"ca_module"`
	// CoreModule is "path version" of the module the CA core came from when it is not the CA
	// module itself (CA HEAD: sigs.k8s.io/cluster-autoscaler).
	CoreModule string `json:"core_module"`
	// Declared is the version the CA module itself declares (version.ClusterAutoscalerVersion).
	Declared string   `json:"declared_version"`
	Passed   int      `json:"passed"`
	Failed   int      `json:"failed"`
	Failures []string `json:"failures"`
}

// Main parses flags, runs every check, prints the summary and exits non-zero on failure.
func Main(version string) {
	expPath := flag.String("expectations", "", "JSON expectations file written by run.py")
	cloudConfig := flag.String("cloud-config", "", "externalgrpc cloud-config (YAML) pointing at the server")
	label := flag.String("label", "", "label printed in check names (e.g. plaintext, mtls)")
	flag.Parse()
	if *expPath == "" || *cloudConfig == "" {
		fmt.Fprintln(os.Stderr, "usage: -expectations FILE -cloud-config FILE [-label L]")
		os.Exit(2)
	}
	raw, err := os.ReadFile(*expPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var exp Expectations
	if err := json.Unmarshal(raw, &exp); err != nil {
		fmt.Fprintln(os.Stderr, "expectations:", err)
		os.Exit(2)
	}
	r := &Runner{Version: version}
	prefix := "ca" + version
	if *label != "" {
		prefix += "/" + *label
	}
	module := moduleVersion("k8s.io/autoscaler/cluster-autoscaler")
	core, coreNote := "", ""
	if caapi.CoreModule != "k8s.io/autoscaler/cluster-autoscaler" {
		core = caapi.CoreModule + " " + moduleVersion(caapi.CoreModule)
		coreNote = ", core " + core
	}
	fmt.Printf("cluster-autoscaler %s externalgrpc client (k8s.io/autoscaler/cluster-autoscaler %s, declares %q%s), cloud-config %s\n",
		version, module, versionpkg.ClusterAutoscalerVersion, coreNote, *cloudConfig)
	func() {
		// A panic inside the CA client (e.g. a nil options duration on <= 1.34.1) is exactly the
		// failure mode this suite exists to catch: record it instead of dying without a summary.
		defer func() {
			if p := recover(); p != nil {
				r.Fail(prefix+"/panic", fmt.Sprintf("the CA client panicked: %v", p))
			}
		}()
		cp := DefaultBuilder(*cloudConfig)
		Run(r, prefix, cp, &exp)
	}()
	out, _ := json.Marshal(Summary{Version: version, Label: *label, CAModule: module, CoreModule: core,
		Declared: versionpkg.ClusterAutoscalerVersion, Passed: r.passed, Failed: r.failed, Failures: r.failures})
	fmt.Printf("SUMMARY %s\n", out)
	if r.failed > 0 {
		os.Exit(1)
	}
}

func node(ref *NodeRef) *apiv1.Node {
	n := &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Labels: map[string]string{}},
		Spec:       apiv1.NodeSpec{ProviderID: ref.ProviderID},
	}
	for k, v := range ref.Labels {
		n.Labels[k] = v
	}
	return n
}

// fakeNode is what the CA core builds for an instance that has no registered Node
// (clusterstate "fake node"): name = providerID, nothing else.
func fakeNode(providerID string) *apiv1.Node {
	return &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: providerID},
		Spec:       apiv1.NodeSpec{ProviderID: providerID},
	}
}

// label names a group in check names: its pool name when known, else its id.
func (g *Group) label() string {
	if g.Name != "" {
		return g.Name
	}
	return g.ID
}

func findGroup(cp caapi.CloudProvider, id string) caapi.NodeGroup {
	for _, g := range cp.NodeGroups() {
		if g.Id() == id {
			return g
		}
	}
	return nil
}

// Run executes the checks in a fixed order: reads first, then mutations, then reads that
// observe the mutations, then Refresh/Cleanup.
func Run(r *Runner, p string, cp caapi.CloudProvider, exp *Expectations) {
	if cp.Name() != caapi.ExternalGrpcProviderName {
		r.Fail(p+"/Name", fmt.Sprintf("got %q", cp.Name()))
	} else {
		r.Pass(p+"/Name", cp.Name())
	}

	// Refresh first: this is what every CA loop does before anything else.
	r.Check(p+"/Refresh", cp.Refresh(), "ok")

	// NodeGroups: every expected id with min/max.
	groups := cp.NodeGroups()
	got := map[string]caapi.NodeGroup{}
	var ids []string
	for _, g := range groups {
		got[g.Id()] = g
		ids = append(ids, g.Id())
	}
	sort.Strings(ids)
	for _, b := range exp.Backends {
		for _, eg := range b.Groups {
			name := fmt.Sprintf("%s/%s/NodeGroups[%s]", p, b.Name, eg.label())
			g, ok := got[eg.ID]
			if !ok {
				r.Fail(name, fmt.Sprintf("group missing; server listed %v", ids))
				continue
			}
			if g.MinSize() != eg.Min || g.MaxSize() != eg.Max {
				r.Fail(name, fmt.Sprintf("min/max %d/%d, want %d/%d", g.MinSize(), g.MaxSize(), eg.Min, eg.Max))
				continue
			}
			r.Pass(name, fmt.Sprintf("min=%d max=%d debug=%q", g.MinSize(), g.MaxSize(), g.Debug()))
		}
	}

	for _, b := range exp.Backends {
		for _, eg := range b.Groups {
			g := got[eg.ID]
			if g == nil {
				continue
			}
			gp := fmt.Sprintf("%s/%s/%s", p, b.Name, eg.label())
			r.Guard(gp, func() { readChecks(r, gp, cp, g, &eg) })
		}
	}

	// NodeGroupForNode for an unmanaged node: (nil, nil).
	if exp.UnmanagedProviderID != "" {
		n := node(&NodeRef{ProviderID: exp.UnmanagedProviderID, Name: "unmanaged-node"})
		g, err := cp.NodeGroupForNode(n)
		switch {
		case err != nil:
			r.Fail(p+"/NodeGroupForNode[unmanaged]", "error: "+err.Error())
		case g != nil && !isNilGroup(g):
			r.Fail(p+"/NodeGroupForNode[unmanaged]", "got group "+g.Id()+", want none")
		default:
			r.Pass(p+"/NodeGroupForNode[unmanaged]", "not autoscaled")
		}
	}

	// GPU label / types.
	if exp.GPULabel != nil {
		if l := cp.GPULabel(); l != *exp.GPULabel {
			r.Fail(p+"/GPULabel", fmt.Sprintf("got %q want %q", l, *exp.GPULabel))
		} else {
			r.Pass(p+"/GPULabel", fmt.Sprintf("%q", l))
		}
	}
	if exp.GPUTypes != nil {
		types := cp.GetAvailableGPUTypes()
		var missing []string
		for _, t := range exp.GPUTypes {
			if _, ok := types[t]; !ok {
				missing = append(missing, t)
			}
		}
		if len(missing) > 0 || len(types) != len(exp.GPUTypes) {
			r.Fail(p+"/GetAvailableGPUTypes", fmt.Sprintf("got %v want %v", keys(types), exp.GPUTypes))
		} else {
			r.Pass(p+"/GetAvailableGPUTypes", fmt.Sprintf("%v", keys(types)))
		}
	}

	// PodPrice: any answer that is a number or ErrNotImplemented is acceptable; an error is not.
	if pm, err := cp.Pricing(); err != nil {
		r.Fail(p+"/Pricing", err.Error())
	} else {
		pod := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
			Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{
				Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("500m")}}}}}}
		now := time.Now()
		price, perr := pm.PodPrice(pod, now, now.Add(time.Hour))
		switch {
		case errors.Is(perr, caapi.ErrNotImplemented):
			r.Pass(p+"/PodPrice", "ErrNotImplemented")
		case perr != nil:
			r.Fail(p+"/PodPrice", perr.Error())
		case price < 0:
			r.Fail(p+"/PodPrice", fmt.Sprintf("negative price %v", price))
		default:
			r.Pass(p+"/PodPrice", fmt.Sprintf("%v", price))
		}
	}

	if exp.Mutate {
		for _, b := range exp.Backends {
			r.Guard(p+"/"+b.Name+"/mutations", func() { mutationChecks(r, p, b, cp, exp) })
		}
	}

	r.Check(p+"/Refresh[final]", cp.Refresh(), "ok")
	r.Check(p+"/Cleanup", cp.Cleanup(), "ok")
}

func isNilGroup(g caapi.NodeGroup) bool {
	// The client returns a typed nil in some versions; treat an empty id as "none".
	defer func() { _ = recover() }()
	return g.Id() == ""
}

func keys(m map[string]struct{}) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func readChecks(r *Runner, gp string, cp caapi.CloudProvider, g caapi.NodeGroup, eg *Group) {
	if eg.TargetSize != nil {
		ts, err := g.TargetSize()
		switch {
		case err != nil:
			r.Fail(gp+"/TargetSize", err.Error())
		case ts != *eg.TargetSize:
			r.Fail(gp+"/TargetSize", fmt.Sprintf("got %d want %d", ts, *eg.TargetSize))
		default:
			r.Pass(gp+"/TargetSize", fmt.Sprintf("%d", ts))
		}
	}

	if eg.ManagedNode != nil {
		ng, err := cp.NodeGroupForNode(node(eg.ManagedNode))
		switch {
		case err != nil:
			r.Fail(gp+"/NodeGroupForNode[managed]", err.Error())
		case ng == nil || isNilGroup(ng):
			r.Fail(gp+"/NodeGroupForNode[managed]", "node not recognised as autoscaled")
		case ng.Id() != eg.ID:
			r.Fail(gp+"/NodeGroupForNode[managed]", fmt.Sprintf("got group %s", ng.Id()))
		case ng.MinSize() != eg.Min || ng.MaxSize() != eg.Max:
			r.Fail(gp+"/NodeGroupForNode[managed]", fmt.Sprintf("min/max %d/%d", ng.MinSize(), ng.MaxSize()))
		default:
			r.Pass(gp+"/NodeGroupForNode[managed]", eg.ManagedNode.ProviderID+" -> "+ng.Id())
		}
		ng, err = cp.NodeGroupForNode(fakeNode(eg.ManagedNode.ProviderID))
		switch {
		case err != nil:
			r.Fail(gp+"/NodeGroupForNode[fake-node]", err.Error())
		case ng == nil || isNilGroup(ng):
			r.Fail(gp+"/NodeGroupForNode[fake-node]", "fake node (name=providerID, no labels) not recognised")
		case ng.Id() != eg.ID:
			r.Fail(gp+"/NodeGroupForNode[fake-node]", fmt.Sprintf("got group %s", ng.Id()))
		default:
			r.Pass(gp+"/NodeGroupForNode[fake-node]", "-> "+ng.Id())
		}
		if pm, err := cp.Pricing(); err != nil {
			r.Fail(gp+"/NodePrice", "Pricing(): "+err.Error())
		} else if eg.NodePrice != nil || eg.NodePriceUnimp {
			now := time.Now()
			price, err := pm.NodePrice(node(eg.ManagedNode), now, now.Add(time.Hour))
			switch {
			case eg.NodePriceUnimp && errors.Is(err, caapi.ErrNotImplemented):
				r.Pass(gp+"/NodePrice", "ErrNotImplemented")
			case err != nil:
				r.Fail(gp+"/NodePrice", err.Error())
			case eg.NodePrice != nil && !approxEqual(price, *eg.NodePrice):
				r.Fail(gp+"/NodePrice", fmt.Sprintf("got %v want %v", price, *eg.NodePrice))
			case eg.NodePriceUnimp:
				r.Fail(gp+"/NodePrice", fmt.Sprintf("got %v want ErrNotImplemented", price))
			default:
				r.Pass(gp+"/NodePrice", fmt.Sprintf("%v", price))
			}
		}
	}

	if len(eg.Instances) > 0 {
		r.Guard(gp+"/Nodes", func() { checkInstances(r, gp+"/Nodes", g, eg.Instances) })
	}

	switch {
	case eg.Template != nil:
		r.Guard(gp+"/TemplateNodeInfo", func() { checkTemplate(r, gp+"/TemplateNodeInfo", g, eg.Template) })
	case eg.TemplateUnimplemented:
		name := gp + "/TemplateNodeInfo[unimplemented]"
		r.Guard(name, func() {
			ni, err := g.TemplateNodeInfo()
			if errors.Is(err, caapi.ErrNotImplemented) {
				r.Pass(name, "ErrNotImplemented")
			} else {
				r.Fail(name, fmt.Sprintf("got %v, %v; want ErrNotImplemented", ni, err))
			}
		})
	}

	r.Guard(gp+"/GetOptions", func() { checkOptions(r, gp+"/GetOptions", g, eg) })
}

// approxEqual compares floats that went through a double on the wire and a config parse.
func approxEqual(a, b float64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d < 1e-9 || d < 1e-6*b
}

var stateNames = map[caapi.InstanceState]string{
	caapi.InstanceRunning:  "running",
	caapi.InstanceCreating: "creating",
	caapi.InstanceDeleting: "deleting",
}

func checkInstances(r *Runner, name string, g caapi.NodeGroup, want []Instance) {
	insts, err := g.Nodes()
	if err != nil {
		r.Fail(name, err.Error())
		return
	}
	byID := map[string]caapi.Instance{}
	var gotIDs []string
	for _, in := range insts {
		byID[in.Id] = in
		gotIDs = append(gotIDs, in.Id)
	}
	for _, w := range want {
		cn := fmt.Sprintf("%s[%s]", name, w.State)
		if w.ErrorCode != "" {
			cn = name + "[creation-error]"
		}
		in, ok := byID[w.ID]
		if !ok {
			r.Fail(cn, fmt.Sprintf("instance %s missing; got %v", w.ID, gotIDs))
			continue
		}
		if in.Status == nil {
			r.Fail(cn, w.ID+": no status")
			continue
		}
		if got := stateNames[in.Status.State]; got != w.State {
			r.Fail(cn, fmt.Sprintf("%s: state %q want %q", w.ID, got, w.State))
			continue
		}
		if w.ErrorCode != "" {
			ei := in.Status.ErrorInfo
			switch {
			case ei == nil:
				r.Fail(cn, w.ID+": no ErrorInfo")
				continue
			case w.ErrorCode != AnyErrorCode && ei.ErrorCode != w.ErrorCode:
				r.Fail(cn, fmt.Sprintf("%s: error code %q want %q", w.ID, ei.ErrorCode, w.ErrorCode))
				continue
			case !errorClassMatches(int(ei.ErrorClass), w.ErrorClass):
				r.Fail(cn, fmt.Sprintf("%s: error class %d want %s", w.ID, ei.ErrorClass, describeClass(w.ErrorClass)))
				continue
			case ei.ErrorMessage == "":
				r.Fail(cn, w.ID+": empty error message")
				continue
			}
			r.Pass(cn, fmt.Sprintf("%s code=%s class=%d", w.ID, ei.ErrorCode, ei.ErrorClass))
			continue
		}
		r.Pass(cn, w.ID)
	}
}

func checkTemplate(r *Runner, name string, g caapi.NodeGroup, want *Template) {
	ni, err := g.TemplateNodeInfo()
	if err != nil {
		r.Fail(name, err.Error())
		return
	}
	if ni == nil || ni.Node() == nil {
		// A nil NodeInfo with a nil error is exactly what makes CA core panic.
		r.Fail(name, "nil NodeInfo with nil error (CA core would dereference it and panic)")
		return
	}
	n := ni.Node()
	var probs []string
	for k, v := range want.Labels {
		if got, ok := n.Labels[k]; !ok || got != v {
			probs = append(probs, fmt.Sprintf("label %s=%q (got %q)", k, v, got))
		}
	}
	for res, q := range want.Allocatable {
		wq := resource.MustParse(q)
		gq, ok := n.Status.Allocatable[apiv1.ResourceName(res)]
		if !ok || gq.Cmp(wq) != 0 {
			probs = append(probs, fmt.Sprintf("allocatable %s=%s (got %s)", res, q, gq.String()))
		}
	}
	// Without these the CA's scheduler simulation rejects every pod ("Too many pods",
	// "Insufficient cpu"), whatever the rest of the template says (docs/reference/protocol.md, "Templates for
	// scale-from-zero").
	for _, res := range []apiv1.ResourceName{apiv1.ResourcePods, apiv1.ResourceCPU, apiv1.ResourceMemory} {
		if q, ok := n.Status.Allocatable[res]; !ok || q.Sign() <= 0 {
			probs = append(probs, fmt.Sprintf("allocatable %s missing or zero", res))
		}
	}
	if want.Taints != nil {
		var gotT, wantT []string
		for _, t := range n.Spec.Taints {
			gotT = append(gotT, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
		}
		for _, t := range want.Taints {
			wantT = append(wantT, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
		}
		sort.Strings(gotT)
		sort.Strings(wantT)
		if strings.Join(gotT, ",") != strings.Join(wantT, ",") {
			probs = append(probs, fmt.Sprintf("taints %v (got %v)", wantT, gotT))
		}
	}
	if n.Spec.Unschedulable {
		probs = append(probs, "template is unschedulable")
	}
	if len(probs) > 0 {
		r.Fail(name, strings.Join(probs, "; "))
		return
	}
	cpu := n.Status.Allocatable[apiv1.ResourceCPU]
	mem := n.Status.Allocatable[apiv1.ResourceMemory]
	pods := n.Status.Allocatable[apiv1.ResourcePods]
	r.Pass(name, fmt.Sprintf("cpu=%s memory=%s pods=%s labels=%d taints=%d", cpu.String(), mem.String(), pods.String(),
		len(n.Labels), len(n.Spec.Taints)))
}

func caDefaults() caapi.NodeGroupAutoscalingOptions {
	// Distinctive values so that "kept the CA's defaults" is observable.
	return caapi.NodeGroupAutoscalingOptions{
		ScaleDownUtilizationThreshold:    0.41,
		ScaleDownGpuUtilizationThreshold: 0.42,
		ScaleDownUnneededTime:            11 * time.Minute,
		ScaleDownUnreadyTime:             21 * time.Minute,
		MaxNodeProvisionTime:             16 * time.Minute,
		ZeroOrMaxNodeScaling:             false,
		IgnoreDaemonSetsUtilization:      true,
	}
}

func checkOptions(r *Runner, name string, g caapi.NodeGroup, eg *Group) {
	if !eg.OptionsEmpty && eg.Options == nil {
		return
	}
	defaults := caDefaults()
	opts, err := g.GetOptions(defaults)
	if eg.OptionsEmpty {
		switch {
		case errors.Is(err, caapi.ErrNotImplemented):
			r.Pass(name+"[default]", "ErrNotImplemented (CA uses its flags)")
		case err != nil:
			r.Fail(name+"[default]", err.Error())
		case opts != nil:
			r.Fail(name+"[default]", fmt.Sprintf("got options %+v, want nil (use CA defaults)", *opts))
		default:
			r.Pass(name+"[default]", "nil options: CA defaults apply")
		}
		return
	}
	if err != nil {
		r.Fail(name+"[configured]", err.Error())
		return
	}
	if opts == nil {
		r.Fail(name+"[configured]", "nil options, want configured values")
		return
	}
	o := eg.Options
	var probs []string
	fl := func(n string, got, def float64, want *float64) {
		w := def
		if want != nil {
			w = *want
		}
		if !approxEqual(got, w) {
			probs = append(probs, fmt.Sprintf("%s=%v want %v", n, got, w))
		}
	}
	du := func(n string, got, def time.Duration, want string) {
		w := def
		if want != "" {
			d, err := time.ParseDuration(want)
			if err != nil {
				probs = append(probs, fmt.Sprintf("%s: bad expectation %q", n, want))
				return
			}
			w = d
		}
		if got != w {
			probs = append(probs, fmt.Sprintf("%s=%v want %v", n, got, w))
		}
	}
	bo := func(n string, got, def bool, want *bool) {
		w := def
		if want != nil {
			w = *want
		}
		if got != w {
			probs = append(probs, fmt.Sprintf("%s=%v want %v", n, got, w))
		}
	}
	fl("ScaleDownUtilizationThreshold", opts.ScaleDownUtilizationThreshold, defaults.ScaleDownUtilizationThreshold, o.ScaleDownUtilizationThreshold)
	fl("ScaleDownGpuUtilizationThreshold", opts.ScaleDownGpuUtilizationThreshold, defaults.ScaleDownGpuUtilizationThreshold, o.ScaleDownGpuUtilizationThreshold)
	du("ScaleDownUnneededTime", opts.ScaleDownUnneededTime, defaults.ScaleDownUnneededTime, o.ScaleDownUnneededTime)
	du("ScaleDownUnreadyTime", opts.ScaleDownUnreadyTime, defaults.ScaleDownUnreadyTime, o.ScaleDownUnreadyTime)
	du("MaxNodeProvisionTime", opts.MaxNodeProvisionTime, defaults.MaxNodeProvisionTime, o.MaxNodeProvisionTime)
	bo("ZeroOrMaxNodeScaling", opts.ZeroOrMaxNodeScaling, defaults.ZeroOrMaxNodeScaling, o.ZeroOrMaxNodeScaling)
	bo("IgnoreDaemonSetsUtilization", opts.IgnoreDaemonSetsUtilization, defaults.IgnoreDaemonSetsUtilization, o.IgnoreDaemonSetsUtilization)
	if len(probs) > 0 {
		r.Fail(name+"[configured]", strings.Join(probs, "; "))
		return
	}
	r.Pass(name+"[configured]", fmt.Sprintf("%+v", *opts))
}

func mutationChecks(r *Runner, p string, b Backend, cp caapi.CloudProvider, exp *Expectations) {
	for _, eg := range b.Groups {
		gp := fmt.Sprintf("%s/%s/%s", p, b.Name, eg.label())
		g := findGroup(cp, eg.ID)
		if g == nil {
			continue
		}
		if eg.IncreaseBy > 0 {
			before, err := g.TargetSize()
			if err != nil {
				r.Fail(gp+"/IncreaseSize", "TargetSize: "+err.Error())
			} else if err := g.IncreaseSize(eg.IncreaseBy); err != nil {
				r.Fail(gp+"/IncreaseSize", err.Error())
			} else if after, err := g.TargetSize(); err != nil || after != before+eg.IncreaseBy {
				r.Fail(gp+"/IncreaseSize", fmt.Sprintf("target %d -> %d (err %v), want +%d", before, after, err, eg.IncreaseBy))
			} else {
				r.Pass(gp+"/IncreaseSize", fmt.Sprintf("%d -> %d", before, after))
			}
			// Beyond max must be refused and leave the target untouched.
			cur, _ := g.TargetSize()
			if err := g.IncreaseSize(eg.Max - cur + 1); err == nil {
				r.Fail(gp+"/IncreaseSize[beyond-max]", "accepted an increase beyond max")
			} else if after, _ := g.TargetSize(); after != cur {
				r.Fail(gp+"/IncreaseSize[beyond-max]", fmt.Sprintf("refused but target moved %d -> %d", cur, after))
			} else {
				r.Pass(gp+"/IncreaseSize[beyond-max]", "refused: "+firstLine(err.Error()))
			}
		}
		if eg.DecreaseBy > 0 {
			before, _ := g.TargetSize()
			if err := g.DecreaseTargetSize(-eg.DecreaseBy); err != nil {
				r.Fail(gp+"/DecreaseTargetSize", err.Error())
			} else if after, err := g.TargetSize(); err != nil || after != before-eg.DecreaseBy {
				r.Fail(gp+"/DecreaseTargetSize", fmt.Sprintf("target %d -> %d (err %v)", before, after, err))
			} else {
				r.Pass(gp+"/DecreaseTargetSize", fmt.Sprintf("%d -> %d", before, after))
			}
		}
		if eg.DeleteNode != nil {
			// A node that belongs to another group must be refused.
			if other := otherGroupNode(exp, eg.ID); other != nil {
				if err := g.DeleteNodes([]*apiv1.Node{node(other)}); err == nil {
					r.Fail(gp+"/DeleteNodes[other-group]", "accepted "+other.ProviderID)
				} else {
					r.Pass(gp+"/DeleteNodes[other-group]", "refused: "+firstLine(err.Error()))
				}
			}
			before, _ := g.TargetSize()
			if err := g.DeleteNodes([]*apiv1.Node{node(eg.DeleteNode)}); err != nil {
				r.Fail(gp+"/DeleteNodes", err.Error())
			} else if after, err := g.TargetSize(); err != nil || after != before-1 {
				r.Fail(gp+"/DeleteNodes", fmt.Sprintf("target %d -> %d (err %v), want -1", before, after, err))
			} else {
				r.Pass(gp+"/DeleteNodes", fmt.Sprintf("%s; target %d -> %d", eg.DeleteNode.ProviderID, before, after))
			}
		}
	}
}

// otherGroupNode returns a managed node of any group other than id (preferring another backend).
func otherGroupNode(exp *Expectations, id string) *NodeRef {
	var fallback *NodeRef
	for _, b := range exp.Backends {
		own := false
		for _, g := range b.Groups {
			if g.ID == id {
				own = true
			}
		}
		for i := range b.Groups {
			g := &b.Groups[i]
			if g.ID == id || g.ManagedNode == nil {
				continue
			}
			if !own {
				return g.ManagedNode
			}
			if fallback == nil {
				fallback = g.ManagedNode
			}
		}
	}
	return fallback
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:160]
	}
	return s
}
