"""Fuzz every RPC with random bytes, damaged messages and hostile field values.

Raw bytes go through a generic ``channel.unary_unary(method, request_serializer=None)`` so nothing on
the client side validates them. For every request the server must answer quickly (no hang, no
DEADLINE_EXCEEDED), with a precise status (never UNKNOWN, never INTERNAL), stay up, and the cloud must
see no mutation: the simulator's request log holds no PATCH/PUT/DELETE/POST (other than
authentication) for the whole module.

Bytes that are not a protobuf message of the method's type get INVALID_ARGUMENT naming the expected
message (server/rpc.py), not grpcio's INTERNAL "Exception deserializing request!".
"""

from __future__ import annotations

import collections
import io
import logging
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protos import externalgrpc_pb2 as pb
from server.logs import configure_logging
from tests.reliability.clouds import BizflyKit
from tests.reliability.harness import EXPECTED_CODES, CampaignStack, PoolSpec, full_method, rpc_names
from tests.reliability.report import publish

RPCS = sorted(rpc_names())
POOLS = (PoolSpec("fz-small", 1, 3, 2), PoolSpec("fz-full", 0, 2, 2))
CALL_TIMEOUT = 3.0
COUNTS: collections.Counter[str] = collections.Counter()

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=64),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=16),
    st.sampled_from(["", " ", "../../etc/passwd", "%s%n", "\x00", "'; DROP TABLE pools;--", "a" * 10_000]),
)


@pytest.fixture(scope="module")
def stack() -> Iterator[CampaignStack]:
    # Production logging (JSON + the redaction filter), so what it costs per request is fuzzed too.
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("json", "info", stream=io.StringIO())
    try:
        with CampaignStack(BizflyKit(), POOLS) as running:
            yield running
            _check_no_mutation_and_alive(running)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _check_no_mutation_and_alive(running: CampaignStack) -> None:
    mutations = running.mutations(0)
    assert not mutations, f"the fuzzed requests changed the cloud: {mutations}"
    # Still alive and answering after everything.
    assert running.call("NodeGroups", pb.NodeGroupsRequest()).ok
    publish(
        f"fuzz: {sum(COUNTS.values())} requests over {len(RPCS)} RPCs; answers "
        + ", ".join(f"{k}={v}" for k, v in sorted(COUNTS.items()))
        + "; cloud mutations: 0"
    )


