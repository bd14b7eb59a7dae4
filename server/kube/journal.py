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
or removed by the replica that knows their id, so a late or repeated write never removes a newer entry;
a record also drops the backend's entries of node groups it no longer serves, once they are
``PRUNE_AFTER`` old.

Time: the calls before the cloud write share the RPC's deadline with it, and the cloud call always keeps
its part: the read may use a third of what is left when it starts, the record half of what is left then
(``READ_SHARE``, ``RECORD_SHARE``), each also capped by ``kubernetes.request_timeout``. A slow API server
therefore costs a refusal that names it (nothing sent to the cloud), never a cloud call squeezed into
an unknown outcome. The settles run in the background, bounded by ``kubernetes.request_timeout``; none
runs while a group's book lock is held.

Age: an entry's age is measured on one clock, the API server's. Its answers carry a ``Date`` header; an
entry stores the API server's time it was recorded at (``api_time``: the last ``Date`` seen plus the
writer's monotonic time since), and a reader subtracts it from the ``Date`` of the read that found it.
Wall clocks of two machines are never compared, so a skewed replica neither applies a retry twice nor
swallows a change. An entry without that time (an older writer) is taken as just recorded.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from providers.backend import Backend
from providers.change_journal import ChangeJournal, PendingChange
from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import JournalUnavailable
from providers.registry import Registry
from server.kube.calls import ApiCall, api_status
from server.kube.client import KubeConnection, core_path
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
# Of the time a size change has left (less the response margin), the journal read before the cloud call
# may use this share, and the record this share of what is left after the read: the cloud call keeps at
# least a third of it (1.6 s of the CA's default 5 s), which a slow API server cannot take away.
READ_SHARE = 1 / 3
RECORD_SHARE = 1 / 2
# An entry of a node group its backend no longer serves is dropped by the next record once this old.
PRUNE_AFTER = 600.0
# The journal ConfigMap's labels.
_LABELS = {"app.kubernetes.io/name": "ca-externalgrpc", "app.kubernetes.io/component": "change-journal"}
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
    since: float  # Unix time it was recorded, by the writer's clock (for people: recorded_at)
    replica: str
    reason: str = ""
    api_time: float | None = None  # the API server's Unix time it was recorded (ages are measured on this)

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
            api_time=float(data["api_time"]) if data.get("api_time") is not None else None,
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
    """The ConfigMap as last read or written: resourceVersion (None: it does not exist) and data, and the
    API server's time of the answer (its Date header; None when it sent none)."""

    version: str | None
    data: dict[str, str]
    api_time: float | None = None


