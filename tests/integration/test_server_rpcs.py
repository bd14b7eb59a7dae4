"""Every CloudProvider RPC over a real gRPC channel, against the server wired to the cloud simulators.

Each test states one behaviour the CA relies on (docs/reference/protocol.md) and checks both what the CA sees
and, for mutations, what reached the simulated cloud.
"""

from __future__ import annotations

import grpc
import pytest

from devstack.harness import Stack, running_stack
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s

CLUSTER = "11111111-2222-4333-8444-555555555555"
GENERAL = "aaaaaaaa-0000-4000-8000-000000000001"
GPU = "aaaaaaaa-0000-4000-8000-000000000002"
FIXED = "aaaaaaaa-0000-4000-8000-000000000003"
SMALL = "aaaaaaaa-0000-4000-8000-000000000004"

SCENARIO = {
    "seed": 5,
    "timings": {"creating": 10, "starting": 10, "registering": 10, "deleting": 10},
    "clusters": [
        {
            "id": CLUSTER,
            "name": "rpc-tests",
            "pools": [
                {
                    "id": GENERAL,
                    "name": "general",
                    "node_type": "DEV1-M",
                    "size": 2,
                    "min_size": 1,
                    "max_size": 4,
                    "labels": {"team": "web"},
                    "taints": {"dedicated": "web:NoSchedule"},
                },
                {"id": GPU, "name": "gpu", "node_type": "L4-1-24G", "size": 0, "min_size": 0, "max_size": 2},
                {"id": SMALL, "name": "small", "node_type": "DEV1-L", "size": 1, "min_size": 0, "max_size": 3},
                {
                    "id": FIXED,
                    "name": "fixed",
                    "node_type": "DEV1-L",
                    "size": 1,
                    "min_size": 1,
                    "max_size": 1,
                    "autoscaling": False,
                },
            ],
        }
    ],
}
OPTIONS = {
    SMALL: {"options": {"scale_down_unneeded_time": "2m", "scale_down_utilization_threshold": 0.3}},
}


@pytest.fixture
def stack(tmp_path):
    with running_stack(tmp_path, scaleway=SCENARIO, backend_extra={"scw": {"node_groups": OPTIONS}}) as s:
        yield s


def provider_ids(stack: Stack, pool_id: str) -> list[str]:
    assert stack.scaleway is not None
    return sorted(n.provider_id for n in stack.scaleway.nodes_of(pool_id))


def cloud_mutations(stack: Stack) -> list[str]:
    assert stack.scaleway is not None
    return [f"{r.method} {r.route}" for r in stack.scaleway.requests.all() if r.method != "GET"]


def code_of(call, *args, **kwargs) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=5, **kwargs)
    return info.value.code()


# ------------------------------------------------------------------ cloud-provider level
def test_node_groups_lists_autoscaled_pools_with_their_bounds(stack):
    groups = stack.groups()
    assert set(groups) == {GENERAL, GPU, SMALL}
    assert (groups[GENERAL].minSize, groups[GENERAL].maxSize) == (1, 4)
    assert groups[GENERAL].debug.startswith("backend=scw")


def test_node_group_for_node_resolves_a_managed_node_with_min_and_max(stack):
    pid = provider_ids(stack, GENERAL)[0]
    node = pb.ExternalGrpcNode(providerID=pid, name="scw-general-1", labels={"team": "web"})
    group = stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5).nodeGroup
    assert (group.id, group.minSize, group.maxSize) == (GENERAL, 1, 4)


def test_node_group_for_node_answers_an_empty_id_for_unmanaged_nodes(stack):
    for node in (
        pb.ExternalGrpcNode(providerID="scaleway://instance/fr-par-1/not-ours", name="control-plane"),
        pb.ExternalGrpcNode(providerID=provider_ids(stack, FIXED)[0], name="fixed-pool-node"),
        pb.ExternalGrpcNode(),
    ):
        group = stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=5).nodeGroup
        assert group.id == ""


def test_node_group_for_node_resolves_a_ca_fake_node_by_its_name(stack):
    pid = provider_ids(stack, GENERAL)[0]
    fake = pb.ExternalGrpcNode(name=pid, annotations={"k8s.io/cluster-autoscaler/fake-node-reason": "unregistered"})
    group = stack.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=fake), timeout=5).nodeGroup
    assert group.id == GENERAL


def test_gpu_label_and_types_come_from_the_cloud(stack):
    assert stack.stub.GPULabel(pb.GPULabelRequest(), timeout=5).label == "k8s.scw.cloud/gpu"
    types = stack.stub.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest(), timeout=5).gpuTypes
    assert len(types) >= 1


def test_refresh_and_cleanup_succeed_while_the_cloud_is_fresh(stack):
    stack.stub.Refresh(pb.RefreshRequest(), timeout=5)
    stack.stub.Cleanup(pb.CleanupRequest(), timeout=5)


