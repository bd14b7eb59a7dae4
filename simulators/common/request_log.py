"""A thread-safe record of every request a simulator answered, for assertions in tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    at: float  # simulated time when the request was answered
    method: str
    path: str
    route: str  # route name, "unknown" when nothing matched
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names, values as sent (secrets too)
    body: Any = None  # parsed JSON, or None
    status: int = 0  # final status; 0 when the connection was dropped without an answer
    # When the request had been read in full (before any injected delay), and the status the cloud's own
    # handler answered: None when it never ran (a fault replaced it, the rate limit, a bad route or body).
    # A write whose ``handled`` is 2xx changed the cloud, whatever ``status`` the client got.
    received: float = 0.0
    handled: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "query": dict(sorted(self.query.items())),
            "headers": dict(self.headers),
            "body": self.body,
            "status": self.status,
            "received": self.received,
            "handled": self.handled,
        }


class RequestLog:
    def __init__(self) -> None:
        self._entries: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def append(self, entry: RecordedRequest) -> None:
        with self._lock:
            self._entries.append(entry)

    def all(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def filter(self, route: str | None = None, method: str | None = None) -> list[RecordedRequest]:
        wanted_method = method.upper() if method else None
        with self._lock:
            return [
                entry
                for entry in self._entries
                if (route is None or entry.route == route) and (wanted_method is None or entry.method == wanted_method)
            ]

    def count(self, route: str | None = None, method: str | None = None) -> int:
        return len(self.filter(route, method))

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
