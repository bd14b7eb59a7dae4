"""Leader election on a coordination.k8s.io/v1 Lease: two or more replicas, one of them writes.

Only the leader syncs with the clouds and changes them. The others (followers) read nothing from the
clouds, refuse mutating RPCs with UNAVAILABLE naming the leader, and fail /readyz so a Service routes
the CA to the leader only.

Two parts:

* ``Leadership``: what this replica may do *now*, decided by its own monotonic clock and never by a
  call to the API server. A leader may write until ``renew_deadline`` after the start of its last
  successful renewal; past that it stops at once, even while its elector thread is still waiting for
  the API server. Another replica can take the Lease only after ``lease_duration`` (longer) since it
  last saw the Lease change, so two replicas never write at the same time while clocks advance at
  the same rate (no wall clocks are compared across machines).
* ``LeaderElector``: a thread that every ``retry_period`` reads the Lease, and creates, renews or
  takes it over with an update guarded by the Lease's resourceVersion (the API server refuses an
  update based on a stale read with 409 Conflict, so two replicas can never both win one round).

Written on ``CoordinationV1Api`` rather than the client's ``kubernetes.leaderelection`` package: that
one judges expiry by comparing wall-clock times, runs its callbacks without telling when the last
successful renewal started (which the write gate needs), and does not release the Lease on shutdown.

A leader that steps down (it could not renew in time, or saw another holder) becomes a follower in the
same process: it pauses syncing and keeps campaigning. When it leads again it syncs first; mutating
RPCs and /readyz wait for that sync, as after any take-over.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from providers.errors import NotLeader
from server.kube.settings import LeaderElectionConfig

log = logging.getLogger(__name__)

# The shortest time an API call of the elector is given; below this it would only time out.
_MIN_CALL_TIMEOUT = 0.2


class Leadership:
    """This replica's role, readable from any thread without I/O. Thread-safe."""

    def __init__(
        self, config: LeaderElectionConfig, identity: str = "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.identity = identity
        self._clock = clock
        self._lock = threading.Lock()
        self._term = 0  # counts this replica's terms as leader
        self._leading = False
        self._renew_started_at = -math.inf  # monotonic start of the last successful acquire or renew
        self._synced_term = 0  # the term whose first sync is done
        self._holder = ""  # the holder last read from the Lease ("" = none or unknown)

    # ------------------------------------------------------------------ queries (any thread, no I/O)
    def holds(self) -> bool:
        """Leader, and still within renew_deadline of the last renewal: may write to the clouds."""
        with self._lock:
            return self._holds_locked()

    def _holds_locked(self) -> bool:
        return self._leading and self._clock() < self._renew_started_at + self.config.renew_deadline

    def serving(self) -> bool:
        """Holds the Lease and has synced since taking it: may answer mutating RPCs."""
        with self._lock:
            return self._holds_locked() and self._synced_term == self._term

    def leader(self) -> str:
        """The leader's identity as last seen ("" when unknown)."""
        with self._lock:
            return self.identity if self._holds_locked() else self._holder

    def check_write(self, what: str) -> None:
        """The cloud transports' write gate: raise NotLeader unless this replica holds the Lease."""
        if not self.holds():
            raise NotLeader(f"{what} not sent: {self._why_not()}")

    def check_mutation(self, rpc: str) -> None:
        """The servicer's gate for mutating RPCs: raise NotLeader unless leader and synced."""
        if self.serving():
            return
        if self.holds():
            raise NotLeader(
                f"{rpc} refused: {self._me()} has just become the leader and syncs with the "
                "cloud before it changes anything; retry in a few seconds"
            )
        raise NotLeader(f"{rpc} refused: {self._why_not()}")

    def readiness(self) -> tuple[bool, str]:
        """For /readyz: ready only on the leader after its first sync, so a Service routes to it alone."""
        if self.serving():
            return True, f"leader ({self.identity})"
        if self.holds():
            return False, f"leader ({self.identity}), first sync pending"
        return False, f"follower; leader is {self.leader() or 'unknown'}"

    def _why_not(self) -> str:
        with self._lock:
            lapsed = self._leading  # still marked leader, but past its renew deadline
            holder = self._holder
        where = f"Lease {self.config.lease_name}"
        if lapsed:
            return (
                f"{self._me()} could not renew its {where} within renew_deadline "
                f"({self.config.renew_deadline:g}s) and stopped writing; the CA reaches the leader on retry"
            )
        leader = f"the leader is {holder}" if holder and holder != self.identity else "the leader is not known yet"
        return f"{self._me()} is not the leader ({where}); {leader}"

    def _me(self) -> str:
        # The identity is known once the election starts, a moment after the ports open.
        return f"this replica ({self.identity})" if self.identity else "this replica"

    # ------------------------------------------------------------------ transitions (elector thread)
    def acquired(self, renew_started_at: float) -> int:
        with self._lock:
            self._term += 1
            self._leading = True
            self._renew_started_at = renew_started_at
            self._holder = self.identity
            return self._term

    def renewed(self, renew_started_at: float) -> None:
        with self._lock:
            self._renew_started_at = max(self._renew_started_at, renew_started_at)

    def lost(self, holder: str = "") -> None:
        with self._lock:
            self._leading = False
            self._renew_started_at = -math.inf
            self._holder = holder if holder != self.identity else ""

    def observed(self, holder: str) -> None:
        with self._lock:
            self._holder = holder

    def synced(self, term: int) -> bool:
        """The first sync of ``term`` is done; False (and nothing changes) when that term already ended."""
        with self._lock:
            if term != self._term or not self._holds_locked():
                return False
            self._synced_term = term
            return True

    @property
    def term(self) -> int:
        with self._lock:
            return self._term

    @property
    def leading(self) -> bool:
        """Marked leader (the elector has not yet stepped down), whether or not the renew deadline passed."""
        with self._lock:
            return self._leading

    def deadline_left(self) -> float:
        with self._lock:
            return self._renew_started_at + self.config.renew_deadline - self._clock()


class LeaderElector:
    """Campaigns for the Lease and keeps it renewed; calls ``on_started`` and ``on_stopped`` on changes.

    ``on_started(term)`` runs in the elector thread and must return at once (start work elsewhere);
    ``on_stopped()`` too.
    """

    def __init__(
        self,
        coordination: Any,  # kubernetes.client.CoordinationV1Api
        namespace: str,
        leadership: Leadership,
        request_timeout: float,
        on_started: Callable[[int], None],
        on_stopped: Callable[[], None],
        on_api_error: Callable[[], None] = lambda: None,
        on_transition: Callable[[str], None] = lambda event: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = coordination
        self._namespace = namespace
        self._leadership = leadership
        self._config = leadership.config
        self._identity = leadership.identity
        self._request_timeout = request_timeout
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_api_error = on_api_error
        self._on_transition = on_transition
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._failing = False

    @property
    def _name(self) -> str:
        return self._config.lease_name

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning; a leader hands the Lease back so another replica takes over without waiting."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._request_timeout + 1)
        if self._leadership.leading:
            self._step_down("this replica is shutting down")
            self._release()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            try:
                self._try_acquire_or_renew(started)
                if self._failing:
                    self._failing = False
                    log.info("the leader Lease is reachable again", extra=self._log_fields())
            except Exception as err:  # an API server problem degrades the election, never crashes the loop
                self._on_api_error()
                level = logging.DEBUG if self._failing else logging.WARNING
                self._failing = True
                log.log(
                    level,
                    "reading or writing the leader Lease failed",
                    extra={**self._log_fields(), "error": _why(err)},
                )
            if self._leadership.leading and self._leadership.deadline_left() <= 0:
                self._step_down(f"could not renew the Lease within renew_deadline ({self._config.renew_deadline:g}s)")
            self._stop.wait(self._config.retry_period)

    def _call_timeout(self) -> float:
        """An API call never outlasts the renew deadline of a leader, so it notices a lapse at once."""
        timeout = self._request_timeout
        if self._leadership.leading:
            timeout = min(timeout, self._leadership.deadline_left())
        return max(timeout, _MIN_CALL_TIMEOUT)

    def _try_acquire_or_renew(self, started: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        now = dt.datetime.now(dt.UTC)
        duration_seconds = math.ceil(self._config.lease_duration)
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=self._call_timeout())
        except ApiException as err:
            if err.status != 404:
                raise
            spec = client.V1LeaseSpec(
                holder_identity=self._identity,
                lease_duration_seconds=duration_seconds,
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            )
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self._name, namespace=self._namespace), spec=spec)
            # 409 AlreadyExists when another replica created it first: this round is lost, the next reads it.
            self._api.create_namespaced_lease(self._namespace, body, _request_timeout=self._call_timeout())
            self._won(started)
            return
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, spec.renew_time, spec.acquire_time, lease.metadata.resource_version)
        if record != self._observed_record:
            # Expiry is measured from when this replica saw the record change, on its own clock.
            self._observed_record = record
            self._observed_at = self._clock()
        if holder and holder != self._identity:
            self._leadership.observed(holder)
            held_for = spec.lease_duration_seconds or duration_seconds
            if self._clock() < self._observed_at + held_for:
                if self._leadership.leading:
                    self._step_down(f"the Lease is held by {holder}", holder)
                return
            log.info("the leader's Lease expired; taking over", extra={**self._log_fields(), "previous": holder})
        if holder != self._identity:
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if holder else 0)
            spec.acquire_time = now
        spec.holder_identity = self._identity
        spec.renew_time = now
        spec.lease_duration_seconds = duration_seconds
        lease.spec = spec
        # metadata.resourceVersion of the read travels along: a Lease changed since then answers 409.
        self._api.replace_namespaced_lease(self._name, self._namespace, lease, _request_timeout=self._call_timeout())
        self._won(started)

    def _won(self, started: float) -> None:
        if self._leadership.leading:
            self._leadership.renewed(started)
            return
        term = self._leadership.acquired(started)
        self._on_transition("acquired")
        log.info("became the leader", extra={**self._log_fields(), "term": term})
        self._on_started(term)

    def _step_down(self, reason: str, holder: str = "") -> None:
        self._leadership.lost(holder)
        self._on_transition("lost")
        log.warning(
            "lost leadership; stopped writing to the clouds and syncing, now a follower",
            extra={**self._log_fields(), "reason": reason, "leader": holder or "unknown"},
        )
        self._on_stopped()

    def _release(self) -> None:
        """Best effort: an empty holder lets a follower take over at its next try, not after lease_duration."""
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=self._request_timeout)
            if lease.spec is None or lease.spec.holder_identity != self._identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self._api.replace_namespaced_lease(
                self._name, self._namespace, lease, _request_timeout=self._request_timeout
            )
            log.info("released the leader Lease", extra=self._log_fields())
        except Exception as err:  # the Lease then expires on its own after lease_duration
            self._on_api_error()
            log.warning("releasing the leader Lease failed", extra={**self._log_fields(), "error": _why(err)})

    def _log_fields(self) -> dict[str, Any]:
        return {"lease": f"{self._namespace}/{self._name}", "identity": self._identity}


