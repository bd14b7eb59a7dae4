"""server.metrics: gRPC interceptor codes, cloud/backend metrics, and the probe HTTP endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from server.metrics import Metrics, MetricsInterceptor, serve_http

SERVICE = "test.Echo"


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


# ---------------------------------------------------------------------- gRPC interceptor


def _ident(b: bytes) -> bytes:
    return b


def _handlers() -> grpc.GenericRpcHandler:
    def ok(request, context):
        return b"pong"

    def abort(request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "beyond max size")

    def raises(request, context):
        raise RuntimeError("bug")

    def set_code(request, context):
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details("no such group")
        return b""

    methods = {
        name: grpc.unary_unary_rpc_method_handler(fn, _ident, _ident)
        for name, fn in {"Ok": ok, "Abort": abort, "Raise": raises, "SetCode": set_code}.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


@pytest.fixture
def grpc_server():
    metrics = Metrics()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[MetricsInterceptor(metrics)])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield metrics, channel
    channel.close()
    server.stop(None)


def call(channel: grpc.Channel, method: str) -> grpc.StatusCode:
    stub = channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_ident, response_deserializer=_ident)
    try:
        stub(b"ping", timeout=5)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    "method, code",
    [("Ok", "OK"), ("Abort", "FAILED_PRECONDITION"), ("Raise", "UNKNOWN"), ("SetCode", "NOT_FOUND")],
)
def test_handled_total_records_the_code_the_client_sees(grpc_server, method, code):
    metrics, channel = grpc_server
    assert call(channel, method).name == code
    labels = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": method}
    assert value(metrics, "grpc_server_started_total", **labels) == 1
    assert value(metrics, "grpc_server_handled_total", **labels, grpc_code=code) == 1
    assert value(metrics, "grpc_server_handling_seconds_count", **labels) == 1


def test_handling_seconds_has_sub_millisecond_buckets(grpc_server):
    metrics, channel = grpc_server
    call(channel, "Ok")
    labels = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": "Ok"}
    assert value(metrics, "grpc_server_handling_seconds_bucket", **labels, le="0.0005") is not None
    assert value(metrics, "grpc_server_handling_seconds_bucket", **labels, le="5.0") == 1


def test_two_metrics_objects_do_not_share_a_registry():
    a, b = Metrics(), Metrics()
    a.scale_action("scw", "pool-a", "increase", "ok")
    assert (
        value(
            b, "ca_externalgrpc_scale_actions_total", backend="scw", node_group="pool-a", action="increase", result="ok"
        )
        is None
    )


# ---------------------------------------------------------------------- cloud API hook


def test_observe_cloud_request_counts_status_duration_and_retries():
    m = Metrics()
    m.observe_cloud_request("scaleway", "/k8s/v1/regions/{region}/pools", "get", 200, 0.12, False)
    m.observe_cloud_request("scaleway", "/k8s/v1/regions/{region}/pools", "GET", 503, 0.3, True)
    m.observe_cloud_request("scaleway", "/k8s/v1/regions/{region}/pools", "GET", TimeoutError(), 5.0, 2)
    ep = "/k8s/v1/regions/{region}/pools"
    name = "ca_externalgrpc_cloud_api_requests_total"
    assert value(m, name, provider="scaleway", endpoint=ep, method="GET", status="200") == 1
    assert value(m, name, provider="scaleway", endpoint=ep, method="GET", status="503") == 1
    assert value(m, name, provider="scaleway", endpoint=ep, method="GET", status="TimeoutError") == 1
    assert value(m, "ca_externalgrpc_cloud_api_retries_total", provider="scaleway", endpoint=ep) == 2
    assert (
        value(
            m,
            "ca_externalgrpc_cloud_api_request_duration_seconds_count",
            provider="scaleway",
            endpoint=ep,
            method="GET",
        )
        == 3
    )


def test_breaker_state_gauge_accepts_names_and_numbers():
    m = Metrics()
    m.set_breaker_state("bizfly", "open")
    assert value(m, "ca_externalgrpc_cloud_api_circuit_breaker_state", provider="bizfly") == 2
    m.set_breaker_state("bizfly", "half-open")
    assert value(m, "ca_externalgrpc_cloud_api_circuit_breaker_state", provider="bizfly") == 1
    m.set_breaker_state("bizfly", 0)
    assert value(m, "ca_externalgrpc_cloud_api_circuit_breaker_state", provider="bizfly") == 0


# ---------------------------------------------------------------------- backend listener


@dataclass(frozen=True)
class FakeInstance:
    id: str
    state: object
    error: object = None


@dataclass(frozen=True)
class FakeGroup:
    id: str
    min_size: int
    max_size: int
    target_size: int
    instances: tuple = ()


@dataclass
class FakeHealth:
    synced: bool = True
    age: float | None = 3.0
    stale: bool = False
    last_error: str = ""
    consecutive_failures: int = 0


@dataclass
class FakeSnapshot:
    groups: dict


@dataclass
class FakeBackend:
    name: str
    groups: dict = field(default_factory=dict)
    h: FakeHealth = field(default_factory=FakeHealth)

    @property
    def snapshot(self):
        return FakeSnapshot(self.groups)

    def health(self):
        return self.h


def test_observe_backend_sets_group_gauges_and_instance_states():
    from providers.model import InstanceError, InstanceState

    m = Metrics()
    insts = (
        FakeInstance("scaleway://a", InstanceState.RUNNING),
        FakeInstance("scaleway://b", InstanceState.CREATING),
        FakeInstance("scaleway://c", InstanceState.CREATING, InstanceError("quota", "no quota", 1)),
    )
    b = FakeBackend("scw", {"pool-a": FakeGroup("pool-a", 1, 10, 3, insts)})
    m.observe_backend(b)
    g = {"backend": "scw", "node_group": "pool-a"}
    assert value(m, "ca_externalgrpc_node_group_min_size", **g) == 1
    assert value(m, "ca_externalgrpc_node_group_max_size", **g) == 10
    assert value(m, "ca_externalgrpc_node_group_target_size", **g) == 3
    assert value(m, "ca_externalgrpc_node_group_instances", **g, state="running") == 1
    assert value(m, "ca_externalgrpc_node_group_instances", **g, state="creating") == 1
    assert value(m, "ca_externalgrpc_node_group_instances", **g, state="error") == 1
    assert value(m, "ca_externalgrpc_node_group_instances", **g, state="deleting") == 0
    assert value(m, "ca_externalgrpc_snapshot_age_seconds", backend="scw") == 3.0
    assert value(m, "ca_externalgrpc_last_sync_success_timestamp_seconds", backend="scw") > 0


def test_deleted_group_stops_being_reported():
    m = Metrics()
    b = FakeBackend("scw", {"a": FakeGroup("a", 0, 1, 0), "b": FakeGroup("b", 0, 1, 0)})
    m.observe_backend(b)
    b.groups = {"b": FakeGroup("b", 0, 1, 0)}
    m.observe_backend(b)
    assert value(m, "ca_externalgrpc_node_group_max_size", backend="scw", node_group="a") is None
    assert value(m, "ca_externalgrpc_node_group_max_size", backend="scw", node_group="b") == 1


def test_failed_sync_counts_an_error_and_keeps_age_growing():
    m = Metrics()
    b = FakeBackend("bfly")
    m.observe_backend(b)
    b.h = FakeHealth(age=120.0, last_error="cloud down", consecutive_failures=1)
    m.observe_backend(b)
    assert value(m, "ca_externalgrpc_sync_errors_total", backend="bfly") == 1
    b.h = FakeHealth(age=180.0, last_error="cloud down", consecutive_failures=1)
    assert value(m, "ca_externalgrpc_snapshot_age_seconds", backend="bfly") == 180.0  # read at scrape


def test_scale_action_accepts_backend_object_or_name():
    m = Metrics()
    m.scale_action(FakeBackend("scw"), "pool-a", "increase", "ok")
    m.scale_action("scw", "pool-a", "increase", "ok")
    assert (
        value(
            m, "ca_externalgrpc_scale_actions_total", backend="scw", node_group="pool-a", action="increase", result="ok"
        )
        == 2
    )


# ---------------------------------------------------------------------- HTTP endpoint


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_http_serves_metrics_healthz_and_readyz():
    m = Metrics()
    m.scale_action("scw", "pool-a", "increase", "ok")
    state = {"ready": (False, "scw: not synced yet")}
    endpoint = serve_http("127.0.0.1", 0, m, health_fn=lambda: True, ready_fn=lambda: state["ready"])
    try:
        base = f"http://127.0.0.1:{endpoint.port}"
        status, body = get(base + "/metrics")
        assert status == 200 and "ca_externalgrpc_scale_actions_total" in body
        assert get(base + "/healthz")[0] == 200
        assert get(base + "/readyz") == (503, "scw: not synced yet\n")
        state["ready"] = (True, "ready")
        assert get(base + "/readyz")[0] == 200
        assert get(base + "/nope")[0] == 404
    finally:
        endpoint.stop()


def test_readyz_accepts_plain_bool_and_survives_exceptions():
    def broken():
        raise RuntimeError("x")

    endpoint = serve_http("127.0.0.1", 0, None, ready_fn=broken)
    try:
        status, body = get(f"http://127.0.0.1:{endpoint.port}/readyz")
        assert status == 503 and "RuntimeError" in body
    finally:
        endpoint.stop()
    endpoint = serve_http("127.0.0.1", 0, None, ready_fn=lambda: True)
    try:
        assert get(f"http://127.0.0.1:{endpoint.port}/readyz")[0] == 200
    finally:
        endpoint.stop()


def test_metrics_output_contains_no_label_value_we_did_not_give():
    m = Metrics()
    m.observe_cloud_request("bizfly", "/_/{cluster}", "GET", 401, 0.1, False)
    text = m.exposition().decode()
    assert "X-Auth-Token" not in text and "password" not in text
