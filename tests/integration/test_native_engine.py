"""The native serving engine (``serving.engine: native``) over real gRPC: what it answers itself is
byte for byte what Python's call path (``Dispatcher.call``) answers, everything else reaches Python.

The rest of the gRPC suite runs through this engine too when ``CA_EXTERNALGRPC_TEST_ENGINE=native``
(``make test`` does both); these tests pin what only this engine has: the natively answered calls,
their metrics, the republication after a mutation, the label recording of NodeGroupForNode, TLS.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, Stack, client_credentials, open_channel, running_stack, server_config
from protos import externalgrpc_pb2 as pb
from server.native_front import NativeFront, build_tables
from server.rpc import Code, NativeCallContext
from server.service import SERVICE_NAME
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator

# Every server here runs the native engine, whatever $CA_EXTERNALGRPC_TEST_ENGINE says.
pytestmark = pytest.mark.one_engine

CLUSTER = "11111111-2222-4333-8444-555555555555"
GENERAL = "aaaaaaaa-0000-4000-8000-000000000001"
EMPTY = "aaaaaaaa-0000-4000-8000-000000000002"
TUNED = "aaaaaaaa-0000-4000-8000-000000000003"
SCENARIO = {
    "seed": 9,
    "timings": {"creating": 10, "starting": 10, "registering": 10, "deleting": 10},
    "clusters": [
        {
            "id": CLUSTER,
            "name": "native-tests",
            "pools": [
                {"id": GENERAL, "name": "general", "node_type": "DEV1-M", "size": 3, "min_size": 1, "max_size": 6},
                {"id": EMPTY, "name": "empty", "node_type": "DEV1-L", "size": 0, "min_size": 0, "max_size": 2},
                {"id": TUNED, "name": "tuned", "node_type": "DEV1-L", "size": 1, "min_size": 0, "max_size": 3},
            ],
        }
    ],
}
NATIVE = {"serving": {"engine": "native"}}
#: tgkill(2), to signal one thread of another process, by architecture
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}
OPTIONS = {TUNED: {"options": {"scale_down_utilization_threshold": 0.3}}}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path, scaleway=SCENARIO, server_extra=NATIVE, backend_extra={"scw": {"node_groups": OPTIONS}}
    ) as s:
        yield s


def raw_call(channel: grpc.Channel, method: str, request: bytes) -> bytes:
    call = channel.unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=None, response_deserializer=None)
    answer: bytes = call(request, timeout=5)
    return answer


def front(stack: Stack) -> NativeFront:
    engine = stack.server.engine
    assert isinstance(engine, NativeFront), "the stack must run the native engine"
    return engine


def native_counts(stack: Stack) -> dict[str, int]:
    calls = front(stack).native_calls()
    return {method: n for service, method, n, _buckets, _seconds in calls if service == SERVICE_NAME}


def python_answer(stack: Stack, method: str, request: bytes) -> tuple[Code, str, bytes]:
    """What Python's call path answers, called directly (the front hands it the calls it does not answer)."""
    return stack.server.dispatcher.call(f"/{SERVICE_NAME}/{method}", request, NativeCallContext(5.0, time.monotonic()))


def node(provider_id: str, labels: dict[str, str] | None = None) -> pb.ExternalGrpcNode:
    return pb.ExternalGrpcNode(providerID=provider_id, name="n", labels=labels or {})