def _why(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:300]


class LeaderMetrics:
    """``ca_externalgrpc_leader`` (read from the clock at scrape time), transitions and Lease API errors."""

    def __init__(self, registry: Any, leadership: Leadership) -> None:
        from prometheus_client import Counter, Gauge

        from server.metrics import PREFIX

        self.leader = Gauge(
            PREFIX + "leader",
            "1 while this replica holds the leader Lease within its renew deadline (it may write to the clouds), "
            "else 0.",
            registry=registry,
        )
        self.leader.set_function(lambda: 1.0 if leadership.holds() else 0.0)
        self.transitions = Counter(
            PREFIX + "leadership_transitions_total",
            "Times this replica became the leader (event=acquired) or stopped being it (event=lost).",
            ("event",),
            registry=registry,
        )
        for event in ("acquired", "lost"):
            self.transitions.labels(event)
        self.lease_errors = Counter(
            PREFIX + "leader_election_errors_total",
            "Failed calls to the Kubernetes API server for the leader Lease.",
            registry=registry,
        )


class Election:
    """Leader election wired to the server: gates the clouds' writes, starts and pauses the sync."""

    def __init__(
        self,
        connection: Any,  # server.kube.client.KubeConnection
        leadership: Leadership,
        registry: Any,  # providers.registry.Registry
        metrics: Any = None,  # server.metrics.Metrics
        liveness: Any = None,  # server.probes.Liveness
        start_backends: bool = True,
    ) -> None:
        leadership.identity = connection.identity
        self.leadership = leadership
        self._registry = registry
        self._liveness = liveness
        self._start_backends = start_backends
        self._metrics = LeaderMetrics(metrics.registry, leadership) if metrics is not None else None
        for backend in registry.backends:
            backend.adapter.guard_writes(leadership.check_write)
        registry.pause()  # a follower until elected: no sync, and no snapshot series to alert on
        self._elector = LeaderElector(
            connection.coordination(),
            connection.namespace,
            leadership,
            connection.request_timeout,
            on_started=self._started_leading,
            on_stopped=self._stopped_leading,
            on_api_error=self._api_error,
            on_transition=self._transition,
        )

    def start(self) -> None:
        self._elector.start()

    def stop(self) -> None:
        self._elector.stop()

    def _started_leading(self, term: int) -> None:
        # The first sync may take up to initial_sync_timeout per backend: never in the elector thread,
        # which must keep renewing meanwhile.
        threading.Thread(target=self._take_over, args=(term,), name=f"take-over-{term}", daemon=True).start()

    def _take_over(self, term: int) -> None:
        started = time.monotonic()
        if self._start_backends:
            if self._liveness is not None:
                self._liveness.watch(self._registry.backends)
            for backend in self._registry.backends:
                if self.leadership.term != term:
                    break
                backend.resume()  # a first sync (bounded), then its loop
            if self.leadership.term != term or not self.leadership.leading:
                self._registry.pause()  # stepped down meanwhile: undo a resume that raced the pause
                return
        if self.leadership.synced(term):
            log.info(
                "leader synced; serving mutating calls",
                extra={
                    "term": term,
                    "sync_s": round(time.monotonic() - started, 3),
                    "identity": self.leadership.identity,
                },
            )

    def _stopped_leading(self) -> None:
        self._registry.pause()
        if self._liveness is not None:
            self._liveness.unwatch(self._registry.backends)

    def _api_error(self) -> None:
        if self._metrics is not None:
            self._metrics.lease_errors.inc()

    def _transition(self, event: str) -> None:
        if self._metrics is not None:
            self._metrics.transitions.labels(event).inc()
