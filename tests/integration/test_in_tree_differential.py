"""The CA's in-tree providers and our server, asked the same read calls about the same cloud, call by call.

The in-tree side is the upstream example server of CA 1.36.1 (its ``wrapper`` turns a CloudProvider into
the externalgrpc service) built with one in-tree provider: ``-tags scaleway`` or ``-tags bizflycloud``
(tests/bench/upstream/build.toml, compiled by ``make build``), configured as that provider is, by its
variables (``devstack.clouds``). Its Scaleway client is pointed at the simulator by ``SCW_API_URL``; its
Bizfly client logs in at the production host whatever it is told, which the interception proxy of the
migration scenario answers for the simulator (tests/support/https_intercept.py). Our side is our server
started by the harness in front of the same simulator. The simulator runs on a manual clock, so both
sides read one unchanging cloud.

Every read the CA makes is asked of both: Refresh, NodeGroups, NodeGroupTargetSize, NodeGroupNodes,
NodeGroupForNode (for every node the cloud lists, and for nodes of no group), NodeGroupTemplateNodeInfo
(decoded, field by field, and as the CA uses it after its own sanitizing), NodeGroupGetOptions,
GPULabel, GetAvailableGPUTypes and the pricing calls of the price expander. Where the answers differ,
the test states the difference exactly; each one is a row of docs/reference/in-tree-differences.md's "What behaves
differently, on purpose". Anything else that differs fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from google.protobuf import message as pb_message
from google.protobuf.timestamp_pb2 import Timestamp

from devstack.clouds import bizfly_cluster_uid, bizfly_in_tree_env, scaleway_in_tree_env
from devstack.harness import Stack, running_stack
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from protos import k8s_core_v1_pb2 as k8s
from providers.node_labels import GroupLabels, machine_names
from simulators.bizfly.state import PROVIDER_ID_PREFIX as BIZFLY_PROVIDER_ID_PREFIX
from tests.bench import golang
from tests.bench.servers import BenchedServer, start_upstream_example
from tests.support.gobuild import GoBuildError
from tests.support.https_intercept import BIZFLY_PRODUCTION_HOST, InterceptingProxy

Code = grpc.StatusCode
# The CA's instance error classes (both sides send its numbers).
OUT_OF_RESOURCES, OTHER_ERROR = 1, 99

# ------------------------------------------------------------------------------------------ Scaleway cloud
SCW_CLUSTER = "5cf2b1a0-0000-4000-8000-00000000d1ff"
GENERAL = "5cf2b1a0-0000-4000-8000-000000000001"  # DEV1-M, 3 ready nodes, labels
MIXED = "5cf2b1a0-0000-4000-8000-000000000002"  # PRO2-S, one node in each status Kapsule has, taints
BOOTING = "5cf2b1a0-0000-4000-8000-000000000003"  # two machines created without a providerID yet
BATCH = "5cf2b1a0-0000-4000-8000-000000000004"  # at zero: every form of the taints map
GPU = "5cf2b1a0-0000-4000-8000-000000000005"  # at zero: an L4 GPU pool
ARM = "5cf2b1a0-0000-4000-8000-000000000006"  # at zero: arm64
BARE = "5cf2b1a0-0000-4000-8000-000000000007"  # at zero: its owner's labels only, like every pool
OLD_GPU = "5cf2b1a0-0000-4000-8000-000000000008"  # at zero: a bare `gpu` count, no allocatable
NOTHING = "5cf2b1a0-0000-4000-8000-000000000009"  # at zero: neither capacity nor allocatable
FIXED = "5cf2b1a0-0000-4000-8000-00000000000a"  # autoscaling off: its node is in no node group
# Every status the simulator (and, as far as it is known, Kapsule) gives a node.
SCW_STATUSES = (
    "ready",
    "creating",
    "starting",
    "registering",
    "not_ready",
    "upgrading",
    "rebooting",
    "deleting",
    "deleted",
    "locked",
    "creation_error",
    "unknown",
)
QUOTA_MESSAGE = "quotas_exceeded: instances quota reached"
STARTUP_TAINT = "startup-taint.cluster-autoscaler.kubernetes.io/warming-up"
OLD_GPU_CAPACITY = {"cpu": 8, "memory": 16 * 2**30, "pods": 110, "gpu": 1}


def _scw_pool(pool_id: str, name: str, node_type: str, size: int, max_size: int, **extra: Any) -> dict[str, Any]:
    pool = {"id": pool_id, "name": name, "node_type": node_type, "size": size, "min_size": 0, "max_size": max_size}
    return {**pool, **extra}


SCALEWAY_SCENARIO = {
    "clusters": [
        {
            "id": SCW_CLUSTER,
            "name": "differential",
            "pools": [
                _scw_pool(GENERAL, "general", "DEV1-M", 3, 6, min_size=1, labels={"team": "web"}),
                _scw_pool(
                    MIXED,
                    "mixed",
                    "PRO2-S",
                    # Size as the pool counts it: every node but the deleting and deleted ones.
                    len(SCW_STATUSES) - 2,
                    20,
                    taints={"dedicated": "compute:NoSchedule"},
                    nodes=[
                        {"status": s, **({"error_message": QUOTA_MESSAGE} if s == "creation_error" else {})}
                        for s in SCW_STATUSES
                    ],
                ),
                _scw_pool(BOOTING, "booting", "DEV1-M", 2, 4, nodes=[{"status": "creating", "provider_id": ""}] * 2),
                _scw_pool(
                    BATCH,
                    "batch",
                    "POP2-4C-16G",
                    0,
                    5,
                    labels={"workload": "batch"},
                    taints={
                        "batch": "true:PreferNoSchedule",  # value:Effect
                        "evict": "NoExecute",  # Effect alone: empty value
                        "odd": "a:b:NoSchedule",  # three parts: the value is dropped
                        "bogus": "x:Sometimes",  # no such effect: skipped
                        # A taint the CA drops from templates (a startup taint, by its prefix).
                        STARTUP_TAINT: "true:NoSchedule",
                    },
                ),
                _scw_pool(GPU, "gpu", "L4-1-24G", 0, 2, taints={"nvidia.com/gpu": "true:NoSchedule"}),
                _scw_pool(ARM, "arm", "COPARM1-4C-16G", 0, 3),
                _scw_pool(BARE, "bare", "DEV1-L", 0, 3, labels={"team": "data"}),
                _scw_pool(OLD_GPU, "old-gpu", "GPU-3070-S", 0, 2, capacity=OLD_GPU_CAPACITY, allocatable={}),
                _scw_pool(NOTHING, "nothing", "DEV1-M", 0, 2, capacity={}, allocatable={}),
                _scw_pool(FIXED, "fixed", "GP1-XS", 1, 1, min_size=1, autoscaling=False),
            ],
        }
    ],
}
SCW_GROUPS = 9  # every pool but FIXED
SCW_EMPTY_GROUPS = (BATCH, GPU, ARM, BARE, OLD_GPU, NOTHING)
SCW_POOLS = {p["id"]: p for p in SCALEWAY_SCENARIO["clusters"][0]["pools"]}  # type: ignore[index]
# The GPU label ours gives a GPU pool without one: its node type in lower case, as the label reads it.
SCW_GPU_TYPES = {GPU: "l4-1-24g", OLD_GPU: "gpu-3070-s"}


def scw_added_labels(group_id: str) -> dict[str, str]:
    """The labels our template adds to the in-tree one, which is the pool's own ``labels`` only (and, as
    recorded, the API's pool labels are what the owner set): what every Kapsule node carries, the
    instance type spelled as the node's label is (``DEV1-M``; the API answers ``dev1_m``), and the GPU
    label on GPU pools (docs/reference/in-tree-differences.md, "What behaves differently on purpose")."""
    pool = SCW_POOLS[group_id]
    added = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "arm64" if pool["node_type"].startswith("COPARM1") else "amd64",
        "node.kubernetes.io/instance-type": pool["node_type"],  # the scenario's spelling is the commercial one
        "topology.kubernetes.io/region": "fr-par",
        "topology.kubernetes.io/zone": "fr-par-1",
        "k8s.scaleway.com/pool": group_id,
        "k8s.scaleway.com/pool-name": pool["name"],
    }
    if group_id in SCW_GPU_TYPES:
        added["k8s.scw.cloud/gpu"] = SCW_GPU_TYPES[group_id]
    return added


def _without_synthetic_ids(found: dict[str, Any]) -> dict[str, Any]:
    """Our instances keyed as the in-tree provider keys them: a machine without a providerID under ""."""
    return {("" if i.startswith("scaleway://kapsule-node/") else i): v for i, v in found.items()}


# ------------------------------------------------------------------------------------------ Bizfly cloud
BZ_GENERAL = "d1ff00000000000000000001"
BZ_MIXED = "d1ff00000000000000000002"
BZ_EMPTY = "d1ff00000000000000000003"
BZ_FIXED = "d1ff00000000000000000004"
# The in-tree provider's own words first, then what the real API (its Senlin node statuses) and a stopped
# VM show. "error" is a failed creation, "ERROR" a failed health check of a node that served (by their
# Senlin reasons): only the first is a failed scale-up (docs/reference/bizfly.md, "Status mapping").
BZ_STATUSES = (
    "running",
    "provisioning",
    "draining",
    "deleting",
    "error",
    "ACTIVE",
    "PROVISIONING",
    "SHUTOFF",
    "INIT",
    "CREATING",
    "WARNING",
    "RECOVERING",
    "ERROR",
)
BZ_REASONS = {
    "error": "Failed in creating server: Build of instance aborted.",
    "ERROR": "Check: Node is not ACTIVE.",
}


def bz_reason(status: str) -> str:
    return BZ_REASONS.get(status, f"node is {status}")


BIZFLY_SCENARIO = {
    "status_vocabulary": "upstream",
    "clusters": [
        {
            "name": "differential",
            "pools": [
                {
                    "id": BZ_GENERAL,
                    "name": "general",
                    "flavor": "nix.2c_4g",
                    "min_size": 1,
                    "max_size": 5,
                    "desired_size": 2,
                    "labels": {"team": "web"},
                },
                {
                    "id": BZ_MIXED,
                    "name": "mixed",
                    "flavor": "nix.4c_8g",
                    "min_size": 0,
                    "max_size": 12,
                    # Every node but the deleting one counts toward the size (so none is removed at start).
                    "desired_size": len(BZ_STATUSES) - 1,
                    "labels": {"workload": "compute"},
                    "taints": [{"key": "dedicated", "value": "compute", "effect": "NoSchedule"}],
                    "nodes": [{"status": s, "status_reason": bz_reason(s)} for s in BZ_STATUSES],
                },
                {
                    "id": BZ_EMPTY,
                    "name": "batch",
                    "flavor": "nix.8c_16g",
                    "min_size": 0,
                    "max_size": 3,
                    "desired_size": 0,
                    "labels": {"workload": "batch"},
                    "taints": [{"key": "batch", "value": "true", "effect": "PreferNoSchedule"}],
                },
                {
                    "id": BZ_FIXED,
                    "name": "system",
                    "flavor": "nix.2c_4g",
                    "min_size": 1,
                    "max_size": 1,
                    "desired_size": 1,
                    "enable_autoscaling": False,
                },
            ],
        }
    ],
}
BZ_GROUPS = 3


# ------------------------------------------------------------------------------------------ the two sides
@dataclass
class Sides:
    """Our server and the upstream example, in front of one simulator."""

    stack: Stack
    upstream: BenchedServer
    theirs: pb_grpc.CloudProviderStub

    @property
    def ours(self) -> pb_grpc.CloudProviderStub:
        return self.stack.stub

    def both(self, method: str, request: pb_message.Message) -> tuple[Any, Any]:
        """The same call to both: (ours, theirs), each the answer or the status code of the error."""
        return ask(self.ours, method, request), ask(self.theirs, method, request)


def ask(stub: pb_grpc.CloudProviderStub, method: str, request: pb_message.Message) -> Any:
    try:
        return getattr(stub, method)(request, timeout=10)
    except grpc.RpcError as err:
        return err.code()


def _upstream_binary(cloud_provider: str) -> Path:
    try:
        return golang.upstream_example(cloud_provider)
    except GoBuildError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="module")
def scaleway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sides]:
    binary = _upstream_binary("scaleway")
    workdir = tmp_path_factory.mktemp("differential-scaleway")
    with running_stack(workdir, scaleway=SCALEWAY_SCENARIO) as stack:
        assert stack.scaleway is not None
        env = scaleway_in_tree_env(stack.scaleway)
        upstream = start_upstream_example(binary, "scaleway", env, workdir, expected_groups=SCW_GROUPS)
        try:
            with grpc.insecure_channel(upstream.address) as channel:
                yield Sides(stack, upstream, pb_grpc.CloudProviderStub(channel))
        finally:
            upstream.stop()


@pytest.fixture(scope="module")
def bizfly(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sides, InterceptingProxy]]:
    binary = _upstream_binary("bizflycloud")
    workdir = tmp_path_factory.mktemp("differential-bizfly")
    with running_stack(workdir, bizfly=BIZFLY_SCENARIO) as stack:
        assert stack.bizfly is not None
        simulator = urlsplit(stack.bizfly.url)
        assert simulator.hostname is not None and simulator.port is not None
        proxy = InterceptingProxy({BIZFLY_PRODUCTION_HOST: (simulator.hostname, simulator.port)}, workdir).start()
        try:
            env = {**bizfly_in_tree_env(stack.bizfly), **proxy.env()}
            upstream = start_upstream_example(
                binary, "bizflycloud", env, workdir, expected_groups=BZ_GROUPS, name="upstream-bizflycloud"
            )
            try:
                with grpc.insecure_channel(upstream.address) as channel:
                    yield Sides(stack, upstream, pb_grpc.CloudProviderStub(channel)), proxy
            finally:
                upstream.stop()
        finally:
            proxy.stop()


# ------------------------------------------------------------------------------------------ reading answers
def groups(answer: pb.NodeGroupsResponse) -> dict[str, tuple[int, int]]:
    """id -> (min, max); the debug strings are free text and differ by design."""
    return {g.id: (g.minSize, g.maxSize) for g in answer.nodeGroups}


def instances(answer: pb.NodeGroupNodesResponse) -> dict[str, tuple[int, tuple[str, str, int]]]:
    """id -> (state, (error code, message, class)); the order is not part of the contract (the in-tree
    Scaleway provider lists a Go map)."""
    return {
        i.id: (
            i.status.instanceState,
            (i.status.errorInfo.errorCode, i.status.errorInfo.errorMessage, i.status.errorInfo.instanceErrorClass),
        )
        for i in answer.instances
    }


def grpc_node(ref: Mapping[str, Any]) -> pb.ExternalGrpcNode:
    """A Kubernetes node as the CA sends it (name, providerID, labels)."""
    return pb.ExternalGrpcNode(providerID=ref["provider_id"], name=ref["name"], labels=dict(ref["labels"]))


def node_group_of(answer: Any) -> Any:
    """NodeGroupForNode's group as (id, min, max); an empty id means "no group"."""
    if isinstance(answer, Code):
        return answer
    return (answer.nodeGroup.id, answer.nodeGroup.minSize, answer.nodeGroup.maxSize)


