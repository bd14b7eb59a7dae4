"""Prometheus metrics of the server, in a registry of their own.

Everything lives in one ``CollectorRegistry`` owned by a ``Metrics`` object, so tests can create as
many servers as they like in one process without "Duplicated timeseries" errors, and nothing from the
global registry (which other libraries may write to) leaks onto /metrics. The process, platform and
garbage-collector collectors are registered on it explicitly, so ``process_resident_memory_bytes``
and friends are there as on any Prometheus client.

Families (docs/reference/metrics.md has the full reference):

* standard gRPC server metrics, named and labelled as go-grpc-prometheus writes them, so dashboards
  and alerts written for Go gRPC servers work: ``grpc_server_started_total``,
  ``grpc_server_handled_total`` (``grpc_code`` spelled as grpc-go spells a code: ``OK``,
  ``Unavailable``, ``DeadlineExceeded``), ``grpc_server_handling_seconds``;
* ``ca_externalgrpc_*``: build info, cloud API calls, retries, circuit breaker, node groups, sync,
  scale actions. Every series about one backend carries a ``backend`` label (the configured name), so
  two backends of the same cloud never merge into one series.

No ``*_created`` series: they double the series count and no dashboard or alert of ours reads them.
Label values are always identifiers we chose (backend names, node-group ids, endpoint names, status
codes); never a URL with a query string, a header or a credential.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import platform
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from server.rpc import Code, Observer

log = logging.getLogger(__name__)

# A process-wide switch of prometheus_client, read when samples are produced: no ``*_created``.
prometheus_client.disable_created_metrics()

PREFIX = "ca_externalgrpc_"
#: the content type of ``Metrics.exposition()``, for the HTTP endpoint
EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_LATEST
DISTRIBUTION = "ca-externalgrpc-server"

#: From 5 us to 10 s, 1-2.5-5 per decade, chosen by measurement (tests/monitoring/rpc_latency.py,
#: docs/evidence/alerts.md): the native engine answers reads from its tables in 2-10 us, Python in
#: 10-300 us, size changes wait for the cloud (milliseconds to seconds), and the CA's deadline is 5 to
#: 10 s. With a first bound of 0.5 ms every read landed in the first bucket and a p99 read 0.495 ms.
GRPC_BUCKETS = (
    0.000005,
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: ``grpc_code`` label values, as grpc-go's ``codes.Code.String()`` writes them (go-grpc-prometheus uses
#: it), in the order of gRPC's code numbers. Not Python's UPPER_CASE names: note ``Canceled``.
GRPC_CODE_LABELS = (
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
)
#: cloud HTTP calls: tens of ms on a good day, up to the transport's longest timeout
CLOUD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: instance states reported per group; always all present so a state going to zero is visible
INSTANCE_STATES = ("running", "creating", "deleting", "unspecified", "error")
#: circuit breaker states; one series each, 1 for the current state and 0 for the others
BREAKER_STATES = ("closed", "half-open", "open")
_BREAKER_ALIASES = {"half_open": "half-open", "0": "closed", "1": "half-open", "2": "open"}


def grpc_code_label(code: Code) -> str:
    """The ``grpc_code`` label value of ``code`` (both serving engines' calls go through here)."""
    return GRPC_CODE_LABELS[code.value]


def build_labels() -> dict[str, str]:
    """``version`` of this server, ``python`` and ``grpcio`` versions, for ``ca_externalgrpc_build_info``."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        version = "unknown"
    try:
        grpcio = importlib.metadata.version("grpcio")  # read from its metadata: the native engine never loads it
    except importlib.metadata.PackageNotFoundError:
        grpcio = "none"
    return {"version": version, "python": platform.python_version(), "grpcio": grpcio}


class Metrics:
    """All metric families of one server process, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None, grpc_buckets: Sequence[float] = GRPC_BUCKETS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        #: the bounds of grpc_server_handling_seconds, for both engines (the native one counts into them too)
        self.grpc_buckets = tuple(grpc_buckets)
        r = self.registry
        # prometheus_client registers these on its global registry only; ours gets its own.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        info = build_labels()
        self.build_info = Gauge(
            PREFIX + "build_info",
            "Always 1; the labels say which server version runs on which Python and grpcio.",
            tuple(info),
            registry=r,
        )
        self.build_info.labels(**info).set(1)
        grpc_labels = ("grpc_type", "grpc_service", "grpc_method")
        # Not registered themselves: the collector below reports them with the calls the native
        # engine answered added in (server/native_front.py), so both land in the same series.
        self.grpc_started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", grpc_labels, registry=None
        )
        self.grpc_handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, regardless of success or failure, by grpc_code as grpc-go and "
            "go-grpc-prometheus spell a status code (OK, NotFound, FailedPrecondition, Unavailable, DeadlineExceeded).",
            (*grpc_labels, "grpc_code"),
            registry=None,
        )
        self.grpc_handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time the server took to answer an RPC (buckets 5 us to 10 s: reads from "
            "memory take microseconds, size changes wait for the cloud).",
            grpc_labels,
            buckets=self.grpc_buckets,
            registry=None,
        )
        self._server_calls = _ServerCallsCollector(
            self.grpc_started, self.grpc_handled, self.grpc_handling_seconds, self.grpc_buckets
        )
        r.register(self._server_calls)
        self.cloud_requests = Counter(
            PREFIX + "cloud_api_requests_total",
            "HTTP requests (attempts) sent to a cloud API, by outcome (HTTP status or error class).",
            ("backend", "api", "endpoint", "method", "status"),
            registry=r,
        )
        self.cloud_request_seconds = Histogram(
            PREFIX + "cloud_api_request_duration_seconds",
            "Duration of one HTTP request to a cloud API (one attempt).",
            ("backend", "api", "endpoint", "method"),
            buckets=CLOUD_BUCKETS,
            registry=r,
        )
        self.cloud_retries = Counter(
            PREFIX + "cloud_api_retries_total",
            "Cloud API requests that were attempts after the first (retries).",
            ("backend", "api", "endpoint"),
            registry=r,
        )
        self.cloud_write_checks = Counter(
            PREFIX + "cloud_write_checks_total",
            "Writes the cloud accepted that are read back because nothing shows the cloud applies them (check: "
            "desired_size_zero, a Bizfly pool set to 0), by result: confirmed, mismatch (the cloud does not show "
            "the change: the write is reported failed), unverified (the read-back failed; the write stands).",
            ("backend", "api", "check", "result"),
            registry=r,
        )
        self.breaker_state = Gauge(
            PREFIX + "cloud_api_circuit_breaker_state",
            "Circuit breaker towards a cloud API: 1 for the current state (closed, half-open, open), else 0.",
            ("backend", "api", "state"),
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
        self.kube_api_errors = Counter(
            PREFIX + "kube_api_errors_total",
            "Failed calls to the Kubernetes API server by an optional Kubernetes feature (it degrades, the "
            "autoscaling goes on).",
            ("feature", "operation"),
            registry=r,
        )
        self.journal_operations = Counter(
            PREFIX + "journal_operations_total",
            "Reads and writes of the durable change journal (kubernetes.journal) by operation (read, record, "
            "mark_unknown, clear) and result (ok, conflict: retried after a 409, failed).",
            ("backend", "operation", "result"),
            registry=r,
        )
        self._snapshots = _SnapshotCollector()
        r.register(self._snapshots)
        self._groups: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ gRPC
    def rpc_observer(self, service: str, method: str) -> tuple[Callable[[], None], Observer]:
        """Count one method's calls that Python answers: (at the start, with the code and seconds at the end)."""
        started = self.grpc_started.labels("unary", service, method)
        seconds = self.grpc_handling_seconds.labels("unary", service, method)
        handled: dict[Code, Any] = {}

        def observe(code: Code, elapsed: float) -> None:
            seconds.observe(elapsed)
            child = handled.get(code)
            if child is None:
                child = handled[code] = self.grpc_handled.labels("unary", service, method, grpc_code_label(code))
            child.inc()

        return started.inc, observe

    def journal_operation(self, backend: str, operation: str, result: str) -> None:
        """One call on the change journal (server/kube/journal.py)."""
        self.journal_operations.labels(backend, operation, result).inc()

    def add_native_calls(self, source: Callable[[], Sequence[NativeCall]]) -> None:
        """Report the calls ``source`` counted (the native engine's) in the gRPC server series."""
        self._server_calls.native = source

    # ------------------------------------------------------------------ cloud API (transport hook)
    def for_backend(self, backend: str) -> BackendMetrics:
        """The object a backend's HTTP transports report to; it adds the ``backend`` label."""
        return BackendMetrics(self, backend)

    def observe_cloud_request(
        self,
        backend: str,
        api: str,
        endpoint: str,
        method: str,
        status_or_error: int | str | BaseException | None,
        seconds: float,
        retried: bool | int = False,
    ) -> None:
        """Record one HTTP attempt. ``endpoint`` must be an endpoint name, never a concrete URL.

        ``api`` names the cloud API (``scaleway``, ``bizfly``, ``bizfly-token``...).
        ``status_or_error`` is the HTTP status code, or an error class name / exception when no
        response arrived (``timeout``, ``connection``...). ``retried`` is true for every attempt
        after the first (an int attempt number > 0 counts as retried too).
        """
        status = _status_label(status_or_error)
        method = method.upper()
        self.cloud_requests.labels(backend, api, endpoint, method, status).inc()
        self.cloud_request_seconds.labels(backend, api, endpoint, method).observe(max(seconds, 0.0))
        if retried:
            self.cloud_retries.labels(backend, api, endpoint).inc()

    def observe_write_check(self, backend: str, api: str, check: str, result: str) -> None:
        self.cloud_write_checks.labels(backend, api, check, result).inc()

    def set_breaker_state(self, backend: str, api: str, state: int | str) -> None:
        current = _breaker_state(state)
        # The new state's 1 first, then the others' 0: a scrape between the two writes sees two states
        # at 1 rather than none, so an alert on "not closed" never reads a gap as a recovery.
        self.breaker_state.labels(backend, api, current).set(1)
        for name in BREAKER_STATES:
            if name != current:
                self.breaker_state.labels(backend, api, name).set(0)

    # ------------------------------------------------------------------ backends (sync listener)
    def watch_backends(self, backends: Iterable[Any]) -> None:
        """Report the snapshot age and staleness of ``backends`` from now on, before their first sync."""
        for backend in backends:
            self._snapshots.track(backend)
            # Present at 0 from the start: "no failed sync" reads 0 on a dashboard, not No data.
            self.sync_errors.labels(backend.name)

    def observe_backend(self, backend: Any) -> None:
        """Listener for ``Backend.listeners``: called after every sync attempt."""
        name = backend.name
        self._snapshots.track(backend)
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

    def kube_api_error(self, feature: str, operation: str) -> None:
        """Hook for the Kubernetes features (server/kube/): one failed API call."""
        self.kube_api_errors.labels(feature, operation).inc()

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> bytes:
        return generate_latest(self.registry)


#: the name the server core imports
ServerMetrics = Metrics


class BackendMetrics:
    """What one backend's HTTP transports report to (``CloudAdapter.instrument``).

    The transports know the cloud API they talk to, not the backend they serve; this view adds the
    configured backend name, so two backends of one cloud keep separate series.
    """

    def __init__(self, metrics: Metrics, backend: str) -> None:
        self._metrics = metrics
        self.backend = backend

    def observe_cloud_request(
        self,
        api: str,
        endpoint: str,
        method: str,
        status_or_error: int | str | BaseException | None,
        seconds: float,
        retried: bool | int = False,
    ) -> None:
        self._metrics.observe_cloud_request(self.backend, api, endpoint, method, status_or_error, seconds, retried)

    def set_breaker_state(self, api: str, state: int | str) -> None:
        self._metrics.set_breaker_state(self.backend, api, state)

    def observe_write_check(self, api: str, check: str, result: str) -> None:
        """A write read back after the cloud accepted it (``CloudAdapter`` code calls it)."""
        self._metrics.observe_write_check(self.backend, api, check, result)


def _breaker_state(state: int | str) -> str:
    name = str(state).lower()
    name = _BREAKER_ALIASES.get(name, name)
    if name not in BREAKER_STATES:
        raise ValueError(f"unknown circuit breaker state {state!r}; expected one of {', '.join(BREAKER_STATES)}")
    return name


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


#: the ``reason`` label of ca_externalgrpc_backend_sync_failure (server/diagnosis.py, Diagnosis.kind)
SYNC_FAILURE_REASONS = ("credentials", "not_found", "rejected", "unreachable")


class _SnapshotCollector(Collector):
    """``ca_externalgrpc_snapshot_age_seconds`` and ``ca_externalgrpc_snapshot_stale``, computed at scrape
    time: a gauge set after each sync would freeze at the last good value while the cloud is down."""

    def __init__(self) -> None:
        self._backends: dict[str, weakref.ref[Any]] = {}
        self._lock = threading.Lock()

    def track(self, backend: Any) -> None:
        with self._lock:
            self._backends[backend.name] = weakref.ref(backend)

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        age = GaugeMetricFamily(
            PREFIX + "snapshot_age_seconds",
            "Seconds since the snapshot being served was read from the cloud (absent before the first sync).",
            labels=("backend",),
        )
        stale = GaugeMetricFamily(
            PREFIX + "snapshot_stale",
            "1 while the backend does not serve its groups: no sync has succeeded yet (its groups are not "
            "listed) or the snapshot is older than max_staleness (Refresh answers UNAVAILABLE), else 0.",
            labels=("backend",),
        )
        failure = GaugeMetricFamily(
            PREFIX + "backend_sync_failure",
            "One series per reason (credentials, not_found, rejected, unreachable): 1 for the reason of the "
            "backend's last sync while it failed, else 0. credentials, not_found and rejected need a fix of the "
            "config or the Secret; while no backend is usable Refresh answers UNAVAILABLE.",
            labels=("backend", "reason"),
        )
        return age, stale, failure

    def collect(self) -> Iterable[GaugeMetricFamily]:
        age_family, stale_family, failure_family = self._families()
        with self._lock:
            items = list(self._backends.items())
        for name, ref in items:
            backend = ref()
            if backend is None or getattr(backend, "paused", False):
                continue  # a follower replica (leader election) serves no snapshot: nothing to alert on
            try:
                health = backend.health()
            except Exception:  # a scrape must never fail because of one backend
                log.exception("reading the health of backend %s for /metrics failed", name)
                continue
            if health.age is not None:
                age_family.add_metric((name,), health.age)
            stale_family.add_metric((name,), 1 if health.stale else 0)
            failing = health.kind if health.consecutive_failures else ""
            for reason in SYNC_FAILURE_REASONS:
                failure_family.add_metric((name, reason), 1 if reason == failing else 0)
        yield age_family
        yield stale_family
        yield failure_family


#: one method's natively answered calls:
#: (service, method, calls, count per bucket of Metrics.grpc_buckets then +Inf, seconds)
NativeCall = tuple[str, str, int, Sequence[int], float]


class _ServerCallsCollector(Collector):
    """The three gRPC server families, the native engine's calls (all unary, all OK) added in."""

    def __init__(self, started: Counter, handled: Counter, seconds: Histogram, buckets: Sequence[float]) -> None:
        self._families = (started, handled, seconds)
        self._bounds = (*buckets, float("inf"))
        self.native: Callable[[], Sequence[NativeCall]] | None = None

    def describe(self) -> list[Metric]:
        return [family for metric in self._families for family in metric.describe()]

    def collect(self) -> Iterable[Metric]:
        native = list(self.native()) if self.native is not None else []
        started, handled, seconds = (next(iter(metric.collect())) for metric in self._families)
        for service, method, calls, buckets, total in native:
            labels = {"grpc_type": "unary", "grpc_service": service, "grpc_method": method}
            _add(started, "grpc_server_started_total", labels, calls)
            _add(handled, "grpc_server_handled_total", {**labels, "grpc_code": grpc_code_label(Code.OK)}, calls)
            cumulative = 0
            for bound, count in zip(self._bounds, buckets, strict=True):
                cumulative += count
                _add(
                    seconds, "grpc_server_handling_seconds_bucket", {**labels, "le": floatToGoString(bound)}, cumulative
                )
            _add(seconds, "grpc_server_handling_seconds_count", labels, calls)
            _add(seconds, "grpc_server_handling_seconds_sum", labels, total)
        return [started, handled, seconds]


def _add(family: Metric, name: str, labels: dict[str, str], value: float) -> None:
    """Add ``value`` to the sample ``name{labels}`` of ``family``, creating it if Python never served one."""
    for index, sample in enumerate(family.samples):
        if sample.name == name and sample.labels == labels:
            family.samples[index] = sample._replace(value=sample.value + value)
            return
    family.samples.append(Sample(name, labels, value))
