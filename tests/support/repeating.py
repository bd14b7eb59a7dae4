"""A daemon thread that does one thing every few seconds until stopped: the load and sampling loops of the
e2e scenarios (tests/e2e/failover.py's arrivals, the chaos campaign's memory samples)."""

from __future__ import annotations

import threading
from typing import Self


class Repeating:
    """Calls ``tick`` every ``every`` seconds in a daemon thread named ``name``, from ``start`` until ``stop``;
    with ``at_once``, the first call is at ``start``, else ``every`` seconds after it."""

    def __init__(self, name: str, every: float, *, at_once: bool) -> None:
        self.every = every
        self._at_once = at_once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        if self._at_once:
            self.tick()
        while not self._stop.wait(self.every):
            self.tick()
