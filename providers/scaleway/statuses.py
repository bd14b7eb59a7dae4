"""Kapsule node status -> instance state, as upstream ``fromScwStatus`` maps it (docs/reference/scaleway.md,
"Status mapping").

Two deliberate differences from upstream:
- every error carries an ``ErrorClass`` (upstream leaves it 0, which the CA core treats as neither
  class): ``creation_error`` is OUT_OF_RESOURCES when the node's error message reads like a quota or
  stock problem, else OTHER, so the CA backs the group off and cleans the failed nodes up;
- the node's own ``error_message`` (public-API field, sent by the autoscaler endpoint when present)
  is used as the message instead of the hard-coded text.
"""

from __future__ import annotations

import re

from providers.model import ErrorClass, InstanceError, InstanceState

RUNNING_STATUSES = frozenset({"ready"})
# Upstream counts a rebooting or upgrading node as "creating": it is not serving yet and the CA
# must not start another node for it.
CREATING_STATUSES = frozenset({"creating", "starting", "registering", "not_ready", "upgrading", "rebooting"})
DELETING_STATUSES = frozenset({"deleting"})
KNOWN_STATUSES = RUNNING_STATUSES | CREATING_STATUSES | DELETING_STATUSES | {"creation_error", "deleted", "locked"}

# Words Scaleway uses for capacity problems: quotas_exceeded, out_of_stock, "not enough ...".
_OUT_OF_RESOURCES = re.compile(
    r"quota|out[ _-]of[ _-]stock|no (?:more )?(?:capacity|stock)|insufficient (?:capacity|resources)|not enough",
    re.IGNORECASE,
)


def instance_status(status: str, error_message: str = "") -> tuple[InstanceState, InstanceError | None]:
    """State and error of one node; an unknown status is reported (code = the raw status), never fatal."""
    if status in RUNNING_STATUSES:
        return InstanceState.RUNNING, None
    if status in CREATING_STATUSES:
        return InstanceState.CREATING, None
    if status in DELETING_STATUSES:
        return InstanceState.DELETING, None
    if status == "creation_error":
        # CREATING + error is what the CA core treats as a failed scale-up (docs/reference/protocol.md, "Instance
        # status").
        error_class = ErrorClass.OUT_OF_RESOURCES if _OUT_OF_RESOURCES.search(error_message) else ErrorClass.OTHER
        return InstanceState.CREATING, InstanceError(
            "creation_error", error_message or "scaleway node could not be created", error_class
        )
    if status == "deleted":
        return InstanceState.UNSPECIFIED, InstanceError("deleted", "node has already been deleted", ErrorClass.OTHER)
    if status == "locked":
        return InstanceState.UNSPECIFIED, InstanceError("locked", "node is locked for legal reasons", ErrorClass.OTHER)
    code = status or "unknown"
    return InstanceState.UNSPECIFIED, InstanceError(
        code, error_message or f"scaleway node status {code!r} is not one this server knows", ErrorClass.OTHER
    )
