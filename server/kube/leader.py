"""Leader election on a coordination.k8s.io/v1 Lease: two or more replicas, one of them writes.

Only the leader syncs with the clouds and changes them. The others (followers) read nothing from the
clouds, refuse mutating RPCs with UNAVAILABLE naming the leader, and fail /readyz so a Service routes
the CA to the leader only.

Two parts:

* ``Leadership``: what this replica may do *now*, decided by its own monotonic clock and never by a
  call to the API server. A leader may write until ``renew_deadline`` after it *sent* the last Lease
  write that succeeded; past that it stops at once, even while its elector is still waiting for the API
  server. Another replica can take the Lease only ``lease_duration`` (longer) after it saw the Lease
  change, which is after that write reached the API server, so two replicas never write at the same
  time while clocks advance at the same rate (no wall clocks are compared across machines).
* ``LeaderElector``: a thread that starts a round every ``retry_period`` (at once when a round took
  longer). A leader renews with one guarded update of the Lease as it last wrote it (its
  resourceVersion: a Lease changed since answers 409), as client-go's leader does; anyone else, and a
  leader whose update met a 409, reads the Lease first and then creates, renews or takes it over with an
  update guarded by what it read. Each API call may take up to ``min(request_timeout, renew_deadline)``:
  a renewal counts from when it was sent, so a slow API server costs no leadership while one update fits
  in the renew deadline with the round before it (held at 2.2, 3 and 4.5 s per call with the defaults).
  The elector never waits past the renew deadline to step down: it waits for its call and for that
  deadline together.

Written on the connection's raw JSON calls (server/kube/client.py: the Lease is a plain dict, no model
class is loaded) rather than the client's ``kubernetes.leaderelection`` package: that one judges expiry
by comparing wall-clock times, runs its callbacks without telling when the last
successful renewal was sent (which the write gate needs), and does not release the Lease on shutdown.

A replica's name in the Lease is its identity (``kubernetes.identity``, else ``$POD_NAME``, else the host
name) followed by ``_`` and 8 random hex digits of this process: two processes given the same identity
(a shared config file) are still two holders, so they never both lead; a namesake seen in the Lease is
logged once. The messages and /readyz show the identity part.

A leader that steps down (it could not renew in time, or saw another holder) becomes a follower in the
same process: it pauses syncing and keeps campaigning. When it leads again it syncs first; mutating
RPCs and /readyz wait for that sync, as after any take-over. ``Leadership.on_stopped_leading`` lists
what else runs at each step-down (the serving engine closing the CA's connections, for one).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from providers.errors import NotLeader
from providers.http_transport import WriteGrant
from server.kube.calls import ApiCall, api_status
from server.kube.client import KubeConnection, group_path
from server.kube.settings import LeaderElectionConfig

log = logging.getLogger(__name__)

# A holder written by this code: the replica's identity, "_" and 8 hex digits unique to the process.
_HOLDER = re.compile(r"^(?P<name>.+)_[0-9a-f]{8}$")
# How long stop() waits for the elector thread, which abandons a call under way at once.
_STOP_JOIN = 2.0
LEASES = "coordination.k8s.io/v1"
# Tries of the release at shutdown (a renewal that was still travelling may make the first one meet 409).
_RELEASE_TRIES = 3


def holder_name(holder: str) -> str:
    """The identity part of a Lease holder ("pod-a_1f2e3d4c" -> "pod-a"); other holders unchanged."""
    found = _HOLDER.match(holder)
    return found.group("name") if found else holder


def lease_identity(identity: str) -> str:
    """This process's name in the Lease: ``identity`` plus a suffix no other process has."""
    return f"{identity}_{secrets.token_hex(4)}"