def _raw_call(stack: CampaignStack, rpc: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    assert stack.channel is not None
    call = stack.channel.unary_unary(full_method(rpc), request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=CALL_TIMEOUT)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details() or ""


def _check_raw(stack: CampaignStack, rpc: str, payload: bytes) -> None:
    mark = stack.log_size()
    code, details = _raw_call(stack, rpc, payload)
    COUNTS[code.name] += 1
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{rpc} hung on {payload[:40]!r}"
    assert code in EXPECTED_CODES, f"{rpc} answered {code.name} ({details}) to {payload[:40]!r}"
    assert not stack.mutations(mark), f"{rpc} with {payload[:40]!r} mutated the cloud"


def _check_message(stack: CampaignStack, rpc: str, request: object) -> grpc.StatusCode:
    mark = stack.log_size()
    code, details = _raw_call(stack, rpc, request.SerializeToString())  # type: ignore[attr-defined]
    COUNTS[code.name] += 1
    # A well-formed message never reaches INTERNAL: a handler that raises something unexpected is a bug.
    assert code in EXPECTED_CODES, f"{rpc} answered {code.name} ({details}) to {request!r:.300}"
    assert not stack.mutations(mark), f"{rpc} with {request!r:.200} mutated the cloud"
    return code


# No shrinking: a failing request is printed as found; shrinking replays it many times, and a request
# that makes the server slow would turn one finding into minutes.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


# ---------------------------------------------------------------------------------------------- raw bytes
@FUZZ
@given(rpc=st.sampled_from(RPCS), payload=st.binary(max_size=512))
def test_random_bytes_never_crash_hang_or_mutate(stack: CampaignStack, rpc: str, payload: bytes) -> None:
    _check_raw(stack, rpc, payload)


def _damaged(valid: bytes, data: st.DataObject) -> bytes:
    """A valid message with bytes flipped, cut short or spliced: the likeliest real-world corruption."""
    raw = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            i = data.draw(st.integers(0, len(raw)))
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


def _templates() -> dict[str, bytes]:
    """One plausible request per RPC, aimed at a group and nodes that do not exist."""
    node = pb.ExternalGrpcNode(providerID="bizflycloud://nope", name="n", labels={"a": "b"}, annotations={"c": "d"})
    ts = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    messages = {
        "NodeGroups": pb.NodeGroupsRequest(),
        "NodeGroupForNode": pb.NodeGroupForNodeRequest(node=node),
        "PricingNodePrice": pb.PricingNodePriceRequest(node=node, startTimestamp=ts, endTimestamp=ts),
        "PricingPodPrice": pb.PricingPodPriceRequest(pod_bytes=b"\x0a\x03pod", startTimestamp=ts, endTimestamp=ts),
        "GPULabel": pb.GPULabelRequest(),
        "GetAvailableGPUTypes": pb.GetAvailableGPUTypesRequest(),
        "Cleanup": pb.CleanupRequest(),
        "Refresh": pb.RefreshRequest(),
        "NodeGroupTargetSize": pb.NodeGroupTargetSizeRequest(id="no-such-group"),
        "NodeGroupIncreaseSize": pb.NodeGroupIncreaseSizeRequest(id="no-such-group", delta=1),
        "NodeGroupDeleteNodes": pb.NodeGroupDeleteNodesRequest(id="no-such-group", nodes=[node]),
        "NodeGroupDecreaseTargetSize": pb.NodeGroupDecreaseTargetSizeRequest(id="no-such-group", delta=-1),
        "NodeGroupNodes": pb.NodeGroupNodesRequest(id="no-such-group"),
        "NodeGroupTemplateNodeInfo": pb.NodeGroupTemplateNodeInfoRequest(id="no-such-group"),
        "NodeGroupGetOptions": pb.NodeGroupAutoscalingOptionsRequest(id="no-such-group"),
    }
    assert sorted(messages) == RPCS
    return {rpc: message.SerializeToString() for rpc, message in messages.items()}


TEMPLATES = _templates()


@FUZZ
@given(rpc=st.sampled_from(RPCS), data=st.data())
def test_damaged_messages_never_crash_hang_or_mutate(stack: CampaignStack, rpc: str, data: st.DataObject) -> None:
    _check_raw(stack, rpc, _damaged(TEMPLATES[rpc], data))


def test_oversized_message_is_refused_cleanly(stack: CampaignStack) -> None:
    code, _details = _raw_call(stack, "NodeGroupNodes", b"\x0a" + b"\xff\xff\xff\x02" + b"x" * (5 * 1024 * 1024))
    COUNTS[code.name] += 1
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stack.call("NodeGroups", pb.NodeGroupsRequest()).ok


# ---------------------------------------------------------------------------------------------- field values
def _groups(stack: CampaignStack) -> dict[str, tuple[int, int, int]]:
    return {gid: (p.min_size, p.max_size, p.target) for gid, p in stack.pools().items()}


def _nodes(stack: CampaignStack) -> dict[str, list[str]]:
    return {gid: [n.provider_id for n in p.live()] for gid, p in stack.pools().items()}


def _group_id(stack: CampaignStack) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(sorted(_groups(stack))), HOSTILE_TEXT)


def _node_message(provider_ids: list[str]) -> st.SearchStrategy[pb.ExternalGrpcNode]:
    return st.builds(
        pb.ExternalGrpcNode,
        providerID=st.one_of(st.sampled_from(provider_ids), HOSTILE_TEXT),
        name=HOSTILE_TEXT,
        labels=st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3),
        annotations=st.dictionaries(
            st.one_of(HOSTILE_TEXT, st.just("k8s.io/cluster-autoscaler/fake-node-reason")), HOSTILE_TEXT, max_size=2
        ),
    )