def _api_date(headers: Mapping[str, str] | None) -> float | None:
    """The Unix time of an HTTP Date header (1 s resolution), or None."""
    value = (headers or {}).get("Date") or (headers or {}).get("date")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


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
        self._connection = connection
        self._observe = observe
        self.wall_clock = wall_clock
        self._copy: _Copy | None = None
        self._copy_lock = threading.Lock()  # guards _copy and _api_clock; never held over an API call
        self._api_clock: tuple[float, float] | None = None  # (API server time, our monotonic time) of an answer
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
        """Run ``fn(timeout)`` (``server/kube/calls.py``) and wait for it no later than ``until`` (monotonic)."""
        timeout = min(self.request_timeout, until - time.monotonic())
        if timeout < MIN_API_CALL_TIME:
            raise _Failed(f"no time left to {what} within the caller's deadline")
        call: ApiCall[Any] = ApiCall(fn, timeout, "journal-api")
        if not call.wait(timeout):
            raise _Failed(f"the API server did not answer within {timeout:.2f}s")
        err = call.error
        if err is None:
            return call.result
        # The client raises ApiException (with a status) for answers and urllib3 errors for the rest.
        status = api_status(err)
        if status == 409:
            raise _Conflict()
        if status is not None:
            reason = getattr(err, "reason", "") or ""
            detail = _api_message(getattr(err, "body", None))
            raise _Failed(f"the API server answered {status} {reason}{': ' + detail if detail else ''}")
        if _timed_out(err):
            # The client's own read timeout (the same budget) can fire a moment before our wait does: the
            # same fact, told the same way whichever clock won.
            raise _Failed(f"the API server did not answer within {timeout:.2f}s")
        raise _Failed(f"the API server could not be reached ({_network_reason(err)})")

    def _answered(self, headers: Mapping[str, str] | None) -> float | None:
        """Note the API server's clock from an answer's Date header; returns that time (None: no header)."""
        at = _api_date(headers)
        if at is not None:
            with self._copy_lock:
                self._api_clock = (at, time.monotonic())
        return at

    def api_now(self) -> float | None:
        """The API server's time now: its last Date header plus our monotonic time since (None: no answer yet)."""
        with self._copy_lock:
            clock = self._api_clock
        if clock is None:
            return None
        return clock[0] + (time.monotonic() - clock[1])

    def read(self, until: float) -> _Copy:
        def get(timeout: float) -> _Copy:
            try:
                found, headers = self._connection.request_with_headers(
                    "GET", core_path("configmaps", self.namespace, self.name), timeout=timeout
                )
            except Exception as err:
                if api_status(err) == 404:
                    return _Copy(None, {}, self._answered(getattr(err, "headers", None)))
                raise
            return self._copy_of(found, headers)

        copy: _Copy = self._call(f"read {self.where}", get, until)
        with self._copy_lock:
            self._copy = copy
        return copy

    def _copy_of(self, configmap: Mapping[str, Any], headers: Mapping[str, str]) -> _Copy:
        version = (configmap.get("metadata") or {}).get("resourceVersion")
        return _Copy(version, dict(configmap.get("data") or {}), self._answered(headers))

    def _write(self, base: _Copy, data: dict[str, str], until: float) -> _Copy:
        def put(timeout: float) -> _Copy:
            meta: dict[str, Any] = {"name": self.name, "labels": _LABELS}
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            if base.version is None:
                path = core_path("configmaps", self.namespace)
                done, headers = self._connection.request_with_headers("POST", path, body=body, timeout=timeout)
            else:
                meta["resourceVersion"] = base.version  # a ConfigMap changed since the read answers 409
                path = core_path("configmaps", self.namespace, self.name)
                done, headers = self._connection.request_with_headers("PUT", path, body=body, timeout=timeout)
            return self._copy_of(done, headers)

        copy: _Copy = self._call(f"write {self.where}", put, until)
        with self._copy_lock:
            self._copy = copy
        return copy

    def modify(
        self,
        backend: str,
        operation: str,
        key: str,
        change: Callable[[str | None], Any],
        until: float,
        also_remove: Callable[[Mapping[str, str]], Iterable[str]] | None = None,
    ) -> None:
        """Apply ``change`` (old value -> new value, None to remove, ``UNCHANGED`` to leave it) to one key,
        and remove the keys ``also_remove`` names, guarded by the resourceVersion and re-applied to a fresh
        read after a 409. Raises _Failed."""
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
            if also_remove is not None:
                for gone in list(also_remove(copy.data)):
                    if gone != key:
                        data.pop(gone, None)
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

    def __init__(
        self, journal: Journal, backend: str, served_groups: Callable[[], Iterable[str] | None] | None = None
    ) -> None:
        self.journal = journal
        self.backend = backend
        # The groups the backend serves now (None: not known, e.g. before its first sync): entries of
        # other groups are pruned once PRUNE_AFTER old.
        self._served_groups = served_groups
        self._lock = threading.Lock()  # guards the two dicts; never held over an API call
        self._current: dict[str, str | None] = {}  # group -> id of the entry there, as this replica knows it
        self._settled: dict[str, str] = {}  # group -> id of the entry this replica settled (its clear is queued)

    @staticmethod
    def _budget(deadline: Deadline, share: float) -> float:
        """The monotonic time by which a call before the cloud write must be done: ``share`` of what is left
        of the deadline less the answer's margin; the rest is the cloud call's."""
        now = time.monotonic()
        return now + max(deadline.expires_at - RESPONSE_MARGIN - now, 0.0) * share

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
            copy = self.journal.read(self._budget(deadline, READ_SHARE))
        except _Failed as err:
            self.journal.count(self.backend, "read", "failed")
            raise self._refused(group_id, "read", err) from None
        self.journal.count(self.backend, "read", "ok")
        text = copy.data.get(key)
        if text is None:
            with self._lock:
                self._current[group_id] = None
            return None
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
            age=_age(entry, copy.api_time),
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
            api_time=self.journal.api_now(),
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
            self.journal.modify(
                self.backend, "record", key, put, self._budget(deadline, RECORD_SHARE), also_remove=self._prunable
            )
        except _Failed as err:
            self.journal.count(self.backend, "record", "failed")
            raise self._refused(group_id, "write to", err) from None
        self.journal.count(self.backend, "record", "ok")
        with self._lock:
            self._current[group_id] = entry.id

    def _prunable(self, data: Mapping[str, str]) -> list[str]:
        """Keys of this backend's entries of node groups it no longer serves, PRUNE_AFTER old or more."""
        served = self._served_groups() if self._served_groups is not None else None
        now = self.journal.api_now()
        if served is None or now is None:
            return []
        served = set(served)
        gone = []
        for key, text in data.items():
            try:
                entry = Entry.from_json(text)
            except (ValueError, KeyError, TypeError):
                continue  # unreadable: an operator's edit, left alone
            if entry.backend != self.backend or entry.group in served or entry.api_time is None:
                continue
            if now - entry.api_time >= PRUNE_AFTER:
                gone.append(key)
        if gone:
            log.info(
                "dropping change journal entries of node groups no longer served",
                extra={"backend": self.backend, "journal": self.journal.where, "keys": gone},
            )
        return gone

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


