"""One cloud listing at a time, shared by everyone who waits for it.

A full listing of a big cluster can take longer than a CA deadline. Callers therefore never run it
themselves: they ask for "a listing that started at or after time t" and wait for it as long as their
own deadline allows. The listing runs in its own thread, so it finishes (and its result serves the
next caller) even when the caller that asked for it has already answered. At most one listing runs at
a time; callers whose moment the running one already covers share it, the others share the next one,
which starts as soon as the running one ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Flight(Generic[T]):
    """One run of the work: when it started, and its result or error once done."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.result: T | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        """True once the run has finished (successfully or not); False when ``timeout`` ran out first."""
        return self._done.wait(timeout=None if timeout is None else max(timeout, 0.0))

    def _finish(self, result: T | None, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self._done.set()


class SingleFlight(Generic[T]):
    """Runs ``work(started_at)`` in a daemon thread, never two at once, reusing runs for every caller."""

    def __init__(self, work: Callable[[float], T], clock: Callable[[], float], name: str) -> None:
        self._work = work
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()  # bookkeeping only; never held while the work runs
        self._running: Flight[T] | None = None
        self._queued: Flight[T] | None = None

    @property
    def running(self) -> Flight[T] | None:
        return self._running

    def since(self, moment: float) -> Flight[T]:
        """A run that started at or after ``moment``: the running one if it qualifies, else the next one."""
        with self._lock:
            running = self._running
            if running is not None:
                assert running.started_at is not None
                if running.started_at >= moment:
                    return running
                if self._queued is None:
                    self._queued = Flight()
                return self._queued
            flight: Flight[T] = Flight()
            flight.started_at = self._clock()
            self._running = flight
        threading.Thread(target=self._chain, args=(flight,), name=self._name, daemon=True).start()
        return flight

    def _chain(self, flight: Flight[T]) -> None:
        while True:
            assert flight.started_at is not None
            try:
                result = self._work(flight.started_at)
            except BaseException as err:  # noqa: BLE001 - handed to every waiter
                flight._finish(None, err)
            else:
                flight._finish(result, None)
            with self._lock:
                queued = self._queued
                self._queued = None
                if queued is None:
                    self._running = None
                    return
                queued.started_at = self._clock()
                self._running = queued
            flight = queued
