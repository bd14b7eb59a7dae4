"""Per-request deadlines: cloud calls inside a gRPC request get the time the caller has left."""

from __future__ import annotations

import time
from dataclasses import dataclass

from providers.errors import DeadlineTooShort

# Time kept back for encoding the answer and the network on the way back to the CA.
RESPONSE_MARGIN = 0.25
# A caller without a deadline (grpcurl without -max-time) reports an "infinite" remaining time; no
# request needs more than this, and timeouts beyond it overflow lock and socket APIs.
LONGEST_REQUEST = 60.0


@dataclass(frozen=True, slots=True)
class Deadline:
    expires_at: float  # time.monotonic() value

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    @classmethod
    def from_grpc_remaining(cls, remaining: float | None) -> Deadline:
        """Build from ``ServicerContext.time_remaining()`` (None or huge when the client sent no deadline)."""
        if remaining is None or remaining > LONGEST_REQUEST:
            return cls.after(LONGEST_REQUEST)
        return cls.after(remaining)

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
