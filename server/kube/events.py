"""Kubernetes Events for scale actions, failed cloud writes and backends going stale or fresh.

The Events are about one ConfigMap the server keeps in its namespace (``kubernetes.events.object_name``),
which also holds a short human-readable status, so ``kubectl describe configmap <name>`` shows both and
``kubectl get events`` lists them. Events are core/v1 Events, as the cluster-autoscaler writes its own:
``count`` and ``lastTimestamp`` grow when a repeat is aggregated, and kubectl shows them as "(x5 over 2m)".

Nothing here runs on an RPC's time: the hooks put a small record on a bounded queue and return; one
background thread turns records into API writes. A full queue drops the record (counted). Writes are
rate-limited per (reason, object) by a token bucket, and a repeat of the same reason and message within
``aggregation_window`` is folded into the existing Event (PATCH of its count) rather than a new one;
repeats that arrive while the bucket is empty are counted and written with the next token, so counts
stay exact while the API server sees at most ``burst`` writes plus one per ``refill_interval``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from providers.backend import KIND_WORDS, Backend
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudAuthFailed,
    CloudRequestRejected,
    CloudUnavailable,
    DomainError,
    GroupBusy,
)
from providers.model import InstanceState, NodeRef
from providers.registry import Registry
from server.kube.calls import api_status
from server.kube.client import MERGE_PATCH, KubeConnection, core_path
from server.kube.settings import EventsConfig
from server.logs import redact
from server.metrics import PREFIX
from server.service import ScaleAction

log = logging.getLogger(__name__)

#: ``source.component`` and ``reportingComponent`` of every Event
COMPONENT = "ca-externalgrpc"
NORMAL = "Normal"
WARNING = "Warning"

# Reasons (CamelCase, as the cluster-autoscaler names its own); docs/reference/kubernetes-features.md has the table.
SCALED_UP_GROUP = "ScaledUpGroup"  # IncreaseSize applied
SCALED_DOWN_GROUP = "ScaledDownGroup"  # DecreaseTargetSize applied
DELETED_NODES = "DeletedNodes"  # DeleteNodes applied
FAILED_SCALE_UP = "FailedScaleUp"  # IncreaseSize failed at the cloud (or its outcome is unknown)
FAILED_SCALE_DOWN = "FailedScaleDown"  # DecreaseTargetSize failed at the cloud
FAILED_TO_DELETE_NODE = "FailedToDeleteNode"  # DeleteNodes failed at the cloud, for some node at least
BACKEND_STALE = "BackendStale"  # a backend stopped serving: its cloud state is beyond max_staleness
BACKEND_FRESH = "BackendFresh"  # a backend that did not serve serves again
# the cloud refuses a backend's configuration (credentials, cluster id, region): no retry cures it
BACKEND_REFUSED = "BackendRefused"

_SUCCESS = {"increase": SCALED_UP_GROUP, "decrease": SCALED_DOWN_GROUP, "delete": DELETED_NODES}
_FAILURE = {"increase": FAILED_SCALE_UP, "decrease": FAILED_SCALE_DOWN, "delete": FAILED_TO_DELETE_NODE}
_RPC = {"increase": "IncreaseSize", "decrease": "DecreaseTargetSize", "delete": "DeleteNodes"}
#: errors that come from the cloud (a refused, failed or unconfirmed write); the others are refusals of
#: the request itself (bad delta, bounds, unknown node), answered to the CA and not worth an Event
CLOUD_FAILURES: tuple[type[DomainError], ...] = (
    CloudUnavailable,
    CloudRequestRejected,
    CloudAuthFailed,
    GroupBusy,
    ChangeOutcomeUnknown,
)

#: records waiting for the writer; beyond this the newest is dropped (a stuck API server)
QUEUE_SIZE = 1000
#: Event series remembered for aggregation; the oldest are forgotten first beyond this
MAX_SERIES = 1000
#: the API server refuses longer messages for the events.k8s.io view; keep every Event readable in both
MAX_MESSAGE = 1024
#: nodes named in one DeleteNodes message
MAX_NAMED_NODES = 10
#: after the status ConfigMap could not be written or read, try again this much later
OBJECT_RETRY = 30.0
DROP_REASONS = ("rate_limited", "queue_full", "api_error", "not_leader")
#: how long a stopping writer keeps writing what is queued (plus the API call under way)
STOP_BUDGET = 3.0


# ---------------------------------------------------------------------------------------------- pure logic
class TokenBucket:
    """``burst`` tokens at most; one more every ``refill_interval`` seconds (clock values are monotonic)."""

    def __init__(self, burst: int, refill_interval: float, now: float) -> None:
        self.burst = burst
        self.refill_interval = refill_interval
        self._tokens = float(burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.refill_interval)
        self._at = max(self._at, now)

    def take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def next_token_at(self, now: float) -> float:
        """When ``take`` will next succeed."""
        self._refill(now)
        return now if self._tokens >= 1.0 else now + (1.0 - self._tokens) * self.refill_interval


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What one Event says; equal specs within the window are one Event with a growing count."""

    reason: str
    type: str
    message: str
    action: str
    related_node: str = ""  # the Node a single-node DeleteNodes is about


