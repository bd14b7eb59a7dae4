"""Learned templates against the real API server: our server (a child process) runs as a user bound to
exactly the RBAC the Helm values ship (the chart's roles with the features file), watches Nodes of Bizfly
simulator machines, records each group's template in its ConfigMap, and serves it for scale-from-zero after a
restart."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devstack.clouds import bizfly_backend, bizfly_cluster_uid
from devstack.harness import ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from providers.bizfly.templates import build_template
from providers.model import LearnedTemplate, NodeTemplate
from server.kube.templates import encode_learned
from simulators.bizfly import BizflySimulator, demo_scenario
from simulators.common import ManualClock
from tests.deploy.chart import CA_1_36_1, sidecar_roles
from tests.e2e.control_plane import ControlPlane
from tests.kube.polling import wait_for
from tests.kube.rbac import bind_user
from tests.support.gfd import A100_NODE, PER_MACHINE_OR_MOMENT, relabelled

CONFIGMAP = "ca-externalgrpc-templates-bizfly"  # <configmap_prefix>-<backend name>
COMPUTE = "5f959e0ac0b18944d0a4f13b"  # demo pool "compute": nix.4c_8g, one running machine
GENERAL = "5f959e0ac0b18944d0a4f13a"  # demo pool "general": nix.2c_4g, two running machines
# What a kubelet on the 4-core 8 GiB machine reports: its own reservations, not the flavor's estimate.
NODE_CAPACITY = {"cpu": "4", "memory": "8152100Ki", "pods": "110", "ephemeral-storage": "41152812Ki"}
NODE_ALLOCATABLE = {"cpu": "3800m", "memory": "7417380Ki", "pods": "110", "ephemeral-storage": "37926431477"}
DAEMONSET_LABEL = ("feature.node.kubernetes.io/cpu-model.vendor_id", "Intel")  # added after join by a DaemonSet
JOIN_TAINT = {"key": "storage.example.com/local-ssd", "value": "pending", "effect": "PreferNoSchedule"}
# What an operator puts on one node for a while: never a property of its group.
BY_HAND_LABEL = ("maintenance", "disk-replacement-2026-12")
BY_HAND_TAINT = {"key": "maintenance.example.com/drain", "value": "true", "effect": "NoSchedule"}
GONE = "5f959e0ac0b18944d0a4ffff"  # a pool the cloud no longer has
TRANSIENT = [
    {"key": "DeletionCandidateOfClusterAutoscaler", "value": "1764780000", "effect": "PreferNoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
]


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def bizfly() -> Iterator[BizflySimulator]:
    sim = BizflySimulator(scenario=demo_scenario(), clock=ManualClock()).start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def server_user(control_plane: ControlPlane, admin: client.ApiClient, namespace: str) -> Path:
    """A kubeconfig of a user bound to the CA's Role and ClusterRole as the chart renders them with the
    sidecar values and the features file (the sidecar runs as the CA's service account)."""
    user = f"learner-{uuid.uuid4().hex[:8]}"
    bind_user(admin, namespace, user, *sidecar_roles(CA_1_36_1, with_features=True))
    return control_plane.user_kubeconfig(user)


def start_server(
    sim: BizflySimulator,
    kubeconfig: Path,
    namespace: str,
    tmp: Path,
    learning: dict[str, Any] | None = None,
    **backend_extra: Any,
) -> ServerProcess:
    """Our server learning templates; ``learning`` adds keys to ``kubernetes.learned_templates``. By default
    it also learns the taint a DaemonSet adds at join (JOIN_TAINT), as an operator would configure it."""
    learning = {"taints": ["storage.example.com/"]} if learning is None else learning
    raw = server_config(
        [bizfly_backend(sim, **backend_extra)],
        kubernetes={
            "kubeconfig": str(kubeconfig),
            "namespace": namespace,
            "learned_templates": {"enabled": True, "min_write_interval": "200ms", **learning},
        },
    )
    return ServerProcess(raw, workdir=tmp)


# ---------------------------------------------------------------------------------------------- helpers
def machine(sim: BizflySimulator, pool_id: str, index: int = 0) -> dict[str, Any]:
    refs = [r for r in sim.node_refs(bizfly_cluster_uid(sim)) if r["pool_id"] == pool_id]
    return refs[index]


def make_node(
    admin: client.ApiClient,
    created: list[str],
    name: str,
    provider_id: str,
    labels: dict[str, str],
    taints: list[dict[str, str]],
    ready: bool = True,
) -> None:
    """A Node as the kubelet registers it and the cloud controller completes it (providerID set)."""
    core = client.CoreV1Api(admin)
    body = {
        "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name}},
        "spec": {"providerID": provider_id, "taints": taints},
    }
    core.create_node(body)
    created.append(name)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    status = {"capacity": NODE_CAPACITY, "allocatable": NODE_ALLOCATABLE, "conditions": [condition]}
    core.patch_node_status(name, {"status": status})


def machine_node(
    admin: client.ApiClient,
    created: list[str],
    ref: dict[str, Any],
    ready: bool = True,
    flavor: str = "nix.4c_8g",
    by_hand: bool = False,
) -> str:
    """The Node of a Bizfly machine: its identity labels, a DaemonSet's label, the pool's taint and one
    added at join, and taints that must not be learned; ``by_hand`` adds the label and taint an operator
    put on this one node (BY_HAND_LABEL, BY_HAND_TAINT)."""
    labels = {
        **ref["labels"],
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": flavor,
        DAEMONSET_LABEL[0]: DAEMONSET_LABEL[1],
        **(dict([BY_HAND_LABEL]) if by_hand else {}),
    }
    taints = [{"key": "dedicated", "value": "compute", "effect": "NoSchedule"}, JOIN_TAINT, *TRANSIENT]
    taints += [BY_HAND_TAINT] if by_hand else []
    make_node(admin, created, ref["name"], ref["provider_id"], labels, taints, ready)
    return str(ref["name"])


def scale_to_zero(server: ServerProcess, sim: BizflySimulator, admin: client.ApiClient, ref: dict[str, Any]) -> None:
    """Remove the group's one node the way the CA does: DeleteNodes, the machine goes, its Node goes."""
    node = pb.ExternalGrpcNode(providerID=ref["provider_id"], name=ref["name"])
    server.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=ref["pool_id"], nodes=[node]), timeout=10)
    sim.advance(600)
    client.CoreV1Api(admin).delete_node(ref["name"])


