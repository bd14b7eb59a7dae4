"""The one table that maps domain errors to gRPC status codes."""

from __future__ import annotations

import grpc

from providers import errors as e

STATUS_FOR: tuple[tuple[type[e.DomainError], grpc.StatusCode], ...] = (
    (e.NodeGroupNotFound, grpc.StatusCode.NOT_FOUND),
    (e.InvalidDelta, grpc.StatusCode.INVALID_ARGUMENT),
    (e.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (e.SizeLimitExceeded, grpc.StatusCode.FAILED_PRECONDITION),
    (e.NodeNotInGroup, grpc.StatusCode.FAILED_PRECONDITION),
    (e.GroupBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (e.CloudRequestRejected, grpc.StatusCode.FAILED_PRECONDITION),
    (e.CloudAuthFailed, grpc.StatusCode.UNAVAILABLE),
    (e.CloudUnavailable, grpc.StatusCode.UNAVAILABLE),
    (e.ChangeOutcomeUnknown, grpc.StatusCode.UNAVAILABLE),
    (e.DeadlineTooShort, grpc.StatusCode.UNAVAILABLE),
    (e.JournalUnavailable, grpc.StatusCode.UNAVAILABLE),
    (e.NotSupported, grpc.StatusCode.UNIMPLEMENTED),
)


def status_for(err: e.DomainError) -> grpc.StatusCode:
    for cls, code in STATUS_FOR:
        if isinstance(err, cls):
            return code
    return grpc.StatusCode.INTERNAL
