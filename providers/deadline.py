"""Per-request deadlines: cloud calls inside a gRPC request get the time the caller has left."""

from __future__ import annotations

import time
from dataclasses import dataclass

from providers.errors import DeadlineTooShort

# Time kept back for encoding the answer and the network on the way back to the CA.
RESPONSE_MARGIN = 0.25


@dataclass(frozen=True, slots=True)
class Deadline:
    expires_at: float  # time.monotonic() value

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    @classmethod
    def from_grpc_remaining(cls, remaining: float | None, default: float = 5.0) -> Deadline:
        """Build from ``ServicerContext.time_remaining()`` (None when the client sent no deadline)."""
        return cls.after(default if remaining is None else remaining)

    def remaining(self) -> float:
        return self.expires_at - time.monotonic()

    def timeout(self, cap: float, needed: float = 0.05) -> float:
        """Seconds a cloud call may take: at most ``cap`` and what is left minus the response margin.

        Raises DeadlineTooShort when less than ``needed`` seconds would be left.
        """
        left = self.remaining() - RESPONSE_MARGIN
        if left < needed:
            raise DeadlineTooShort(
                f"only {max(left, 0.0):.2f}s of the caller's deadline is left; not starting a cloud call "
                "(raise grpc_timeout in the CA cloud-config if this repeats)"
            )
        return min(cap, left)

    def check(self, needed: float = 0.05) -> None:
        self.timeout(cap=float("inf"), needed=needed)
