"""The scale-from-zero walk a CA makes, on each cloud, over gRPC against the simulators.

A pool at size 0 has no real node for the CA to copy, so the CA asks for a template, runs its
scheduler simulation of a pending pod on it, calls IncreaseSize, and then waits for the new instance
to show up as running under an id equal to the Kubernetes node's providerID (docs/reference/protocol.md,
"Templates for scale-from-zero" and "Instance status").
"""

from __future__ import annotations

import pytest

from devstack.harness import running_stack
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from simulators.bizfly import demo_scenario as bizfly_demo

SCW_POOL = "cccccccc-0000-4000-8000-000000000001"
SCW_SCENARIO = {
    "timings": {"creating": 20, "starting": 20, "registering": 15, "deleting": 20},
    "clusters": [
        {
            "id": "11111111-2222-4333-8444-777777777777",
            "name": "zero",
            "pools": [
                {
                    "id": SCW_POOL,
                    "name": "batch",
                    "node_type": "POP2-4C-16G",
                    "size": 0,
                    "min_size": 0,
                    "max_size": 3,
                    "labels": {"workload": "batch"},
                    "taints": {"batch": "true:NoSchedule"},
                }
            ],
        }
    ],
}
BZ_POOL = "5f959e0ac0b18944d0a4f13c"  # demo "batch": nix.8c_16g at 0

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "m": 1e-3}


def quantity(text: str) -> float:
    for suffix in sorted(UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * UNITS[suffix]
    return float(text)


def fits(node: k8s.Node, cpu: float, memory: float, selector: dict[str, str], tolerations: set[str]) -> list[str]:
    """What the scheduler's basic filters would say about one pending pod on this node (empty = fits)."""
    allocatable = {k: quantity(v.string) for k, v in node.status.allocatable.items()}
    problems = []
    if allocatable.get("pods", 0) < 1:
        problems.append("no pod slots")
    if allocatable.get("cpu", 0) < cpu:
        problems.append("cpu")
    if allocatable.get("memory", 0) < memory:
        problems.append("memory")
    labels = dict(node.metadata.labels)
    problems += [f"label {k}" for k, v in selector.items() if labels.get(k) != v]
    problems += [f"taint {t.key}" for t in node.spec.taints if t.effect == "NoSchedule" and t.key not in tolerations]
    if node.spec.unschedulable:
        problems.append("unschedulable")
    return problems


def walk(stack, group_id: str, pod_selector: dict[str, str], tolerations: set[str], provider_ids, settle: float):
    assert stack.target(group_id) == 0 and stack.instances(group_id) == []
    answer = stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group_id), timeout=5)
    template = k8s.Node.FromString(answer.nodeBytes)
    assert fits(template, cpu=2, memory=4 * 2**30, selector=pod_selector, tolerations=tolerations) == []
    assert fits(template, cpu=64, memory=4 * 2**30, selector=pod_selector, tolerations=tolerations) == ["cpu"]

    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=1), timeout=5)
    assert stack.target(group_id) == 1
    stack.advance(1)
    [creating] = stack.instances(group_id)
    assert creating.status.instanceState == pb.InstanceStatus.instanceCreating

    stack.advance(settle)
    [running] = stack.instances(group_id)
    assert running.status.instanceState == pb.InstanceStatus.instanceRunning
    assert running.id in provider_ids()
    node = pb.ExternalGrpcNode(providerID=running.id, name="new-node")
    assert stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5).nodeGroup.id == group_id


def test_scaleway_pool_scales_from_zero(tmp_path):
    with running_stack(tmp_path, scaleway=SCW_SCENARIO) as stack:

        def provider_ids() -> set[str]:
            return {r["provider_id"] for r in stack.scaleway.node_refs()}

        walk(stack, SCW_POOL, {"workload": "batch"}, {"batch"}, provider_ids, settle=120)


@pytest.mark.parametrize("auth_method", ["password", "application_credential"])
def test_bizfly_pool_scales_from_zero(tmp_path, auth_method):
    with running_stack(tmp_path, bizfly=bizfly_demo(), bizfly_auth=auth_method) as stack:
        uid = stack.bizfly.snapshot()["clusters"][0]["uid"]

        def provider_ids() -> set[str]:
            return {r["provider_id"] for r in stack.bizfly.node_refs(uid)}

        walk(stack, BZ_POOL, {"workload": "batch"}, set(), provider_ids, settle=300)
        patches = [r.body for r in stack.bizfly.requests.all() if r.method == "PATCH"]
        assert patches == [{"desired_size": 1}]


HAND_POOL = "cccccccc-0000-4000-8000-000000000002"
HAND_SCENARIO = {
    "clusters": [
        {
            "id": "11111111-2222-4333-8444-888888888888",
            "name": "by-hand",
            "pools": [
                {
                    "id": HAND_POOL,
                    "name": "web",
                    "node_type": "POP2-4C-16G",
                    "size": 1,
                    "min_size": 0,
                    "max_size": 3,
                    "labels": {"workload": "web"},
                }
            ],
        }
    ],
}
NFD_LABEL = ("feature.node.kubernetes.io/cpu-model.vendor_id", "AMD")  # the machine type's: kept


def test_a_label_put_by_hand_on_a_node_the_ca_asked_about_is_not_served_for_the_group_at_zero(tmp_path):
    # Issue 26, item 6, on the cloud's template: the labels of a node the CA shows in NodeGroupForNode
    # fill in the template, and one an operator put on that node for a while (maintenance=true) was
    # served for the group at zero long after the node was gone, with source "cloud". The same rule as
    # learned templates now: the stable list plus kubernetes.learned_templates.labels.
    extra = {"kubernetes": {"learned_templates": {"labels": ["example.com/team"]}}}
    with running_stack(tmp_path, scaleway=HAND_SCENARIO, server_extra=extra) as stack:
        [ref] = stack.scaleway.node_refs()
        labels = {
            **ref["labels"],
            "maintenance": "true",
            "example.com/disk-replacement": "2026-12",
            NFD_LABEL[0]: NFD_LABEL[1],
            "example.com/team": "payments",  # named in the config
        }
        node = pb.ExternalGrpcNode(providerID=ref["provider_id"], name=ref["name"], labels=labels)
        assert stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5).nodeGroup.id == HAND_POOL
        stack.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=HAND_POOL, nodes=[node]), timeout=10)
        stack.advance(120)
        assert stack.target(HAND_POOL) == 0 and stack.instances(HAND_POOL) == []

        answer = stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=HAND_POOL), timeout=5)
        served = dict(k8s.Node.FromString(answer.nodeBytes).metadata.labels)
        assert "maintenance" not in served and "example.com/disk-replacement" not in served
        assert served[NFD_LABEL[0]] == NFD_LABEL[1]
        assert served["example.com/team"] == "payments"
        assert served["workload"] == "web"  # the pool's own, from the cloud
        assert "template=cloud" in stack.groups()[HAND_POOL].debug
