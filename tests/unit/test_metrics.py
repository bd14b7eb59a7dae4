"""server.metrics and server.probes: the codes of calls Python answers, cloud/backend metrics, standard process
metrics, and the probe HTTP endpoint with its liveness and readiness decisions."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from concurrent import futures
from dataclasses import dataclass, field

import pytest
from google.protobuf import wrappers_pb2

from providers.backend import SyncHealth
from server.metrics import BREAKER_STATES as STATES
from server.metrics import GRPC_BUCKETS, GRPC_CODE_LABELS, Metrics, grpc_code_label
from server.probes import Liveness, readiness, serve_http
from server.rpc import Abort, Code, Dispatcher, NativeCallContext, UnaryMethod

SERVICE = "test.Echo"


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


# ---------------------------------------------------------------------- calls Python answers


def _dispatcher(metrics: Metrics) -> Dispatcher:
    def ok(request, context):
        return wrappers_pb2.StringValue(value="pong " + request.value)

    def abort(request, context):
        raise Abort(Code.FAILED_PRECONDITION, "beyond max size")

    def raises(request, context):
        raise RuntimeError("bug")

    handlers = {"Ok": ok, "Abort": abort, "Raise": raises}
    return Dispatcher(
        [
            UnaryMethod(SERVICE, name, wrappers_pb2.StringValue, fn, *metrics.rpc_observer(SERVICE, name))
            for name, fn in handlers.items()
        ]
    )


PING = wrappers_pb2.StringValue(value="ping").SerializeToString()


@pytest.mark.parametrize(
    "method, data, code, label",
    [
        ("Ok", PING, "OK", "OK"),
        ("Abort", PING, "FAILED_PRECONDITION", "FailedPrecondition"),
        ("Raise", PING, "UNKNOWN", "Unknown"),
        ("Ok", b"\xff\xff", "INVALID_ARGUMENT", "InvalidArgument"),
    ],
)
def test_handled_total_records_the_code_the_client_sees(method, data, code, label):
    metrics = Metrics()
    answer = _dispatcher(metrics).call(f"/{SERVICE}/{method}", data, NativeCallContext(None, 0.0))
    assert answer[0].name == code
    labels = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": method}
    assert value(metrics, "grpc_server_started_total", **labels) == 1
    assert value(metrics, "grpc_server_handled_total", **labels, grpc_code=label) == 1
    assert value(metrics, "grpc_server_handling_seconds_count", **labels) == 1


def test_dispatch_answers_the_message_or_the_precise_error():
    dispatcher = _dispatcher(Metrics())
    context = NativeCallContext(None, 0.0)
    code, details, body = dispatcher.call(f"/{SERVICE}/Ok", PING, context)
    assert (code, details, wrappers_pb2.StringValue.FromString(body).value) == (Code.OK, "", "pong ping")
    code, details, _ = dispatcher.call(f"/{SERVICE}/Ok", b"\xff\xff", context)
    assert "not a valid google.protobuf.StringValue message" in details
    assert dispatcher.call(f"/{SERVICE}/Abort", PING, context)[:2] == (Code.FAILED_PRECONDITION, "beyond max size")
    assert dispatcher.call(f"/{SERVICE}/Nope", PING, context)[:2] == (Code.UNIMPLEMENTED, "Method not found!")


def test_handling_seconds_resolves_microsecond_answers_up_to_the_cas_deadline():
    # The measured answers (tests/monitoring/rpc_latency.py): native table reads 2-10 us, Python's reads
    # 10-300 us, size changes milliseconds to seconds; the CA's deadline 5-10 s.
    assert GRPC_BUCKETS[0] <= 0.000005 and GRPC_BUCKETS[-1] >= 10.0
    decades = [b for b in GRPC_BUCKETS if 0.00001 <= b <= 0.001]
    assert len(decades) >= 6, "at least three bounds per decade where the reads are"
    metrics = Metrics()
    _dispatcher(metrics).call(f"/{SERVICE}/Ok", PING, NativeCallContext(None, 0.0))
    labels = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": "Ok"}
    assert value(metrics, "grpc_server_handling_seconds_bucket", **labels, le="5e-06") is not None
    assert value(metrics, "grpc_server_handling_seconds_bucket", **labels, le="10.0") == 1


def test_grpc_code_labels_are_the_names_grpc_go_writes():
    # grpc-go's codes.Code.String() (go-grpc-prometheus writes it): one label per code, in code order.
    assert [grpc_code_label(code) for code in Code] == list(GRPC_CODE_LABELS)
    assert grpc_code_label(Code.CANCELLED) == "Canceled"
    assert grpc_code_label(Code.DEADLINE_EXCEEDED) == "DeadlineExceeded"
    assert grpc_code_label(Code.UNAVAILABLE) == "Unavailable"


def test_a_breaker_change_never_shows_every_state_at_zero():
    # A scrape may fall between two writes of one change: it must never read "no state" (all 0), which
    # an alert on "not closed" would take for a recovery.
    metrics = Metrics()
    metrics.set_breaker_state("scw", "scaleway", "closed")
    gauge = metrics.breaker_state
    gauge_labels = gauge.labels
    seen: list[float] = []

    def spying(*names: str):
        child = gauge_labels(*names)
        setter = child.set

        def set_and_look(v: float) -> None:
            setter(v)
            seen.append(max(value(metrics, gauge._name, backend="scw", api="scaleway", state=s) or 0 for s in STATES))

        child.set = set_and_look  # type: ignore[method-assign]
        return child

    gauge.labels = spying  # type: ignore[method-assign]
    for state in ("open", "half-open", "open", "half-open", "closed"):
        metrics.set_breaker_state("scw", "scaleway", state)
    assert seen and min(seen) == 1.0


def test_sync_errors_start_at_zero_for_every_watched_backend():
    metrics = Metrics()
    metrics.watch_backends([FakeBackend("scw")])
    assert value(metrics, "ca_externalgrpc_sync_errors_total", backend="scw") == 0.0


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
    metrics = Metrics()
    m = metrics.for_backend("scw-par")
    ep = "/k8s/v1/regions/{region}/pools"
    m.observe_cloud_request("scaleway", ep, "get", 200, 0.12, False)
    m.observe_cloud_request("scaleway", ep, "GET", 503, 0.3, True)
    m.observe_cloud_request("scaleway", ep, "GET", TimeoutError(), 5.0, 2)
    name = "ca_externalgrpc_cloud_api_requests_total"
    labels = {"backend": "scw-par", "api": "scaleway", "endpoint": ep, "method": "GET"}
    assert value(metrics, name, **labels, status="200") == 1
    assert value(metrics, name, **labels, status="503") == 1
    assert value(metrics, name, **labels, status="TimeoutError") == 1
    retries = value(metrics, "ca_externalgrpc_cloud_api_retries_total", backend="scw-par", api="scaleway", endpoint=ep)
    assert retries == 2
    assert value(metrics, "ca_externalgrpc_cloud_api_request_duration_seconds_count", **labels) == 3


def test_two_backends_of_one_cloud_keep_separate_series():
    m = Metrics()
    m.for_backend("scw-par").observe_cloud_request("scaleway", "pools", "GET", 429, 0.1)
    m.for_backend("scw-ams").observe_cloud_request("scaleway", "pools", "GET", 200, 0.1)
    name = "ca_externalgrpc_cloud_api_requests_total"
    common = {"api": "scaleway", "endpoint": "pools", "method": "GET"}
    assert value(m, name, backend="scw-par", **common, status="429") == 1
    assert value(m, name, backend="scw-ams", **common, status="429") is None
    assert value(m, name, backend="scw-ams", **common, status="200") == 1


def test_breaker_state_is_one_series_per_state_with_the_current_one_at_1():
    m = Metrics()
    view = m.for_backend("bfly")
    name = "ca_externalgrpc_cloud_api_circuit_breaker_state"

    def states() -> dict[str, float | None]:
        return {s: value(m, name, backend="bfly", api="bizfly", state=s) for s in ("closed", "half-open", "open")}

    view.set_breaker_state("bizfly", "open")
    assert states() == {"closed": 0, "half-open": 0, "open": 1}
    view.set_breaker_state("bizfly", "half-open")
    assert states() == {"closed": 0, "half-open": 1, "open": 0}
    view.set_breaker_state("bizfly", "closed")
    assert states() == {"closed": 1, "half-open": 0, "open": 0}
    with pytest.raises(ValueError, match="unknown circuit breaker state"):
        view.set_breaker_state("bizfly", "ajar")


def test_exposition_has_process_metrics_build_info_and_no_created_series():
    m = Metrics()
    m.scale_action("scw", "pool-a", "increase", "ok")
    m.for_backend("scw").observe_cloud_request("scaleway", "pools", "GET", 200, 0.1)
    text = m.exposition().decode()
    assert "process_resident_memory_bytes " in text
    assert "process_cpu_seconds_total " in text
    assert "process_open_fds " in text
    assert "python_info{" in text
    info = [line for line in text.splitlines() if line.startswith("ca_externalgrpc_build_info{")]
    assert len(info) == 1 and info[0].endswith(" 1.0")
    for label in ("version=", "python=", "grpcio="):
        assert label in info[0]
    assert "_created" not in text


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


def FakeHealth(  # noqa: N802 - stands for the class it builds
    synced: bool = True,
    age: float | None = 3.0,
    stale: bool = False,
    last_error: str = "",
    consecutive_failures: int = 0,
    kind: str = "",
    check: str = "",
) -> SyncHealth:
    return SyncHealth(synced, age, stale, last_error, consecutive_failures, kind, check)


@dataclass
class FakeSnapshot:
    groups: dict


@dataclass
class FakeBackend:
    name: str
    groups: dict = field(default_factory=dict)
    h: SyncHealth = field(default_factory=FakeHealth)

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
    assert value(m, "ca_externalgrpc_snapshot_stale", backend="scw") == 0
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
    b.h = FakeHealth(age=180.0, stale=True, last_error="cloud down", consecutive_failures=1)
    assert value(m, "ca_externalgrpc_snapshot_age_seconds", backend="bfly") == 180.0  # read at scrape
    assert value(m, "ca_externalgrpc_snapshot_stale", backend="bfly") == 1


def test_sync_failure_has_one_series_per_reason_and_clears_after_a_good_sync():
    m = Metrics()
    failing = FakeHealth(
        synced=False, age=None, stale=True, last_error="401", consecutive_failures=2, kind="credentials"
    )
    b = FakeBackend("scw", h=failing)
    m.watch_backends([b])
    reasons = ("credentials", "not_found", "rejected", "unreachable")
    assert [value(m, "ca_externalgrpc_backend_sync_failure", backend="scw", reason=r) for r in reasons] == [1, 0, 0, 0]
    b.h = FakeHealth()
    assert [value(m, "ca_externalgrpc_backend_sync_failure", backend="scw", reason=r) for r in reasons] == [0, 0, 0, 0]


def test_watched_backend_reports_stale_before_its_first_sync():
    m = Metrics()
    b = FakeBackend("scw", h=FakeHealth(synced=False, age=None, stale=True))
    m.watch_backends([b])
    assert value(m, "ca_externalgrpc_snapshot_stale", backend="scw") == 1
    assert value(m, "ca_externalgrpc_snapshot_age_seconds", backend="scw") is None


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
    state = {"live": (True, "ok"), "ready": (False, "shutting down")}
    endpoint = serve_http("127.0.0.1", 0, m, live=lambda: state["live"], ready=lambda: state["ready"])
    try:
        base = f"http://127.0.0.1:{endpoint.port}"
        status, body = get(base + "/metrics")
        assert status == 200 and "ca_externalgrpc_scale_actions_total" in body
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/readyz") == (503, "shutting down\n")
        state["ready"] = (True, "ready")
        assert get(base + "/readyz")[0] == 200
        state["live"] = (False, "wedged: x")
        assert get(base + "/healthz") == (503, "wedged: x\n")
        assert get(base + "/nope")[0] == 404
    finally:
        endpoint.stop()


def test_a_check_that_raises_answers_503_naming_the_exception():
    def broken():
        raise RuntimeError("x")

    endpoint = serve_http("127.0.0.1", 0, None, live=broken, ready=broken)
    try:
        status, body = get(f"http://127.0.0.1:{endpoint.port}/readyz")
        assert status == 503 and "RuntimeError" in body
        assert get(f"http://127.0.0.1:{endpoint.port}/healthz")[0] == 503
    finally:
        endpoint.stop()


def test_metrics_output_contains_no_label_value_we_did_not_give():
    m = Metrics()
    m.observe_cloud_request("bfly", "bizfly", "worker pool", "GET", 401, 0.1, False)
    text = m.exposition().decode()
    assert "X-Auth-Token" not in text and "password" not in text


# ---------------------------------------------------------------------- readiness and liveness decisions


@dataclass
class FakeSettings:
    max_staleness: float = 600.0


@dataclass
class WatchedBackend(FakeBackend):
    settings: FakeSettings = field(default_factory=FakeSettings)


def test_readiness_stays_ready_while_the_snapshot_is_stale_or_not_synced_yet():
    """In the Service layout an unready pod loses its endpoint: the CA must keep reaching Refresh."""
    backends = [
        FakeBackend("scw", h=FakeHealth(synced=False, age=None, stale=True, last_error="first sync pending")),
        FakeBackend("bfly", h=FakeHealth(age=900.0, stale=True, last_error="503 from the cloud")),
    ]
    ready, body = readiness(lambda: False, backends)
    assert ready
    assert "scw: not synced yet" in body and "bfly: snapshot 900s old, Refresh answers UNAVAILABLE" in body


def test_readiness_fails_while_draining():
    ready, body = readiness(lambda: True, [FakeBackend("scw")])
    assert not ready and body.startswith("shutting down")


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HeldExecutor:
    """An executor whose workers are all stuck: submitted tasks wait until released."""

    def __init__(self) -> None:
        self.queued: list = []

    def submit(self, fn):
        self.queued.append(fn)

    def run_queued(self) -> None:
        while self.queued:
            self.queued.pop(0)()


def test_liveness_tolerates_a_busy_pool_and_fails_when_it_stays_wedged():
    clock, pool = ManualClock(), HeldExecutor()
    live = Liveness(pool, wedged_after=60.0, clock=clock)
    assert live.check() == (True, "ok")  # queues a canary
    clock.now += 59
    assert live.check()[0], "busy for less than the bound is not wedged"
    assert len(pool.queued) == 1, "one canary at a time"
    clock.now += 2
    alive, reason = live.check()
    assert not alive and "gRPC worker pool has not run a queued task for 61s" in reason
    pool.run_queued()
    assert live.check()[0]


def test_liveness_fails_when_a_sync_loop_stops_finishing_attempts_not_when_the_cloud_fails():
    clock = ManualClock()
    live = Liveness(None, clock=clock)
    failing = WatchedBackend("scw", h=FakeHealth(stale=True, consecutive_failures=5))
    live.watch([failing])
    for _ in range(30):  # a failing cloud: attempts keep ending, with errors
        clock.now += 60
        live.sync_attempt_ended(failing)
        assert live.check()[0]
    clock.now += 1201  # silent for more than twice max_staleness (600 s)
    alive, reason = live.check()
    assert not alive and "scw: the sync loop has not finished an attempt for 1201s" in reason


def test_liveness_on_a_real_thread_pool_recovers_once_the_stuck_worker_is_released():
    clock, release = ManualClock(), threading.Event()
    with futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(release.wait, 10)  # the only worker is stuck
        live = Liveness(pool, wedged_after=60.0, clock=clock)
        assert live.check()[0]  # queues the canary behind the stuck task
        clock.now += 61
        assert not live.check()[0]
        release.set()
        pool.submit(lambda: None).result(timeout=5)  # FIFO: the canary has run by now
        assert live.check()[0]


def test_calls_the_native_engine_answered_join_the_grpc_server_series():
    metrics = Metrics()
    service = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
    labels = ("unary", service, "NodeGroupTargetSize")
    metrics.grpc_started.labels(*labels).inc()
    metrics.grpc_handled.labels(*labels, "OK").inc()
    metrics.grpc_handled.labels(*labels, "NotFound").inc()
    metrics.grpc_handling_seconds.labels(*labels).observe(0.002)
    # 3 calls in the first bucket (<= 5 us), 1 in the +Inf slot, as the extension reports them
    per_bucket = [3] + [0] * (len(GRPC_BUCKETS) - 1) + [1]
    metrics.add_native_calls(
        lambda: [
            (service, "NodeGroupTargetSize", 4, per_bucket, 12.5),
            (service, "NodeGroups", 2, [2] + [0] * len(GRPC_BUCKETS), 0.001),
        ]
    )
    text = metrics.exposition().decode()
    where = f'grpc_method="NodeGroupTargetSize",grpc_service="{service}",grpc_type="unary"'
    assert f"grpc_server_started_total{{{where}}} 5.0" in text
    assert f'grpc_server_handled_total{{grpc_code="OK",{where}}} 5.0' in text
    assert f'grpc_server_handled_total{{grpc_code="NotFound",{where}}} 1.0' in text
    assert f'grpc_server_handling_seconds_bucket{{{where},le="5e-06"}} 3.0' in text
    assert f'grpc_server_handling_seconds_bucket{{{where},le="0.0025"}} 4.0' in text  # Python's 2 ms call
    assert f'grpc_server_handling_seconds_bucket{{{where},le="+Inf"}} 5.0' in text
    assert f"grpc_server_handling_seconds_count{{{where}}} 5.0" in text
    assert f"grpc_server_handling_seconds_sum{{{where}}} 12.502" in text
    only_native = f'grpc_method="NodeGroups",grpc_service="{service}",grpc_type="unary"'
    assert f"grpc_server_started_total{{{only_native}}} 2.0" in text
    assert f'grpc_server_handling_seconds_bucket{{{only_native},le="10.0"}} 2.0' in text
    assert text.count("# TYPE grpc_server_handled_total counter") == 1
