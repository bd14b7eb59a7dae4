"""A call to the Kubernetes API server that its caller waits for no longer than it can afford.

The call runs in a daemon thread of its own. The client's connection attempts can outlast the timeout it
is given against an address that never answers, and the caller must not wait for that (an RPC has a
deadline, the elector a renew deadline), nor must a stuck call delay the process's exit. The calls of the
features that use this are few: a Lease renewal every ``retry_period``, two journal calls per size change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ApiCall(Generic[T]):
    """``fn(timeout)`` started at once in its own thread; ``wait`` for it, then read ``result``/``error``.

    ``wake``, when given, is set when the call ends, so a caller waiting for several things on one Event
    (the elector: the call, its stop, its renew deadline) is woken by this one too.
    """

    def __init__(
        self, fn: Callable[[float], T], timeout: float, name: str, wake: threading.Event | None = None
    ) -> None:
        self.fn = fn
        self.timeout = timeout
        self.done = threading.Event()
        self.result: T | None = None
        self.error: Exception | None = None
        self._wake = wake
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self.fn(self.timeout)
        except Exception as err:  # noqa: BLE001 - handed to the caller, which classifies it
            self.error = err
        finally:
            self.done.set()
            if self._wake is not None:
                self._wake.set()

    def wait(self, seconds: float) -> bool:
        """True once the call ended (within ``seconds``)."""
        return self.done.wait(max(seconds, 0.0))

    def outcome(self) -> Any:
        """The call's result, or its error raised (call once ``done``)."""
        if self.error is not None:
            raise self.error
        return self.result


def api_status(err: BaseException) -> int | None:
    """The HTTP status of an answer the client raised as ``ApiException``; None for network errors."""
    status = getattr(err, "status", None)
    return status if isinstance(status, int) and status > 0 else None
