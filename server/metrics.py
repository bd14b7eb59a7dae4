"""Prometheus metrics for the server, and the small plaintext HTTP endpoint that serves them.

Everything lives in one dedicated ``CollectorRegistry`` owned by a ``Metrics`` object, so tests can
create as many servers as they like in one process without "Duplicated timeseries" errors, and
nothing from the global registry (which other libraries may write to) leaks onto /metrics.

Families (docs/operations.md has the full reference):

* standard gRPC server metrics, named as py-grpc-prometheus / go-grpc-prometheus name them, so
  existing dashboards work: ``grpc_server_started_total``, ``grpc_server_handled_total``,
  ``grpc_server_handling_seconds``;
* ``ca_externalgrpc_*``: cloud API calls, retries, circuit breaker, node groups, sync, scale actions.

Label values are always identifiers we chose (backend names, node-group ids, endpoint templates,
status codes); never a URL with a query string, a header or a credential.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from server.interceptors import UnaryInterceptor

log = logging.getLogger(__name__)

PREFIX = "ca_externalgrpc_"

#: sub-millisecond in-memory reads up to the CA's default 5 s gRPC deadline (plus a margin)
GRPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: cloud HTTP calls: tens of ms on a good day, up to the transport's longest timeout
CLOUD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: instance states reported per group; always all present so a state going to zero is visible
INSTANCE_STATES = ("running", "creating", "deleting", "unspecified", "error")


class BreakerState(enum.IntEnum):
    """Value of ``ca_externalgrpc_cloud_api_circuit_breaker_state``."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


_BREAKER_NAMES = {
    "closed": BreakerState.CLOSED,
    "half-open": BreakerState.HALF_OPEN,
    "half_open": BreakerState.HALF_OPEN,
    "open": BreakerState.OPEN,
}