def test_node_price_is_whole_hours_times_the_pool_price(stack):
    node = pb.ExternalGrpcNode(name="template", labels={"k8s.scaleway.com/pool": GENERAL})
    request = pb.PricingNodePriceRequest(node=node)
    request.startTimestamp.seconds = 1_700_000_000
    request.endTimestamp.seconds = 1_700_000_000 + 90 * 60  # 1.5 h -> 2 billed hours
    price = stack.stub.PricingNodePrice(request, timeout=5).price
    assert stack.scaleway is not None
    hourly = stack.scaleway.pool(GENERAL).node_price_per_hour
    assert price == pytest.approx(2 * hourly)


def test_node_price_reads_the_legacy_time_fields_too(stack):
    node = pb.ExternalGrpcNode(name="template", labels={"k8s.scaleway.com/pool": GENERAL})
    request = pb.PricingNodePriceRequest(node=node)
    request.startTime.seconds = 1_700_000_000
    request.endTime.seconds = 1_700_000_000 + 3 * 3600
    assert stack.scaleway is not None
    hourly = stack.scaleway.pool(GENERAL).node_price_per_hour
    assert stack.stub.PricingNodePrice(request, timeout=5).price == pytest.approx(3 * hourly)


def test_pod_price_answers_for_both_request_generations(stack):
    pod = k8s.Pod()
    pod.metadata.name = "web-1"
    new = pb.PricingPodPriceRequest(pod_bytes=pod.SerializeToString())
    old = pb.PricingPodPriceRequest(pod=pod.SerializeToString())
    assert stack.stub.PricingPodPrice(new, timeout=5).price == 0.0
    assert stack.stub.PricingPodPrice(old, timeout=5).price == 0.0


# ------------------------------------------------------------------ reads per group
def test_target_size_and_nodes_report_the_pool(stack):
    assert stack.target(GENERAL) == 2
    instances = stack.instances(GENERAL)
    assert sorted(i.id for i in instances) == provider_ids(stack, GENERAL)
    assert {i.status.instanceState for i in instances} == {pb.InstanceStatus.instanceRunning}


def test_unknown_group_is_not_found_and_an_empty_id_is_invalid(stack):
    assert code_of(stack.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id="nope")) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert code_of(stack.stub.NodeGroupNodes, pb.NodeGroupNodesRequest(id="")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stack.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id=FIXED)) == (
        grpc.StatusCode.NOT_FOUND
    )


def test_template_is_a_raw_node_in_both_fields_with_what_the_scheduler_needs(stack):
    response = stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=GENERAL), timeout=5)
    assert response.nodeInfo and response.nodeInfo == response.nodeBytes
    assert not response.nodeBytes.startswith(b"k8s\x00")
    node = k8s.Node.FromString(response.nodeBytes)
    allocatable = {k: v.string for k, v in node.status.allocatable.items()}
    assert allocatable["pods"] and int(allocatable["pods"]) > 0
    assert int(allocatable["cpu"]) == 3  # DEV1-M: 3 vCPU
    assert allocatable["memory"]
    labels = dict(node.metadata.labels)
    assert labels["team"] == "web"
    assert labels["node.kubernetes.io/instance-type"] == "DEV1-M"
    assert labels["kubernetes.io/os"] == "linux"
    assert "topology.kubernetes.io/zone" in labels
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("dedicated", "web", "NoSchedule")]
    assert not node.spec.unschedulable
    ready = {c.type: c.status for c in node.status.conditions}
    assert ready["Ready"] == "True"


def test_gpu_pool_at_zero_has_a_gpu_template(stack):
    response = stack.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=GPU), timeout=5)
    node = k8s.Node.FromString(response.nodeBytes)
    assert node.status.capacity["nvidia.com/gpu"].string == "1"
    assert "k8s.scw.cloud/gpu" in node.metadata.labels


def test_options_are_empty_unless_configured(stack):
    response = stack.stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(id=GENERAL), timeout=5)
    assert not response.HasField("nodeGroupAutoscalingOptions")
    assert response.SerializeToString() == b""


def test_configured_options_keep_the_ca_defaults_elsewhere_in_both_generations(stack):
    request = pb.NodeGroupAutoscalingOptionsRequest(id=SMALL)
    defaults = request.defaults
    defaults.scaleDownUtilizationThreshold = 0.5
    defaults.scaleDownGpuUtilizationThreshold = 0.6
    defaults.scaleDownUnreadyDuration.seconds = 1200
    defaults.MaxNodeProvisionDuration.seconds = 900
    options = stack.stub.NodeGroupGetOptions(request, timeout=5).nodeGroupAutoscalingOptions
    assert options.scaleDownUtilizationThreshold == pytest.approx(0.3)
    assert options.scaleDownGpuUtilizationThreshold == pytest.approx(0.6)
    assert options.scaleDownUnneededDuration.seconds == 120
    assert options.scaleDownUnneededTime.duration == 120 * 10**9
    assert options.scaleDownUnreadyDuration.seconds == 1200
    assert options.scaleDownUnreadyTime.duration == 1200 * 10**9
    assert options.MaxNodeProvisionDuration.seconds == 900
    assert options.MaxNodeProvisionTime.duration == 900 * 10**9


