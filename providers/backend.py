"""The rules every cloud shares, written once: snapshot, sync, size changes, membership.

A ``Backend`` wraps one ``CloudAdapter``. Reads (the hot RPCs) come from an immutable in-memory
``Snapshot`` swapped atomically after each cloud listing, so they take no lock and do no I/O.

Mutations follow the CA's real concurrency (docs/explanation/reliability.md):

- locks only guard bookkeeping; no cloud call runs under one. Deletions of one group run side by side;
  a size write waits until the deletions already sent are answered, because an absolute size write and
  the cloud's own decrement per deleted node do not commute (providers/group_book.py);
- every wait (admission, a listing) ends before the caller's deadline with UNAVAILABLE and its reason;
- a write whose answer was lost or an error may have been applied: it is read back from the cloud
  before answering when the deadline allows, and in any case before the group's next change, and a
  listing is started at once so TargetSize follows the cloud within seconds;
- one listing runs at a time and serves every caller waiting for it (providers/single_flight.py);
- the CA's Refresh starts that listing once the snapshot is older than the interval and waits for it
  a bounded time (``sync.follow_refresh``); the timer lists by itself only when no CA asks.

Changes this server made are overlaid on the snapshot until a listing that certainly saw them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from providers.change_journal import ChangeJournal
from providers.cloud import CloudAdapter
from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudAuthFailed,
    CloudOutcomeUnknown,
    CloudRequestRejected,
    CloudUnavailable,
    DeadlineTooShort,
    DomainError,
    InvalidDelta,
    InvalidRequest,
    NodeGroupNotFound,
    NodeNotInGroup,
    SizeLimitExceeded,
)
from providers.group_book import GroupBook, Intent
from providers.http_transport import change_waiting
from providers.model import (
    CloudListing,
    GroupState,
    Instance,
    InstanceState,
    LearnedTemplate,
    NodeRef,
    NodeTemplate,
)
from providers.node_labels import GroupLabels, LabelAgreement, machine_names
from providers.single_flight import Flight, SingleFlight

log = logging.getLogger(__name__)

# A view older than this is re-read from the cloud before an absolute size write.
FRESH_FOR_WRITE = 5.0
# After a size change, pick up the new instances soon (but not more often than min_interval).
SYNC_SOON_DELAY = 3.0
# How long an unconfirmed increase is remembered to make a CA retry of it idempotent.
INTENT_MEMORY = 120.0
# A listing gets this long, whoever asked for it; it finishes even after the caller has answered.
LISTING_TIMEOUT = 60.0
# After a write with an unknown outcome, the group is listed again this much later: a request that
# was still travelling when the first reconciling listing ran has landed by then.
LATE_LANDING_RECHECK = 3.0
# A decrease that needs a fresh listing shares one already running if it started this recently.
SHARE_LISTING_SLACK = 0.25
# The CA calls DecreaseTargetSize again one loop later: the listing an earlier call gave up waiting for
# (it outlived that call's deadline) serves the next call within this window.
REUSE_LISTING_WINDOW = 30.0
# DeleteNodes: at most this many distinct nodes per call (a scale-down call carries one; cleanup of
# failed or unregistered machines carries those of one group), and never more than the group can hold.
MAX_NODES_PER_DELETE = 1000
# Deletions of one call sent to the cloud at once (the CA's own scale-down parallelism is 10).
DELETE_PARALLELISM = 10
# Following the CA's Refresh (sync.follow_refresh): a Refresh that finds the snapshot older than the
# interval waits this long at most for the listing it started or joined (less when its deadline is
# nearer), then answers from the snapshot in place while the listing goes on.
REFRESH_WAIT = 3.0
# Of the Refresh caller's deadline, kept for the staleness checks and the answer.
REFRESH_MARGIN = 1.0
# Following the CA's Refresh, the timer still lists by itself this many intervals after the last
# listing (no CA asked: it is stopped or disconnected), and always within half the staleness bound, so
# readiness, metrics and the liveness watch of the sync loop keep working without a CA.
IDLE_SYNC_INTERVALS = 4.0


@dataclass(frozen=True, slots=True)
class SyncSettings:
    interval: float | None = None  # None: use the cloud's cache hint, else DEFAULT_INTERVAL
    default_interval: float = 60.0
    min_interval: float = 5.0
    max_staleness: float = 600.0
    initial_sync_timeout: float = 20.0
    # True: the CA's Refresh starts a listing once the snapshot is older than the interval (the cloud is
    # read while a CA asks, as the in-tree providers re-list in their Refresh) and the timer only
    # covers for a missing CA; False: the timer lists every interval whether anyone asks or not.
    follow_refresh: bool = True


@dataclass(frozen=True, slots=True)
class Snapshot:
    groups: Mapping[str, GroupState]
    by_provider_id: Mapping[str, str]  # instance id -> group id
    started_at: float  # monotonic time the listing was requested
    finished_at: float
    version: int
    instances_by_id: Mapping[str, Instance]  # instance id -> instance: DeleteNodes resolves through it

    @classmethod
    def empty(cls) -> Snapshot:
        return cls({}, {}, 0.0, 0.0, 0, {})


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a failed sync means for the operator (server/diagnosis.py builds the per-cloud advice)."""

    kind: str  # credentials, not_found, rejected, unreachable
    check: str  # the settings to check, named as the operator finds them


#: the kinds of failure that no retry cures: the cloud refused this backend's configuration
REFUSED = ("credentials", "not_found", "rejected")
KIND_WORDS = {
    "credentials": "the cloud refused the credentials",
    "not_found": "the cloud does not know the cluster",
    "rejected": "the cloud refused the listing",
    "unreachable": "the cloud did not answer",
}


