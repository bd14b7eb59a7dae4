"""Typed domain errors. The servicer maps each class to one gRPC status code (server/errors.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def printable(text: str) -> str:
    """``text`` with every character a terminal could act on written as its escape (``\\x1b``, ``\\u202e``,
    ``\\n``): control characters, format characters such as a right-to-left override, unassigned code
    points. What a cloud or a proxy answers is shown to people (``status``, the CA's log, /readyz), never
    obeyed by their terminal; and one message stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class DomainError(Exception):
    """Base class; ``str(err)`` is the actionable message the CA will log, made ``printable``: a message
    may quote what the cloud answered."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(printable(a) if isinstance(a, str) else a for a in args))


class NodeGroupNotFound(DomainError):
    def __init__(self, group_id: str) -> None:
        super().__init__(
            f"node group {group_id!r} is not known to this server; call NodeGroups for the current ids "
            "(a pool that stopped autoscaling or was deleted disappears from the list)"
        )
        self.group_id = group_id


class NodeInNoGroup(DomainError):
    """A node that no node group of this server holds (PricingNodePrice: no group, so no price)."""

    def __init__(self, name: str, provider_id: str) -> None:
        super().__init__(
            f"node {name!r} (providerID {provider_id!r}) is in no node group of this server: neither its "
            "labels nor its providerID name an autoscaled pool, so it has no price (a node of a pool with "
            "autoscaling off, or of another cluster, is priced by no one)"
        )
        self.name = name
        self.provider_id = provider_id


class InvalidDelta(DomainError):
    """The delta of IncreaseSize/DecreaseTargetSize has the wrong sign."""


class InvalidRequest(DomainError):
    """A request is malformed (empty id, empty node list, missing field)."""


class SizeLimitExceeded(DomainError):
    """The change would take the target outside [min, max] or below the existing instances."""


class NodeNotInGroup(DomainError):
    """A node named in DeleteNodes does not belong to the group."""


class GroupBusy(DomainError):
    """The cloud reports the group in a state where it cannot change size now (locked, upgrading)."""


class CloudUnavailable(DomainError):
    """The cloud API cannot be reached or answers 5xx/429 after retries; the caller may retry."""


class CloudTimeout(CloudUnavailable):
    """A cloud call got no answer in time after it may have reached the cloud (outcome unknown)."""


class CloudOutcomeUnknown(CloudUnavailable):
    """A write reached the cloud but no clear answer came back: a timeout, a lost connection or a
    500/502/503/504. It may have been applied, so the state is read back instead of guessed.

    ``finished`` is True when the cloud itself answered that it failed (500, 503): it is done with the
    request, so a read-back that shows nothing changed is final. A 502/504 (a gateway gave up waiting)
    or no answer at all means the request may still be applied later.
    """

    def __init__(self, message: str, *, finished: bool) -> None:
        super().__init__(message)
        self.finished = finished


class NotLeader(CloudUnavailable):
    """This replica may not change the cloud: it does not hold the leader Lease (or its hold lapsed).

    Raised before anything is sent, so the cloud is unchanged; the CA retries and reaches the leader.
    """


class CloudRequestRejected(DomainError):
    """The cloud API refused the request (4xx other than auth); retrying unchanged will not help.

    ``body`` is the cloud's error body when it was a JSON object (else None), so a cloud package can read
    its fields (Scaleway's ``type``, ``resource``, ``current_state``) instead of parsing the message.
    """

    def __init__(self, message: str, status: int | None = None, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class CloudAuthFailed(DomainError):
    """The cloud API refused the credentials (401/403)."""


def http_status(err: BaseException) -> int | None:
    """The HTTP status of a cloud's refusal: a ``CloudRequestRejected``'s own, else the 401, 403 or 404 its
    message quotes (``... answered 403: ...``, how the transport words a ``CloudAuthFailed``); None otherwise."""
    if isinstance(err, CloudRequestRejected) and err.status is not None:
        return err.status
    text = str(err)
    for code in (401, 403, 404):
        if f"answered {code}" in text:
            return code
    return None


class NotSupported(DomainError):
    """The backend has no answer for this optional RPC (pricing, template)."""


class DeadlineTooShort(DomainError):
    """Not enough of the caller's deadline is left to start (or finish) a cloud call safely."""


class ChangeOutcomeUnknown(DomainError):
    """A change may or may not have been applied (the cloud's answer was lost or an error, and it could
    not be read back within the caller's deadline); the server re-reads the cloud before the group's
    next change."""


class JournalUnavailable(DomainError):
    """The durable change journal could not record a size change before its cloud call, so nothing was
    sent: without the record, a restart could apply the change twice. The caller may retry."""