def template(answer: Any) -> k8s.Node | Code:
    """The Node the CA 1.36.1 decodes (it reads ``nodeBytes``), or the error code."""
    if isinstance(answer, Code):
        return answer
    assert answer.nodeBytes, "an OK answer without nodeBytes gives the CA 1.36.1 a nil template"
    return k8s.Node.FromString(answer.nodeBytes)


_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?")
_SUFFIX = {
    None: Fraction(1),
    **{s: Fraction(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Fraction(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12))},
    **{"P": Fraction(10) ** 15, "E": Fraction(10) ** 18},
}


def quantity(text: str) -> Fraction:
    """A Kubernetes quantity's exact value: the two sides may spell one value two ways ("16G", "16000000000")."""
    match = _QUANTITY.fullmatch(text)
    assert match is not None, f"{text!r} is not a Kubernetes quantity"
    number, exponent, suffix = match.groups()
    value = Fraction(number) * _SUFFIX[suffix]
    return value * Fraction(10) ** int(exponent) if exponent else value


def resources(values: Mapping[str, k8s.Quantity]) -> dict[str, Fraction]:
    return {name: quantity(q.string) for name, q in values.items()}


def raw(node: k8s.Node) -> dict[str, Any]:
    """The fields of a template node that mean something, in comparable form."""
    return {
        "name": node.metadata.name,
        "labels": dict(node.metadata.labels),
        "taints": sorted((t.key, t.value, t.effect) for t in node.spec.taints),
        "unschedulable": node.spec.unschedulable,
        "capacity": resources(node.status.capacity),
        "allocatable": resources(node.status.allocatable),
        "conditions": {c.type: c.status for c in node.status.conditions},
        "phase": node.status.phase,
        "os_arch": (node.status.nodeInfo.operatingSystem, node.status.nodeInfo.architecture),
    }