def stored(admin: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    try:
        cm = client.CoreV1Api(admin).read_namespaced_config_map(CONFIGMAP, namespace)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    return {key: json.loads(value) for key, value in (cm.data or {}).items()}


def template_of(server: ServerProcess, group: str) -> k8s.Node:
    answer = server.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout=5)
    return k8s.Node.FromString(answer.nodeBytes)


def debug_of(server: ServerProcess, group: str) -> str:
    groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
    return next(g.debug for g in groups if g.id == group)


def quantities(resources: Any) -> dict[str, str]:
    return {k: v.string for k, v in resources.items()}


def flavor_allocatable(sim: BizflySimulator, pool_id: str) -> dict[str, str]:
    pool = next(p for p in sim.snapshot()["clusters"][0]["worker_pools"] if p["id"] == pool_id)
    template = build_template(pool, "HN", None)
    assert template is not None
    return dict(template.allocatable)


# ---------------------------------------------------------------------------------------------- tests
def test_a_group_scaled_to_zero_keeps_its_last_nodes_template_across_a_restart(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    server = start_server(bizfly, server_user, namespace, tmp_path)
    try:
        assert "template=cloud" in debug_of(server, COMPUTE)
        ref = machine(bizfly, COMPUTE)
        name = machine_node(admin, nodes, ref)

        record = wait_for("the ConfigMap to hold the compute pool", lambda: stored(admin, namespace).get(COMPUTE))
        assert record["node"] == name and record["allocatable"] == NODE_ALLOCATABLE
        assert record["capacity"] == NODE_CAPACITY
        assert "kubernetes.io/hostname" not in record["labels"]
        assert "bke.bizflycloud.vn/node-id" not in record["labels"]
        assert record["labels"][DAEMONSET_LABEL[0]] == DAEMONSET_LABEL[1]
        # The pool's own taint ("dedicated") is not recorded: it comes from the cloud when served.
        assert {t["key"] for t in record["taints"]} == {JOIN_TAINT["key"]}

        scale_to_zero(server, bizfly, admin, ref)
        server.restart()

        wait_for(
            "the pool at zero",
            lambda: not server.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=COMPUTE), timeout=5).instances,
        )
        template = template_of(server, COMPUTE)
        assert quantities(template.status.allocatable) == NODE_ALLOCATABLE
        assert quantities(template.status.allocatable) != flavor_allocatable(bizfly, COMPUTE)
        assert quantities(template.status.capacity) == NODE_CAPACITY
        labels = dict(template.metadata.labels)
        assert labels[DAEMONSET_LABEL[0]] == DAEMONSET_LABEL[1] and labels["workload"] == "compute"
        assert "bke.bizflycloud.vn/node-id" not in labels
        assert labels["kubernetes.io/hostname"] != name  # the CA's template gets a name of its own
        taints = {(t.key, t.value, t.effect) for t in template.spec.taints}
        assert taints == {("dedicated", "compute", "NoSchedule"), tuple(JOIN_TAINT.values())}
        assert f"template=learned from node {name} at {record['learned_at']}" in debug_of(server, COMPUTE)
        status = server.cli("status", "--address", server.address)
        assert f"learned from node {name}" in status
    finally:
        server.stop()


