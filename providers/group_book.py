"""What the server knows about one node group beyond the last listing, and who may write to it now.

Both clouds lower a pool's desired size by one when they delete one of its nodes, while a size write
is absolute ("size = 7"). Deletions therefore commute with each other and may run side by side, but a
size write must not overlap a deletion: a PATCH computed before a DELETE landed and applied after it
would undo that DELETE's decrement (the pool would grow back a replacement machine), and one applied
before it would be lowered again behind the server's back. So one group admits either any number of
deletions or one size write (or read-back) at a time. The book's lock only guards this bookkeeping;
no cloud call ever runs while it is held, and every wait for admission ends before the caller's
deadline with an answer that says what it waited for.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import DeadlineTooShort
from providers.single_flight import Flight

# Time kept after an admission wait for the cloud call itself; less than this and nothing is sent.
MIN_CALL_TIME = 0.2


@dataclass(frozen=True, slots=True)
class Intent:
    """An increase whose cloud answer was lost: base -> desired, remembered to recognise the CA's retry."""

    base: int
    desired: int
    at: float


class GroupBook:
    """Per-group overlay on the snapshot and the admission rule for writes. Guard every field with ``cond``."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.cond = threading.Condition(threading.Lock())
        # The target this server knows the cloud has, ahead of the snapshot; None: the snapshot's.
        self.target: int | None = None
        self.changed_at = 0.0  # when target/deleting last changed; older listings cannot settle them
        self.deleting: set[str] = set()  # instances whose DELETE the cloud accepted
        self.maybe_deleting: set[str] = set()  # instances whose DELETE had an unknown outcome
        self.in_flight: collections.Counter[str] = collections.Counter()  # DELETEs sent, not answered
        self.writer = False  # a size write or a read-back runs
        self.writers_waiting = 0
        self.unknown = ""  # why the cloud's state of this group is uncertain ("" = it is not)
        self.unknown_at = 0.0
        self.intent: Intent | None = None
        # The listing a decrease gave up waiting for at its deadline, for the CA's next call to reuse.
        self.view_wanted: Flight[Any] | None = None
        self.view_wanted_at = 0.0

    # ------------------------------------------------------------------ admission (hold cond)
    def wait_until(self, ready: Callable[[], bool], deadline: Deadline, why: Callable[[], str]) -> None:
        """Wait on ``cond`` until ``ready()``; DeadlineTooShort (naming ``why()``) rather than overrun."""
        while not ready():
            budget = deadline.remaining() - RESPONSE_MARGIN - MIN_CALL_TIME
            if budget <= 0:
                raise DeadlineTooShort(why())
            self.cond.wait(timeout=budget)

    def deletions_in_flight(self) -> int:
        return sum(self.in_flight.values())

    @contextlib.contextmanager
    def exclusive(self, deadline: Deadline) -> Iterator[None]:
        """Admission for a size write or read-back: no deletion in flight, no other writer."""
        with self.cond:
            self.writers_waiting += 1
            try:
                self.wait_until(lambda: not self.writer and not self.in_flight, deadline, self._busy_for_writer)
            finally:
                self.writers_waiting -= 1
                self.cond.notify_all()  # deletions held back for this writer may go if it gave up
            self.writer = True
        try:
            yield
        finally:
            with self.cond:
                self.writer = False
                self.cond.notify_all()

    def admit_deletions(self, deadline: Deadline) -> None:
        """Wait (holding ``cond``) until deletions may be sent: no size write running or waiting."""
        self.wait_until(lambda: not self.writer and not self.writers_waiting, deadline, self._busy_for_deletion)

    def _busy_for_writer(self) -> str:
        n = self.deletions_in_flight()
        what = f"{n} node deletion(s) sent to the cloud are not answered yet" if n else "another size change runs"
        return (
            f"node group {self.group_id!r}: {what}, and a size change must not overlap them (it would undo or "
            "double their size decrements); nothing was sent before the caller's deadline, retry shortly"
        )

    def _busy_for_deletion(self) -> str:
        return (
            f"node group {self.group_id!r}: a size change is being written to the cloud, and a deletion must not "
            "overlap it; nothing was sent before the caller's deadline, retry shortly"
        )

    # ------------------------------------------------------------------ overlay (hold cond)
    def pin(self, snapshot_target: int, now: float) -> None:
        """Fix the overlay before a write: a listing that overlaps the write must not move the view."""
        if self.target is None:
            self.target = snapshot_target
            self.changed_at = now

    def set_target(self, target: int, now: float) -> None:
        self.target = target
        self.changed_at = now

    def mark_unknown(self, reason: str, now: float) -> None:
        self.unknown = reason
        self.unknown_at = now
        self.changed_at = now

    def settle(self, listing_started_at: float) -> bool:
        """Hand the view back to a listing that certainly saw every change made here; True if it did."""
        if self.writer or self.in_flight:
            return False  # a write overlaps the listing: it may or may not show it
        if listing_started_at <= max(self.changed_at, self.unknown_at):
            return False
        self.target = None
        self.deleting.clear()
        self.maybe_deleting.clear()
        self.unknown = ""
        return True