# What the CA 1.36.1 does to a template before its scale-up simulation uses it, with its default flags
# (read from its simulator/node_info_utils.go, utils/taints, utils/labels and utils/gpu): the node gets
# a fresh name, "template-node-for-<group>-<random>", and the hostname label follows it; a label marks
# it as a template; each stable topology/instance-type label is copied to its deprecated beta name; the
# taints the CA itself sets, the ones that mirror node conditions, and startup/status taints (by their
# key prefixes) are dropped. Its GPU handling looks for the provider's GPU label, or a non-zero
# allocatable of a vendor GPU resource, and counts that resource's allocatable.
TEMPLATE_NODE_LABEL = "cluster-autoscaler.kubernetes.io/template-node"
BETA_LABELS = (
    ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"),
    ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region"),
    ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"),
)
CA_DROPPED_TAINTS = frozenset(
    {
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/pid-pressure",
        "node.cloudprovider.kubernetes.io/uninitialized",
        "node.cloudprovider.kubernetes.io/shutdown",
        "cloud.google.com/impending-node-termination",
        "NodeWithImpairedVolumes",
    }
)
CA_DROPPED_TAINT_PREFIXES = (
    "ignore-taint.cluster-autoscaler.kubernetes.io/",
    "startup-taint.cluster-autoscaler.kubernetes.io/",
    "status-taint.cluster-autoscaler.kubernetes.io/",
)
GPU_RESOURCES = ("nvidia.com/gpu", "habana.ai/gaudi", "gpu.intel.com/xe", "amd.com/gpu", "microsoft.com/directx")


