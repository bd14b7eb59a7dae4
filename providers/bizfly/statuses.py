"""Map a Bizfly pool node's ``status`` (and ``status_reason``) to the CA's instance state.

The words come from the autoscaling group behind each worker pool, an OpenStack Senlin cluster
(docs/reference/bizfly.md, "Status mapping", says where each fact comes from): a node is ``INIT`` then
``CREATING`` while its server is built, ``ACTIVE`` once it exists ("Creation succeeded"),
``UPDATING``, ``RECOVERING`` or ``OPERATING`` while an existing server is changed, recovered or
operated on, ``WARNING`` when it serves but something around it failed (a load-balancer membership),
``DELETING`` while it goes, and ``ERROR`` when any of these steps failed. The comparison ignores case and
separators; the CA's own lower-case words (``provisioning``, ``running``, ``draining``, ``deleting``)
and common synonyms are accepted too.

``ERROR`` alone does not say whether a machine failed to be created (the CA should give up on it, back
the pool off and delete it) or failed later, for instance a failed health check of a node that served
for days (the CA must not take it for a failed scale-up). Senlin's ``status_reason`` tells them apart
(``Failed in creating server: ...`` versus ``Check: Node is not ACTIVE.``, ``Recovery failed``,
``Failed in recovering ...``). Senlin wraps one failure in another (a failed recovery that recreated the
server reads ``Failed in recovering node '<id>': Failed in creating server: ...``), and the outer words,
the first in the text, say what failed: the first pattern found in the reason decides. When the reason
says neither, what this server saw of the node decides
(``History``): seen serving, it failed later; seen being created, or new since the pool's previous
listing, its creation failed; with nothing seen (the first listing after a start) there is no
evidence, and the node is taken for one that exists, which never makes the CA delete a machine on our
guess (if it never registers, the CA's max-node-provision-time removes it).

A stopped VM (``SHUTOFF``, ``STOPPED``, ...) is a machine that exists: it is reported as running, so the
CA sees its node NotReady and can remove it through DeleteNodes, which then really deletes it.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from dataclasses import dataclass

from providers.model import ErrorClass, InstanceError, InstanceState

log = logging.getLogger(__name__)

# A machine that exists and is (or was just) serving: Senlin's ACTIVE, WARNING (serving, but a step
# around it such as a load-balancer membership failed), UPDATING / RECOVERING / OPERATING (an existing
# server being changed, recovered or operated on), the CA's own "running" and common synonyms.
_SERVING = frozenset(
    {
        "active",
        "warning",
        "updating",
        "recovering",
        "operating",
        "running",
        "ready",
        "healthy",
        "online",
        "provisioned",
        "available",
        "rebuilding",
        "rebooting",
        "upgrading",
    }
)
# Stopped but existing machines: running from the CA's point of view (see the module docstring).
_STOPPED = frozenset(
    {"shutoff", "shutdown", "shutingdown", "shuttingdown", "stopped", "stopping", "paused", "suspended", "poweredoff"}
)
_CREATING = frozenset(
    {
        "init",  # Senlin: the node record exists, its server is not being built yet
        "creating",  # Senlin: the server is being built
        "provisioning",  # the CA's own word
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
        "",  # a node the API lists before it has a status is one being created
    }
)
_DELETING = frozenset(
    {"draining", "deleting", "delete", "deleted", "terminating", "terminated", "pendingdelete", "removing"}
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
# status_reason of a failed creation: Senlin's "Failed in creating <type>: <message>." and its guard
# "Node must be in INIT status", plus the wording of other tools ("Creation failed: ...").
_CREATION_FAILED = re.compile(
    r"failed in creating|node must be in init status|creat(e|ion)[ _-]?(failed|error)|failed to create", re.IGNORECASE
)
# status_reason of a node that failed after it existed: Senlin's health check ("Check: Node is not
# ACTIVE."), recovery ("Recovery failed"), and every "Failed in <doing> ..." but creating: updating,
# deleting, "found" (the server is gone), recovering, rebooting and the other operations, and the
# load-balancer policy's "Failed in adding node into lb pool.".
_FAILED_LATER = re.compile(r"^\s*check:|recover|failed in (?!creating\b)[a-z]+", re.IGNORECASE)
# Words in a failure's status_reason that mean the cloud had no room (the CA then tries other groups).
_OUT_OF_RESOURCES = re.compile(
    r"quota|exceed|insufficient|no valid host|not enough|out of (stock|capacity|resources)|capacity",
    re.IGNORECASE,
)
_SEPARATORS = re.compile(r"[\s._-]+")

ERROR_CODE_FAILED = "bizfly-node-failed"
ERROR_CODE_OUT_OF_RESOURCES = "bizfly-out-of-resources"


class History(enum.Enum):
    """What this server saw of a pool node before the listing being mapped."""

    UNKNOWN = "unknown"  # the pool was not listed before (this process just started): no evidence
    NEW = "new"  # the pool was listed before without this node: it was created since
    CREATING = "creating"  # seen in a being-created status and never serving
    SERVING = "serving"  # seen in a status of a machine that exists (ACTIVE, WARNING, ...)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    state: InstanceState
    error: InstanceError | None = None
    known: bool = True
    # What the status shows of the node for its History: True serving, False being created, None neither.
    serving: bool | None = None


_reported: set[str] = set()
_reported_lock = threading.Lock()
# Reasons can carry ids: past this many distinct warnings, further ones are not remembered (nor logged).
_REPORTED_MAX = 1000


def map_status(status: str | None, reason: str | None = None, history: History = History.UNKNOWN) -> NodeStatus:
    """The instance state (and error, for a failed creation) of one pool node; never raises."""
    raw = status if isinstance(status, str) else ""
    key = _SEPARATORS.sub("", raw).lower()
    reason_text = reason if isinstance(reason, str) else ""
    if key in _SERVING or key in _STOPPED:
        return NodeStatus(InstanceState.RUNNING, serving=True)
    if key in _DELETING:
        return NodeStatus(InstanceState.DELETING)
    if key in _FAILED:
        if failed_at_creation(reason_text, history):
            return NodeStatus(InstanceState.CREATING, failure_error(raw, reason_text))
        return NodeStatus(InstanceState.RUNNING)
    if key in _CREATING:
        return NodeStatus(InstanceState.CREATING, serving=False)
    # A node that served is not being created again because its status has a new name.
    state = InstanceState.RUNNING if history is History.SERVING else InstanceState.CREATING
    outcome = state.name.lower()
    _report_once(f"status:{raw}", "unknown Bizfly node status %r (%s): reported as %s", raw, history, outcome)
    return NodeStatus(state, known=False)


def failed_at_creation(reason: str, history: History) -> bool:
    """Whether an ERROR node is a failed creation (True) or a machine that failed after it existed."""
    creation, later = _CREATION_FAILED.search(reason), _FAILED_LATER.search(reason)
    if creation or later:
        # Senlin puts a wrapped error's text after its own words: the outer failure comes first.
        return later is None or (creation is not None and creation.start() < later.start())
    if _OUT_OF_RESOURCES.search(reason):
        return True  # no room for the machine: only a creation asks for room
    if history is History.SERVING:
        return False
    if history in (History.CREATING, History.NEW):
        return True
    _report_once(
        f"error:{reason}",
        "Bizfly node in ERROR with reason %r (%s): no evidence that its creation failed, so it is reported "
        "as a machine that exists (%s), not as a failed scale-up",
        reason,
        history,
        "running",
    )
    return False


def failure_error(status: str, reason: str) -> InstanceError:
    """The CA error of a failed creation; quota/capacity reasons are OUT_OF_RESOURCES."""
    message = f"Bizfly reports the node as {status}" + (f": {reason}" if reason else "")
    if reason and _OUT_OF_RESOURCES.search(reason):
        return InstanceError(ERROR_CODE_OUT_OF_RESOURCES, message, ErrorClass.OUT_OF_RESOURCES)
    return InstanceError(ERROR_CODE_FAILED, message, ErrorClass.OTHER)


def _report_once(key: str, message: str, value: str, history: History, outcome: str) -> None:
    # Once per process and spelling: a sync every 30 s must not repeat the same warning forever.
    with _reported_lock:
        if key in _reported or len(_reported) >= _REPORTED_MAX:
            return
        _reported.add(key)
    shown = {
        History.UNKNOWN: "nothing seen of it yet",
        History.NEW: "new since the pool's previous listing",
        History.CREATING: "seen being created",
        History.SERVING: "seen serving",
    }[history]
    log.warning(message, value, shown, outcome, extra={"cloud": "bizfly", "node_status": value})
