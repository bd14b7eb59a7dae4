"""The durable change journal: every size change recorded in a ConfigMap before its cloud call.

One ConfigMap (``kubernetes.journal.configmap``) holds one key per node group with a change in flight
or of unknown outcome; the value is a JSON entry (backend, group, increase/decrease, base -> desired,
when, by which replica, and whether the outcome is known to be unknown). The backend calls the
``ChangeJournal`` interface of providers/change_journal.py:

- ``pending`` (before a write) reads the ConfigMap and hands back an entry that no one settled, so the
  backend adopts it as its intent and reads the group back before changing it;
- ``record`` (before the cloud call) writes the entry; if either fails, the write is refused and nothing
  is sent to the cloud (``JournalUnavailable``, UNAVAILABLE): without the record, a restart could apply
  the change twice;
- ``mark_unknown`` and ``clear`` (after the cloud call) are queued for a background thread, so the
  answer to the CA never waits for them; a failure is retried with backoff, and an entry left behind is
  adopted by the group's next write (which reads the group back first).

Every write replaces the whole ConfigMap guarded by its resourceVersion (optimistic concurrency): on 409
the ConfigMap is read again and the change re-applied to the fresh copy. Entries are only ever replaced
or removed by the replica that knows their id, so a late or repeated write never removes a newer entry.
Calls before the cloud write are bounded by the RPC's deadline (keeping time for the cloud call), the
others by ``kubernetes.request_timeout``; none runs while a group's book lock is held.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from providers.change_journal import ChangeJournal, PendingChange
from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import JournalUnavailable
from providers.group_book import MIN_CALL_TIME
from providers.registry import Registry
from server.kube.client import KubeConnection
from server.kube.settings import JournalConfig
from server.logs import redact

log = logging.getLogger(__name__)

# An API call is not started with less time than this left.
MIN_API_CALL_TIME = 0.05
# A write meeting 409 (another writer changed the ConfigMap meanwhile) is re-applied at most this often.
MAX_CONFLICT_RETRIES = 5
# Background settles (clear, mark unknown) that fail are retried after 1, 2, 4 ... s, this many times.
SETTLE_ATTEMPTS = 6
# At a clean stop, the queued settles get this long in all.
STOP_SETTLE_TIME = 2.0
# ConfigMap data keys allow these characters only.
_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")

#: what ``observe`` is called with: (backend, operation, result)
Observer = Callable[[str, str, str], None]


class _Conflict(Exception):
    """The ConfigMap changed since it was read (HTTP 409)."""


class _Failed(Exception):
    """An API call failed or did not answer in time; ``str`` says why (never a credential)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One journal entry, stored as JSON under ``entry_key(backend, group)``."""

    id: str
    backend: str
    group: str
    kind: str  # "increase" / "decrease"
    base: int
    desired: int
    state: str  # "in-flight": sent or about to be; "unknown": its answer was lost
    since: float  # Unix time it was recorded
    replica: str
    reason: str = ""

    def to_json(self) -> str:
        data = asdict(self)
        data["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))  # for kubectl readers
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Entry:
        data = json.loads(text)
        return cls(
            id=str(data["id"]),
            backend=str(data["backend"]),
            group=str(data["group"]),
            kind=str(data["kind"]),
            base=int(data["base"]),
            desired=int(data["desired"]),
            state=str(data["state"]),
            since=float(data["since"]),
            replica=str(data["replica"]),
            reason=str(data.get("reason", "")),
        )


def entry_key(backend: str, group_id: str) -> str:
    """``<backend>.<group>`` when that is a valid ConfigMap key, else a readable prefix and a hash of both."""
    key = f"{backend}.{group_id}"
    if _KEY.match(key):
        return key
    digest = hashlib.sha256(f"{backend}\0{group_id}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^-._a-zA-Z0-9]", "_", key)[:200]
    return f"{readable}.{digest}"


@dataclass(frozen=True, slots=True)
class _Copy:
    """The ConfigMap as last read or written: resourceVersion (None: it does not exist) and data."""

    version: str | None
    data: dict[str, str]


class Journal:
    """The ConfigMap and the API calls on it, shared by every backend's ``BackendJournal``."""

    def __init__(
        self,
        connection: KubeConnection,
        settings: JournalConfig,
        observe: Observer | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = connection.namespace
        self.name = settings.configmap
        self.identity = connection.identity
        self.request_timeout = connection.request_timeout
        self._core = connection.core()
        self._observe = observe
        self.wall_clock = wall_clock
        self._copy: _Copy | None = None
        self._copy_lock = threading.Lock()  # guards _copy only; never held over an API call
        self._settles: dict[str, _Settle] = {}
        self._settle_cond = threading.Condition()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run_settles, name="journal-settle", daemon=True)

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        with self._settle_cond:
            self._settle_cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout=self.request_timeout + 1.0)
        # A clean stop settles what is queued (one try each, bounded), so a restart adopts nothing stale.
        with self._settle_cond:
            left, self._settles = list(self._settles.values()), {}
        until = time.monotonic() + STOP_SETTLE_TIME
        for settle in left:
            try:
                self.modify(settle.backend, settle.operation, settle.key, settle.change, until)
            except _Failed as err:
                self.count(settle.backend, settle.operation, "failed")
                log.warning(
                    "change journal entry left for the next start to adopt",
                    extra={"backend": settle.backend, "journal": self.where, "error": str(err)},
                )
            else:
                self.count(settle.backend, settle.operation, "ok")

    def for_backend(self, backend: str) -> BackendJournal:
        return BackendJournal(self, backend)

    def count(self, backend: str, operation: str, result: str) -> None:
        if self._observe is not None:
            self._observe(backend, operation, result)

    # ------------------------------------------------------------------ API calls
    def _call(self, what: str, fn: Callable[[float], Any], until: float) -> Any:
        """Run ``fn(timeout)`` and wait for it no later than ``until`` (monotonic).

        The call runs in a daemon thread of its own: the client's connection retries can take several
        times its timeout against an address that never answers, and the caller must not wait for that
        (nor must a stuck call delay the process's exit). Journal calls are few (three per size change).
        """
        timeout = min(self.request_timeout, until - time.monotonic())
        if timeout < MIN_API_CALL_TIME:
            raise _Failed(f"no time left to {what} within the caller's deadline")
        call = _Call(fn, timeout)
        threading.Thread(target=call.run, name="journal-api", daemon=True).start()
        if not call.done.wait(timeout):
            raise _Failed(f"the API server did not answer within {timeout:.2f}s")
        err = call.error
        if err is None:
            return call.result
        # The client raises ApiException (with a status) for answers and urllib3 errors for the rest.
        status = getattr(err, "status", None)
        if status == 409:
            raise _Conflict()
        if status is not None:
            reason = getattr(err, "reason", "") or ""
            detail = _api_message(getattr(err, "body", None))
            raise _Failed(f"the API server answered {status} {reason}{': ' + detail if detail else ''}")
        raise _Failed(f"the API server could not be reached ({_network_reason(err)})")

    def read(self, until: float) -> _Copy:
        def get(timeout: float) -> _Copy:
            try:
                found = self._core.read_namespaced_config_map(self.name, self.namespace, _request_timeout=timeout)
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    return _Copy(None, {})
                raise
            return _Copy(found.metadata.resource_version, dict(found.data or {}))

        copy: _Copy = self._call(f"read {self.where}", get, until)
        with self._copy_lock:
            self._copy = copy
        return copy

    def _write(self, base: _Copy, data: dict[str, str], until: float) -> _Copy:
        from kubernetes import client

        def put(timeout: float) -> _Copy:
            meta = client.V1ObjectMeta(
                name=self.name,
                resource_version=base.version,
                labels={"app.kubernetes.io/name": "ca-externalgrpc", "app.kubernetes.io/component": "change-journal"},
            )
            body = client.V1ConfigMap(metadata=meta, data=data)
            if base.version is None:
                done = self._core.create_namespaced_config_map(self.namespace, body, _request_timeout=timeout)
            else:
                done = self._core.replace_namespaced_config_map(
                    self.name, self.namespace, body, _request_timeout=timeout
                )
            return _Copy(done.metadata.resource_version, dict(done.data or {}))

        copy: _Copy = self._call(f"write {self.where}", put, until)
        with self._copy_lock:
            self._copy = copy
        return copy

    def modify(self, backend: str, operation: str, key: str, change: Callable[[str | None], Any], until: float) -> None:
        """Apply ``change`` (old value -> new value, None to remove, ``UNCHANGED`` to leave it) to one key,
        guarded by the resourceVersion and re-applied to a fresh read after a 409. Raises _Failed."""
        with self._copy_lock:
            copy = self._copy
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            if copy is None:
                copy = self.read(until)
            new = change(copy.data.get(key))
            if new is UNCHANGED:
                return
            data = dict(copy.data)
            if new is None:
                data.pop(key, None)
            else:
                data[key] = new
            try:
                self._write(copy, data, until)
            except _Conflict:
                self.count(backend, operation, "conflict")
                copy = None
                continue
            return
        raise _Failed(f"{self.where} kept changing under this write ({MAX_CONFLICT_RETRIES + 1} conflicts)")

    # ------------------------------------------------------------------ background settles
    def settle_later(self, settle: _Settle) -> None:
        with self._settle_cond:
            self._settles[settle.key] = settle  # a newer settle of the same key replaces an older one
            self._settle_cond.notify_all()

    def _run_settles(self) -> None:
        while not self._stop.is_set():
            with self._settle_cond:
                now = time.monotonic()
                ready = [s for s in self._settles.values() if s.not_before <= now]
                if not ready:
                    waits = [s.not_before - now for s in self._settles.values()]
                    self._settle_cond.wait(timeout=min(waits, default=None))
                    continue
                for settle in ready:
                    del self._settles[settle.key]
            for index, settle in enumerate(ready):
                if self._stop.is_set():  # stop() settles the rest itself
                    with self._settle_cond:
                        for later in ready[index:]:
                            self._settles.setdefault(later.key, later)
                    return
                self._settle(settle)

    def _settle(self, settle: _Settle) -> None:
        try:
            self.modify(
                settle.backend, settle.operation, settle.key, settle.change, time.monotonic() + self.request_timeout
            )
        except _Failed as err:
            self.count(settle.backend, settle.operation, "failed")
            attempts = settle.attempts + 1
            log.warning(
                "could not update the change journal after a size change; "
                + ("retrying" if attempts < SETTLE_ATTEMPTS else "the group's next size change adopts the entry"),
                extra={
                    "backend": settle.backend,
                    "journal": self.where,
                    "operation": settle.operation,
                    "error": str(err),
                    "attempt": attempts,
                },
            )
            if attempts < SETTLE_ATTEMPTS:
                with self._settle_cond:
                    if settle.key not in self._settles:  # not replaced by a newer settle meanwhile
                        self._settles[settle.key] = replace(
                            settle, attempts=attempts, not_before=time.monotonic() + 2 ** (attempts - 1)
                        )
                        self._settle_cond.notify_all()
            return
        self.count(settle.backend, settle.operation, "ok")