@dataclass(slots=True)
class EventSeries:
    """One Event object: its occurrences so far and how many of them the API server has seen."""

    spec: EventSpec
    first_seen: float  # wall clock (Event timestamps)
    last_seen: float
    last_seen_mono: float
    count: int = 1
    written_count: int = 0
    name: str = ""  # metadata.name once created

    @property
    def pending(self) -> bool:
        return self.count > self.written_count


@dataclass
class EventBook:
    """Aggregation and rate limiting, without I/O: which Event writes are due, and when the next one is.

    ``record`` returns the series of the occurrence, or None when it is dropped: a new distinct Event
    whose bucket is empty. A repeat is never dropped: it raises its series' count and waits for a token.
    """

    burst: int
    refill_interval: float
    window: float
    object_name: str
    series: dict[EventSpec, EventSeries] = field(default_factory=dict)
    buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)
    # Series whose token was taken when they were recorded: their first write needs no other one.
    reserved: set[EventSpec] = field(default_factory=set)

    def _bucket(self, reason: str, now: float) -> TokenBucket:
        key = (reason, self.object_name)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(self.burst, self.refill_interval, now)
        return bucket

    def record(self, spec: EventSpec, wall: float, now: float) -> EventSeries | None:
        self._forget(now)
        found = self.series.get(spec)
        # A repeat within the window joins its Event, and so does any repeat of one with unwritten
        # occurrences (its count must not be lost by starting another).
        if found is not None and (found.pending or now - found.last_seen_mono <= self.window):
            found.count += 1
            found.last_seen, found.last_seen_mono = wall, now
            return found
        if not self._bucket(spec.reason, now).take(now):
            return None
        self.series.pop(spec, None)
        created = self.series[spec] = EventSeries(spec, wall, wall, now)
        self.reserved.add(spec)
        return created

    def due(self, now: float) -> list[EventSeries]:
        """Series to write now (create or patch), each having taken its token."""
        out = []
        for spec, series in self.series.items():
            if not series.pending:
                continue
            if spec in self.reserved:
                self.reserved.discard(spec)
                out.append(series)
            elif self._bucket(spec.reason, now).take(now):
                out.append(series)
        return out

    def next_due_at(self, now: float) -> float | None:
        """When a pending repeat will get its token (None: nothing waits)."""
        times = [
            self._bucket(spec.reason, now).next_token_at(now)
            for spec, series in self.series.items()
            if series.pending and spec not in self.reserved
        ]
        return min(times) if times else None

    def written(self, series: EventSeries, name: str, count: int) -> None:
        series.name = name
        series.written_count = max(series.written_count, count)

    def drop_unwritten(self) -> int:
        """Forget every series with occurrences not yet written (this replica stopped leading); returns how
        many occurrences that drops."""
        dropped = 0
        for spec, series in list(self.series.items()):
            if series.pending:
                dropped += series.count - series.written_count
                del self.series[spec]
                self.reserved.discard(spec)
        return dropped

    def failed(self, series: EventSeries) -> None:
        """The API server refused the write: forget the series (a later occurrence starts a new one)."""
        self.series.pop(series.spec, None)
        self.reserved.discard(series.spec)

    def _forget(self, now: float) -> None:
        expired = [s for s, v in self.series.items() if not v.pending and now - v.last_seen_mono > self.window]
        for spec in expired:
            del self.series[spec]
        while len(self.series) >= MAX_SERIES:
            oldest = min(self.series.values(), key=lambda v: v.last_seen_mono)
            del self.series[oldest.spec]
            self.reserved.discard(oldest.spec)