def test_an_override_beats_the_learned_template_key_by_key(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    override = {COMPUTE: {"template": {"allocatable": {"cpu": "1500m"}, "labels": {"tier": "gold"}}}}
    server = start_server(bizfly, server_user, namespace, tmp_path, node_groups=override)
    try:
        name = machine_node(admin, nodes, machine(bizfly, COMPUTE))
        wait_for("the ConfigMap to hold the compute pool", lambda: stored(admin, namespace).get(COMPUTE))
        wait_for("the learned template in use", lambda: "learned" in debug_of(server, COMPUTE))
        template = template_of(server, COMPUTE)
        allocatable = quantities(template.status.allocatable)
        assert allocatable["cpu"] == "1500m"  # the override's key
        assert allocatable["memory"] == NODE_ALLOCATABLE["memory"]  # the learned rest
        assert template.metadata.labels["tier"] == "gold"
        assert template.metadata.labels[DAEMONSET_LABEL[0]] == DAEMONSET_LABEL[1]
        assert f"template=override over learned from node {name} at" in debug_of(server, COMPUTE)
    finally:
        server.stop()


def test_a_node_that_is_not_ready_or_of_no_group_teaches_nothing(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    server = start_server(bizfly, server_user, namespace, tmp_path)
    try:
        machine_node(admin, nodes, machine(bizfly, COMPUTE), ready=False)
        stranger = f"stranger-{uuid.uuid4().hex[:8]}"
        make_node(admin, nodes, stranger, f"bizflycloud://{uuid.uuid4()}", {"workload": "compute"}, [])
        # A Ready node of another group, created last: once it is stored, the two before it were seen.
        machine_node(admin, nodes, machine(bizfly, GENERAL), flavor="nix.2c_4g")
        wait_for("the ConfigMap to hold the general pool", lambda: stored(admin, namespace).get(GENERAL))
        assert set(stored(admin, namespace)) == {GENERAL}
        assert "template=cloud" in debug_of(server, COMPUTE)
        assert quantities(template_of(server, COMPUTE).status.allocatable) == flavor_allocatable(bizfly, COMPUTE)
    finally:
        server.stop()


def served_labels_and_taints(server: ServerProcess, group: str) -> tuple[dict[str, str], set[tuple[str, str, str]]]:
    template = template_of(server, group)
    return dict(template.metadata.labels), {(t.key, t.value, t.effect) for t in template.spec.taints}


def test_a_label_or_taint_put_by_hand_on_the_last_node_is_not_served_for_the_group_at_zero(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    # Issue 26, item 6: the maintenance label and taint of the teacher node were learned and served for the
    # group at zero for good (source "learned"). No learning keys: the defaults alone keep them out.
    server = start_server(bizfly, server_user, namespace, tmp_path, learning={})
    try:
        ref = machine(bizfly, COMPUTE)
        machine_node(admin, nodes, ref, by_hand=True)
        record = wait_for("the ConfigMap to hold the compute pool", lambda: stored(admin, namespace).get(COMPUTE))
        scale_to_zero(server, bizfly, admin, ref)
        wait_for("the learned template in use", lambda: "learned" in debug_of(server, COMPUTE))
        labels, taints = served_labels_and_taints(server, COMPUTE)
        assert BY_HAND_LABEL[0] not in labels and BY_HAND_LABEL[0] not in record["labels"]
        assert BY_HAND_TAINT["key"] not in {key for key, _, _ in taints}
        assert BY_HAND_TAINT["key"] not in {t["key"] for t in record["taints"]}
        # What every node of a group has is still learned (node-feature-discovery's label); the pool's taint
        # comes from the cloud; a taint added at join is learned only once configured (the first test).
        assert labels[DAEMONSET_LABEL[0]] == DAEMONSET_LABEL[1]
        assert taints == {("dedicated", "compute", "NoSchedule")}
    finally:
        server.stop()


def test_the_pools_labels_and_taints_changed_while_at_zero_are_served_over_the_learned_ones(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    # Issue 26, item 6: the learned template replaced the cloud's whole, so a pool's labels and taints
    # edited while the group was at zero were never served.
    sync = {"interval": "1s", "min_interval": "200ms"}
    server = start_server(bizfly, server_user, namespace, tmp_path, learning={}, sync=sync)
    try:
        ref = machine(bizfly, COMPUTE)
        name = machine_node(admin, nodes, ref)
        wait_for("the ConfigMap to hold the compute pool", lambda: stored(admin, namespace).get(COMPUTE))
        scale_to_zero(server, bizfly, admin, ref)
        new_taint = {"key": "dedicated", "value": "compute-v2", "effect": "NoExecute"}
        bizfly.set_pool_labels_and_taints(COMPUTE, {"workload": "compute-v2", "tier": "gold"}, [new_taint])
        wait_for(
            "the pool's new labels served",
            lambda: served_labels_and_taints(server, COMPUTE)[0].get("workload") == "compute-v2",
        )
        labels, taints = served_labels_and_taints(server, COMPUTE)
        assert labels["tier"] == "gold" and labels[DAEMONSET_LABEL[0]] == DAEMONSET_LABEL[1]
        assert taints == {tuple(new_taint.values())}  # the old value of the pool's taint is gone
        assert quantities(template_of(server, COMPUTE).status.allocatable) == NODE_ALLOCATABLE  # still learned
        assert f"template=learned from node {name} at" in debug_of(server, COMPUTE)
    finally:
        server.stop()


def test_the_record_of_a_node_group_the_cloud_no_longer_lists_is_deleted(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    # Issue 26, item 9: records were never pruned; a deleted pool's record stayed in the ConfigMap for good.
    old = encode_learned(
        LearnedTemplate(NodeTemplate({}, (), NODE_CAPACITY, NODE_ALLOCATABLE), "old-node", "2026-01-01T00:00:00Z")
    )
    body = {"metadata": {"name": CONFIGMAP}, "data": {GONE: old}}
    client.CoreV1Api(admin).create_namespaced_config_map(namespace, body)
    learning = {"taints": ["storage.example.com/"], "forget_after": "1s"}
    server = start_server(bizfly, server_user, namespace, tmp_path, learning, sync={"interval": "1s"})
    try:
        machine_node(admin, nodes, machine(bizfly, COMPUTE))
        wait_for("the compute pool stored", lambda: COMPUTE in stored(admin, namespace))
        wait_for("the deleted pool's record gone", lambda: GONE not in stored(admin, namespace))
        assert set(stored(admin, namespace)) == {COMPUTE}
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- labels that vary
def learned_lines(server: ServerProcess, group: str) -> list[dict[str, Any]]:
    """The server's log records saying a group's record changed (a new record, or labels taken out of it)."""
    records = []
    for line in server.output.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("nodeGroup") == group and record.get("msg", "").startswith(
                ("learned the template of a node group", "labels that differ between a node group's nodes")
            ):
                records.append(record)
    return records


def configmap_writes(server: ServerProcess) -> list[str]:
    return [line for line in server.output.splitlines() if '"learned templates written"' in line and CONFIGMAP in line]


def relabel(admin: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    client.CoreV1Api(admin).patch_node(name, {"metadata": {"labels": labels}})


def test_an_unchanged_gpu_node_relabelled_by_gpu_feature_discovery_teaches_its_template_once(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    # Issue 30, item 4: every label under nvidia.com/ was kept, GFD's timestamp too, which GFD rewrites every
    # minute: each relabel made a new record (a ConfigMap write, a log line, the cached templates dropped),
    # and the template served carried one old node's timestamp.
    server = start_server(bizfly, server_user, namespace, tmp_path, learning={})
    try:
        ref = machine(bizfly, COMPUTE)
        name = machine_node(admin, nodes, ref)
        relabel(admin, name, A100_NODE)
        first = wait_for(
            "the GPU labels recorded",
            lambda: (r := stored(admin, namespace).get(COMPUTE)) and "nvidia.com/gpu.product" in r["labels"] and r,
        )
        assert first["labels"].keys() >= A100_NODE.keys() - PER_MACHINE_OR_MOMENT
        assert not first["labels"].keys() & PER_MACHINE_OR_MOMENT
        records, writes = len(learned_lines(server, COMPUTE)), len(configmap_writes(server))
        for at in range(10):  # ten passes of GFD, a minute apart on a real node
            relabel(admin, name, relabelled(A100_NODE, 1764780060 + 60 * at))
            time.sleep(0.1)
        # Then a change that does describe the machine, so the relabels before it are known to have been seen.
        relabel(admin, name, {"feature.node.kubernetes.io/pci-10de.present": "true"})
        wait_for(
            "the last change recorded",
            lambda: "feature.node.kubernetes.io/pci-10de.present" in stored(admin, namespace)[COMPUTE]["labels"],
        )
        changes = learned_lines(server, COMPUTE)[records:]
        written = len(configmap_writes(server)) - writes
        print(f"\n10 GFD relabels, then one real change: {len(changes)} record(s), {written} ConfigMap write(s)")
        assert len(changes) == 1, "\n".join(json.dumps(c) for c in changes)  # the last change only
        assert written == 1
        labels = dict(template_of(server, COMPUTE).metadata.labels)
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB" and "nvidia.com/gfd.timestamp" not in labels
    finally:
        server.stop()


def test_a_label_whose_value_differs_between_a_groups_nodes_leaves_its_template(
    bizfly: BizflySimulator, admin: client.ApiClient, namespace: str, server_user: Path, nodes: list[str], tmp_path
) -> None:
    server = start_server(bizfly, server_user, namespace, tmp_path, learning={})
    try:
        first, second = machine(bizfly, GENERAL, 0), machine(bizfly, GENERAL, 1)
        machine_node(admin, nodes, first, flavor="nix.2c_4g")
        relabel(admin, first["name"], A100_NODE)
        wait_for(
            "the first node's labels recorded",
            lambda: (r := stored(admin, namespace).get(GENERAL)) and "nvidia.com/gpu.product" in r["labels"],
        )
        # The second node of the pool has another driver (a node upgraded before the other, say).
        machine_node(admin, nodes, second, flavor="nix.2c_4g")
        relabel(admin, second["name"], {**A100_NODE, "nvidia.com/cuda.driver.minor": "127"})

        def pruned() -> dict[str, Any] | None:
            record = stored(admin, namespace)[GENERAL]
            return record if "nvidia.com/cuda.driver.minor" not in record["labels"] else None

        record = wait_for("the driver label out of the record", pruned)
        assert record["varying_labels"] == ["nvidia.com/cuda.driver.minor"]
        assert record["labels"]["nvidia.com/cuda.driver.major"] == "550", "what both nodes agree on stays"
        labels = dict(template_of(server, GENERAL).metadata.labels)
        assert "nvidia.com/cuda.driver.minor" not in labels and labels["nvidia.com/gpu.count"] == "8"
        changes = learned_lines(server, GENERAL)
        assert [c["msg"].split(" ")[0] for c in changes] == ["learned", "learned", "labels"], changes
        # After a restart the key stays out, though the first node, read first, still shows its old value.
        server.restart()
        wait_for("the record loaded", lambda: "learned" in debug_of(server, GENERAL))
        assert "nvidia.com/cuda.driver.minor" not in dict(template_of(server, GENERAL).metadata.labels)
    finally:
        server.stop()