def _default_diagnosis(err: BaseException) -> Diagnosis:
    if isinstance(err, CloudAuthFailed):
        return Diagnosis("credentials", "the backend's credentials")
    if isinstance(err, CloudRequestRejected):
        return Diagnosis("not_found" if err.status == 404 else "rejected", "the cluster id and region")
    return Diagnosis("unreachable", "the network path to the cloud API")


@dataclass(frozen=True, slots=True)
class SyncHealth:
    synced: bool
    age: float | None  # seconds since the last good snapshot finished
    stale: bool  # older than max_staleness
    last_error: str
    consecutive_failures: int
    kind: str = ""  # the last failure's kind (Diagnosis.kind), empty after a good sync
    check: str = ""  # what to check for it

    @property
    def serving(self) -> bool:
        """The backend serves its groups: it has synced and is within its staleness bound."""
        return self.synced and not self.stale

    @property
    def refused(self) -> bool:
        """The cloud's last answer refused this backend's configuration (credentials, cluster, region)."""
        return self.consecutive_failures > 0 and self.kind in REFUSED

    @property
    def usable(self) -> bool:
        """Serving, and not refused by the cloud: its snapshot can still become fresh."""
        return self.serving and not self.refused

    def problem(self, name: str) -> str:
        """One line for Refresh's answer, /readyz and ``status``: what is wrong and what to check."""
        if not self.synced and not self.consecutive_failures:
            return f"backend {name!r}: the first sync with the cloud has not finished yet"
        what = KIND_WORDS.get(self.kind, "the cloud sync failed")
        when = "has never synced" if not self.synced else f"last synced {self.age or 0:.0f}s ago"
        check = f"; check {self.check}" if self.check else ""
        return f"backend {name!r} {when}: {what} ({self.last_error}){check}"