def _dropped_by_the_ca(taint_key: str) -> bool:
    return taint_key in CA_DROPPED_TAINTS or taint_key.startswith(CA_DROPPED_TAINT_PREFIXES)


def as_the_ca_sees_it(node: k8s.Node, group_id: str, gpu_label: str) -> dict[str, Any]:
    """The template after the CA's sanitizing, and the GPU it finds on it (type, resource, count)."""
    view = raw(node)
    name = f"template-node-for-{group_id}"  # the CA appends a random number, the same rule for both sides
    labels = {**view["labels"], "kubernetes.io/hostname": name, TEMPLATE_NODE_LABEL: "true"}
    for stable, beta in BETA_LABELS:
        if stable in labels:
            labels[beta] = labels[stable]
    allocatable = view["allocatable"]
    gpu = None
    with_allocatable = [r for r in GPU_RESOURCES if allocatable.get(r, 0) != 0]
    if gpu_label in labels or with_allocatable:
        resource = with_allocatable[0] if with_allocatable else GPU_RESOURCES[0]
        gpu = (labels.get(gpu_label, ""), resource, allocatable.get(resource, Fraction(0)))
    return {
        "name": name,
        "labels": labels,
        "taints": [t for t in view["taints"] if not _dropped_by_the_ca(t[0])],
        "unschedulable": view["unschedulable"],
        "capacity": view["capacity"],
        "allocatable": allocatable,
        "ready": view["conditions"].get("Ready") == "True",
        "gpu": gpu,
    }


def price_request(node: pb.ExternalGrpcNode) -> pb.PricingNodePriceRequest:
    start = Timestamp(seconds=1_700_000_000)
    end = Timestamp(seconds=1_700_000_000 + 90 * 60)  # 1.5 h: both round up to 2 hours
    return pb.PricingNodePriceRequest(node=node, startTimestamp=start, endTimestamp=end)


def _template_node(node: k8s.Node, group_id: str) -> pb.ExternalGrpcNode:
    """The sanitized template node the CA's price expander prices for a scale-up of ``group_id``."""
    name = f"template-node-for-{group_id}-1"
    return pb.ExternalGrpcNode(name=name, labels={**node.metadata.labels, "kubernetes.io/hostname": name})


# ========================================================================================== Scaleway
def test_scaleway_refresh_and_node_groups_are_the_same(scaleway: Sides) -> None:
    ours, theirs = scaleway.both("Refresh", pb.RefreshRequest())
    assert isinstance(ours, pb.RefreshResponse) and isinstance(theirs, pb.RefreshResponse)
    ours, theirs = scaleway.both("NodeGroups", pb.NodeGroupsRequest())
    assert groups(ours) == groups(theirs)
    assert len(groups(ours)) == SCW_GROUPS and FIXED not in groups(ours)


def test_scaleway_target_sizes_are_the_same(scaleway: Sides) -> None:
    for group_id in groups(scaleway.ours.NodeGroups(pb.NodeGroupsRequest(), timeout=10)):
        ours, theirs = scaleway.both("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id))
        assert ours.targetSize == theirs.targetSize, group_id
    assert scaleway.ours.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=MIXED)).targetSize == 10


