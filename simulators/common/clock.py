"""Clocks that drive a simulator's asynchronous transitions.

Simulated clouds never use wall-clock timers: every delayed change (a node becoming ready, a deleted
node disappearing) is due at a time read from a ``Clock``. Tests use ``ManualClock`` and move time
explicitly; the demo uses ``WallClock`` so that things happen on their own, optionally faster.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Current simulated time in seconds (epoch-like float)."""
        ...


class ManualClock:
    """Time that only moves when ``advance`` is called."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance({seconds}))")
        with self._lock:
            self._now += float(seconds)
            return self._now


class WallClock:
    """Simulated time running ``speed`` times as fast as the wall clock, plus explicit jumps."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self._speed = float(speed)
        self._origin_wall = time.time()
        self._origin_monotonic = time.monotonic()
        self._offset = 0.0
        self._lock = threading.Lock()

    @property
    def speed(self) -> float:
        return self._speed

    def now(self) -> float:
        # Monotonic elapsed time, so a wall-clock step (NTP) cannot make simulated time go backwards.
        elapsed = time.monotonic() - self._origin_monotonic
        with self._lock:
            return self._origin_wall + elapsed * self._speed + self._offset

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance({seconds}))")
        with self._lock:
            self._offset += float(seconds)
        return self.now()