def hot_requests(stack: Stack) -> list[tuple[str, bytes]]:
    assert stack.scaleway is not None
    pid = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL))[0]
    defaults = pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)
    requests: list[tuple[str, Any]] = [
        ("NodeGroups", pb.NodeGroupsRequest()),
        ("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=node(pid))),
        ("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=node("scaleway://instance/fr-par-1/unknown"))),
        ("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(name=pid))),
        ("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=GENERAL)),
        ("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=EMPTY)),
        ("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest(id=GENERAL, defaults=defaults)),
        ("NodeGroupNodes", pb.NodeGroupNodesRequest(id=GENERAL)),
        ("NodeGroupNodes", pb.NodeGroupNodesRequest(id=EMPTY)),
    ]
    return [(method, request.SerializeToString()) for method, request in requests]


def test_hot_reads_are_answered_natively_with_the_servicers_bytes(stack: Stack) -> None:
    before = native_counts(stack)
    for method, request in hot_requests(stack):
        assert raw_call(stack.channel, method, request) == python_answer(stack, method, request)[2], method
    after = native_counts(stack)
    answered = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    assert answered == {
        "NodeGroups": 1,
        "NodeGroupForNode": 3,
        "NodeGroupTargetSize": 2,
        "NodeGroupGetOptions": 1,
        "NodeGroupNodes": 2,
    }


def status_of(channel: grpc.Channel, method: str, request: bytes) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        raw_call(channel, method, request)
    return info.value.code(), info.value.details()


@pytest.mark.parametrize(
    ("method", "request_bytes"),
    [
        ("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="").SerializeToString()),
        ("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id="no-such-pool").SerializeToString()),
        ("NodeGroupNodes", pb.NodeGroupNodesRequest(id="no-such-pool").SerializeToString()),
        ("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest(id="").SerializeToString()),
        ("NodeGroupTargetSize", b"\x0a\x02\xff\xfe"),  # an id that is not UTF-8
        ("NodeGroupForNode", b"\x0a\x05\x0a\x09abc"),  # a node whose providerID runs past the end
        ("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id="no-such-pool").SerializeToString()),
    ],
)
def test_errors_are_pythons_own(stack: Stack, method: str, request_bytes: bytes) -> None:
    before = native_counts(stack)
    through_front = status_of(stack.channel, method, request_bytes)
    code, details, _ = python_answer(stack, method, request_bytes)
    assert through_front == (grpc.StatusCode[code.name], details)
    assert code != Code.OK
    assert native_counts(stack) == before, "an error is never answered natively"


def test_options_that_depend_on_the_callers_defaults_are_learned_from_python(stack: Stack) -> None:
    def request(threshold: float) -> bytes:
        defaults = pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=threshold)
        return pb.NodeGroupAutoscalingOptionsRequest(id=TUNED, defaults=defaults).SerializeToString()

    def answered_natively(threshold: float) -> int:
        before = native_counts(stack).get("NodeGroupGetOptions", 0)
        answer = raw_call(stack.channel, "NodeGroupGetOptions", request(threshold))
        assert answer == python_answer(stack, "NodeGroupGetOptions", request(threshold))[2]
        got = pb.NodeGroupAutoscalingOptionsResponse.FromString(answer).nodeGroupAutoscalingOptions
        assert got.scaleDownUtilizationThreshold == pytest.approx(0.3)  # the group's own option
        return native_counts(stack).get("NodeGroupGetOptions", 0) - before

    assert answered_natively(0.5) == 0, "the first call with these defaults is Python's"
    assert answered_natively(0.5) == 1, "then the front gives Python's answer"
    assert answered_natively(0.6) == 0, "other defaults: Python again"
    stack.advance(1)  # a new snapshot keeps what was learned
    assert answered_natively(0.5) == 1


def test_a_size_change_is_visible_in_the_next_native_answer(stack: Stack) -> None:
    assert stack.target(GENERAL) == 3
    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=2), timeout=10)
    before = native_counts(stack)["NodeGroupTargetSize"]
    assert stack.target(GENERAL) == 5
    assert native_counts(stack)["NodeGroupTargetSize"] == before + 1


def test_labels_reach_python_once_per_snapshot_then_lookups_stay_native(stack: Stack) -> None:
    assert stack.scaleway is not None
    pid = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL))[0]
    request = pb.NodeGroupForNodeRequest(node=node(pid, {"topology.kubernetes.io/zone": "fr-par-1"}))
    backend = stack.backend("scw")

    def lookup() -> int:
        before = native_counts(stack).get("NodeGroupForNode", 0)
        assert stack.stub.NodeGroupForNode(request, timeout=5).nodeGroup.id == GENERAL
        return native_counts(stack).get("NodeGroupForNode", 0) - before

    assert lookup() == 0, "the first labelled lookup of a snapshot goes to Python"
    assert backend._observed_labels[GENERAL] == {"topology.kubernetes.io/zone": "fr-par-1"}
    assert lookup() == 1, "then the front answers"
    stack.advance(1)  # a new snapshot: its labels are recorded anew
    assert lookup() == 0
    assert lookup() == 1


def scrape(stack: Stack) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.in_process.http_port}/metrics", timeout=5) as r:
        text: str = r.read().decode()
    return text


def sample(text: str, name: str, method: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'grpc_method="{method}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_natively_answered_calls_are_in_the_grpc_server_series(stack: Stack) -> None:
    start = scrape(stack)
    for _ in range(5):
        stack.target(GENERAL)
    with pytest.raises(grpc.RpcError):
        stack.target("no-such-pool")  # answered by Python: counted by its call path
    text = scrape(stack)
    method = "NodeGroupTargetSize"
    for name in ("grpc_server_started_total", "grpc_server_handling_seconds_count"):
        assert sample(text, name, method) - sample(start, name, method) == 6, name
    ok = f'grpc_code="OK",grpc_method="{method}"'
    handled = [line for line in text.splitlines() if line.startswith("grpc_server_handled_total") and ok in line]
    assert handled and float(handled[0].rsplit(" ", 1)[1]) >= 5
    inf_bucket = [
        line
        for line in text.splitlines()
        if line.startswith("grpc_server_handling_seconds_bucket")
        and f'grpc_method="{method}"' in line
        and "+Inf" in line
    ]
    assert len(inf_bucket) == 1, "one series per method, whoever answered"
    assert text.count("# TYPE grpc_server_started_total counter") == 1


@pytest.mark.parametrize("mode", ["tls", "mtls"])
def test_tls_and_client_certificates_as_on_the_grpcio_engine(tmp_path: Path, mode: str) -> None:
    with running_stack(tmp_path, scaleway=SCENARIO, server_extra=NATIVE, tls=mode) as s:
        assert s.pki is not None
        assert s.target(GENERAL) == 3
        assert native_counts(s)["NodeGroupTargetSize"] >= 1
        health = health_pb2_grpc.HealthStub(s.channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        if mode == "mtls":
            no_cert = open_channel(s.address, client_credentials(s.pki, with_cert=False))
            with pytest.raises(grpc.RpcError) as info:
                raw_call(no_cert, "NodeGroups", b"")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            other = open_channel(s.address, client_credentials(s.pki, other=True))
            with pytest.raises(grpc.RpcError) as info:
                raw_call(other, "NodeGroups", b"")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        plaintext = grpc.insecure_channel(s.address)
        with pytest.raises(grpc.RpcError) as info:
            raw_call(plaintext, "NodeGroups", b"")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_native_engine_process_never_loads_grpcio_and_serves_every_service(tmp_path: Path) -> None:
    """The point of handing calls to Python in-process: grpcio's ~15 MiB are never mapped."""
    with ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()) as sim:
        server = ServerProcess(server_config([scaleway_backend(sim)], **NATIVE), workdir=tmp_path)
        try:
            maps = Path(f"/proc/{server.process.pid}/maps").read_text()
            assert "ca_externalgrpc_native" in maps and "cygrpc" not in maps
            with grpc.insecure_channel(server.address) as channel:
                assert raw_call(channel, "NodeGroups", b"")  # native
                refresh = raw_call(channel, "Refresh", b"")  # Python, in the same process
                assert pb.RefreshResponse.FromString(refresh) == pb.RefreshResponse()
                code, details = status_of(channel, "NodeGroupTargetSize", b"\x0a\x02\xff\xfe")
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "NodeGroupTargetSizeRequest" in details
                with pytest.raises(grpc.RpcError) as info:
                    channel.unary_unary("/no.Such/Method")(b"", timeout=5)
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
                health = health_pb2_grpc.HealthStub(channel)
                check = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
                assert check.status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.RpcError) as info:
                    health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
                listed = reflection_services(channel)
                assert SERVICE_NAME in listed and "grpc.health.v1.Health" in listed
            assert "cygrpc" not in Path(f"/proc/{server.process.pid}/maps").read_text()
        finally:
            server.stop()


def reflection_services(channel: grpc.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    answers = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    return [s.name for s in answers[0].list_services_response.service]


def test_sigterm_received_by_a_front_thread_still_drains_the_server(tmp_path: Path) -> None:
    """The kernel may hand a process's SIGTERM to any thread: here to one of the front's, on purpose."""
    with ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()) as sim:
        server = ServerProcess(server_config([scaleway_backend(sim)], **NATIVE), workdir=tmp_path)
        try:
            tasks = Path(f"/proc/{server.process.pid}/task")
            front = [int(t.name) for t in tasks.iterdir() if (t / "comm").read_text().startswith("native-front")]
            assert front, "the front's threads are named native-front"
            number = SYS_TGKILL.get(os.uname().machine)
            if number is None:
                pytest.skip(f"no tgkill syscall number known for {os.uname().machine}")
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.syscall(number, server.process.pid, front[0], signal.SIGTERM) == 0, ctypes.get_errno()
            assert server.process.wait(timeout=10) == 0
            assert "signal received; draining" in server.output
        finally:
            server.stop(signal.SIGKILL)


def test_a_listing_that_changes_no_machine_keeps_the_node_lookups_a_new_machine_rebuilds_them(
    stack: Stack,
) -> None:
    assert stack.scaleway is not None
    service = stack.server.service
    _, published = build_tables(service)
    stack.sync()  # the same machines: the same lookups, not built again
    tables, lookups = build_tables(service, published)
    assert lookups.same_as(published) and tables["for_node"] is None
    known = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL))[0]
    request = pb.NodeGroupForNodeRequest(node=node(known)).SerializeToString()
    assert raw_call(stack.channel, "NodeGroupForNode", request) == python_answer(stack, "NodeGroupForNode", request)[2]

    stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=10)
    # Past "creating": the new machine is listed with its providerID (Kapsule lists none while it creates it).
    stack.advance(SCENARIO["timings"]["creating"] + 1)
    tables, lookups = build_tables(service, published)
    assert not lookups.same_as(published) and tables["for_node"] is not None
    new = set(n.provider_id for n in stack.scaleway.nodes_of(GENERAL)) - {known}
    before = native_counts(stack).get("NodeGroupForNode", 0)
    for provider_id in new:
        request = pb.NodeGroupForNodeRequest(node=node(provider_id)).SerializeToString()
        answer = pb.NodeGroupForNodeResponse.FromString(raw_call(stack.channel, "NodeGroupForNode", request))
        assert answer.nodeGroup.id == GENERAL, provider_id
    assert native_counts(stack)["NodeGroupForNode"] == before + len(new), "answered from the rebuilt table"


def test_templates_are_pythons_first_then_native_until_a_nodes_labels_change_them(stack: Stack) -> None:
    request = pb.NodeGroupTemplateNodeInfoRequest(id=GENERAL).SerializeToString()

    def answered_natively() -> tuple[int, bytes]:
        before = native_counts(stack).get("NodeGroupTemplateNodeInfo", 0)
        answer = raw_call(stack.channel, "NodeGroupTemplateNodeInfo", request)
        assert answer == python_answer(stack, "NodeGroupTemplateNodeInfo", request)[2]
        return native_counts(stack).get("NodeGroupTemplateNodeInfo", 0) - before, answer

    assert answered_natively()[0] == 0, "the first call after a publication is Python's"
    count, first = answered_natively()
    assert count == 1, "then the front gives Python's answer"
    # A real node of the group with a label that describes its machine type: the template now carries it.
    assert stack.scaleway is not None
    member = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL))[0]
    labelled = pb.NodeGroupForNodeRequest(
        node=node(member, {"feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true"})
    ).SerializeToString()
    raw_call(stack.channel, "NodeGroupForNode", labelled)
    count, changed = answered_natively()
    assert count == 0 and changed != first, "forgotten: Python builds the new template"
    assert answered_natively() == (1, changed)
    stack.sync()  # a new publication: Python's again, once
    assert answered_natively()[0] == 0