@FUZZ
@given(data=st.data())
def test_size_changes_with_forbidden_values_are_refused(stack: CampaignStack, data: st.DataObject) -> None:
    groups = _groups(stack)
    gid = data.draw(_group_id(stack), label="id")
    increase = data.draw(st.booleans(), label="increase")
    if gid in groups:
        low, high, target = groups[gid]
        # Every size in the pool is running, so any decrease would remove existing machines.
        forbidden = (
            st.one_of(st.integers(-(2**31), 0), st.integers(high - target + 1, 2**31 - 1)) if increase else INT32
        )
        delta = data.draw(forbidden, label="delta")
    else:
        delta = data.draw(INT32, label="delta")
    if increase:
        code = _check_message(stack, "NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=gid, delta=delta))
    else:
        request = pb.NodeGroupDecreaseTargetSizeRequest(id=gid, delta=delta)
        code = _check_message(stack, "NodeGroupDecreaseTargetSize", request)
    assert code != grpc.StatusCode.OK


@FUZZ
@given(data=st.data())
def test_delete_nodes_with_a_stranger_in_the_list_deletes_nothing(stack: CampaignStack, data: st.DataObject) -> None:
    nodes = _nodes(stack)
    gid = data.draw(_group_id(stack), label="id")
    own = nodes.get(gid, [])
    others = [pid for g, pids in nodes.items() if g != gid for pid in pids]
    valid = data.draw(st.lists(_node_message(own or ["x"]), max_size=3), label="nodes")
    stranger = pb.ExternalGrpcNode(
        providerID=data.draw(st.one_of(st.sampled_from(others or ["y"]), HOSTILE_TEXT).filter(lambda p: p not in own))
    )
    position = data.draw(st.integers(0, len(valid)), label="position")
    request = pb.NodeGroupDeleteNodesRequest(id=gid, nodes=[*valid[:position], stranger, *valid[position:]])
    code = _check_message(stack, "NodeGroupDeleteNodes", request)
    assert code != grpc.StatusCode.OK


@FUZZ
@given(data=st.data())
def test_read_rpcs_with_hostile_values_answer_precisely(stack: CampaignStack, data: st.DataObject) -> None:
    nodes = [pid for pids in _nodes(stack).values() for pid in pids]
    gid = data.draw(_group_id(stack), label="id")
    node = data.draw(_node_message(nodes), label="node")
    stamp = st.builds(timestamp_pb2.Timestamp, seconds=INT64, nanos=INT32)
    duration = st.builds(duration_pb2.Duration, seconds=INT64, nanos=INT32)
    defaults = st.builds(
        pb.NodeGroupAutoscalingOptions,
        scaleDownUtilizationThreshold=st.floats(allow_nan=True, allow_infinity=True),
        scaleDownGpuUtilizationThreshold=st.floats(allow_nan=True, allow_infinity=True),
        zeroOrMaxNodeScaling=st.booleans(),
        ignoreDaemonSetsUtilization=st.booleans(),
        scaleDownUnneededDuration=duration,
        scaleDownUnreadyDuration=duration,
        MaxNodeProvisionDuration=duration,
    )
    choice = data.draw(st.integers(0, 6), label="rpc")
    if choice == 0:
        _check_message(stack, "NodeGroupForNode", pb.NodeGroupForNodeRequest(node=node))
    elif choice == 1:
        start, end = data.draw(stamp), data.draw(stamp)
        request = pb.PricingNodePriceRequest(node=node, startTimestamp=start, endTimestamp=end)
        _check_message(stack, "PricingNodePrice", request)
    elif choice == 2:
        start, end = data.draw(stamp), data.draw(stamp)
        pod = data.draw(st.binary(max_size=256))
        request = pb.PricingPodPriceRequest(pod_bytes=pod, startTimestamp=start, endTimestamp=end)
        _check_message(stack, "PricingPodPrice", request)
    elif choice == 3:
        request = pb.NodeGroupAutoscalingOptionsRequest(id=gid, defaults=data.draw(defaults))
        _check_message(stack, "NodeGroupGetOptions", request)
    elif choice == 4:
        _check_message(stack, "NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id=gid))
    elif choice == 5:
        _check_message(stack, "NodeGroupNodes", pb.NodeGroupNodesRequest(id=gid))
    else:
        _check_message(stack, "NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=gid))