class Leadership:
    """This replica's role, readable from any thread without I/O. Thread-safe."""

    def __init__(
        self, config: LeaderElectionConfig, identity: str = "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.identity = identity  # the replica's name, for people (messages, Events, the journal)
        self.lease_identity = identity  # its holderIdentity in the Lease (Election adds the process suffix)
        # Run (in the elector thread, in order) each time this replica stops leading, after it stopped
        # writing and paused its sync; and each time it starts serving as the leader (its first sync of a
        # term done, in that term's take-over thread). Each must return at once and never raise. For the
        # serving engine to send the CA's connections to the leader (server/app.py, FollowerConnections).
        self.on_stopped_leading: list[Callable[[], None]] = []
        self.on_serving: list[Callable[[], None]] = []
        self._clock = clock
        self._lock = threading.Lock()
        self._term = 0  # counts this replica's terms as leader
        # The Lease's leaseTransitions as this replica's acquisition wrote it: the term for every replica
        # (each acquisition by a new holder raises it), which each cloud write carries (check_write).
        self._lease_term = 0
        self._leading = False
        self._retired = False  # stopping: never leads again
        self._renew_sent_at = -math.inf  # monotonic time the last successful acquire or renew was sent
        self._synced_term = 0  # the term whose first sync is done
        self._holder = ""  # the holder last read from the Lease ("" = none or unknown)
        self._stopped_because = ""  # why the last term ended

    # ------------------------------------------------------------------ queries (any thread, no I/O)
    def holds(self) -> bool:
        """Leader, and still within renew_deadline of the last renewal: may write to the clouds."""
        with self._lock:
            return self._left_locked() > 0

    def _left_locked(self) -> float:
        if not self._leading:
            return 0.0
        return self._renew_sent_at + self.config.renew_deadline - self._clock()

    def serving(self) -> bool:
        """Holds the Lease and has synced since taking it: may answer mutating RPCs."""
        with self._lock:
            return self._left_locked() > 0 and self._synced_term == self._term

    def leader(self) -> str:
        """The leader's identity as last seen ("" when unknown)."""
        with self._lock:
            return self.identity if self._left_locked() > 0 else self._shown(self._holder)

    def _shown(self, holder: str) -> str:
        name = holder_name(holder)
        if holder and name == self.identity and holder != self.lease_identity:
            return holder  # another process with this replica's identity: show which one
        return name

    def check_write(self, what: str) -> WriteGrant:
        """The cloud transports' write gate: the seconds this replica may still write, or NotLeader; and
        who writes, the Lease holder and its term (``writer``), which the request carries.

        The transport asks it once the connection is ready, just before the request's bytes go out, and
        bounds the sending by the answer (providers/http_transport.py)."""
        with self._lock:
            left = self._left_locked()
            writer = f"{self.lease_identity}; term={self._lease_term}"
        if left <= 0:
            raise NotLeader(f"{what} not sent: {self._why_not()}")
        return WriteGrant(left, writer)

    def check_serving(self, rpc: str) -> None:
        """The servicer's gate for mutating RPCs and Refresh: raise NotLeader unless leader and synced."""
        if self.serving():
            return
        if self.holds():
            raise NotLeader(
                f"{rpc} refused: {self._me()} has just become the leader and syncs with the "
                "cloud before it answers; retry in a few seconds"
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
            retired = self._retired
        where = f"Lease {self.config.lease_name}"
        if retired:
            return f"{self._me()} is shutting down and handed the {where} back"
        if lapsed:
            return (
                f"{self._me()} could not renew its {where} within renew_deadline "
                f"({self.config.renew_deadline:g}s) and stopped writing; the CA reaches the leader on retry"
            )
        shown = self._shown(holder)
        leader = f"the leader is {shown}" if holder and holder != self.lease_identity else "the leader is not known yet"
        with self._lock:
            because = self._stopped_because
        ended = f" (it stopped leading: {because})" if because else ""
        return f"{self._me()} is not the leader ({where}); {leader}{ended}"

    def _me(self) -> str:
        # The identity is known once the election starts, a moment after the ports open.
        return f"this replica ({self.identity})" if self.identity else "this replica"

    # ------------------------------------------------------------------ transitions (elector thread)
    def acquired(self, renew_sent_at: float, lease_term: int = 0) -> int | None:
        """A new term from a write sent at ``renew_sent_at`` (``lease_term``: the Lease's leaseTransitions it
        wrote); None (no term) when stopping, or when that write came back too late to allow any writing."""
        with self._lock:
            if self._retired or self._clock() >= renew_sent_at + self.config.renew_deadline:
                return None
            self._term += 1
            self._lease_term = lease_term
            self._leading = True
            self._renew_sent_at = renew_sent_at
            self._holder = self.lease_identity
            self._stopped_because = ""
            return self._term

    def renewed(self, renew_sent_at: float) -> None:
        with self._lock:
            if self._leading:
                self._renew_sent_at = max(self._renew_sent_at, renew_sent_at)

    def lost(self, holder: str = "", reason: str = "") -> bool:
        """Stop leading (``reason`` is shown in refusals); True if this replica was leading."""
        with self._lock:
            was = self._leading
            self._leading = False
            self._renew_sent_at = -math.inf
            self._holder = holder if holder != self.lease_identity else ""
            if was:
                self._stopped_because = reason
            return was

    def retire(self) -> bool:
        """Stop leading for good (shutdown); True if this replica was leading."""
        with self._lock:
            self._retired = True
        return self.lost()

    def observed(self, holder: str) -> None:
        with self._lock:
            self._holder = holder

    def synced(self, term: int) -> bool:
        """The first sync of ``term`` is done; False (and nothing changes) when that term already ended."""
        with self._lock:
            if term != self._term or self._left_locked() <= 0:
                return False
            self._synced_term = term
            return True

    def current(self, term: int) -> bool:
        """``term`` is the term under way (it has not ended, whether or not its renew deadline passed)."""
        with self._lock:
            return self._leading and self._term == term

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
        """Seconds until the renew deadline (negative: past it); -inf when not leading."""
        with self._lock:
            return self._renew_sent_at + self.config.renew_deadline - self._clock()


class _Stopped(Exception):
    """The elector was stopped while it waited."""


class _NoAnswer(Exception):
    """An API call of the elector did not end within its timeout."""


class LeaderElector:
    """Campaigns for the Lease and keeps it renewed; calls ``on_started`` and ``on_stopped`` on changes.

    ``on_started(term)`` runs in the elector thread and must return at once (start work elsewhere);
    ``on_stopped()`` too. Both run under one lock, in the order the transitions happen, also when
    ``stop()`` (another thread) ends the last term.
    """

    def __init__(
        self,
        connection: KubeConnection,
        namespace: str,
        leadership: Leadership,
        request_timeout: float,
        on_started: Callable[[int], None],
        on_stopped: Callable[[], None],
        on_api_error: Callable[[], None] = lambda: None,
        on_transition: Callable[[str], None] = lambda event: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = connection
        self._namespace = namespace
        self._leadership = leadership
        self._config = leadership.config
        # A write that comes back after renew_deadline allows no writing: no call is worth waiting longer.
        self._call_timeout = min(request_timeout, self._config.renew_deadline)
        self._request_timeout = request_timeout
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_api_error = on_api_error
        self._on_transition = on_transition
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and by the end of an API call
        self._transitions = threading.RLock()  # one step-down or take-over at a time, in order
        self._thread: threading.Thread | None = None
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._written: dict[str, Any] | None = None  # the Lease as this replica last wrote it, while it leads
        self._failing = False
        self._namesake_warned = False
        self._wrote = False  # a write of the Lease was sent (so this process may hold it at the API server)

    @property
    def _name(self) -> str:
        return self._config.lease_name

    @property
    def _identity(self) -> str:
        return self._leadership.lease_identity

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning; a leader stops writing at once and hands the Lease back, so another replica
        takes over at its next round without waiting for the Lease to expire.

        The role ends before anything else: a renewal still travelling can no longer make this replica a
        leader in memory. The elector thread abandons a call under way and ends; the release then reads
        the Lease again (a renewal that landed meanwhile only costs one more try)."""
        self._stop.set()
        self._wake.set()
        with self._transitions:
            if self._leadership.retire():
                self._announce_lost("this replica is shutting down", "")
        if self._thread is not None:
            self._thread.join(timeout=_STOP_JOIN)
        if self._wrote:
            self._release()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        next_round = self._clock()
        while self._sleep_until(next_round):
            started = self._clock()
            try:
                self._round()
                if self._failing:
                    self._failing = False
                    log.info("the leader Lease is reachable again", extra=self._log_fields())
            except _Stopped:
                return
            except Exception as err:  # an API server problem degrades the election, never crashes the loop
                if api_status(err) == 409:
                    # Another replica wrote the Lease between this one's read and write: normal contention.
                    log.debug("the Lease changed meanwhile; reading it again next round", extra=self._log_fields())
                else:
                    self._on_api_error()
                    level = logging.DEBUG if self._failing else logging.WARNING
                    self._failing = True
                    log.log(
                        level,
                        "reading or writing the leader Lease failed",
                        extra={**self._log_fields(), "error": _why(err)},
                    )
            self._lapse_if_due()
            next_round = started + self._config.retry_period

    def _sleep_until(self, until: float) -> bool:
        """Wait until ``until``, stepping down meanwhile if the renew deadline passes; False once stopped."""
        while not self._stop.is_set():
            self._lapse_if_due()
            now = self._clock()
            if now >= until:
                return True
            self._wake.wait(self._wait_slice(until - now))
            self._wake.clear()
        return False

    def _wait_slice(self, seconds: float) -> float:
        """``seconds``, cut at the renew deadline of a leader (so the step-down happens on time)."""
        left = self._leadership.deadline_left()
        if self._leadership.leading and left < seconds:
            seconds = left
        return max(seconds, 0.001)

    def _lapse_if_due(self) -> None:
        if self._leadership.leading and self._leadership.deadline_left() <= 0:
            self._step_down(f"could not renew the Lease within renew_deadline ({self._config.renew_deadline:g}s)")

    def _call(self, what: str, fn: Callable[[float], Any]) -> Any:
        """``fn(timeout)`` in a thread of its own; meanwhile a renew deadline that passes steps down."""
        self._wake.clear()
        call: ApiCall[Any] = ApiCall(fn, self._call_timeout, "leader-election-api", self._wake)
        ends = self._clock() + self._call_timeout
        while not call.done.is_set():
            if self._stop.is_set():
                raise _Stopped()
            self._lapse_if_due()
            now = self._clock()
            if now >= ends:
                raise _NoAnswer(f"the API server did not answer ({what}) within {self._call_timeout:g}s")
            self._wake.wait(self._wait_slice(ends - now))
            self._wake.clear()
        return call.outcome()

    def _round(self) -> None:
        written = self._written  # read once: stop() may clear it meanwhile
        if self._leadership.leading and written is not None:
            try:
                self._renew_as_written(written)
                return
            except _Stopped:
                raise
            except Exception as err:
                if api_status(err) not in (404, 409):
                    raise  # the next round tries the same update again
                self._written = None  # changed or deleted since this replica wrote it: read it first
                log.debug("the Lease changed since this replica wrote it; reading it", extra=self._log_fields())
        self._read_then_write()

    def _renew_as_written(self, old: dict[str, Any]) -> None:
        """The leader's renewal: one update of the Lease as it last wrote it, guarded by its resourceVersion."""
        spec = dict(old.get("spec") or {})
        spec["holderIdentity"] = self._identity
        spec["renewTime"] = _micro_time(dt.datetime.now(dt.UTC))
        body = {**old, "spec": spec}
        self._write("renew the Lease", functools.partial(self._replace, body))

    def _read_then_write(self) -> None:
        duration_seconds = math.ceil(self._config.lease_duration)
        try:
            lease = self._call("read the Lease", self._read)
        except Exception as err:
            if api_status(err) != 404:
                raise
            now = _micro_time(dt.datetime.now(dt.UTC))
            body = {
                "apiVersion": LEASES,
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": {
                    "holderIdentity": self._identity,
                    "leaseDurationSeconds": duration_seconds,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            # 409 AlreadyExists when another replica created it first: this round is lost, the next reads it.
            self._write("create the Lease", functools.partial(self._create, body))
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        metadata = lease.get("metadata") or {}
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), metadata.get("resourceVersion"))
        if record != self._observed_record:
            # Expiry is measured from when this replica saw the record change, on its own clock.
            self._observed_record = record
            self._observed_at = self._clock()
        if holder and holder != self._identity:
            self._warn_namesake(holder)
            self._leadership.observed(holder)
            held_for = spec.get("leaseDurationSeconds") or duration_seconds
            if self._clock() < self._observed_at + held_for:
                if self._leadership.leading:
                    self._step_down(f"the Lease is held by {holder}", holder)
                return
            log.info("the leader's Lease expired; taking over", extra={**self._log_fields(), "previous": holder})
        now = _micro_time(dt.datetime.now(dt.UTC))
        if holder != self._identity:
            # Every acquisition by a new holder raises it, after a hand-back too (as client-go does): it
            # numbers the terms, and a cloud write carries the one it was made in.
            spec["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = now
        spec["holderIdentity"] = self._identity
        spec["renewTime"] = now
        spec["leaseDurationSeconds"] = duration_seconds
        lease["spec"] = spec
        # metadata.resourceVersion of the read travels along: a Lease changed since then answers 409.
        self._write("write the Lease", functools.partial(self._replace, lease))

    def _write(self, what: str, fn: Callable[[float], Any]) -> None:
        """One Lease write; its success counts from the moment it was sent."""
        sent = self._clock()
        self._wrote = True
        self._won(sent, self._call(what, fn))

    def _warn_namesake(self, holder: str) -> None:
        if self._namesake_warned or holder_name(holder) != self._leadership.identity:
            return
        self._namesake_warned = True
        log.warning(
            "another process holds or held the Lease under this replica's identity; leadership tells them "
            "apart, but Events and the journal name both alike: give each replica its own kubernetes.identity "
            "(unset, it is $POD_NAME)",
            extra={**self._log_fields(), "other": holder},
        )

    def _won(self, sent: float, written: dict[str, Any]) -> None:
        with self._transitions:
            if self._leadership.leading:
                self._written = written
                self._leadership.renewed(sent)
                return
            lease_term = (written.get("spec") or {}).get("leaseTransitions") or 0
            term = self._leadership.acquired(sent, int(lease_term))
            if term is None:  # stopping, or the write took longer than the renew deadline
                return
            self._written = written
            self._on_transition("acquired")
            log.info("became the leader", extra={**self._log_fields(), "term": term, "lease_term": lease_term})
            self._on_started(term)

    def _step_down(self, reason: str, holder: str = "") -> None:
        with self._transitions:
            if self._leadership.lost(holder, reason):
                self._announce_lost(reason, holder)

    def _announce_lost(self, reason: str, holder: str) -> None:
        self._written = None
        self._on_transition("lost")
        log.warning(
            "lost leadership; stopped writing to the clouds and syncing, now a follower",
            extra={**self._log_fields(), "reason": reason, "leader": holder or "unknown"},
        )
        self._on_stopped()

    def _release(self) -> None:
        """Best effort, within two request timeouts (a read and a write): an empty holder lets a follower
        take over at its next round, not after lease_duration."""
        until = self._clock() + 2 * self._request_timeout
        for _ in range(_RELEASE_TRIES):
            try:
                lease = self._bounded(self._read, until)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self._identity:
                    return
                spec.pop("holderIdentity", None)
                spec["leaseDurationSeconds"] = 1
                lease["spec"] = spec
                self._bounded(functools.partial(self._replace, lease), until)
                log.info("released the leader Lease", extra=self._log_fields())
                return
            except Exception as err:  # the Lease then expires on its own after lease_duration
                if api_status(err) == 409:
                    continue  # a renewal that was still travelling landed first: read it again
                self._on_api_error()
                log.warning("releasing the leader Lease failed", extra={**self._log_fields(), "error": _why(err)})
                return

    def _read(self, timeout: float) -> dict[str, Any]:
        return self._api.request("GET", group_path(LEASES, "leases", self._namespace, self._name), timeout=timeout)

    def _replace(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        path = group_path(LEASES, "leases", self._namespace, self._name)
        return self._api.request("PUT", path, body=lease, timeout=timeout)

    def _create(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        return self._api.request("POST", group_path(LEASES, "leases", self._namespace), body=lease, timeout=timeout)

    def _bounded(self, fn: Callable[[float], Any], until: float) -> Any:
        left = until - self._clock()
        if left <= 0:
            raise _NoAnswer("no time left to release the Lease")
        call: ApiCall[Any] = ApiCall(fn, left, "leader-election-release")
        if not call.wait(left):
            raise _NoAnswer(f"the API server did not answer within {left:.2f}s")
        return call.outcome()

    def _log_fields(self) -> dict[str, Any]:
        return {"lease": f"{self._namespace}/{self._name}", "identity": self._identity}


def _run_hooks(hooks: list[Callable[[], None]], what: str) -> None:
    for hook in list(hooks):
        try:
            hook()
        except Exception:  # one hook failing must not keep the others from running
            log.exception(f"{what} failed")


def _micro_time(at: dt.datetime) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds, as the API server writes it."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _why(err: Exception) -> str:
    status = api_status(err)
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
        connection: KubeConnection,
        leadership: Leadership,
        registry: Any,  # providers.registry.Registry
        metrics: Any = None,  # server.metrics.Metrics
        liveness: Any = None,  # server.probes.Liveness
        start_backends: bool = True,
    ) -> None:
        leadership.identity = connection.identity
        leadership.lease_identity = lease_identity(connection.identity)
        self.leadership = leadership
        self._registry = registry
        self._liveness = liveness
        self._start_backends = start_backends
        # Orders the take-over threads' resumes against the step-downs' pauses (see _take_over).
        self._switch = threading.Lock()
        self._metrics = LeaderMetrics(metrics.registry, leadership) if metrics is not None else None
        for backend in registry.backends:
            backend.adapter.guard_writes(leadership.check_write)
        registry.pause()  # a follower until elected: no sync, and no snapshot series to alert on
        self._elector = LeaderElector(
            connection,
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
        """Resume each backend (a first sync, bounded, then its loop) while ``term`` lasts, then serve.

        Terms can overlap here: a term may end, and the next begin, while this thread is still in a first
        sync. A step-down pauses everything (under ``_switch``); a resume that raced it is undone here, but
        only while no later term runs, whose own thread resumes what it needs: an older term's thread
        never pauses a newer term's backends."""
        started = time.monotonic()
        if self._start_backends:
            with self._switch:
                if not self.leadership.current(term):
                    return
                if self._liveness is not None:
                    self._liveness.watch(self._registry.backends)
            for backend in self._registry.backends:
                with self._switch:
                    if not self.leadership.current(term):
                        break
                backend.resume()  # a first sync (bounded), then its loop
            with self._switch:
                if not self.leadership.current(term):
                    if not self.leadership.leading:
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
            _run_hooks(self.leadership.on_serving, "a take-over hook")

    def _stopped_leading(self) -> None:
        with self._switch:
            self._registry.pause()
            if self._liveness is not None:
                self._liveness.unwatch(self._registry.backends)
        _run_hooks(self.leadership.on_stopped_leading, "a step-down hook")

    def _api_error(self) -> None:
        if self._metrics is not None:
            self._metrics.lease_errors.inc()

    def _transition(self, event: str) -> None:
        if self._metrics is not None:
            self._metrics.transitions.labels(event).inc()
