"""Plaintext HTTP for kubelet probes and Prometheus: /healthz, /readyz, /metrics.

Kubelet probes cannot present client certificates, so they never go to the (m)TLS gRPC port.

What the probes mean (docs/how-to/monitoring.md, "Know what the probes say"):

* ``/readyz`` fails only while the server drains after SIGTERM. A stale or not-yet-synced cloud view
  does *not* make it fail: in the Service layout an unready pod loses its Service endpoint, and the
  CA would then see connection errors instead of the UNAVAILABLE answer of ``Refresh`` that says what
  is wrong. The answer's body still lists every backend's state for people.
* ``/healthz`` (liveness) fails only when the process is wedged, i.e. a restart is the cure: the gRPC
  worker pool has not run a queued no-op for ``wedged_after`` seconds (every worker stuck), or a
  backend's sync loop has not finished an attempt, good or bad, for twice its staleness bound (each
  attempt is bounded by its deadline and the loop retries at least once per interval, so a loop that
  stays silent that long has died or hangs). A failing cloud is not a reason to restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from providers.errors import printable
from server.http_server import TEXT, Answer, BoundedHttpServer, HttpLimits
from server.metrics import EXPOSITION_CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

#: a gRPC worker pool that has not started a queued no-op for this long is wedged. Far above any
#: CA deadline (10 s in the manifests): every worker would have to be stuck well past it.
WEDGED_AFTER = 60.0

Check = Callable[[], tuple[bool, str]]


class Submitter(Protocol):
    """The serving engine's pool of call workers (``submit`` runs a task there)."""

    def submit(self, task: Callable[[], object]) -> object: ...


class Liveness:
    """Tells a wedged process from a busy one or one whose cloud is failing (see the module doc)."""

    def __init__(
        self,
        executor: Submitter | None,
        wedged_after: float = WEDGED_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._executor = executor
        self._wedged_after = wedged_after
        self._clock = clock
        self._lock = threading.Lock()
        self._canary_queued_at: float | None = None
        self._loops: dict[str, tuple[float, float]] = {}  # backend -> (last attempt ended, silence allowed)
        self._unwatched: set[str] = set()  # paused loops (a follower replica): silence expected

    def watch(self, backends: Iterable[Any]) -> None:
        """Start watching the sync loops of ``backends`` (before their first sync)."""
        now = self._clock()
        with self._lock:
            for backend in backends:
                self._loops[backend.name] = (now, _allowed_silence(backend))
                self._unwatched.discard(backend.name)

    def unwatch(self, backends: Iterable[Any]) -> None:
        """Stop watching the sync loops of ``backends`` (paused on a follower replica: silence is expected)."""
        with self._lock:
            for backend in backends:
                self._loops.pop(backend.name, None)
                self._unwatched.add(backend.name)

    def sync_attempt_ended(self, backend: Any) -> None:
        """Listener for ``Backend.listeners``: called after every sync attempt, good or bad."""
        with self._lock:
            if backend.name in self._unwatched:  # the last listing of a loop just paused
                return
            self._loops[backend.name] = (self._clock(), _allowed_silence(backend))

    def check(self) -> tuple[bool, str]:
        """``(alive, reason)``; never blocks (a kubelet probe times out after one second by default)."""
        now = self._clock()
        problems = []
        with self._lock:
            for name, (last, allowed) in sorted(self._loops.items()):
                if now - last > allowed:
                    problems.append(f"{name}: the sync loop has not finished an attempt for {now - last:.0f}s")
            queued = self._canary_queued_at
            if queued is not None and now - queued > self._wedged_after:
                problems.append(f"the gRPC worker pool has not run a queued task for {now - queued:.0f}s")
            elif queued is None and self._executor is not None:
                self._canary_queued_at = now
                try:
                    self._executor.submit(self._canary_ran)
                except RuntimeError:  # shut down: the server is stopping, which is not a wedge
                    self._canary_queued_at = None
        if problems:
            return False, "wedged: " + "; ".join(problems)
        return True, "ok"

    def _canary_ran(self) -> None:
        with self._lock:
            self._canary_queued_at = None


def _allowed_silence(backend: Any) -> float:
    return 2 * float(backend.settings.max_staleness)


def readiness(draining: Callable[[], bool], backends: Iterable[Any], role: Check | None = None) -> tuple[bool, str]:
    """``(ready, body)``: unready only while draining, or, with leader election (``role``), on a follower
    and on a new leader before its first sync; the body lists each backend's sync state."""
    states = [_backend_state(backend) for backend in backends]
    if draining():
        return False, "; ".join(["shutting down", *states])
    if role is not None:
        leads, what = role()
        if not leads:
            return False, "; ".join([what, *states])
        states.insert(0, what)
    return True, "; ".join(["ready", *states])


def _backend_state(backend: Any) -> str:
    """The backend's line on /readyz: which state and why, in words (server/diagnosis.py), never the
    settings or the cloud's message, which ``status`` and the log give to those allowed to see them."""
    from server.diagnosis import report

    return report(backend).readiness


# ---------------------------------------------------------------------- the HTTP server


def serve_http(
    host: str,
    port: int,
    metrics: Metrics | None,
    live: Check | None,
    ready: Check | None,
    limits: HttpLimits | None = None,
) -> BoundedHttpServer:
    """Serve /metrics, /healthz and /readyz in a daemon thread (server/http_server.py); return at once.

    ``live`` and ``ready`` return ``(ok, reason)``; the reason is the body (200 or 503). A check
    that raises answers 503 naming the exception type.
    """

    def metrics_answer() -> Answer:
        if metrics is None:
            return 404, b"metrics disabled\n", TEXT
        return 200, metrics.exposition(), EXPOSITION_CONTENT_TYPE

    def check_answer(check: Check | None, path: str) -> Callable[[], Answer]:
        def answer() -> Answer:
            ok, reason = _run_check(check, path)
            return (200 if ok else 503), printable(reason).encode() + b"\n", TEXT

        return answer

    routes = {
        "/metrics": metrics_answer,
        "/healthz": check_answer(live, "/healthz"),
        "/readyz": check_answer(ready, "/readyz"),
    }
    return BoundedHttpServer(host, port, routes, limits)


def _run_check(check: Check | None, path: str) -> tuple[bool, str]:
    if check is None:
        return True, "ok"
    try:
        ok, reason = check()
    except Exception as err:
        log.exception("the %s check failed", path)
        return False, f"{path} check failed: {type(err).__name__}"
    return bool(ok), str(reason)


def serve_probes(host: str, port: int, running: Any) -> BoundedHttpServer:
    """The probe/metrics endpoint of a ``server.app.RunningServer``."""
    backends = running.registry.backends
    return serve_http(
        host,
        port,
        running.metrics,
        live=running.liveness.check,
        ready=lambda: readiness(
            running.draining, backends, running.leadership.readiness if running.leadership is not None else None
        ),
        limits=running.config.http.limits,
    )