# ---------------------------------------------------------------------------------------------- messages
def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 15] + " ...(truncated)"


def _node_names(nodes: Iterable[NodeRef]) -> str:
    listed = list(nodes)
    shown = [f"{n.name or '?'} ({n.provider_id})" if n.provider_id else (n.name or "?") for n in listed]
    extra = len(shown) - MAX_NAMED_NODES
    return ", ".join(shown[:MAX_NAMED_NODES]) + (f" and {extra} more" if extra > 0 else "")


def scale_event(action: ScaleAction) -> EventSpec | None:
    """The Event for one mutating RPC's outcome, or None when it was a refusal of the request itself."""
    rpc = _RPC.get(action.action)
    if rpc is None:
        return None
    where = f"node group {action.group_id} (backend {action.backend})"
    related = action.nodes[0].name if len(action.nodes) == 1 else ""
    if action.error is None:
        target = "" if action.target is None else f"; target size now {action.target}"
        if action.action == "increase":
            message = f"Scaled up {where} by {action.delta}{target}"
        elif action.action == "decrease":
            message = f"Lowered the target size of {where} by {-action.delta} (machines not yet created){target}"
        else:
            message = f"Deleted {len(action.nodes)} node(s) of {where}: {_node_names(action.nodes)}{target}"
        return EventSpec(_SUCCESS[action.action], NORMAL, _cut(message), rpc, related)
    if not isinstance(action.error, CLOUD_FAILURES):
        return None
    # The cloud's reason, with every configured secret and secret-looking value masked.
    reason = redact(str(action.error)[: MAX_MESSAGE * 2])
    # An unconfirmed change may have been applied: say so rather than "failed".
    outcome = "was not confirmed by the cloud" if isinstance(action.error, ChangeOutcomeUnknown) else "failed"
    if action.action == "delete":
        message = f"Deleting {len(action.nodes)} node(s) of {where} {outcome} ({_node_names(action.nodes)}): {reason}"
    else:
        message = f"{rpc} of {where} by {action.delta} {outcome}: {reason}"
    return EventSpec(_FAILURE[action.action], WARNING, _cut(message), rpc, related)


def backend_event(backend: Backend, serving: bool) -> EventSpec:
    health = backend.health()
    if serving:
        groups = len(list(backend.groups()))
        return EventSpec(
            BACKEND_FRESH, NORMAL, f"Backend {backend.name} serves its {groups} node group(s) again", "Sync"
        )
    error = redact(health.last_error[: MAX_MESSAGE * 2]) or "none"
    if health.refused:
        what = KIND_WORDS.get(health.kind, "the cloud refused it")
        kept = "it serves no node group" if not health.synced else "its last good snapshot is served for now"
        return EventSpec(
            BACKEND_REFUSED,
            WARNING,
            _cut(f"Backend {backend.name}: {what}; {kept}. Check {health.check}. Last error: {error}"),
            "Sync",
        )
    if not health.synced:
        state = "has no cloud state yet"
    else:
        state = (
            f"serves nothing: its last good sync is {health.age or 0:.0f}s old "
            f"(bound {backend.settings.max_staleness:.0f}s)"
        )
    return EventSpec(BACKEND_STALE, WARNING, _cut(f"Backend {backend.name} {state}; last error: {error}"), "Sync")