class Backend:
    """One configured cloud backend: its adapter, its snapshot and its mutation rules."""

    def __init__(
        self,
        name: str,
        adapter: CloudAdapter,
        settings: SyncSettings | None = None,
        template_overrides: Mapping[str, Callable[[NodeTemplate | None], NodeTemplate | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        group_labels: GroupLabels | None = None,
        diagnose: Callable[[BaseException], Diagnosis] | None = None,
    ) -> None:
        self.name = name
        # Turns a failed sync into what the operator should check (server/diagnosis.py per cloud).
        self._diagnose = diagnose or _default_diagnosis
        self.adapter = adapter
        self.settings = settings or SyncSettings()
        self._template_overrides = dict(template_overrides or {})
        # Which labels of a real node the CA shows (observe_node) describe its group (providers/node_labels.py).
        self._group_labels = group_labels or GroupLabels()
        self._clock = clock
        self._snapshot = Snapshot.empty()
        self._books: dict[str, GroupBook] = {}
        self._observed_labels: dict[str, Mapping[str, str]] = {}
        self._label_agreements: dict[str, LabelAgreement] = {}  # group id -> what its nodes' labels agree on
        self._learned: dict[str, LearnedTemplate] = {}  # group id -> template of its last real Ready node
        self._learned_generation = 0  # bumped on every change of _learned (part of template_key)
        # group id -> (template_key, template, source): the last answer of _template_and_source
        self._templates: dict[str, tuple[object, NodeTemplate | None, str]] = {}
        self._state_lock = threading.Lock()  # guards the fields below and _books; never held over I/O
        self._listing: SingleFlight[Snapshot] = SingleFlight(self._list_and_swap, clock, f"sync-{name}")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._paused = threading.Event()  # a follower replica (leader election): no sync, no cloud reads
        self._thread: threading.Thread | None = None
        self._next_sync_at = 0.0
        self._list_after = 0.0  # the timer's next listing starts at or after this (a change asked for it)
        self._rechecks: list[float] = []  # extra listings owed after unknown outcomes (times)
        self._last_error = ""
        self._diagnosis: Diagnosis | None = None
        self._failures = 0
        self._max_age: float | None = None
        self._deleter: concurrent.futures.ThreadPoolExecutor | None = None
        self.listeners: list[Callable[[Backend], None]] = []  # called after every sync attempt
        # Called when a learned template changes (what TemplateNodeInfo and the debug strings say).
        self.template_listeners: list[Callable[[Backend], None]] = []
        # Records size changes durably before their cloud call (providers/change_journal.py); None: memory only.
        self.journal: ChangeJournal | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, background: bool = True) -> None:
        """Try a first sync (bounded), then keep syncing in a daemon thread."""
        try:
            self.sync(Deadline.after(self.settings.initial_sync_timeout))
        except DomainError as err:
            # A replica resuming with a snapshot from before had its sync's own line say it all.
            if not self.health().synced:
                diagnosis = self._diagnosis or self._diagnose(err)
                log.log(
                    logging.ERROR if diagnosis.kind in REFUSED else logging.WARNING,
                    f"initial sync failed: {KIND_WORDS.get(diagnosis.kind, 'the cloud sync failed')}; this "
                    f"backend serves no node groups until the cloud answers; check {diagnosis.check}",
                    extra={
                        "backend": self.name,
                        "error": str(err),
                        "reason": diagnosis.kind,
                        "check": diagnosis.check,
                    },
                )
        if background:
            self._thread = threading.Thread(target=self._run, name=f"sync-timer-{self.name}", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Stop syncing until ``resume`` (this replica stepped down to follower); a listing running now
        finishes, none starts. The snapshot stays, but a follower answers no mutating call from it."""
        self._paused.set()
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def resume(self) -> None:
        """Sync again (this replica became the leader): a first sync now (bounded), then the loop."""
        self._paused.clear()
        self.start(background=self._thread is None)
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._deleter is not None:
            self._deleter.shutdown(wait=False, cancel_futures=True)
        self.adapter.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._state_lock:
                due = min([self._next_sync_at, *self._rechecks])
            self._wake.wait(timeout=max(0.0, due - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._paused.is_set():
                self._wake.wait()  # resume() or stop() sets it
                continue
            now = self._clock()
            with self._state_lock:
                if now < min([self._next_sync_at, *self._rechecks]):
                    continue
                recheck = any(t <= now for t in self._rechecks)
                self._rechecks = [t for t in self._rechecks if t > now]
                # A listing already running (a Refresh's, a decrease's) serves the timer when it began
                # after the snapshot in place and after any change that asked for one; a recheck after an
                # unknown outcome needs one that starts now. Asked under the lock, as in refresh_listing.
                flight = self._listing.since(now if recheck else max(self._snapshot.started_at, self._list_after))
            # The listing reports its own failures (log, health, metrics); waiting keeps this loop calm.
            flight.wait(LISTING_TIMEOUT + 5.0)

    def _interval(self) -> float:
        s = self.settings
        if s.interval is not None:
            return max(s.interval, s.min_interval)
        if self._max_age is not None:
            return max(self._max_age, s.min_interval)
        return s.default_interval

    def _timer_interval(self) -> float:
        """From a good listing to the next one the timer starts by itself."""
        interval = self._interval()
        if not self.settings.follow_refresh:
            return interval
        return max(interval, min(interval * IDLE_SYNC_INTERVALS, self.settings.max_staleness / 2))

    def refresh_listing(self) -> Flight[Snapshot] | None:
        """For the CA's Refresh: the listing to wait for when the snapshot is older than the interval
        (the running one, else a new one), or None: the snapshot is young enough, the backend does not
        follow Refresh, its last listing failed (its timer retries by itself), or it is paused (a follower
        replica reads nothing from the cloud, Refresh included)."""
        if not self.settings.follow_refresh or self._stop.is_set() or self._paused.is_set():
            return None
        now = self._clock()
        # Held while the listing is asked for: a listing that ends in between swaps the snapshot under
        # this lock, so a Refresh either sees the new snapshot or shares the listing still running,
        # never starts a second one right after it.
        with self._state_lock:
            snapshot = self._snapshot
            if snapshot.version and now - snapshot.finished_at < self._interval():
                return None
            if self._failures:
                # The cloud is failing: the timer retries with its backoff, and a Refresh neither adds
                # listings nor spends the other backends' time waiting for this one's.
                return None
            # Any listing running now started after the one that built this snapshot.
            return self._listing.since(snapshot.started_at)

    def sync_soon(self, delay: float = SYNC_SOON_DELAY) -> None:
        """Ask for a listing within ``delay`` seconds (rate-limited by ``min_interval``)."""
        now = self._clock()
        at = now + max(delay, 0.0)
        with self._state_lock:
            self._list_after = max(self._list_after, now)
            earliest = self._snapshot.finished_at + self.settings.min_interval
            at = max(at, earliest)
            if at < self._next_sync_at:
                self._next_sync_at = at
                self._wake.set()

    def reconcile_soon(self) -> None:
        """A listing now and another after LATE_LANDING_RECHECK, past the rate limit: after a write
        with an unknown outcome, TargetSize must follow the cloud within seconds. Paused (this replica
        stopped leading while the write was out), only the recheck is noted: the next leader lists itself."""
        now = self._clock()
        if not self._paused.is_set():
            self._listing.since(now)
        with self._state_lock:
            self._rechecks.append(now + LATE_LANDING_RECHECK)
        self._wake.set()

    # ------------------------------------------------------------------ sync
    def sync(self, deadline: Deadline, since: float | None = None) -> Snapshot:
        """A listing that started at or after ``since`` (default: now), waited for within ``deadline``.

        Listings run one at a time in their own thread and are shared by every caller they satisfy; one
        that outlives the caller's deadline finishes anyway and serves the next caller. Raises the
        listing's error, or DeadlineTooShort when it cannot finish in time.
        """
        flight = self._listing.since(self._clock() if since is None else since)
        return self._await_listing(flight, deadline)

    def _await_listing(self, flight: Flight[Snapshot], deadline: Deadline) -> Snapshot:
        if not flight.wait(deadline.remaining() - RESPONSE_MARGIN):
            started = flight.started_at
            running = f"started {self._clock() - started:.1f}s ago" if started is not None else "queued"
            raise DeadlineTooShort(
                f"backend {self.name!r}: the cloud listing this call needs ({running}) did not finish within the "
                "caller's deadline; it continues in the background and the next call uses its result"
            )
        if flight.error is not None:
            raise flight.error
        assert flight.result is not None
        return flight.result

    def _list_and_swap(self, started: float) -> Snapshot:
        """One listing (run by the single-flight thread): read every group, swap the snapshot."""
        try:
            listing = self.adapter.list_groups(Deadline.after(LISTING_TIMEOUT))
        except DomainError as err:
            diagnosis = self._diagnose(err)
            with self._state_lock:
                self._failures += 1
                self._last_error = str(err)
                self._diagnosis = diagnosis
                backoff = min(self._interval(), self.settings.min_interval * (2 ** min(self._failures - 1, 6)))
                self._next_sync_at = self._clock() + backoff
            health = self.health()
            if not health.synced:
                serving = "no snapshot yet: this backend serves no node groups"
            elif health.refused:
                serving = (
                    "the last good snapshot is kept, but Refresh fails while no backend is usable, "
                    "and it cannot become fresh until this is fixed"
                )
            else:
                serving = "serving the last good snapshot"
            log.log(
                logging.ERROR if diagnosis.kind in REFUSED else logging.WARNING,
                f"cloud sync failed: {KIND_WORDS.get(diagnosis.kind, 'error')}; {serving}",
                extra={
                    "backend": self.name,
                    "error": str(err),
                    "reason": diagnosis.kind,
                    "check": diagnosis.check,
                    "failures": self._failures,
                    "snapshot_age_s": health.age,
                },
            )
            self._notify()
            raise
        snapshot = self._build_snapshot(listing, started)
        with self._state_lock:
            self._snapshot = snapshot
            self._max_age = listing.max_age
            self._failures = 0
            self._last_error = ""
            self._diagnosis = None
            if self._list_after <= started:  # else a change asked for a listing after this one began
                self._next_sync_at = self._clock() + self._timer_interval()
            books = list(self._books.values())
        for book in books:
            with book.cond:
                book.settle(snapshot.started_at)
                book.cond.notify_all()
        self._notify()
        return snapshot

    def _build_snapshot(self, listing: CloudListing, started: float) -> Snapshot:
        # Wall-clock time of the read, for humans (status command, CA logs of NodeGroup.debug).
        synced = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        previous = self._snapshot
        groups: dict[str, GroupState] = {}
        unchanged = previous.version > 0 and len(listing.groups) == len(previous.groups)
        for group in listing.groups:
            before = previous.groups.get(group.id)
            kept = _kept_instances(group.instances, before.instances if before else (), previous.instances_by_id)
            unchanged = unchanged and before is not None and kept is before.instances
            # The pool's name as one word (``status`` reads the words it knows from the debug string).
            name = f" name={'_'.join(group.name.split())}" if group.name.strip() else ""
            groups[group.id] = replace(
                group, instances=kept, debug=f"backend={self.name} synced={synced}{name} {group.debug}".strip()
            )
        if unchanged:
            # Every group holds the very machines it held: the lookups of the last snapshot stand.
            by_pid, instances = previous.by_provider_id, previous.instances_by_id
        else:
            by_pid, instances = {}, {}
            for group in groups.values():
                for inst in group.instances:
                    if inst.id:
                        by_pid[inst.id] = group.id
                        instances[inst.id] = inst
        return Snapshot(groups, by_pid, started, self._clock(), previous.version + 1, instances)

    def _notify(self) -> None:
        for listener in self.listeners:
            try:
                listener(self)
            except Exception:  # a metrics listener must never break syncing
                log.exception("sync listener failed")

    def health(self) -> SyncHealth:
        snap = self._snapshot
        synced = snap.version > 0
        age = self._clock() - snap.finished_at if synced else None
        stale = (not synced) or (age is not None and age > self.settings.max_staleness)
        diagnosis = self._diagnosis
        kind, check = (diagnosis.kind, diagnosis.check) if diagnosis is not None else ("", "")
        return SyncHealth(synced, age, stale, self._last_error, self._failures, kind, check)

    # ------------------------------------------------------------------ reads (no I/O, no waits)
    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def has_group(self, group_id: str) -> bool:
        return group_id in self._snapshot.groups

    def group(self, group_id: str) -> GroupState:
        try:
            return self._snapshot.groups[group_id]
        except KeyError:
            raise NodeGroupNotFound(group_id) from None

    def groups(self) -> Iterable[GroupState]:
        return self._snapshot.groups.values()

    def group_id_for(self, provider_id: str) -> str | None:
        return self._snapshot.by_provider_id.get(provider_id)

    def target_size(self, group_id: str) -> int:
        group = self.group(group_id)
        book = self._books.get(group_id)
        target = book.target if book is not None else None
        return target if target is not None else group.target_size

    def instances(self, group_id: str) -> tuple[Instance, ...]:
        group = self.group(group_id)
        book = self._books.get(group_id)
        deleting = frozenset(book.deleting) if book is not None else frozenset()
        if not deleting:
            return group.instances
        return tuple(
            replace(inst, state=InstanceState.DELETING, error=None) if inst.id in deleting else inst
            for inst in group.instances
        )

    def observe_node(
        self, group_id: str, labels: Mapping[str, str], node_name: str = "", provider_id: str = ""
    ) -> bool:
        """Remember the labels of a real node of the group that describe the group (templates for
        scale-from-zero): a label put on that one node (``maintenance=true``), or naming it, is dropped.

        Returns True when they differ from what was known (so cached templates must be rebuilt).
        """
        kept = self._group_labels.keep(labels, machine_names(node_name, provider_id))
        # A label whose value differs between the group's nodes, or over time, does not describe the group
        # (until they agree again: providers/node_labels.py).
        agreement = self._label_agreements.setdefault(group_id, LabelAgreement())
        agreement.observe(kept, node_name, self._clock())
        kept = agreement.agreed(kept)
        if not kept or self._observed_labels.get(group_id) == kept:
            return False
        self._observed_labels[group_id] = kept
        return True

    def set_learned_template(self, group_id: str, learned: LearnedTemplate | None) -> None:
        """The hook of learned templates (server/kube/templates.py): the last real Ready node's template."""
        with self._state_lock:
            if self._learned.get(group_id) == learned:
                return
            if learned is None:
                self._learned.pop(group_id, None)
            else:
                self._learned[group_id] = learned
            self._learned_generation += 1
        for listener in list(self.template_listeners):
            listener(self)

    def learned_template(self, group_id: str) -> LearnedTemplate | None:
        return self._learned.get(group_id)

    def template(self, group_id: str) -> NodeTemplate | None:
        return self._template_and_source(group_id)[0]

    def template_source(self, group_id: str) -> str:
        """Where ``template(group_id)`` comes from, for humans: override, learned from a node, cloud."""
        try:
            return self._template_and_source(group_id)[1]
        except NodeGroupNotFound:  # gone with a listing swapped in since the caller saw it
            return "none"

    def _template_and_source(self, group_id: str) -> tuple[NodeTemplate | None, str]:
        """Config override > learned from a real node > the cloud's description; override keys win per key."""
        key = self.template_key(group_id)
        cached = self._templates.get(group_id)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        group = self.group(group_id)
        cloud = self.adapter.template(group, self._observed_labels.get(group_id))
        learned = self._learned.get(group_id)
        if learned is not None and _machine_type_changed(learned.template, cloud, self.adapter.same_machine_type):
            # The pool now makes another machine type: the last node no longer describes a new one.
            learned = None
        base: NodeTemplate | None = cloud
        source = "cloud"
        if learned is not None:
            base, source = learned_over_cloud(learned.template, cloud), learned.source
        override = self._template_overrides.get(group_id)
        if override is not None:
            template = override(base)
            source = f"override over {source}" if base is not None else "override"
        else:
            template = base
        if template is None:
            source = "none"
        self._templates[group_id] = (key, template, source)
        return template, source

    def template_key(self, group_id: str) -> tuple[int, int, int]:
        """Changes whenever ``template(group_id)`` may change: snapshot version, observed labels, learned."""
        observed = self._observed_labels.get(group_id)
        return (
            self._snapshot.version,
            hash(tuple(sorted(observed.items()))) if observed else 0,
            self._learned_generation,
        )

    def check_fresh_enough(self) -> None:
        """The isolation rule for Refresh: raise CloudUnavailable only when this backend serves groups
        from a snapshot beyond its staleness bound. A backend that never synced serves no groups; it
        reports through health, readiness, logs and metrics instead of stopping every other cloud."""
        health = self.health()
        if health.synced and health.stale:
            raise CloudUnavailable(
                f"backend {self.name!r}: cloud state is too stale to act on (last good sync {health.age:.0f}s "
                f"ago, bound {self.settings.max_staleness:.0f}s); last error: {health.last_error or 'none'}"
                + (f"; check {health.check}" if health.check else "")
            )

    # ------------------------------------------------------------------ size changes
    def _book(self, group_id: str) -> GroupBook:
        with self._state_lock:
            book = self._books.get(group_id)
            if book is None:
                book = self._books[group_id] = GroupBook(group_id)
            return book

    def _snapshot_target(self, group_id: str) -> int:
        return self.group(group_id).target_size

    @change_waiting()
    def increase_size(self, group_id: str, delta: int, deadline: Deadline) -> int:
        if delta <= 0:
            raise InvalidDelta(f"size increase must be positive, got delta={delta}")
        self.group(group_id)
        book = self._book(group_id)
        with book.exclusive(deadline):
            adopted = self._adopt_pending_change(book, group_id, deadline)
            with book.cond:
                intent = book.intent
                if intent is not None and self._clock() - intent.at > INTENT_MEMORY:
                    intent = book.intent = None
            group = self._base(book, group_id, deadline, force_read=intent is not None)
            # Settled only once the cloud could be read: if that read fails, the next retry must still
            # know that the first call may have landed, or it would apply the change a second time.
            with book.cond:
                book.intent = None
            if intent is not None and group.target_size == intent.desired and delta == intent.desired - intent.base:
                # The earlier call whose answer was lost did land: this is the CA retrying it.
                log.info(
                    "increase already applied by an earlier call whose answer was lost",
                    extra={"backend": self.name, "node_group": group_id, "delta": delta},
                )
                self._drop_adopted(adopted, group_id)
                return group.target_size
            desired = group.target_size + delta
            if desired > group.max_size:
                self._drop_adopted(adopted, group_id)
                raise SizeLimitExceeded(
                    f"size increase too large for node group {group_id!r}: target {group.target_size} + "
                    f"delta {delta} = {desired} > max {group.max_size}"
                )
            self._write_size(book, group, desired, deadline, remember_intent=True)
            return desired

    @change_waiting()
    def decrease_target_size(self, group_id: str, delta: int, deadline: Deadline) -> int:
        if delta >= 0:
            raise InvalidDelta(f"size decrease must be negative, got delta={delta}")
        self.group(group_id)
        book = self._book(group_id)
        running, booting, failed = self._machine_counts(group_id)
        target = self.target_size(group_id)
        unseen = max(target - running - booting - failed, 0)
        if target + delta < running + booting + unseen:
            # The cloud decides which machines a smaller size removes (booting ones first); one the
            # snapshot shows booting, or does not show yet, may run by now. Decide on a fresh listing,
            # waited for outside any admission and within the deadline.
            self._await_fresh_view(book, deadline)
        with book.exclusive(deadline):
            adopted = self._adopt_pending_change(book, group_id, deadline)
            group = self._base(book, group_id, deadline)
            running, _, _ = self._machine_counts(group_id)
            with book.cond:
                book.view_wanted = None
            desired = group.target_size + delta
            self._drop_adopted(adopted and (desired < group.min_size or desired < running), group_id)
            if desired < group.min_size:
                raise SizeLimitExceeded(
                    f"size decrease too large for node group {group_id!r}: target {group.target_size} "
                    f"+ delta {delta} = {desired} < min {group.min_size}"
                )
            if desired < running:
                raise SizeLimitExceeded(
                    f"attempt to delete existing nodes of {group_id!r}: target {group.target_size} + delta "
                    f"{delta} = {desired} < {running} running instances; use DeleteNodes for those"
                )
            self._write_size(book, group, desired, deadline, remember_intent=False)
            return desired

    def _adopt_pending_change(self, book: GroupBook, group_id: str, deadline: Deadline) -> bool:
        """Take a change the journal holds for the group as this server's own memory of it (call with
        exclusive admission, before the group is read). Read at each size write rather than once at start,
        so a replica that took over from another sees what that one left. True if an entry was adopted."""
        if self.journal is None:
            return False
        pending = self.journal.pending(group_id, deadline)  # JournalUnavailable: refused, nothing sent
        if pending is None:
            return False
        now = self._clock()
        with book.cond:
            if pending.kind == "increase" and book.intent is None:
                book.intent = Intent(pending.base, pending.desired, now - pending.age)
            book.mark_unknown(
                f"the journal holds an unconfirmed size change from {pending.base} to {pending.desired} "
                f"recorded by {pending.replica} {pending.age:.0f}s ago",
                now,
            )
        log.info(
            "adopted an unconfirmed size change from the journal; reading the group back before changing it",
            extra={
                "backend": self.name,
                "node_group": group_id,
                "base": pending.base,
                "desired": pending.desired,
                "recorded_by": pending.replica,
                "age_s": round(pending.age, 1),
            },
        )
        return True

    def _drop_adopted(self, adopted: bool, group_id: str) -> None:
        """No write follows an adopted entry (whose write would replace it): the group was read back since,
        so the entry served its purpose."""
        if adopted and self.journal is not None:
            self.journal.clear(group_id)

    def _await_fresh_view(self, book: GroupBook, deadline: Deadline) -> None:
        """A listing that started after this call (or shortly before, when one already runs), or the one
        the previous call of this group gave up waiting for: it outlived that call's deadline, kept
        running, and now serves the CA's next call instead of a new listing that would time out too."""
        now = self._clock()
        with book.cond:
            remembered = book.view_wanted
            if remembered is not None and now - book.view_wanted_at > REUSE_LISTING_WINDOW:
                remembered = book.view_wanted = None
        if remembered is not None and remembered.done and remembered.error is None:
            return  # its snapshot (or a newer one) is in place
        running = self._listing.running
        if remembered is not None and remembered.error is None:
            flight = remembered
        elif running is not None and (running.started_at or 0.0) >= now - SHARE_LISTING_SLACK:
            flight = running
        else:
            flight = self._listing.since(now)
        try:
            self._await_listing(flight, deadline)
        except DeadlineTooShort:
            with book.cond:
                if book.view_wanted is not flight:
                    book.view_wanted, book.view_wanted_at = flight, now
            raise

    def _machine_counts(self, group_id: str) -> tuple[int, int, int]:
        """Machines of the current view that run, boot, and failed to boot (leaving ones excluded)."""
        running = booting = failed = 0
        for inst in self.instances(group_id):
            if inst.state == InstanceState.RUNNING:
                running += 1
            elif inst.state == InstanceState.CREATING:
                if inst.error is None:
                    booting += 1
                else:
                    failed += 1
        return running, booting, failed

    def _base(self, book: GroupBook, group_id: str, deadline: Deadline, force_read: bool = False) -> GroupState:
        """The group with its current target (call with exclusive admission): from memory when it is
        fresh and certain, else read back from the cloud."""
        group = self.group(group_id)
        with book.cond:
            fresh_at = max(self._snapshot.started_at, book.changed_at)
            must_read = force_read or bool(book.unknown) or self._clock() - fresh_at > FRESH_FOR_WRITE
            view = book.target
        if not must_read:
            return group if view is None else replace(group, target_size=view)
        fresh = self.adapter.read_group(group_id, deadline)
        with book.cond:
            # Exclusive admission: nothing of ours is in flight, so the read is the group's exact size.
            # (Which machines are leaving is only known from the next listing: maybe_deleting stays.)
            book.set_target(fresh.target_size, self._clock())
            book.unknown = ""
        return replace(
            group,
            min_size=fresh.min_size,
            max_size=fresh.max_size,
            target_size=fresh.target_size,
            cloud_data=fresh.cloud_data,
        )

    def _write_size(
        self, book: GroupBook, group: GroupState, desired: int, deadline: Deadline, remember_intent: bool
    ) -> None:
        """With a journal, record the change before the PATCH (or send nothing: JournalUnavailable), clear it
        once its outcome is known, and mark it when the outcome stays unknown."""
        journal = self.journal
        if journal is None:
            self._patch_size(book, group, desired, deadline, remember_intent)
            return
        kind = "increase" if desired > group.target_size else "decrease"
        journal.record(group.id, kind, group.target_size, desired, deadline)
        try:
            self._patch_size(book, group, desired, deadline, remember_intent)
        except ChangeOutcomeUnknown as unknown:
            journal.mark_unknown(group.id, str(unknown))
            raise
        except BaseException:
            journal.clear(group.id)  # a definite failure: nothing was applied
            raise
        journal.clear(group.id)

    def _patch_size(
        self, book: GroupBook, group: GroupState, desired: int, deadline: Deadline, remember_intent: bool
    ) -> None:
        """PATCH the absolute size (exclusive admission held); an unknown outcome is read back, not guessed."""
        with book.cond:
            book.pin(group.target_size, self._clock())
        try:
            self.adapter.set_target_size(group, desired, deadline)
        except CloudOutcomeUnknown as err:
            self._read_back_size(book, group, desired, deadline, err, remember_intent)
            return
        with book.cond:
            book.set_target(desired, self._clock())
        self.sync_soon()

    def _read_back_size(
        self,
        book: GroupBook,
        group: GroupState,
        desired: int,
        deadline: Deadline,
        err: CloudOutcomeUnknown,
        remember_intent: bool,
    ) -> None:
        """Decide from the cloud itself whether a size write with a lost or failed answer was applied."""
        base = group.target_size
        with book.cond:
            book.mark_unknown(str(err), self._clock())
        try:
            seen: int | None = self.adapter.read_group(group.id, deadline).target_size
        except DomainError:
            seen = None  # no time left, or the cloud cannot be read either: reconcile in the background
        if seen is not None:
            with book.cond:
                book.set_target(seen, self._clock())
                if seen == desired or (seen == base and err.finished):
                    book.unknown = ""  # the cloud is done with the request: what it shows is final
            if seen == desired:
                log.info(
                    "size write answered with an error but applied; confirmed by reading the cloud back",
                    extra={"backend": self.name, "node_group": group.id, "target": desired, "error": str(err)},
                )
                self.sync_soon()
                return
            if seen == base and err.finished:
                raise CloudUnavailable(f"{err} The cloud still shows size {base}: the change was not applied.")
        if remember_intent:
            with book.cond:
                book.intent = Intent(base, desired, self._clock())
        self.reconcile_soon()
        shown = "" if seen is None else f"; the cloud shows size {seen} for now"
        raise ChangeOutcomeUnknown(
            f"the size change of {group.id!r} from {base} to {desired} was not confirmed ({err}){shown}; the "
            "group is re-read from the cloud before its next change, so retrying is safe"
        )

    # ------------------------------------------------------------------ deletions
    @change_waiting()
    def delete_nodes(self, group_id: str, nodes: list[NodeRef], deadline: Deadline) -> int:
        """Delete the named machines of the group; OK only for those the cloud accepted or shows gone."""
        work = self._validate_deletion(group_id, nodes)
        book = self._book(group_id)
        with book.cond:
            unknown = bool(book.unknown)
        if unknown:
            # An earlier change's outcome is unknown: read the group back before changing it again.
            with book.exclusive(deadline):
                self._base(book, group_id, deadline, force_read=True)
        to_send = self._admit_deletions(book, group_id, work, deadline)
        outcomes = self._send_deletions(book, group_id, to_send, deadline)
        return self._deletion_result(book, group_id, work, to_send, outcomes, deadline)

    def _validate_deletion(self, group_id: str, nodes: list[NodeRef]) -> list[tuple[Instance, NodeRef]]:
        """Everything that can be refused is refused here, before any wait and without any lock."""
        if not nodes:
            raise InvalidRequest("DeleteNodes needs at least one node")
        snapshot = self._snapshot
        group = snapshot.groups.get(group_id)
        if group is None:
            raise NodeGroupNotFound(group_id)
        unique: dict[str, NodeRef] = {}
        for node in nodes:  # duplicates first: the bound is on distinct machines
            unique.setdefault(node.provider_id or node.name, node)
        bound = min(MAX_NODES_PER_DELETE, max(group.max_size, len(group.instances)))
        if len(unique) > bound:
            raise InvalidRequest(
                f"DeleteNodes names {len(unique)} distinct nodes, more than node group {group_id!r} can hold "
                f"(max size {group.max_size}, {len(group.instances)} machines) or than one call may carry "
                f"({MAX_NODES_PER_DELETE}); nothing was deleted"
            )
        work: list[tuple[Instance, NodeRef]] = []
        for key, node in unique.items():
            inst = snapshot.instances_by_id.get(key)
            owner = snapshot.by_provider_id.get(key)
            if inst is None or owner != group_id:
                where = f"it belongs to node group {owner!r}" if owner else "no node group of this server has it"
                raise NodeNotInGroup(
                    f"node {node.name or '?'} (providerID {key[:256] or 'empty'}) is not in node group "
                    f"{group_id!r}: {where}; nothing was deleted"
                )
            work.append((inst, node))
        return work

    def _admit_deletions(
        self, book: GroupBook, group_id: str, work: list[tuple[Instance, NodeRef]], deadline: Deadline
    ) -> list[tuple[Instance, NodeRef]]:
        """Check the min size against deletions already under way and register these as in flight."""
        with book.cond:
            book.admit_deletions(deadline)
            snapshot = self._snapshot
            # Accepted by the cloud already (a CA retry): nothing to send twice.
            to_send = [(inst, node) for inst, node in work if inst.id not in book.deleting]
            view = book.target if book.target is not None else self._snapshot_target(group_id)

            def lowers_size(instance_id: str) -> bool:
                inst = snapshot.instances_by_id.get(instance_id)
                return inst is None or inst.state != InstanceState.DELETING

            under_way = sum(1 for iid in book.in_flight if lowers_size(iid))
            new = [inst for inst, _ in to_send if inst.id not in book.in_flight and lowers_size(inst.id)]
            real = [node for _, node in to_send if not node.fake_reason]
            if real and new and view - under_way - len(new) < self.group(group_id).min_size:
                raise SizeLimitExceeded(
                    f"deleting {len(new)} node(s) would take {group_id!r} from {view - under_way} below its min "
                    f"size {self.group(group_id).min_size}; nothing was deleted"
                )
            if to_send:
                book.pin(view, self._clock())
                for inst, _ in to_send:
                    book.in_flight[inst.id] += 1
            return to_send

    def _send_deletions(
        self, book: GroupBook, group_id: str, to_send: list[tuple[Instance, NodeRef]], deadline: Deadline
    ) -> list[DomainError | None]:
        """Send every DELETE (in parallel for a multi-node call) and record each answer as it comes."""
        group = self.group(group_id)

        def one(inst: Instance, node: NodeRef) -> DomainError | None:
            try:
                self.adapter.delete_instance(group, inst, node, deadline)
                error: DomainError | None = None
            except DomainError as err:
                error = err
            self._record_deletion(book, group_id, inst, error)
            return error

        if len(to_send) <= 1:
            return [one(inst, node) for inst, node in to_send]
        with self._state_lock:
            if self._deleter is None:
                self._deleter = concurrent.futures.ThreadPoolExecutor(
                    DELETE_PARALLELISM, thread_name_prefix=f"delete-{self.name}"
                )
            pool = self._deleter
        # Each in a copy of this call's context: the DELETEs are a change the CA waits for (change_waiting).
        futures = [pool.submit(contextvars.copy_context().run, one, inst, node) for inst, node in to_send]
        # Each DELETE is bounded by the deadline, so waiting for all of them is bounded too.
        return [future.result() for future in futures]

    def _record_deletion(self, book: GroupBook, group_id: str, inst: Instance, error: DomainError | None) -> None:
        now = self._clock()
        with book.cond:
            book.in_flight[inst.id] -= 1
            if book.in_flight[inst.id] <= 0:
                del book.in_flight[inst.id]
            if error is None and inst.id not in book.deleting:
                book.deleting.add(inst.id)
                if inst.id in book.maybe_deleting:
                    # An earlier DELETE of it had an unknown outcome: whether the cloud lowered the size
                    # then or now is not known, so the size is re-read instead of adjusted.
                    book.maybe_deleting.discard(inst.id)
                    book.mark_unknown(f"node {inst.id} was deleted twice after an unknown outcome", now)
                else:
                    if inst.state != InstanceState.DELETING:  # the cloud lowered the size for this DELETE
                        view = book.target if book.target is not None else self._snapshot_target(group_id)
                        book.set_target(max(view - 1, 0), now)
                    book.changed_at = now
            elif isinstance(error, CloudOutcomeUnknown):
                book.maybe_deleting.add(inst.id)
                book.mark_unknown(f"the deletion of {inst.id} may or may not have been applied ({error})", now)
            book.cond.notify_all()

    def _deletion_result(
        self,
        book: GroupBook,
        group_id: str,
        work: list[tuple[Instance, NodeRef]],
        sent: list[tuple[Instance, NodeRef]],
        outcomes: list[DomainError | None],
        deadline: Deadline,
    ) -> int:
        failures = [err for err in outcomes if err is not None and not isinstance(err, CloudOutcomeUnknown)]
        unknown = [inst for (inst, _), err in zip(sent, outcomes, strict=True) if isinstance(err, CloudOutcomeUnknown)]
        done = len(work) - len(failures) - len(unknown)
        if any(err is None for err in outcomes):
            self.sync_soon()
        if unknown:
            self.reconcile_soon()
            unknown = self._confirm_from_listing(book, group_id, unknown, deadline)
            done = len(work) - len(failures) - len(unknown)
        if failures:
            first = failures[0]
            note = f"{done} of {len(work)} node(s) deleted" + (
                f", {len(unknown)} with an unknown outcome" if unknown else ""
            )
            first.args = (f"{first} ({note}; retrying deletes only the rest)",)
            raise first
        if unknown:
            names = ", ".join(inst.id for inst in unknown[:5])
            raise ChangeOutcomeUnknown(
                f"the cloud did not confirm the deletion of {len(unknown)} node(s) of {group_id!r} ({names}): the "
                f"request reached it, but the answer was lost or an error, so it may or may not have been applied "
                f"({done} of {len(work)} confirmed). The group is re-read from the cloud before its next change "
                "and TargetSize follows within seconds; retrying DeleteNodes is safe"
            )
        return done

    def _confirm_from_listing(
        self, book: GroupBook, group_id: str, unknown: list[Instance], deadline: Deadline
    ) -> list[Instance]:
        """With time left, wait for a listing after the unknown outcomes; the nodes it shows leaving (or
        gone) were deleted. Returns those still unconfirmed."""
        if deadline.remaining() - RESPONSE_MARGIN < 0.5:
            return unknown
        with book.cond:
            since = book.unknown_at
        try:
            snapshot = self._await_listing(self._listing.since(since), deadline)
        except DomainError:
            return unknown
        with book.cond:
            if book.unknown:  # the listing could not settle the group (other writes overlapped it)
                return unknown
        return [
            inst
            for inst in unknown
            if (seen := snapshot.instances_by_id.get(inst.id)) is not None and seen.state != InstanceState.DELETING
        ]


def _kept_instances(
    listed: tuple[Instance, ...], before: tuple[Instance, ...], known: Mapping[str, Instance]
) -> tuple[Instance, ...]:
    """``listed`` made of the previous snapshot's objects wherever a machine is unchanged, and the previous
    tuple itself when the group holds exactly what it held.

    A listing of a steady cluster then allocates nothing that outlives it: a 20,000-node snapshot is
    about 11 MiB of instances and strings, which the old and the new snapshot would otherwise each hold
    while they overlap, and which Python's allocator rarely gives back to the system afterwards.
    """
    kept = tuple(old if (old := known.get(inst.id)) is not None and old == inst else inst for inst in listed)
    if len(kept) == len(before) and all(a is b for a, b in zip(kept, before, strict=True)):
        return before
    return kept


INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def learned_over_cloud(learned: NodeTemplate, cloud: NodeTemplate | None) -> NodeTemplate:
    """A learned template served with the cloud's pool definition: resources from the real node, labels
    and taints of both, the cloud's winning where they name the same key. So a label or taint the pool
    gains, changes or drops while the group is at zero shows at once, and a node's stale value of a pool
    label never hides the pool's."""
    if cloud is None:
        return learned
    defined = {t.key for t in cloud.taints}
    return NodeTemplate(
        labels={**learned.labels, **cloud.labels},
        taints=(*cloud.taints, *(t for t in learned.taints if t.key not in defined)),
        capacity=learned.capacity,
        allocatable=learned.allocatable,
    )


def _machine_type_changed(
    learned: NodeTemplate, cloud: NodeTemplate | None, same: Callable[[str, str], bool] = str.__eq__
) -> bool:
    """The cloud now names another instance type for the group than the learned node carried; ``same`` is the
    cloud's own comparison (``CloudAdapter.same_machine_type``), so another spelling of one type is no change."""
    if cloud is None:
        return False
    now, then = cloud.labels.get(INSTANCE_TYPE_LABEL), learned.labels.get(INSTANCE_TYPE_LABEL)
    return bool(now and then and not same(now, then))