def test_scaleway_instances_have_the_same_ids_and_states(scaleway: Sides) -> None:
    """Same ids, same states for every status; the error details differ as docs/reference/in-tree-differences.md
    says."""
    assert scaleway.stack.scaleway is not None
    status_of = {n["provider_id"]: n["status"] for n in scaleway.stack.scaleway.state.snapshot()["nodes"]}
    compared = set()
    for group_id in groups(scaleway.ours.NodeGroups(pb.NodeGroupsRequest(), timeout=10)):
        if group_id == BOOTING:
            continue  # below
        ours, theirs = (instances(a) for a in scaleway.both("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group_id)))
        # MIXED's creating machine has no providerID yet (as recorded): ours lists it by its Kapsule node id.
        ours = _without_synthetic_ids(ours)
        assert {i: s for i, (s, _) in ours.items()} == {i: s for i, (s, _) in theirs.items()}, group_id
        for instance_id, (_, (code, message, error_class)) in theirs.items():
            status = status_of[instance_id]
            compared.add(status)
            if not code:
                assert ours[instance_id][1] == ("", "", 0), status
            elif status == "creation_error":
                # The node's own error message, and the class that makes the CA back off a quota failure.
                assert (code, message, error_class) == ("creation_error", "scaleway node could not be created", 0)
                assert ours[instance_id][1] == ("creation_error", QUOTA_MESSAGE, OUT_OF_RESOURCES)
            elif status == "unknown":
                assert (message, error_class) == ("", 0)
                explained = "scaleway node status 'unknown' is not one this server knows"
                assert ours[instance_id][1] == (code, explained, OTHER_ERROR)
            else:  # deleted, locked: the same words; every error of ours has a class
                assert error_class == 0
                assert ours[instance_id][1] == (code, message, OTHER_ERROR), status
    assert compared == set(SCW_STATUSES)


def test_scaleway_machines_without_a_provider_id_are_counted_one_by_one(scaleway: Sides) -> None:
    """Two machines Kapsule has not given a providerID yet: the in-tree provider keys nodes by providerID
    and lists one instance; ours lists both, so the CA counts both as coming."""
    ours, theirs = (instances(a) for a in scaleway.both("NodeGroupNodes", pb.NodeGroupNodesRequest(id=BOOTING)))
    assert list(theirs) == [""] and theirs[""][0] == pb.InstanceStatus.instanceCreating
    assert len(ours) == 2 and all(i.startswith("scaleway://kapsule-node/") for i in ours)
    assert {s for s, _ in ours.values()} == {pb.InstanceStatus.instanceCreating}


def test_scaleway_every_node_maps_to_the_same_group(scaleway: Sides) -> None:
    assert scaleway.stack.scaleway is not None
    refs = scaleway.stack.scaleway.node_refs(registered_only=False)
    foreign = [
        {
            "provider_id": f"scaleway://instance/fr-par-1/{'0' * 8}-0000-4000-8000-{'0' * 12}",
            "name": "gone",
            "labels": {},
        },
        {"provider_id": "", "name": "no-provider-id", "labels": {}},
        {"provider_id": "aws:///eu-west-1a/i-0123456789abcdef0", "name": "elsewhere", "labels": {}},
    ]
    mapped: dict[str, Any] = {}
    for ref in [*refs, *foreign]:
        ours, theirs = scaleway.both("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=grpc_node(ref)))
        if not ref["provider_id"]:
            # A node without a providerID: the in-tree provider finds it among the machines of a pool that
            # have none yet (BOOTING's, or MIXED's creating one), which says nothing about the node; ours maps
            # it to no group.
            assert node_group_of(theirs)[0] in (BOOTING, MIXED) and node_group_of(ours) == ("", 0, 0), ref
        else:
            assert node_group_of(ours) == node_group_of(theirs), ref
        mapped[ref["name"]] = node_group_of(ours)[0]
    expected = {r["name"]: ("" if r["pool_id"] == FIXED or not r["provider_id"] else r["pool_id"]) for r in refs}
    assert {name: mapped[name] for name in expected} == expected
    assert [mapped[f["name"]] for f in foreign] == ["", "", ""]
    assert sum(1 for r in refs if not r["provider_id"]) == 3  # BOOTING's two machines, MIXED's creating one


def _templates(sides: Sides, group_id: str) -> tuple[k8s.Node | Code, k8s.Node | Code]:
    ours, theirs = sides.both("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id=group_id))
    return template(ours), template(theirs)


# The readiness conditions the in-tree template has; ours adds PIDPressure, as a real kubelet reports it.
IN_TREE_CONDITIONS = {
    "Ready": "True",
    "NetworkUnavailable": "False",
    "DiskPressure": "False",
    "MemoryPressure": "False",
}


def test_scaleway_templates_of_empty_groups_are_the_same_but_for_the_known_differences(scaleway: Sides) -> None:
    """Field by field, as the two servers send them."""
    for group_id in SCW_EMPTY_GROUPS:
        ours_node, theirs_node = _templates(scaleway, group_id)
        if group_id == NOTHING:
            # No resources in the pool record: the in-tree template has none either (nothing fits it, so the
            # CA never picks the group); ours has no template (the CA skips the group, and says why).
            assert ours_node == Code.UNIMPLEMENTED
            assert isinstance(theirs_node, k8s.Node)
            assert raw(theirs_node)["capacity"] == raw(theirs_node)["allocatable"] == {}
            continue
        assert isinstance(ours_node, k8s.Node) and isinstance(theirs_node, k8s.Node), group_id
        ours, theirs = raw(ours_node), raw(theirs_node)
        # Naming: the in-tree node has no name and no hostname label; ours names it (the CA renames both).
        assert theirs["name"] == "" and "kubernetes.io/hostname" not in theirs["labels"]
        assert ours["name"] == ours["labels"].pop("kubernetes.io/hostname") == f"template-node-for-{group_id}"
        # Readiness and the fields a real node has.
        assert theirs["conditions"] == IN_TREE_CONDITIONS
        assert ours["conditions"] == {**IN_TREE_CONDITIONS, "PIDPressure": "False"}
        assert (theirs["phase"], theirs["os_arch"]) == ("", ("", ""))
        assert (ours["phase"], ours["os_arch"]) == ("Running", ("linux", ours["labels"]["kubernetes.io/arch"]))
        for key in ("name", "conditions", "phase", "os_arch"):
            del ours[key], theirs[key]
        assert theirs["labels"] == SCW_POOLS[group_id].get("labels", {}), group_id
        assert ours["labels"] == {**theirs["labels"], **scw_added_labels(group_id)}, group_id
        ours["labels"] = theirs["labels"]
        if group_id == OLD_GPU:
            # A bare `gpu` count is the GPU resource the CA looks for; no allocatable means the capacity.
            assert theirs["capacity"] == {k: Fraction(v) for k, v in OLD_GPU_CAPACITY.items()}
            assert theirs["allocatable"] == {}
            renamed = {("nvidia.com/gpu" if k == "gpu" else k): v for k, v in theirs["capacity"].items()}
            assert ours["capacity"] == ours["allocatable"] == renamed
            ours["capacity"] = ours["allocatable"] = None
            theirs["capacity"] = theirs["allocatable"] = None
        assert ours == theirs, group_id
    # The taints map in every form: both parse it the same way.
    ours_batch, _ = _templates(scaleway, BATCH)
    assert isinstance(ours_batch, k8s.Node)
    assert raw(ours_batch)["taints"] == [
        ("batch", "true", "PreferNoSchedule"),
        ("evict", "", "NoExecute"),
        ("odd", "", "NoSchedule"),
        (STARTUP_TAINT, "true", "NoSchedule"),
    ]


def test_scaleway_templates_give_the_ca_the_same_node_but_for_the_known_differences(scaleway: Sides) -> None:
    """What the CA derives from each template: its sanitized labels and taints, resources, readiness, GPU."""
    gpu_label = scaleway.ours.GPULabel(pb.GPULabelRequest(), timeout=10).label
    assert gpu_label == scaleway.theirs.GPULabel(pb.GPULabelRequest(), timeout=10).label == "k8s.scw.cloud/gpu"
    seen = {}
    arch = {}
    for group_id in SCW_EMPTY_GROUPS:
        ours_node, theirs_node = _templates(scaleway, group_id)
        if not isinstance(ours_node, k8s.Node) or not isinstance(theirs_node, k8s.Node):
            continue  # NOTHING, above
        ours = as_the_ca_sees_it(ours_node, group_id, gpu_label)
        theirs = as_the_ca_sees_it(theirs_node, group_id, gpu_label)
        assert ours["ready"] and theirs["ready"]
        added = scw_added_labels(group_id)
        added |= {beta: added[stable] for stable, beta in BETA_LABELS}
        assert ours["labels"] == {**theirs["labels"], **added}, group_id
        arch[group_id] = ours["labels"]["kubernetes.io/arch"]
        ours["labels"] = theirs["labels"]
        if group_id == GPU:
            # The in-tree template has no GPU label (the pool has none): the CA finds the GPU by its resource.
            assert theirs["gpu"] == ("", "nvidia.com/gpu", 1)
            assert ours["gpu"] == ("l4-1-24g", "nvidia.com/gpu", 1)
            theirs["gpu"] = ours["gpu"]
        if group_id == OLD_GPU:
            # The in-tree template: no GPU label and nothing allocatable, so the CA sees no GPU and no pod fits
            # (no allocatable at all). Ours: one GPU, the machine's resources.
            assert theirs["gpu"] is None and theirs["allocatable"] == {}
            assert ours["gpu"] == ("gpu-3070-s", "nvidia.com/gpu", 1) and ours["allocatable"]["cpu"] == 8
            for side in (ours, theirs):
                side["gpu"] = side["capacity"] = side["allocatable"] = None
        assert ours == theirs, group_id
        seen[group_id] = ours
    assert seen[GPU]["gpu"] == ("l4-1-24g", "nvidia.com/gpu", 1)
    assert seen[GPU]["taints"] == [("nvidia.com/gpu", "true", "NoSchedule")]
    assert arch[ARM] == "arm64" and arch[BATCH] == "amd64"
    assert seen[BATCH]["allocatable"]["memory"] < seen[BATCH]["capacity"]["memory"] == 16 * 2**30
    assert [t[0] for t in seen[BATCH]["taints"]] == ["batch", "evict", "odd"]  # the startup taint dropped


def test_scaleway_templates_of_groups_with_nodes_are_the_same_too(scaleway: Sides) -> None:
    """The CA falls back to a template when a group has no ready node; same answers there, but for labels."""
    assert scaleway.stack.scaleway is not None
    gpu_label = "k8s.scw.cloud/gpu"
    for group_id in (GENERAL, MIXED, BOOTING):
        ours_node, theirs_node = _templates(scaleway, group_id)
        assert isinstance(ours_node, k8s.Node) and isinstance(theirs_node, k8s.Node)
        ours = as_the_ca_sees_it(ours_node, group_id, gpu_label)
        theirs = as_the_ca_sees_it(theirs_node, group_id, gpu_label)
        added = scw_added_labels(group_id)
        # With nodes, ours also fills in the labels the CA showed of them (NodeGroupForNode, above) that
        # describe the group: those every node of the pool carries (providers/node_labels.py).
        refs = scaleway.stack.scaleway.node_refs(registered_only=False)
        for shown in [r for r in refs if r["pool_id"] == group_id and r["provider_id"]][:1]:
            added |= GroupLabels().keep(shown["labels"], machine_names(shown["name"], shown["provider_id"]))
        added |= {beta: added[stable] for stable, beta in BETA_LABELS}
        assert ours["labels"] == {**theirs["labels"], **added}, group_id
        ours["labels"] = theirs["labels"]
        assert ours == theirs, group_id


def test_scaleway_options_gpu_types_and_prices(scaleway: Sides) -> None:
    """The other reads: options and GPU types differ on purpose; prices of nodes agree (to the in-tree
    provider's 32-bit float), and only ours prices a template node (the pool's labels lack the pool label)."""
    ours, theirs = scaleway.both(
        "NodeGroupGetOptions",
        pb.NodeGroupAutoscalingOptionsRequest(id=GENERAL, defaults=pb.NodeGroupAutoscalingOptions()),
    )
    assert theirs == Code.UNIMPLEMENTED
    assert ours == pb.NodeGroupAutoscalingOptionsResponse()  # empty: the CA's defaults
    ours, theirs = scaleway.both("GetAvailableGPUTypes", pb.GetAvailableGPUTypesRequest())
    assert set(theirs.gpuTypes) == set()
    assert set(ours.gpuTypes) == set(SCW_GPU_TYPES.values())
    # A pod's price: Kapsule bills nodes; both say 0.
    pod = pb.PricingPodPriceRequest(startTimestamp=Timestamp(seconds=0), endTimestamp=Timestamp(seconds=3600))
    pod.pod_bytes = k8s.Pod(metadata=k8s.ObjectMeta(name="web-0", namespace="default")).SerializeToString()
    ours, theirs = scaleway.both("PricingPodPrice", pod)
    assert ours.price == theirs.price == 0

    assert scaleway.stack.scaleway is not None
    hourly = {p["id"]: p["node_price_per_hour"] for p in scaleway.stack.scaleway.state.snapshot()["pools"]}
    for ref in scaleway.stack.scaleway.node_refs():
        ours, theirs = scaleway.both("PricingNodePrice", price_request(grpc_node(ref)))
        if ref["pool_id"] == FIXED:
            assert theirs == Code.UNKNOWN and ours == Code.NOT_FOUND  # no group, no price, on both
            continue
        assert ours.price == pytest.approx(theirs.price, rel=1e-6)
        assert ours.price == pytest.approx(2 * hourly[ref["pool_id"]], rel=1e-12)
    for group_id in SCW_EMPTY_GROUPS:
        ours_node, theirs_node = _templates(scaleway, group_id)
        if not isinstance(theirs_node, k8s.Node) or not isinstance(ours_node, k8s.Node):
            continue
        ours = ask(scaleway.ours, "PricingNodePrice", price_request(_template_node(ours_node, group_id)))
        theirs = ask(scaleway.theirs, "PricingNodePrice", price_request(_template_node(theirs_node, group_id)))
        # The in-tree template carries the pool's labels only: no k8s.scaleway.com/pool label to find it by.
        assert theirs == Code.UNKNOWN, group_id
        assert ours.price == pytest.approx(2 * hourly[group_id], rel=1e-12), group_id


def test_scaleway_price_of_a_node_of_no_group_names_the_node(scaleway: Sides) -> None:
    """The in-tree answer is a bare error; ours names the node and why it has no price."""
    assert scaleway.stack.scaleway is not None
    [fixed] = [r for r in scaleway.stack.scaleway.node_refs() if r["pool_id"] == FIXED]
    for ref in (fixed, {"provider_id": "", "name": "no-provider-id", "labels": {}}):
        with pytest.raises(grpc.RpcError) as raised:
            scaleway.ours.PricingNodePrice(price_request(grpc_node(ref)), timeout=10)
        assert raised.value.code() == Code.NOT_FOUND
        assert ref["name"] in raised.value.details() and "no node group" in raised.value.details()


# ========================================================================================== Bizfly
def test_bizfly_the_in_tree_client_reached_the_simulator_through_the_proxy(
    bizfly: tuple[Sides, InterceptingProxy],
) -> None:
    _, proxy = bizfly
    assert proxy.refused == []
    assert {(r.host, r.method, r.path.split("?")[0]) for r in proxy.relayed} >= {
        (BIZFLY_PRODUCTION_HOST, "POST", "/api/token")
    }


def test_bizfly_refresh_node_groups_and_targets_are_the_same(bizfly: tuple[Sides, InterceptingProxy]) -> None:
    sides, _ = bizfly
    ours, theirs = sides.both("Refresh", pb.RefreshRequest())
    assert isinstance(ours, pb.RefreshResponse) and isinstance(theirs, pb.RefreshResponse)
    ours, theirs = sides.both("NodeGroups", pb.NodeGroupsRequest())
    assert groups(ours) == groups(theirs) == {BZ_GENERAL: (1, 5), BZ_MIXED: (0, 12), BZ_EMPTY: (0, 3)}
    for group_id in groups(ours):
        ours_size, theirs_size = sides.both("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id))
        assert ours_size.targetSize == theirs_size.targetSize, group_id


# Bizfly statuses the in-tree provider does not know (it reports no state, with an error the CA ignores
# for a machine without a state), and what ours reports (docs/reference/bizfly.md, "Status mapping").
BZ_KNOWN_STATE_DIFFERENCES = {
    "error": pb.InstanceStatus.instanceCreating,  # with an error: a failed scale-up, backed off and cleaned up
    "ACTIVE": pb.InstanceStatus.instanceRunning,
    "PROVISIONING": pb.InstanceStatus.instanceCreating,
    "SHUTOFF": pb.InstanceStatus.instanceRunning,  # a stopped VM is a machine that exists
    "INIT": pb.InstanceStatus.instanceCreating,
    "CREATING": pb.InstanceStatus.instanceCreating,
    "WARNING": pb.InstanceStatus.instanceRunning,  # serving; a step around it (a load balancer) failed
    "RECOVERING": pb.InstanceStatus.instanceRunning,  # an existing server being recovered
    "ERROR": pb.InstanceStatus.instanceRunning,  # failed its health check: exists, no failed scale-up
}


def test_bizfly_instances_have_the_same_ids_and_states_for_the_words_the_in_tree_provider_knows(
    bizfly: tuple[Sides, InterceptingProxy],
) -> None:
    sides, _ = bizfly
    assert sides.stack.bizfly is not None
    pools = sides.stack.bizfly.snapshot()["clusters"][0]["worker_pools"]
    status_of = {BIZFLY_PROVIDER_ID_PREFIX + n["physical_id"]: n["status"] for p in pools for n in p.get("nodes") or []}
    compared = set()
    for group_id in (BZ_GENERAL, BZ_MIXED, BZ_EMPTY):
        ours, theirs = (instances(a) for a in sides.both("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group_id)))
        assert set(ours) == set(theirs), group_id
        for instance_id, (state, (code, message, error_class)) in theirs.items():
            status = status_of[instance_id]
            compared.add(status)
            if status not in BZ_KNOWN_STATE_DIFFERENCES:
                assert ours[instance_id] == (state, ("", "", 0)), status
                continue
            assert state == pb.InstanceStatus.unspecified
            assert (code, message, error_class) == ("no-code-bizflycloud", bz_reason(status), OTHER_ERROR)
            assert ours[instance_id][0] == BZ_KNOWN_STATE_DIFFERENCES[status], status
            expected_error = (
                "bizfly-node-failed",
                f"Bizfly reports the node as error: {BZ_REASONS['error']}",
                OTHER_ERROR,
            )
            assert ours[instance_id][1] == (expected_error if status == "error" else ("", "", 0)), status
    assert compared == set(BZ_STATUSES)


def test_bizfly_every_node_maps_to_the_same_group(bizfly: tuple[Sides, InterceptingProxy]) -> None:
    sides, _ = bizfly
    assert sides.stack.bizfly is not None
    refs = sides.stack.bizfly.node_refs(bizfly_cluster_uid(sides.stack.bizfly))
    foreign = [
        {
            "provider_id": f"{BIZFLY_PROVIDER_ID_PREFIX}{'0' * 8}-0000-4000-8000-{'0' * 12}",
            "name": "gone",
            "labels": {},
        },
        {"provider_id": "", "name": "no-provider-id", "labels": {}},
    ]
    for ref in [*refs, *foreign]:
        ours, theirs = sides.both("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=grpc_node(ref)))
        assert node_group_of(ours) == node_group_of(theirs), ref
        expected = ref.get("pool_id", "") if ref.get("pool_id") != BZ_FIXED else ""
        assert node_group_of(ours)[0] == expected, ref


def test_bizfly_templates_only_ours_has_them(bizfly: tuple[Sides, InterceptingProxy]) -> None:
    """The in-tree Bizfly provider has no templates, so a pool at zero never scales up with it; ours
    describes a new node of the pool from its flavor, labels and taints."""
    sides, _ = bizfly
    gpu_label = sides.ours.GPULabel(pb.GPULabelRequest(), timeout=10).label
    assert gpu_label == sides.theirs.GPULabel(pb.GPULabelRequest(), timeout=10).label == "bke.bizflycloud.vn/gpu-node"
    for group_id, cpu, memory in ((BZ_EMPTY, 8, 16 * 2**30), (BZ_MIXED, 4, 8 * 2**30), (BZ_GENERAL, 2, 4 * 2**30)):
        ours, theirs = _templates(sides, group_id)
        assert theirs == Code.UNIMPLEMENTED
        assert isinstance(ours, k8s.Node)
        seen = as_the_ca_sees_it(ours, group_id, gpu_label)
        assert seen["ready"] and seen["gpu"] is None
        assert seen["capacity"]["cpu"] == cpu and seen["capacity"]["memory"] == memory
        assert seen["allocatable"]["pods"] > 0
    batch = as_the_ca_sees_it(_templates(sides, BZ_EMPTY)[0], BZ_EMPTY, gpu_label)  # type: ignore[arg-type]
    assert batch["labels"]["workload"] == "batch"
    assert batch["taints"] == [("batch", "true", "PreferNoSchedule")]


def test_bizfly_options_gpu_types_and_prices(bizfly: tuple[Sides, InterceptingProxy]) -> None:
    sides, _ = bizfly
    ours, theirs = sides.both(
        "NodeGroupGetOptions",
        pb.NodeGroupAutoscalingOptionsRequest(id=BZ_GENERAL, defaults=pb.NodeGroupAutoscalingOptions()),
    )
    assert theirs == Code.UNIMPLEMENTED and ours == pb.NodeGroupAutoscalingOptionsResponse()
    ours, theirs = sides.both("GetAvailableGPUTypes", pb.GetAvailableGPUTypesRequest())
    assert set(ours.gpuTypes) == set(theirs.gpuTypes) == set()
    assert sides.stack.bizfly is not None
    [ref, *_] = sides.stack.bizfly.node_refs(bizfly_cluster_uid(sides.stack.bizfly))
    assert sides.both("PricingNodePrice", price_request(grpc_node(ref))) == (Code.UNIMPLEMENTED, Code.UNIMPLEMENTED)
    pod = pb.PricingPodPriceRequest(startTimestamp=Timestamp(seconds=0), endTimestamp=Timestamp(seconds=3600))
    assert sides.both("PricingPodPrice", pod) == (Code.UNIMPLEMENTED, Code.UNIMPLEMENTED)