UNCHANGED = object()


class _Call:
    """One API call run in its own thread: its result or error, and when it ended."""

    def __init__(self, fn: Callable[[float], Any], timeout: float) -> None:
        self.fn = fn
        self.timeout = timeout
        self.done = threading.Event()
        self.result: Any = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(self.timeout)
        except Exception as err:  # noqa: BLE001 - handed to the caller, which classifies it
            self.error = err
        finally:
            self.done.set()


@dataclass(frozen=True, slots=True)
class _Settle:
    backend: str
    operation: str  # "clear" / "mark_unknown"
    key: str
    change: Callable[[str | None], Any]
    attempts: int = 0
    not_before: float = 0.0


class BackendJournal(ChangeJournal):
    """One backend's entries in the journal (the interface ``providers.backend.Backend`` calls).

    For each group it remembers the id of the entry it last adopted or wrote: ``record`` replaces only
    that entry (another one appearing meanwhile means another replica writes to the group: refused), and
    ``mark_unknown``/``clear`` touch only that entry, never a newer one.
    """

    def __init__(self, journal: Journal, backend: str) -> None:
        self.journal = journal
        self.backend = backend
        self._lock = threading.Lock()  # guards the two dicts; never held over an API call
        self._current: dict[str, str | None] = {}  # group -> id of the entry there, as this replica knows it
        self._settled: dict[str, str] = {}  # group -> id of the entry this replica settled (its clear is queued)

    def _budget(self, deadline: Deadline) -> float:
        """The monotonic time by which a call before the cloud write must be done: the cloud call keeps
        MIN_CALL_TIME and the answer keeps RESPONSE_MARGIN of the deadline."""
        return deadline.expires_at - RESPONSE_MARGIN - MIN_CALL_TIME

    def _refused(self, group_id: str, what: str, err: Exception) -> JournalUnavailable:
        return JournalUnavailable(
            f"node group {group_id!r} of backend {self.backend!r}: could not {what} the change journal "
            f"({self.journal.where}) before the cloud call: {err}. Nothing was sent to the cloud: without the "
            "record a restart or fail-over could apply this change twice (kubernetes.journal is on). Retrying "
            "is safe once the Kubernetes API server answers"
        )

    def pending(self, group_id: str, deadline: Deadline) -> PendingChange | None:
        key = entry_key(self.backend, group_id)
        try:
            copy = self.journal.read(self._budget(deadline))
        except _Failed as err:
            self.journal.count(self.backend, "read", "failed")
            raise self._refused(group_id, "read", err) from None
        self.journal.count(self.backend, "read", "ok")
        text = copy.data.get(key)
        if text is None:
            with self._lock:
                self._current[group_id] = None
            return None
        now = self.journal.wall_clock()
        try:
            entry = Entry.from_json(text)
        except (ValueError, KeyError, TypeError) as err:
            # Unreadable (edited by hand?): nothing to recognise a retry by, but the group is read back.
            log.warning(
                "unreadable change journal entry; reading the group back before changing it",
                extra={
                    "backend": self.backend,
                    "node_group": group_id,
                    "journal": self.journal.where,
                    "error": str(err),
                },
            )
            with self._lock:
                self._current[group_id] = _raw_id(text)
            return PendingChange(group_id, "unreadable", 0, 0, 0.0, True, "unknown")
        with self._lock:
            self._current[group_id] = entry.id
            if self._settled.get(group_id) == entry.id:
                return None  # this replica already knows its outcome; its clear is queued
        return PendingChange(
            group_id=group_id,
            kind=entry.kind,
            base=entry.base,
            desired=entry.desired,
            age=max(now - entry.since, 0.0),
            unknown=entry.state == "unknown",
            replica=entry.replica,
        )

    def record(self, group_id: str, kind: str, base: int, desired: int, deadline: Deadline) -> None:
        key = entry_key(self.backend, group_id)
        entry = Entry(
            id=uuid.uuid4().hex[:16],
            backend=self.backend,
            group=group_id,
            kind=kind,
            base=base,
            desired=desired,
            state="in-flight",
            since=self.journal.wall_clock(),
            replica=self.journal.identity,
        )
        with self._lock:
            expected = self._current.get(group_id)

        def put(current: str | None) -> str:
            # Gone (settled meanwhile, by this replica's queued clear or by another) or the one read before
            # this write: fine. Any other entry means another replica is writing to this group.
            found = None if current is None else _entry_id(current)
            if found is not None and found != expected:
                raise _Failed(
                    "another replica recorded a change of this group after it was read "
                    f"({_describe(current)}); two replicas must not write to one group"
                )
            return entry.to_json()

        try:
            self.journal.modify(self.backend, "record", key, put, self._budget(deadline))
        except _Failed as err:
            self.journal.count(self.backend, "record", "failed")
            raise self._refused(group_id, "write to", err) from None
        self.journal.count(self.backend, "record", "ok")
        with self._lock:
            self._current[group_id] = entry.id

    def mark_unknown(self, group_id: str, reason: str) -> None:
        with self._lock:
            target = self._current.get(group_id)
        if target is None:
            return

        def mark(current: str | None) -> Any:
            if current is None or _entry_id(current) != target:
                return UNCHANGED
            try:
                # Masked like every error the server shows: a cloud's error body may echo a credential.
                return replace(Entry.from_json(current), state="unknown", reason=redact(reason[:1000])).to_json()
            except (ValueError, KeyError, TypeError):
                return UNCHANGED

        self.journal.settle_later(_Settle(self.backend, "mark_unknown", entry_key(self.backend, group_id), mark))

    def clear(self, group_id: str) -> None:
        with self._lock:
            target = self._current.get(group_id)
            if target is None:
                return
            self._settled[group_id] = target

        def remove(current: str | None) -> Any:
            if current is None or _entry_id(current) != target:
                return UNCHANGED
            return None

        self.journal.settle_later(_Settle(self.backend, "clear", entry_key(self.backend, group_id), remove))


