"""The hook through which a backend records its size changes durably before sending them to the cloud.

A backend holds what it knows about an unconfirmed change in memory (``GroupBook.intent`` and
``GroupBook.unknown``). A journal makes that survive a restart or a fail-over to another replica: the
change is recorded before the cloud call, marked when its outcome is unknown, and cleared once it is
confirmed or read back. The backend reads the journal at each size write of a group, so a replica that
starts or takes over adopts what an earlier one left: the CA's retry of a change that landed is
recognised, and the group is read back from the cloud before any new change.

The backend only knows this interface; the Kubernetes implementation lives in ``server/kube/journal.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from providers.deadline import Deadline


@dataclass(frozen=True, slots=True)
class PendingChange:
    """A size change a writer recorded and nobody confirmed or read back yet."""

    group_id: str
    kind: str  # "increase" or "decrease"
    base: int  # the target the change started from
    desired: int  # the target it writes
    age: float  # seconds since it was recorded
    unknown: bool  # its outcome is known to be unknown (else the writer stopped before learning it)
    replica: str  # who recorded it


class ChangeJournal(Protocol):
    """One backend's view of the journal. Every call ends within ``deadline`` (minus the response margin).

    ``pending`` and ``record`` run before a cloud write and raise ``JournalUnavailable`` when the journal
    cannot be read or written: the write is then refused, since going on without the record could apply
    a change twice after a restart. ``mark_unknown`` and ``clear`` act on the entry ``pending`` returned
    or ``record`` wrote last for the group; they are queued and done in the background (the answer to the
    CA does not wait for them) and never raise: a failure is logged, counted and retried, and an entry
    left behind is adopted by the group's next write, which reads the group back first.
    """

    def pending(self, group_id: str, deadline: Deadline) -> PendingChange | None: ...

    def record(self, group_id: str, kind: str, base: int, desired: int, deadline: Deadline) -> None: ...

    def mark_unknown(self, group_id: str, reason: str) -> None: ...

    def clear(self, group_id: str) -> None: ...