# ------------------------------------------------------------------ mutations
def test_increase_size_raises_the_target_and_new_instances_appear(stack):
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=2), timeout=5)
    assert stack.target(GENERAL) == 4
    assert stack.scaleway is not None
    assert stack.scaleway.pool(GENERAL).size == 4
    stack.advance(1)
    states = sorted(i.status.instanceState for i in stack.instances(GENERAL))
    assert len(states) == 4
    assert states.count(pb.InstanceStatus.instanceCreating) == 2


def test_increase_size_rejects_a_non_positive_delta_without_touching_the_cloud(stack):
    for delta in (0, -1):
        code = code_of(stack.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=delta))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert cloud_mutations(stack) == []


def test_increase_size_beyond_max_is_refused_without_touching_the_cloud(stack):
    code = code_of(stack.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=3))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert stack.target(GENERAL) == 2
    assert cloud_mutations(stack) == []


def test_increase_of_an_unknown_group_is_not_found(stack):
    code = code_of(stack.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="missing", delta=1))
    assert code == grpc.StatusCode.NOT_FOUND


def test_decrease_target_size_drops_requested_but_unregistered_capacity(stack):
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=2), timeout=5)
    stack.stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=GENERAL, delta=-1), timeout=5)
    assert stack.target(GENERAL) == 3
    assert stack.scaleway is not None
    assert stack.scaleway.pool(GENERAL).size == 3


def test_decrease_target_size_rejects_a_non_negative_delta(stack):
    for delta in (0, 1):
        code = code_of(
            stack.stub.NodeGroupDecreaseTargetSize, pb.NodeGroupDecreaseTargetSizeRequest(id=GENERAL, delta=delta)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert cloud_mutations(stack) == []


def test_decrease_target_size_never_goes_below_min_or_running_nodes(stack):
    code = code_of(stack.stub.NodeGroupDecreaseTargetSize, pb.NodeGroupDecreaseTargetSizeRequest(id=GENERAL, delta=-2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code = code_of(stack.stub.NodeGroupDecreaseTargetSize, pb.NodeGroupDecreaseTargetSizeRequest(id=SMALL, delta=-1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION  # min 0, but its one node is running
    assert cloud_mutations(stack) == []


def test_delete_nodes_removes_the_node_and_lowers_the_target(stack):
    pid = provider_ids(stack, GENERAL)[0]
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=5)
    request = pb.NodeGroupDeleteNodesRequest(id=GENERAL, nodes=[pb.ExternalGrpcNode(providerID=pid, name="n1")])
    stack.stub.NodeGroupDeleteNodes(request, timeout=5)
    assert stack.target(GENERAL) == 2
    by_id = {i.id: i.status.instanceState for i in stack.instances(GENERAL)}
    assert by_id.get(pid, pb.InstanceStatus.instanceDeleting) == pb.InstanceStatus.instanceDeleting
    assert any(m.startswith("DELETE") for m in cloud_mutations(stack))


def test_delete_nodes_refuses_a_node_of_another_group_and_deletes_nothing(stack):
    ours = provider_ids(stack, GENERAL)[0]
    theirs = provider_ids(stack, SMALL)[0]
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=5)
    before = cloud_mutations(stack)
    request = pb.NodeGroupDeleteNodesRequest(
        id=GENERAL, nodes=[pb.ExternalGrpcNode(providerID=ours), pb.ExternalGrpcNode(providerID=theirs)]
    )
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.NodeGroupDeleteNodes(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert SMALL in info.value.details() and "nothing was deleted" in info.value.details()
    assert cloud_mutations(stack) == before
    assert stack.target(GENERAL) == 3


def test_delete_nodes_needs_at_least_one_node(stack):
    code = code_of(stack.stub.NodeGroupDeleteNodes, pb.NodeGroupDeleteNodesRequest(id=GENERAL))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_delete_nodes_below_min_is_refused(stack):
    pids = provider_ids(stack, GENERAL)
    request = pb.NodeGroupDeleteNodesRequest(id=GENERAL, nodes=[pb.ExternalGrpcNode(providerID=p) for p in pids])
    assert code_of(stack.stub.NodeGroupDeleteNodes, request) == grpc.StatusCode.FAILED_PRECONDITION
    assert cloud_mutations(stack) == []


def test_scale_up_failure_is_reported_as_creating_with_error_info(stack):
    assert stack.scaleway is not None
    stack.scaleway.fail_next_scale_up(SMALL, mode="creation_error")
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=SMALL, delta=1), timeout=5)
    stack.advance(60)
    failed = [i for i in stack.instances(SMALL) if i.status.errorInfo.errorCode]
    assert failed, stack.instances(SMALL)
    assert failed[0].status.instanceState == pb.InstanceStatus.instanceCreating
    assert failed[0].status.errorInfo.instanceErrorClass in (1, 99)


def test_malformed_request_bytes_get_a_precise_status(stack):
    call = stack.channel.unary_unary(
        "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroupIncreaseSize",
        request_serializer=None,
        response_deserializer=None,
    )
    with pytest.raises(grpc.RpcError) as info:
        call(b"\xff\xff\xff\xff", timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NodeGroupIncreaseSizeRequest" in info.value.details()
    assert cloud_mutations(stack) == []