def _entry_id(text: str) -> str:
    try:
        return str(json.loads(text)["id"])
    except (ValueError, KeyError, TypeError):
        return _raw_id(text)


def _raw_id(text: str) -> str:
    return "raw-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _describe(text: str | None) -> str:
    if text is None:
        return "its entry was removed"
    try:
        entry = Entry.from_json(text)
    except (ValueError, KeyError, TypeError):
        return "an unreadable entry"
    return f"{entry.kind} {entry.base} -> {entry.desired} by {entry.replica}"


def _api_message(body: Any) -> str:
    try:
        return str(json.loads(body)["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return ""


def _network_reason(err: BaseException) -> str:
    """The operating system's words for a failed connection ("Connection refused"), else the error's
    first line: urllib3 wraps them in several layers of repr."""
    text = str(getattr(err, "reason", None) or err)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    lines = text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300]}" if lines else type(err).__name__


def start_journal(
    connection: KubeConnection, settings: JournalConfig, registry: Registry, observe: Observer | None = None
) -> Callable[[], None]:
    """Attach the journal to every backend and start its background thread; returns the stop function."""
    journal = Journal(connection, settings, observe)
    journal.start()
    for backend in registry.backends:
        backend.journal = journal.for_backend(backend.name)
    log.info("change journal on", extra={"journal": journal.where})

    def stop() -> None:
        for backend in registry.backends:
            backend.journal = None
        journal.stop()

    return stop
