"""The rules every cloud shares, written once: snapshot, sync, size changes, membership.

A ``Backend`` wraps one ``CloudAdapter``. Reads (the hot RPCs) come from an immutable in-memory
``Snapshot`` swapped atomically by a background sync thread, so they take no lock and do no I/O.
Mutations are serialised per node group, validated against min/max, written to the cloud inside
the caller's deadline, and recorded as *pending* changes that overlay the snapshot until a sync
that started after the change has seen the cloud catch up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from providers.cloud import CloudAdapter
from providers.deadline import Deadline
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudTimeout,
    CloudUnavailable,
    DeadlineTooShort,
    DomainError,
    InvalidDelta,
    InvalidRequest,
    NodeGroupNotFound,
    NodeNotInGroup,
    SizeLimitExceeded,
)
from providers.model import CloudListing, GroupState, Instance, InstanceState, NodeRef, NodeTemplate

log = logging.getLogger(__name__)

# A snapshot older than this is re-read from the cloud before an absolute size write.
FRESH_FOR_WRITE = 5.0
# After a size change, pick up the new instances soon (but not more often than this).
SYNC_SOON_DELAY = 3.0
# How long an unconfirmed change is remembered to make a CA retry of it idempotent.
INTENT_MEMORY = 120.0


@dataclass(frozen=True, slots=True)
class SyncSettings:
    interval: float | None = None  # None: use the cloud's cache hint, else DEFAULT_INTERVAL
    default_interval: float = 60.0
    min_interval: float = 5.0
    max_staleness: float = 600.0
    initial_sync_timeout: float = 20.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    groups: Mapping[str, GroupState]
    by_provider_id: Mapping[str, str]
    started_at: float  # monotonic time the listing was requested
    finished_at: float
    version: int

    @classmethod
    def empty(cls) -> Snapshot:
        return cls({}, {}, 0.0, 0.0, 0)


@dataclass(slots=True)
class _Pending:
    """A size change this server made that the last snapshot may not show yet."""

    target: int
    at: float
    deleting: set[str] = field(default_factory=set)  # instance ids


@dataclass(frozen=True, slots=True)
class _Intent:
    """An increase whose cloud call did not answer in time: base -> desired."""

    base: int
    desired: int
    at: float


@dataclass(frozen=True, slots=True)
class SyncHealth:
    synced: bool
    age: float | None  # seconds since the last good snapshot finished
    stale: bool  # older than max_staleness
    last_error: str
    consecutive_failures: int


class Backend:
    """One configured cloud backend: its adapter, its snapshot and its mutation rules."""

    def __init__(
        self,
        name: str,
        adapter: CloudAdapter,
        settings: SyncSettings | None = None,
        template_overrides: Mapping[str, Callable[[NodeTemplate | None], NodeTemplate | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.adapter = adapter
        self.settings = settings or SyncSettings()
        self._template_overrides = dict(template_overrides or {})
        self._clock = clock
        self._snapshot = Snapshot.empty()
        self._pending: dict[str, _Pending] = {}
        self._intents: dict[str, _Intent] = {}
        self._observed_labels: dict[str, Mapping[str, str]] = {}
        self._group_locks: dict[str, threading.Lock] = {}
        self._state_lock = threading.Lock()  # guards _pending/_intents/_group_locks, never held over I/O
        self._sync_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_sync_at = 0.0
        self._last_error = ""
        self._failures = 0
        self._max_age: float | None = None
        self.listeners: list[Callable[[Backend], None]] = []  # called after every sync attempt

    # ------------------------------------------------------------------ lifecycle
    def start(self, background: bool = True) -> None:
        """Try a first sync (bounded), then keep syncing in a daemon thread."""
        try:
            self.sync(Deadline.after(self.settings.initial_sync_timeout))
        except DomainError as err:
            log.warning(
                "initial sync failed; serving no groups until the cloud answers",
                extra={"backend": self.name, "error": str(err)},
            )
        if background:
            self._thread = threading.Thread(target=self._run, name=f"sync-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.adapter.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = max(0.0, self._next_sync_at - self._clock())
            self._wake.wait(timeout=delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._clock() < self._next_sync_at:
                continue
            with contextlib.suppress(DomainError):  # already logged and recorded by sync()
                self.sync(Deadline.after(60.0))

    def _interval(self) -> float:
        s = self.settings
        if s.interval is not None:
            return max(s.interval, s.min_interval)
        if self._max_age is not None:
            return max(self._max_age, s.min_interval)
        return s.default_interval

    def sync_soon(self, delay: float = SYNC_SOON_DELAY) -> None:
        """Ask the background thread to sync within ``delay`` seconds (rate-limited)."""
        at = self._clock() + max(delay, 0.0)
        with self._state_lock:
            earliest = self._snapshot.finished_at + self.settings.min_interval
            at = max(at, earliest)
            if at < self._next_sync_at:
                self._next_sync_at = at
                self._wake.set()

    # ------------------------------------------------------------------ sync
    def sync(self, deadline: Deadline) -> Snapshot:
        """Read every group from the cloud and swap the snapshot; keeps the old one on failure."""
        with self._sync_lock:
            started = self._clock()
            try:
                listing = self.adapter.list_groups(deadline)
            except DomainError as err:
                self._failures += 1
                self._last_error = str(err)
                backoff = min(self._interval(), self.settings.min_interval * (2 ** min(self._failures - 1, 6)))
                self._next_sync_at = self._clock() + backoff
                log.warning(
                    "cloud sync failed; serving the last good snapshot",
                    extra={
                        "backend": self.name,
                        "error": str(err),
                        "failures": self._failures,
                        "snapshot_age_s": self.health().age,
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
                self._next_sync_at = self._clock() + self._interval()
                self._settle_pending(snapshot)
            self._notify()
            return snapshot

    def _build_snapshot(self, listing: CloudListing, started: float) -> Snapshot:
        # Wall-clock time of the read, for humans (status command, CA logs of NodeGroup.debug).
        synced = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        groups: dict[str, GroupState] = {}
        by_pid: dict[str, str] = {}
        for group in listing.groups:
            group = replace(group, debug=f"backend={self.name} synced={synced} {group.debug}".strip())
            groups[group.id] = group
            for inst in group.instances:
                if inst.id:
                    by_pid[inst.id] = group.id
        return Snapshot(groups, by_pid, started, self._clock(), self._snapshot.version + 1)

    def _settle_pending(self, snapshot: Snapshot) -> None:
        """Drop pending changes that a snapshot started after them already reflects."""
        now = self._clock()
        for gid in list(self._pending):
            pending = self._pending[gid]
            if snapshot.started_at > pending.at or gid not in snapshot.groups:
                del self._pending[gid]
        for gid in list(self._intents):
            if now - self._intents[gid].at > INTENT_MEMORY:
                del self._intents[gid]

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
        return SyncHealth(synced, age, stale, self._last_error, self._failures)

    # ------------------------------------------------------------------ reads (no I/O, no locks)
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
        pending = self._pending.get(group_id)
        return pending.target if pending is not None else group.target_size

    def instances(self, group_id: str) -> tuple[Instance, ...]:
        group = self.group(group_id)
        pending = self._pending.get(group_id)
        if pending is None or not pending.deleting:
            return group.instances
        return tuple(
            replace(inst, state=InstanceState.DELETING, error=None) if inst.id in pending.deleting else inst
            for inst in group.instances
        )

    def view_key(self, group_id: str) -> tuple[int, float]:
        """Changes whenever ``instances``/``target_size`` of the group may change."""
        pending = self._pending.get(group_id)
        return (self._snapshot.version, pending.at if pending is not None else 0.0)

    def observe_node(self, group_id: str, labels: Mapping[str, str]) -> bool:
        """Remember the labels a real node of the group carries (templates for scale-from-zero).

        Returns True when they differ from what was known (so cached templates must be rebuilt).
        """
        if not labels or self._observed_labels.get(group_id) == labels:
            return False
        self._observed_labels[group_id] = dict(labels)
        return True

    def template(self, group_id: str) -> NodeTemplate | None:
        group = self.group(group_id)
        template = self.adapter.template(group, self._observed_labels.get(group_id))
        override = self._template_overrides.get(group_id)
        return override(template) if override is not None else template

    def template_key(self, group_id: str) -> tuple[int, int]:
        """Changes whenever ``template(group_id)`` may change: snapshot version and observed labels."""
        observed = self._observed_labels.get(group_id)
        return (self._snapshot.version, hash(tuple(sorted(observed.items()))) if observed else 0)

    def check_fresh_enough(self) -> None:
        """Raise CloudUnavailable when the snapshot is beyond the staleness bound (Refresh)."""
        health = self.health()
        if health.stale:
            age = "never synced" if health.age is None else f"last good sync {health.age:.0f}s ago"
            raise CloudUnavailable(
                f"backend {self.name!r}: cloud state is too stale to act on ({age}, bound "
                f"{self.settings.max_staleness:.0f}s); last error: {health.last_error or 'none'}"
            )

    # ------------------------------------------------------------------ mutations
    def _lock_for(self, group_id: str) -> threading.Lock:
        with self._state_lock:
            lock = self._group_locks.get(group_id)
            if lock is None:
                lock = self._group_locks[group_id] = threading.Lock()
            return lock

    def _acquire(self, group_id: str, deadline: Deadline) -> threading.Lock:
        lock = self._lock_for(group_id)
        if not lock.acquire(timeout=max(deadline.remaining() - 0.5, 0.0)):
            raise DeadlineTooShort(f"node group {group_id!r} is busy with another size change; retry shortly")
        return lock

    def _base(self, group_id: str, deadline: Deadline, force_read: bool = False) -> GroupState:
        """The group with its current target: from memory when fresh, else re-read from the cloud."""
        group = self.group(group_id)
        pending = self._pending.get(group_id)
        fresh_at = max(self._snapshot.started_at, pending.at if pending else 0.0)
        if force_read or self._clock() - fresh_at > FRESH_FOR_WRITE:
            fresh = self.adapter.read_group(group_id, deadline)
            group = replace(
                group,
                min_size=fresh.min_size,
                max_size=fresh.max_size,
                target_size=fresh.target_size,
                cloud_data=fresh.cloud_data,
            )
            with self._state_lock:
                self._pending[group_id] = _Pending(
                    group.target_size, self._clock(), pending.deleting if pending else set()
                )
            return group
        if pending is not None:
            group = replace(group, target_size=pending.target)
        return group

    def _record_target(self, group_id: str, target: int, deleting: Iterable[str] = ()) -> None:
        with self._state_lock:
            old = self._pending.get(group_id)
            marks = set(old.deleting) if old else set()
            marks.update(deleting)
            self._pending[group_id] = _Pending(target, self._clock(), marks)

    def increase_size(self, group_id: str, delta: int, deadline: Deadline) -> int:
        if delta <= 0:
            raise InvalidDelta(f"size increase must be positive, got delta={delta}")
        self.group(group_id)
        lock = self._acquire(group_id, deadline)
        try:
            intent = self._intents.get(group_id)
            group = self._base(group_id, deadline, force_read=intent is not None)
            # Settled only once the cloud could be read: if that read fails, the next retry must still
            # know that the first call may have landed, or it would apply the change a second time.
            self._intents.pop(group_id, None)
            if intent is not None and group.target_size == intent.desired and delta == intent.desired - intent.base:
                # The earlier call that timed out did land: this is the CA retrying it.
                log.info(
                    "increase already applied by an earlier call that timed out",
                    extra={"backend": self.name, "node_group": group_id, "delta": delta},
                )
                return group.target_size
            desired = group.target_size + delta
            if desired > group.max_size:
                raise SizeLimitExceeded(
                    f"size increase too large for node group {group_id!r}: target {group.target_size} + "
                    f"delta {delta} = {desired} > max {group.max_size}"
                )
            self._write_size(group, desired, deadline)
            return desired
        finally:
            lock.release()

    def decrease_target_size(self, group_id: str, delta: int, deadline: Deadline) -> int:
        if delta >= 0:
            raise InvalidDelta(f"size decrease must be negative, got delta={delta}")
        self.group(group_id)
        lock = self._acquire(group_id, deadline)
        try:
            group = self._base(group_id, deadline)
            running, booting, failed = self._machine_counts(group_id)
            unseen = max(group.target_size - running - booting - failed, 0)
            if group.target_size + delta < running + booting + unseen:
                # The cloud decides which machines a smaller size removes (booting ones first); one the
                # snapshot shows booting, or does not show yet, may run by now. Decide on a fresh view.
                # Syncing is a full listing, so it is done only when such machines could be hit, and it
                # also refreshes what every other RPC serves.
                self.sync(deadline)
                group = self._base(group_id, deadline)
                running, _, _ = self._machine_counts(group_id)
            desired = group.target_size + delta
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
            self._write_size(group, desired, deadline)
            return desired
        finally:
            lock.release()

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

    def _write_size(self, group: GroupState, desired: int, deadline: Deadline) -> None:
        try:
            self.adapter.set_target_size(group, desired, deadline)
        except (CloudUnavailable, DeadlineTooShort) as err:
            if isinstance(err, CloudTimeout):
                # The request may have reached the cloud: remember it so a retry is not applied twice.
                with self._state_lock:
                    self._intents[group.id] = _Intent(group.target_size, desired, self._clock())
                self.sync_soon(0.0)
                raise ChangeOutcomeUnknown(
                    f"the cloud did not confirm the size change of {group.id!r} to {desired} in time; "
                    "it will be re-read before any retry, so retrying is safe"
                ) from err
            raise
        self._record_target(group.id, desired)
        self.sync_soon()

    def delete_nodes(self, group_id: str, nodes: list[NodeRef], deadline: Deadline) -> int:
        if not nodes:
            raise InvalidRequest("DeleteNodes needs at least one node")
        self.group(group_id)
        lock = self._acquire(group_id, deadline)
        try:
            return self._delete_locked(group_id, nodes, deadline)
        finally:
            lock.release()

    def _resolve(self, group: GroupState, node: NodeRef) -> Instance:
        key = node.provider_id or node.name
        for inst in group.instances:
            if inst.id and inst.id == key:
                return inst
        owner = self._snapshot.by_provider_id.get(key)
        where = f"it belongs to node group {owner!r}" if owner else "no node group of this server has it"
        raise NodeNotInGroup(
            f"node {node.name or '?'} (providerID {key or 'empty'}) is not in node group {group.id!r}: {where}; "
            "nothing was deleted"
        )

    def _delete_locked(self, group_id: str, nodes: list[NodeRef], deadline: Deadline) -> int:
        group = self.group(group_id)
        pending = self._pending.get(group_id)
        already = pending.deleting if pending else set()
        work: list[tuple[Instance, NodeRef]] = []
        seen: set[str] = set()
        for node in nodes:  # validate all before touching the cloud
            inst = self._resolve(group, node)
            if inst.id in already or inst.id in seen or inst.state == InstanceState.DELETING:
                continue  # a retry of a deletion already under way: nothing to do twice
            seen.add(inst.id)
            work.append((inst, node))
        target = self.target_size(group_id)
        real = [n for _, n in work if not n.fake_reason]
        if real and target - len(work) < group.min_size:
            raise SizeLimitExceeded(
                f"deleting {len(work)} node(s) would take {group_id!r} from {target} below its min size "
                f"{group.min_size}; nothing was deleted"
            )
        done = 0
        try:
            for inst, node in work:
                deadline.check(needed=0.3)
                self.adapter.delete_instance(group, inst, node, deadline)
                done += 1
                target -= 1
                self._record_target(group_id, max(target, 0), deleting=[inst.id])
        except DomainError as err:
            if done:
                err.args = (
                    f"{err} (deleted {done} of {len(work)} node(s) before the failure; retrying deletes only the rest)",
                )
            raise
        finally:
            if done:
                self.sync_soon()
        return done
