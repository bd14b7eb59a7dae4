"""Map a Bizfly pool node's ``status`` to the CA's instance state.

Upstream matched only lower-case ``provisioning``/``running``/``draining``/``deleting`` and turned
everything else (including the ``ACTIVE`` every public fixture shows) into an error without a
state, which externalgrpc drops (docs/protocol.md, "Instance status"). Here the comparison ignores
case and separators, the real vocabulary is accepted, failures become CREATING + an error (so the
CA gives up on the machine quickly and backs off the pool, as it does for Scaleway's
``creation_error``), and an unknown status is reported once and treated as CREATING: the CA then
neither counts the machine as a ready node nor deletes it, and if it never registers the CA's own
max-node-provision-time takes over.

A stopped VM (``SHUTOFF``, ``SHUTDOWN``, ``STOPPED``, ``PAUSED``, ``SUSPENDED``, any case) is a machine
that exists: it is reported as running, so the CA sees its node NotReady and can remove it through
DeleteNodes, which then really deletes it. Reporting it as deleting would make the CA wait for a
deletion nobody started, and make a DeleteNodes for it look already done.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

from providers.model import ErrorClass, InstanceError, InstanceState

log = logging.getLogger(__name__)

_RUNNING = frozenset({"running", "active", "ready", "healthy", "online", "provisioned", "available"})
# Stopped but existing machines: running from the CA's point of view (see the module docstring).
_STOPPED = frozenset(
    {"shutoff", "shutdown", "shutingdown", "shuttingdown", "stopped", "stopping", "paused", "suspended", "poweredoff"}
)
_CREATING = frozenset(
    {
        "provisioning",
        "creating",
        "create",
        "building",
        "build",
        "pending",
        "pendingprovision",
        "pendingcreate",
        "initializing",
        "initialising",
        "starting",
        "booting",
        "registering",
        "notready",
        "rebuilding",
        "rebooting",
        "upgrading",
        "updating",
        "",  # a node the API lists before it has a status is one being created
    }
)
_DELETING = frozenset(
    {
        "draining",
        "deleting",
        "delete",
        "deleted",
        "terminating",
        "terminated",
        "pendingdelete",
        "removing",
    }
)
_FAILED = frozenset(
    {
        "error",
        "failed",
        "failure",
        "createfailed",
        "creationerror",
        "createerror",
        "provisionfailed",
        "provisioningfailed",
        "provisionerror",
    }
)
# Words in a failure's status_reason that mean the cloud had no room (the CA then tries other groups).
_OUT_OF_RESOURCES = re.compile(
    r"quota|exceed|insufficient|no valid host|not enough|out of (stock|capacity|resources)|capacity",
    re.IGNORECASE,
)
_SEPARATORS = re.compile(r"[\s._-]+")

ERROR_CODE_FAILED = "bizfly-node-failed"
ERROR_CODE_OUT_OF_RESOURCES = "bizfly-out-of-resources"


@dataclass(frozen=True, slots=True)
class NodeStatus:
    state: InstanceState
    error: InstanceError | None = None
    known: bool = True


_reported_unknown: set[str] = set()
_reported_lock = threading.Lock()


def map_status(status: str | None, reason: str | None = None) -> NodeStatus:
    """The instance state (and error, for failed nodes) of one pool node; never raises."""
    raw = status if isinstance(status, str) else ""
    key = _SEPARATORS.sub("", raw).lower()
    reason_text = reason if isinstance(reason, str) else ""
    if key in _RUNNING or key in _STOPPED:
        return NodeStatus(InstanceState.RUNNING)
    if key in _DELETING:
        return NodeStatus(InstanceState.DELETING)
    if key in _FAILED:
        return NodeStatus(InstanceState.CREATING, failure_error(raw, reason_text))
    if key in _CREATING:
        return NodeStatus(InstanceState.CREATING)
    _report_unknown(raw)
    return NodeStatus(InstanceState.CREATING, known=False)


def failure_error(status: str, reason: str) -> InstanceError:
    """The CA error of a failed node; quota/capacity reasons are OUT_OF_RESOURCES."""
    message = f"Bizfly reports the node as {status}" + (f": {reason}" if reason else "")
    if reason and _OUT_OF_RESOURCES.search(reason):
        return InstanceError(ERROR_CODE_OUT_OF_RESOURCES, message, ErrorClass.OUT_OF_RESOURCES)
    return InstanceError(ERROR_CODE_FAILED, message, ErrorClass.OTHER)


def _report_unknown(status: str) -> None:
    # Once per process and spelling: a sync every 30 s must not repeat the same warning forever.
    with _reported_lock:
        if status in _reported_unknown:
            return
        _reported_unknown.add(status)
    log.warning(
        "unknown Bizfly node status %r; treating the node as still being created",
        status,
        extra={"cloud": "bizfly", "node_status": status},
    )
