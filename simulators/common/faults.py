"""Fault injection per route: error statuses, throttling, slowness, dropped connections, bad bodies.

A ``Fault`` describes what goes wrong and for which requests; the ``FaultInjector`` decides, request by
request, which fault (if any) applies. Faults are checked in the order they were added and the first
one that applies wins.

By default a fault replaces the cloud's work: the request is never processed (``delay`` holds it back
first, so a delayed write lands late). With ``apply`` the cloud processes the request first and the
fault only spoils the answer: a 5xx, a dropped connection or an answer held back past the client's
timeout, after the change was made. That is the case a client cannot tell from "nothing happened".
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, fields
from typing import Any


class InvalidFault(ValueError):
    """A fault description (usually JSON from the control API) that cannot be used."""


@dataclass(frozen=True)
class Fault:
    route: str  # a route name, or "*" for every route
    method: str = "*"  # an HTTP method, or "*"
    status: int | None = None  # answer with this status and the cloud's JSON error body
    retry_after: float | None = None  # seconds, sent as the Retry-After header
    delay: float = 0.0  # seconds of real sleep before answering (or before dropping)
    drop: bool = False  # close the connection without any answer; the handler does not run
    malformed: bool = False  # answer 200 with a truncated, invalid JSON body
    empty_body: bool = False  # send the answer's status and headers with no body (with ``apply``: a bare 2xx)
    content_type: str | None = None  # override the Content-Type of whatever is answered
    times: int | None = None  # how many matching requests it applies to; None = until cleared
    after: int = 0  # let this many matching requests through untouched first
    # Extensions beyond the shared contract, for cloud-specific error shapes:
    headers: dict[str, str] | None = None  # extra response headers (e.g. X-Ratelimit-Remaining)
    body: Any = None  # replaces the cloud's error body for a ``status`` fault (e.g. a type-clashing body)
    message: str | None = None  # message placed in the cloud's error body
    apply: bool = False  # process the request first, then answer with the fault (status, drop, delay)

    def __post_init__(self) -> None:
        if not self.route:
            raise InvalidFault("fault route must be a route name or '*'")
        if self.status is not None and not 100 <= self.status <= 599:
            raise InvalidFault(f"fault status must be an HTTP status, got {self.status}")
        if self.delay < 0:
            raise InvalidFault(f"fault delay must be >= 0, got {self.delay}")
        if self.times is not None and self.times < 1:
            raise InvalidFault(f"fault times must be >= 1 or null, got {self.times}")
        if self.after < 0:
            raise InvalidFault(f"fault after must be >= 0, got {self.after}")
        if self.retry_after is not None and self.retry_after < 0:
            raise InvalidFault(f"fault retry_after must be >= 0, got {self.retry_after}")

    def applies_to(self, route: str, method: str) -> bool:
        return (self.route == "*" or self.route == route) and (self.method == "*" or self.method.upper() == method)

    @classmethod
    def from_dict(cls, data: Any) -> Fault:
        if not isinstance(data, dict):
            raise InvalidFault("a fault must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidFault(f"unknown fault field(s): {', '.join(unknown)}")
        if "route" not in data:
            raise InvalidFault("a fault needs a 'route' (a route name or '*')")
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidFault(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _ActiveFault:
    """Mutable bookkeeping for one added fault: how many matches it skipped and applied."""

    __slots__ = ("fault", "skipped", "used")

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.skipped = 0
        self.used = 0

    def exhausted(self) -> bool:
        return self.fault.times is not None and self.used >= self.fault.times


class FaultInjector:
    def __init__(self) -> None:
        self._active: list[_ActiveFault] = []
        self._lock = threading.Lock()

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._active.append(_ActiveFault(fault))

    def clear(self) -> None:
        with self._lock:
            self._active.clear()

    def remove(self, fault: Fault) -> bool:
        """Take back one fault added earlier (this very object, not an equal one); False if it is gone
        already (used up, or cleared). Lets faults that overlap in time end one by one."""
        with self._lock:
            for index, entry in enumerate(self._active):
                if entry.fault is fault:
                    del self._active[index]
                    return True
        return False

    def active(self) -> list[Fault]:
        with self._lock:
            return [entry.fault for entry in self._active if not entry.exhausted()]

    def match(self, route: str, method: str) -> Fault | None:
        """The fault that applies to this request, consuming one of its uses; None if none applies.

        Every fault whose ``after`` window this request falls into counts it as skipped, so two faults
        on one route with different ``after`` values each see the same sequence of requests.
        """
        method = method.upper()
        chosen: Fault | None = None
        with self._lock:
            for entry in self._active:
                if entry.exhausted() or not entry.fault.applies_to(route, method):
                    continue
                if entry.skipped < entry.fault.after:
                    entry.skipped += 1
                    continue
                if chosen is None:
                    entry.used += 1
                    chosen = entry.fault
            self._active = [entry for entry in self._active if not entry.exhausted()]
        return chosen
