"""Several backends in one server: each RPC goes to the cloud that owns the group or the providerID.

Also the template paths that depend on configuration: UNIMPLEMENTED when nothing describes a machine,
an explicit template override, and labels learnt from real nodes kept for a pool scaled to zero.
"""

from __future__ import annotations

import copy

import grpc
import pytest

from devstack.harness import running_stack
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from simulators.bizfly import demo_scenario as bizfly_demo

MYSTERY = "5f959e0ac0b18944d0a4f1ff"
OVERRIDDEN = "5f959e0ac0b18944d0a4f1fe"
GENERAL_BZ = "5f959e0ac0b18944d0a4f13a"
SCW_CLUSTER = "11111111-2222-4333-8444-666666666666"
SCW_POOL = "bbbbbbbb-0000-4000-8000-000000000001"


def bizfly_scenario() -> dict:
    scenario = copy.deepcopy(bizfly_demo())
    pools = scenario["clusters"][0]["pools"]
    for pool_id, name in ((MYSTERY, "mystery"), (OVERRIDDEN, "overridden")):
        pools.append(
            {
                "id": pool_id,
                "name": name,
                "flavor": "custom-build",
                "min_size": 0,
                "max_size": 2,
                "desired_size": 0,
                "enable_autoscaling": True,
            }
        )
    return scenario


SCW_SCENARIO = {
    "clusters": [
        {
            "id": SCW_CLUSTER,
            "name": "dispatch",
            "pools": [{"id": SCW_POOL, "name": "web", "node_type": "DEV1-M", "size": 1, "min_size": 0, "max_size": 3}],
        }
    ]
}
OVERRIDES = {
    "bizfly": {
        "node_groups": {
            OVERRIDDEN: {
                "template": {
                    "capacity": {"cpu": "4", "memory": "8Gi"},
                    "labels": {"hardware": "custom"},
                    "taints": [{"key": "custom", "value": "yes", "effect": "NoSchedule"}],
                }
            }
        }
    }
}


@pytest.fixture
def stack(tmp_path):
    with running_stack(tmp_path, scaleway=SCW_SCENARIO, bizfly=bizfly_scenario(), backend_extra=OVERRIDES) as s:
        yield s


def general_node_refs(stack) -> list[dict]:
    """The Kubernetes view (providerID, name, labels) of the Bizfly 'general' pool's nodes."""
    uid = stack.bizfly.snapshot()["clusters"][0]["uid"]
    return [r for r in stack.bizfly.node_refs(uid) if r["pool_id"] == GENERAL_BZ]


def template(stack, group_id: str) -> k8s.Node:
    response = stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group_id), timeout=5)
    assert response.nodeInfo == response.nodeBytes
    return k8s.Node.FromString(response.nodeBytes)


def test_node_groups_of_both_clouds_are_listed(stack):
    groups = stack.groups()
    assert SCW_POOL in groups and GENERAL_BZ in groups
    assert groups[GENERAL_BZ].debug.startswith("backend=bizfly")


def test_each_mutation_reaches_only_the_owning_cloud(stack):
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL_BZ, delta=1), timeout=5)
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=SCW_POOL, delta=1), timeout=5)
    bizfly_writes = [r for r in stack.bizfly.requests.all() if r.method not in ("GET", "POST")]
    scaleway_writes = [r for r in stack.scaleway.requests.all() if r.method != "GET"]
    assert len(bizfly_writes) == 1 and len(scaleway_writes) == 1
    assert stack.target(GENERAL_BZ) == 3 and stack.target(SCW_POOL) == 2


def test_node_group_for_node_finds_bizfly_nodes_by_provider_id(stack):
    refs = general_node_refs(stack)
    node = pb.ExternalGrpcNode(providerID=refs[0]["provider_id"], name=refs[0]["name"], labels=refs[0]["labels"])
    group = stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5).nodeGroup
    assert (group.id, group.minSize, group.maxSize) == (GENERAL_BZ, 1, 5)


def test_a_pool_nothing_describes_answers_unimplemented(stack):
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=MYSTERY), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert f"node_groups.{MYSTERY}.template" in info.value.details()


def test_an_explicit_template_override_describes_the_pool(stack):
    node = template(stack, OVERRIDDEN)
    assert node.status.capacity["cpu"].string == "4"
    assert node.status.allocatable["pods"].string
    assert node.metadata.labels["hardware"] == "custom"
    assert [(t.key, t.effect) for t in node.spec.taints] == [("custom", "NoSchedule")]


def test_bizfly_pool_at_zero_gets_a_template_from_its_flavor(stack):
    node = template(stack, "5f959e0ac0b18944d0a4f13c")  # batch: nix.8c_16g at size 0
    assert node.status.capacity["cpu"].string == "8"
    assert node.metadata.labels["workload"] == "batch"
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "nix.8c_16g"


def test_labels_of_real_nodes_that_describe_their_group_are_kept_for_the_template(stack):
    refs = general_node_refs(stack)
    nfd = "feature.node.kubernetes.io/cpu-model.vendor_id"
    labels = dict(refs[0]["labels"], **{nfd: "Intel", "example.com/rack": "r12"})
    node = pb.ExternalGrpcNode(providerID=refs[0]["provider_id"], name=refs[0]["name"], labels=labels)
    stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5)
    served = template(stack, GENERAL_BZ).metadata.labels
    assert served[nfd] == "Intel"  # the machine type's
    assert "example.com/rack" not in served  # one machine's, and not in kubernetes.learned_templates.labels


def test_node_price_of_a_cloud_without_prices_is_unimplemented(stack):
    ref = general_node_refs(stack)[0]
    request = pb.PricingNodePriceRequest(node=pb.ExternalGrpcNode(providerID=ref["provider_id"], name=ref["name"]))
    request.endTimestamp.seconds = 3600
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.PricingNodePrice(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    scw_node = pb.ExternalGrpcNode(name="template", labels={"k8s.scaleway.com/pool": SCW_POOL})
    request = pb.PricingNodePriceRequest(node=scw_node)
    request.endTimestamp.seconds = 3600
    assert stack.stub.PricingNodePrice(request, timeout=5).price > 0