def _age(entry: Entry, read_at: float | None) -> float:
    """Seconds since ``entry`` was recorded, both times by the API server's clock; 0 when either is unknown
    (taken as just recorded: a retry of it is recognised rather than applied twice)."""
    if entry.api_time is None or read_at is None:
        return 0.0
    return max(read_at - entry.api_time, 0.0)


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


def _timed_out(err: BaseException) -> bool:
    """Whether a network error is a read/connect timeout (urllib3's TimeoutError family or the socket's)."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, TimeoutError) or type(seen).__name__ in ("ReadTimeoutError", "ConnectTimeoutError"):
            return True
        seen = getattr(seen, "reason", None) or seen.__cause__ or seen.__context__
    return False


def _network_reason(err: BaseException) -> str:
    """The operating system's words for a failed connection ("Connection refused"), else the error's
    first line: urllib3 wraps them in several layers of repr."""
    text = str(getattr(err, "reason", None) or err)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    lines = text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300]}" if lines else type(err).__name__


def _served_groups(backend: Backend) -> list[str] | None:
    """The ids of the groups ``backend`` serves now; None before its first good sync."""
    if not backend.health().synced:
        return None
    return [group.id for group in backend.groups()]


def start_journal(
    connection: KubeConnection, settings: JournalConfig, registry: Registry, observe: Observer | None = None
) -> Callable[[], None]:
    """Attach the journal to every backend and start its background thread; returns the stop function."""
    journal = Journal(connection, settings, observe)
    journal.start()
    for backend in registry.backends:
        backend.journal = BackendJournal(journal, backend.name, functools.partial(_served_groups, backend))
    log.info("change journal on", extra={"journal": journal.where})

    def stop() -> None:
        for backend in registry.backends:
            backend.journal = None
        journal.stop()

    return stop