class Metrics:
    """All metric families of one server process, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        grpc_labels = ("grpc_type", "grpc_service", "grpc_method")
        self.grpc_started = Counter("grpc_server_started_total", "RPCs started on the server.", grpc_labels, registry=r)
        self.grpc_handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure.",
            (*grpc_labels, "grpc_code"),
            registry=r,
        )
        self.grpc_handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time the server took to handle an RPC, from receipt to the handler returning.",
            grpc_labels,
            buckets=GRPC_BUCKETS,
            registry=r,
        )
        self.cloud_requests = Counter(
            PREFIX + "cloud_api_requests_total",
            "HTTP requests sent to a cloud API, by outcome (HTTP status or error class).",
            ("provider", "endpoint", "method", "status"),
            registry=r,
        )
        self.cloud_request_seconds = Histogram(
            PREFIX + "cloud_api_request_duration_seconds",
            "Duration of one HTTP request to a cloud API (one attempt).",
            ("provider", "endpoint", "method"),
            buckets=CLOUD_BUCKETS,
            registry=r,
        )
        self.cloud_retries = Counter(
            PREFIX + "cloud_api_retries_total",
            "Cloud API requests that were attempts after the first (retries).",
            ("provider", "endpoint"),
            registry=r,
        )
        self.breaker_state = Gauge(
            PREFIX + "cloud_api_circuit_breaker_state",
            "Circuit breaker towards a cloud API: 0 closed, 1 half-open, 2 open.",
            ("provider",),
            registry=r,
        )
        group_labels = ("backend", "node_group")
        self.group_min = Gauge(PREFIX + "node_group_min_size", "Node group minimum size.", group_labels, registry=r)
        self.group_max = Gauge(PREFIX + "node_group_max_size", "Node group maximum size.", group_labels, registry=r)
        self.group_target = Gauge(
            PREFIX + "node_group_target_size", "Node group target size as last seen.", group_labels, registry=r
        )
        self.group_instances = Gauge(
            PREFIX + "node_group_instances",
            "Instances of a node group by state, from the last snapshot.",
            (*group_labels, "state"),
            registry=r,
        )
        self.last_sync_success = Gauge(
            PREFIX + "last_sync_success_timestamp_seconds",
            "Unix time of the last successful sync with the cloud.",
            ("backend",),
            registry=r,
        )
        self.sync_errors = Counter(
            PREFIX + "sync_errors_total", "Failed syncs with the cloud.", ("backend",), registry=r
        )
        self.scale_actions = Counter(
            PREFIX + "scale_actions_total",
            "Mutating node-group actions (increase, decrease, delete) by result.",
            ("backend", "node_group", "action", "result"),
            registry=r,
        )
        self._snapshot_age = _SnapshotAgeCollector()
        r.register(self._snapshot_age)
        self._groups: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ gRPC
    def interceptor(self) -> MetricsInterceptor:
        return MetricsInterceptor(self)

    # ------------------------------------------------------------------ cloud API (transport hook)
    def observe_cloud_request(
        self,
        provider: str,
        endpoint: str,
        method: str,
        status_or_error: int | str | BaseException | None,
        seconds: float,
        retried: bool | int = False,
    ) -> None:
        """Record one HTTP attempt. ``endpoint`` must be a route template, never a concrete URL.

        ``status_or_error`` is the HTTP status code, or an error class name / exception when no
        response arrived (``timeout``, ``connection``...). ``retried`` is true for every attempt
        after the first (an int attempt number > 0 counts as retried too).
        """
        status = _status_label(status_or_error)
        method = method.upper()
        self.cloud_requests.labels(provider, endpoint, method, status).inc()
        self.cloud_request_seconds.labels(provider, endpoint, method).observe(max(seconds, 0.0))
        if retried:
            self.cloud_retries.labels(provider, endpoint).inc()

    def set_breaker_state(self, provider: str, state: BreakerState | int | str) -> None:
        value = _BREAKER_NAMES[state.lower()] if isinstance(state, str) else BreakerState(int(state))
        self.breaker_state.labels(provider).set(int(value))

    # ------------------------------------------------------------------ backends (sync listener)
    def observe_backend(self, backend: Any) -> None:
        """Listener for ``Backend.listeners``: called after every sync attempt."""
        name = backend.name
        self._snapshot_age.track(backend)
        health = backend.health()
        if health.consecutive_failures > 0:
            self.sync_errors.labels(name).inc()
            return
        self.last_sync_success.labels(name).set(time.time())
        self.observe_groups(name, backend.snapshot.groups.values())

    def observe_groups(self, backend: str, groups: Iterable[Any]) -> None:
        """Replace the per-group gauges of ``backend`` with the given ``GroupState`` values."""
        seen: set[str] = set()
        for g in groups:
            seen.add(g.id)
            self.group_min.labels(backend, g.id).set(g.min_size)
            self.group_max.labels(backend, g.id).set(g.max_size)
            self.group_target.labels(backend, g.id).set(g.target_size)
            counts = dict.fromkeys(INSTANCE_STATES, 0)
            for inst in g.instances:
                counts[_instance_state(inst)] += 1
            for state, count in counts.items():
                self.group_instances.labels(backend, g.id, state).set(count)
        with self._lock:
            gone = self._groups.get(backend, set()) - seen
            self._groups[backend] = seen
        for gid in gone:  # a deleted pool must not keep reporting its last size forever
            for gauge in (self.group_min, self.group_max, self.group_target):
                _remove(gauge, backend, gid)
            for state in INSTANCE_STATES:
                _remove(self.group_instances, backend, gid, state)

    # ------------------------------------------------------------------ scale actions (servicer hook)
    def scale_action(self, backend: Any, node_group: str, action: str, result: str) -> None:
        """Hook for ``CloudProviderService(on_scale_action=...)``; ``backend`` is a Backend or a name."""
        name = backend if isinstance(backend, str) else backend.name
        self.scale_actions.labels(name, node_group, action, result).inc()

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> bytes:
        return generate_latest(self.registry)


#: the name the server core imports
ServerMetrics = Metrics


def _status_label(value: int | str | BaseException | None) -> str:
    if value is None:
        return "error"
    if isinstance(value, bool):  # bool is an int; never a status
        return "error"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, BaseException):
        return type(value).__name__
    # an error class name chosen by the transport ("timeout", "connection", "breaker_open"...)
    return str(value)[:40]


def _instance_state(inst: Any) -> str:
    if getattr(inst, "error", None) is not None:
        return "error"
    state = getattr(inst, "state", None)
    name = getattr(state, "name", None)
    if isinstance(name, str) and name.lower() in INSTANCE_STATES:
        return name.lower()
    return "unspecified"


def _remove(metric: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)


class _SnapshotAgeCollector(Collector):
    """``ca_externalgrpc_snapshot_age_seconds``, computed at scrape time so it keeps growing while
    the cloud is down (a gauge set after each sync would freeze at the last good value), and
    ``ca_externalgrpc_backend_serving``: 1 while a backend serves its groups, 0 before its first good
    sync or beyond its staleness bound (the isolation rule: such a backend reports here, not by failing
    every CA loop)."""

    def __init__(self) -> None:
        self._backends: dict[str, weakref.ref[Any]] = {}
        self._lock = threading.Lock()

    def track(self, backend: Any) -> None:
        with self._lock:
            self._backends[backend.name] = weakref.ref(backend)

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family(), self._serving_family()]

    @staticmethod
    def _serving_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            PREFIX + "backend_serving",
            "1 while the backend serves its node groups (synced, within its staleness bound), else 0.",
            labels=("backend",),
        )

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            PREFIX + "snapshot_age_seconds",
            "Seconds since the snapshot being served was read from the cloud (absent before the first sync).",
            labels=("backend",),
        )

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = self._family()
        serving = self._serving_family()
        with self._lock:
            items = list(self._backends.items())
        for name, ref in items:
            backend = ref()
            if backend is None:
                continue
            try:
                health = backend.health()
            except Exception:  # a scrape must never fail because of one backend
                continue
            if health.age is not None:
                family.add_metric((name,), health.age)
            serving.add_metric((name,), 1.0 if health.synced and not health.stale else 0.0)
        yield family
        yield serving


# ---------------------------------------------------------------------- gRPC interceptor


class MetricsInterceptor(UnaryInterceptor):
    """Counts and times every unary-unary RPC, recording the status code the client will see.

    The handler either returns (code OK, unless it called ``context.set_code``), calls
    ``context.abort`` (which stores the code on the context and raises), or raises something else
    (grpcio turns it into UNKNOWN). ``ServicerContext.code()`` exists in grpcio >= 1.38 and is what
    we read; the exception is always re-raised so grpcio's own handling is unchanged.
    Streaming RPCs (reflection, health Watch) are passed through uncounted.
    """

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self._metrics = metrics

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        service, method = _split_method(full_method)
        inner = handler.unary_unary
        m = self._metrics
        started = m.grpc_started.labels("unary", service, method)
        seconds = m.grpc_handling_seconds.labels("unary", service, method)
        handled: dict[grpc.StatusCode, Any] = {}

        def count(code: grpc.StatusCode) -> None:
            child = handled.get(code)
            if child is None:
                child = handled[code] = m.grpc_handled.labels("unary", service, method, code.name)
            child.inc()

        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            started.inc()
            start = time.perf_counter()
            try:
                response = inner(request, context)
            except BaseException:
                seconds.observe(time.perf_counter() - start)
                count(_context_code(context) or grpc.StatusCode.UNKNOWN)
                raise
            seconds.observe(time.perf_counter() - start)
            count(_context_code(context) or grpc.StatusCode.OK)
            return response

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _split_method(full: str) -> tuple[str, str]:
    # "/package.Service/Method"
    _, _, rest = full.partition("/")
    service, _, method = rest.rpartition("/")
    return service or "unknown", method or "unknown"


def _context_code(context: Any) -> grpc.StatusCode | None:
    code_fn = getattr(context, "code", None)
    if code_fn is None:
        return None
    try:
        code = code_fn()
    except Exception:
        return None
    return code if isinstance(code, grpc.StatusCode) else None


# ---------------------------------------------------------------------- HTTP: /metrics /healthz /readyz


class HttpEndpoint:
    """A running probe/metrics HTTP server; ``.port`` is the bound port (useful with port 0)."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = httpd.server_address[0]
        self.port = int(httpd.server_address[1])

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve_http(
    host: str,
    port: int,
    metrics: Metrics | None,
    health_fn: Callable[[], bool] | None = None,
    ready_fn: Callable[[], bool | tuple[bool, str]] | None = None,
) -> HttpEndpoint:
    """Serve /metrics, /healthz and /readyz in a daemon thread; return at once.

    ``ready_fn`` may return a bool or ``(ready, reason)``; the reason is the 503 body.
    """

    class Handler(BaseHTTPRequestHandler):
        server_version = "ca-externalgrpc"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if metrics is None:
                    self._reply(404, b"metrics disabled\n")
                else:
                    self._reply(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = _call_bool(health_fn, default=True)
                self._reply(200 if ok else 503, b"ok\n" if ok else b"shutting down\n")
            elif path == "/readyz":
                ok, reason = _call_ready(ready_fn)
                body = (reason or ("ready" if ok else "not ready")).encode() + b"\n"
                self._reply(200 if ok else 503, body)
            else:
                self._reply(404, b"not found: try /metrics, /healthz, /readyz\n")

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def _reply(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server API
            log.debug("http %s", format % args)

    bind_host = host.strip("[]")
    server_cls = _server_class(bind_host)
    httpd = server_cls((bind_host, port), Handler)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="http-probes", daemon=True
    )
    thread.start()
    return HttpEndpoint(httpd, thread)


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    if ":" not in host:
        return ThreadingHTTPServer
    import socket

    class V6Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    return V6Server


def _call_bool(fn: Callable[[], bool] | None, default: bool) -> bool:
    if fn is None:
        return default
    try:
        return bool(fn())
    except Exception:
        log.exception("health check function failed")
        return False


def _call_ready(fn: Callable[[], bool | tuple[bool, str]] | None) -> tuple[bool, str]:
    if fn is None:
        return True, "ready"
    try:
        result = fn()
    except Exception as err:
        log.exception("readiness function failed")
        return False, f"readiness check failed: {type(err).__name__}"
    if isinstance(result, tuple):
        ok, reason = result
        return bool(ok), str(reason)
    return bool(result), ""
