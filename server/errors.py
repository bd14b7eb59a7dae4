"""The one table that maps domain errors to gRPC status codes (``server.rpc.Code``, grpcio's numbers)."""

from __future__ import annotations

from providers import errors as e
from server.rpc import Code

STATUS_FOR: tuple[tuple[type[e.DomainError], Code], ...] = (
    (e.NodeGroupNotFound, Code.NOT_FOUND),
    (e.NodeInNoGroup, Code.NOT_FOUND),
    (e.InvalidDelta, Code.INVALID_ARGUMENT),
    (e.InvalidRequest, Code.INVALID_ARGUMENT),
    (e.SizeLimitExceeded, Code.FAILED_PRECONDITION),
    (e.NodeNotInGroup, Code.FAILED_PRECONDITION),
    (e.GroupBusy, Code.FAILED_PRECONDITION),
    (e.CloudRequestRejected, Code.FAILED_PRECONDITION),
    (e.CloudAuthFailed, Code.UNAVAILABLE),
    (e.CloudUnavailable, Code.UNAVAILABLE),
    (e.ChangeOutcomeUnknown, Code.UNAVAILABLE),
    (e.DeadlineTooShort, Code.UNAVAILABLE),
    (e.JournalUnavailable, Code.UNAVAILABLE),
    (e.NotSupported, Code.UNIMPLEMENTED),
)


def status_for(err: e.DomainError) -> Code:
    for cls, code in STATUS_FOR:
        if isinstance(err, cls):
            return code
    return Code.INTERNAL