def render_status(backends: Iterable[Backend]) -> str:
    """The status ConfigMap's text: each backend's state and each group's sizes (no ages: it changes only
    when something an operator cares about changes)."""
    lines = []
    for backend in backends:
        health = backend.health()
        if health.refused:
            state = f"REFUSED BY THE CLOUD ({health.kind}; check {health.check})"
        elif health.serving:
            state = "serving"
        elif not health.synced:
            state = "NOT SYNCED YET"
        else:
            state = f"STALE (beyond max_staleness {backend.settings.max_staleness:.0f}s)"
        error = f"; last error: {redact(health.last_error[:300])}" if health.last_error else ""
        lines.append(f"backend {backend.name}: {state}{error}")
        groups = sorted(backend.groups(), key=lambda g: g.id)
        if groups:
            lines.append(f"  {'NODE GROUP':<40} {'MIN':>4} {'MAX':>4} {'TARGET':>6}  INSTANCES")
        for group in groups:
            try:
                target = backend.target_size(group.id)
            except DomainError:
                continue
            counts: dict[str, int] = {}
            for inst in group.instances:
                name = "failed" if inst.error is not None else InstanceState(inst.state).name.lower()
                counts[name] = counts.get(name, 0) + 1
            detail = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            lines.append(
                f"  {group.id:<40} {group.min_size:>4} {group.max_size:>4} {target:>6}  "
                f"{len(group.instances)}" + (f" ({detail})" if detail else "")
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- metrics
class EventMetrics:
    """``ca_externalgrpc_events_written_total`` and ``ca_externalgrpc_events_dropped_total``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            PREFIX + "events_written_total",
            "Kubernetes Events written: created, or patched when a repeat was aggregated into one.",
            ("event_reason", "operation"),
            registry=registry,
        )
        self.dropped = Counter(
            PREFIX + "events_dropped_total",
            "Kubernetes Event occurrences not written: rate_limited (bucket empty), queue_full (the writer "
            "is behind), api_error (the API server refused or did not answer), not_leader (this replica "
            "stopped leading before they were written).",
            ("reason",),
            registry=registry,
        )
        for reason in DROP_REASONS:  # present from the start, so an alert on a rise works at once
            self.dropped.labels(reason)


# ---------------------------------------------------------------------------------------------- writer
@dataclass(frozen=True, slots=True)
class _Occurrence:
    spec: EventSpec
    wall: float
    mono: float


_STOP = object()


class EventRecorder:
    """The hooks (``scale_action``, ``backend_synced``) and the one thread that writes to the API server."""

    def __init__(
        self,
        config: EventsConfig,
        connection: KubeConnection,
        backends: Iterable[Backend],
        metrics: EventMetrics,
        clock: Callable[[], float] = time.monotonic,
        leads: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        # With leader election, only the leader reports: a follower syncs nothing, so its backends'
        # state says nothing about the clouds, and two writers would fight over the status ConfigMap.
        self._leads = leads
        self.connection = connection
        self.backends = tuple(backends)
        self.metrics = metrics
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_SIZE)
        self._book = EventBook(config.burst, config.refill_interval, config.aggregation_window, config.object_name)
        self._serving: dict[str, bool] = {}
        self._serving_lock = threading.Lock()
        self._status_dirty = threading.Event()
        self._status_dirty.set()
        self._object_uid = ""
        self._object_version = ""
        self._object_retry_at = 0.0
        self._status_text = ""
        self._status_written_at = -1e9
        self._api_failures = 0
        self._stopping = threading.Event()
        self._stop_by = 0.0
        self._thread = threading.Thread(target=self._run, name="kube-events", daemon=True)

    # ------------------------------------------------------------------ hooks (any thread, never block)
    def scale_action(self, action: ScaleAction) -> None:
        """Observer for ``CloudProviderService.scale_observers``."""
        self._status_dirty.set()
        spec = scale_event(action)
        if spec is not None:
            self._offer(spec)

    def backend_synced(self, backend: Backend) -> None:
        """Listener for ``Backend.listeners`` (after every sync attempt): Events on serving changes."""
        self._status_dirty.set()
        self._check_backend(backend)

    def _check_backend(self, backend: Backend) -> None:
        if not self._leads():
            with self._serving_lock:
                self._serving.clear()  # a new term starts from "serving" again, after its first sync
            return
        health = backend.health()
        if not health.synced and health.consecutive_failures == 0:
            return  # its first sync has not ended yet: nothing to say
        serving = health.usable  # serving and not refused by the cloud (credentials, cluster, region)
        with self._serving_lock:
            # A backend is expected to serve: a first sync that succeeds says nothing, one that fails is stale.
            before = self._serving.get(backend.name, True)
            self._serving[backend.name] = serving
        if before != serving:
            self._status_dirty.set()
            self._offer(backend_event(backend, serving))

    def _offer(self, spec: EventSpec) -> None:
        try:
            self._queue.put_nowait(_Occurrence(spec, time.time(), self._clock()))
        except queue.Full:
            self.metrics.dropped.labels("queue_full").inc()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EventRecorder:
        for backend in self.backends:
            self._check_backend(backend)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Write what the buckets allow of what is queued, for STOP_BUDGET at most, then end."""
        self._stop_by = self._clock() + STOP_BUDGET
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)  # wakes the thread at once; without it, it notices within a second
        # Bounded: an unreachable API server must not hold up the server's shutdown. The thread is not
        # left running past this either: a call under way ends within request_timeout (no retries).
        self._thread.join(timeout=STOP_BUDGET + self.connection.request_timeout + 1.0)

    # ------------------------------------------------------------------ the writer thread
    def _run(self) -> None:
        stopping = False
        while not stopping:
            now = self._clock()
            wake = [now + 1.0]  # staleness and the status are checked each second
            pending = self._book.next_due_at(now)
            if pending is not None:
                wake.append(pending)
            try:
                item = self._queue.get(timeout=max(0.0, min(wake) - now))
            except queue.Empty:
                item = None
            items = [item] if item is not None else []
            while len(items) < 200:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                # Ends after a step that knew it was the last one (it writes the final status); a stop that
                # came during a step gets one more.
                stopping = self._step(items)
            except Exception:  # the writer must survive any surprise; the server does not depend on it
                log.exception("writing Kubernetes Events failed unexpectedly")
                stopping = self._stopping.is_set()

    def _step(self, items: list[Any]) -> bool:
        stopping = self._stopping.is_set()
        for backend in self.backends:  # staleness grows without a sync attempt too
            self._check_backend(backend)
        for item in items:
            if item is _STOP:
                stopping = True
                continue
            if self._book.record(item.spec, item.wall, item.mono) is None:
                self.metrics.dropped.labels("rate_limited").inc()
        now = self._clock()
        leads = self._leads()
        if not leads:
            # A replica that stopped leading writes nothing more, not even what it queued while it led:
            # the new leader reports from then on, and two writers would interleave their Events.
            dropped = self._book.drop_unwritten()
            if dropped:
                self.metrics.dropped.labels("not_leader").inc(dropped)
            return stopping
        # After a failed ConfigMap write, the next waits for OBJECT_RETRY (Events go on meanwhile).
        status_allowed = now >= self._object_retry_at
        if not self._object_uid and status_allowed:
            self._write_status(now, force=True)
        for series in self._book.due(now):
            if self._out_of_time() or not self._leads():
                return stopping
            self._write_event(series)
        # The last step before the writer ends writes a changed status whatever the interval: the
        # ConfigMap then shows the state the server stopped in.
        due = stopping or now - self._status_written_at >= self.config.status_interval
        if self._status_dirty.is_set() and due and status_allowed and not self._out_of_time() and self._leads():
            self._write_status(now)
        return stopping

    def _out_of_time(self) -> bool:
        return self._stopping.is_set() and self._clock() > self._stop_by

    # ------------------------------------------------------------------ API writes
    def _api_failed(self, what: str, err: Exception) -> None:
        self._api_failures += 1
        # The first failure and then every 100th: a refusing API server must not flood the log either.
        if self._api_failures == 1 or self._api_failures % 100 == 0:
            log.warning(
                "Kubernetes API write for Events failed; autoscaling is unaffected",
                extra={"what": what, "error": _api_error(err), "failures": self._api_failures},
            )

    def _event_body(self, series: EventSeries, name: str) -> dict[str, Any]:
        spec = series.spec
        namespace = self.connection.namespace
        involved = {"apiVersion": "v1", "kind": "ConfigMap", "name": self.config.object_name, "namespace": namespace}
        if self._object_uid:
            involved["uid"] = self._object_uid  # kubectl describe finds Events by the object's uid
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": spec.reason,
            "message": spec.message,
            "type": spec.type,
            "action": spec.action,
            "count": series.count,
            "firstTimestamp": _timestamp(series.first_seen),
            "lastTimestamp": _timestamp(series.last_seen),
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.connection.identity,
        }
        if spec.related_node:
            body["related"] = {"apiVersion": "v1", "kind": "Node", "name": spec.related_node}
        return body

    def _write_event(self, series: EventSeries) -> None:
        connection = self.connection
        namespace = self.connection.namespace
        count = series.count
        timeout = self.connection.request_timeout
        try:
            if series.name:
                patch = {"count": count, "lastTimestamp": _timestamp(series.last_seen)}
                try:
                    connection.request(
                        "PATCH",
                        core_path("events", namespace, series.name),
                        body=patch,
                        timeout=timeout,
                        content_type=MERGE_PATCH,
                    )
                    self._book.written(series, series.name, count)
                    self.metrics.written.labels(series.spec.reason, "patch").inc()
                    return
                except Exception as err:
                    if api_status(err) != 404:
                        raise
                    # The Event expired (the API server keeps them about an hour): a new one carries the count.
            name = f"{self.config.object_name}.{time.time_ns():x}"
            body = self._event_body(series, name)
            connection.request("POST", core_path("events", namespace), body=body, timeout=timeout)
            self._book.written(series, name, count)
            self.metrics.written.labels(series.spec.reason, "create").inc()
        except Exception as err:  # ApiException, connection errors, timeouts: the Event is lost, counted
            self._book.failed(series)
            self.metrics.dropped.labels("api_error").inc(max(count - series.written_count, 1))
            self._api_failed(f"event {series.spec.reason}", err)

    def _write_status(self, now: float, force: bool = False) -> None:
        """Create or update the status ConfigMap when its text changed (or, ``force``, to learn its uid)."""
        self._status_dirty.clear()
        text = render_status(self.backends)
        if text == self._status_text and not force:
            return
        connection = self.connection
        namespace, name = connection.namespace, self.config.object_name
        timeout = connection.request_timeout
        stamp = _timestamp(time.time())
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": COMPONENT},
            "annotations": {"ca-externalgrpc/updated": stamp, "ca-externalgrpc/updated-by": connection.identity},
        }
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"status": text}}
        path = core_path("configmaps", namespace, name)
        try:
            try:
                if not self._object_version:
                    current = connection.request("GET", path, timeout=timeout)
                    self._object_version = current["metadata"]["resourceVersion"]
                meta["resourceVersion"] = self._object_version  # changed since the read: 409
                saved = connection.request("PUT", path, body=body, timeout=timeout)
            except Exception as err:
                status = api_status(err)
                if status == 404:
                    meta.pop("resourceVersion", None)
                    saved = connection.request("POST", core_path("configmaps", namespace), body=body, timeout=timeout)
                elif status == 409:  # changed by someone else since our read: read again next time
                    self._object_version = ""
                    self._status_dirty.set()
                    return
                else:
                    raise
        except Exception as err:
            self._object_version = ""
            self._object_retry_at = now + OBJECT_RETRY
            self._status_dirty.set()
            self._api_failed("status ConfigMap", err)
            return
        self._object_uid = saved["metadata"]["uid"]
        self._object_version = saved["metadata"]["resourceVersion"]
        self._status_text = text
        self._status_written_at = now


def _timestamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _api_error(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {redact(str(err))[:300]}"


def start_events(
    config: EventsConfig,
    connection: KubeConnection,
    registry: Registry,
    metrics_registry: CollectorRegistry,
    leads: Callable[[], bool] = lambda: True,
) -> EventRecorder:
    """Start the writer thread and hook it to every backend's sync (the caller hooks the servicer).

    ``leads`` (leader election's ``Leadership.holds``): backend and status reports only while it is true.
    """
    recorder = EventRecorder(config, connection, registry.backends, EventMetrics(metrics_registry), leads=leads)
    for backend in registry.backends:
        backend.listeners.append(recorder.backend_synced)
    return recorder.start()
