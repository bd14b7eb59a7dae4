"""Learned templates: scale-from-zero templates recorded from the real Ready nodes of each node group.

A template built from cloud metadata (a Bizfly flavor, a Kapsule pool) cannot know what the kubelet
reserves, nor the hardware labels node-feature-discovery adds once a node has joined. The Node object of a
real node of the group knows both. This module watches the Node objects, maps each to its node group by
``spec.providerID`` through the registry, and when a node is Ready records its allocatable and capacity,
the labels that describe its group (providers/node_labels.py: a stable allowlist plus
``learned_templates.labels``, the same rule as for the labels the CA shows in NodeGroupForNode, without
the labels known to name a machine or a moment, nor those found to differ between the group's nodes or to
change on one node until the nodes agree again: a GPU node relabelled every minute teaches its template
once) and the
taints the config names (``learned_templates.taints``): never what an operator put on one node (a
maintenance taint, a manual label), which would outlive that node. The pool's own labels and taints are
not learned at all: the backend takes them from the cloud when it serves the template (the cloud's pool
definition wins).
The record goes to the backend (``Backend.set_learned_template``) and to a ConfigMap per backend,
``<configmap_prefix>-<backend>``, one JSON value per node group, read back at start so that a group
scaled to zero keeps its template across restarts of the server.

Memory does not grow with the size of Node objects, and little with their number: the list is read in
pages (``limit``/``continue``) and the watch line by line, each decoded by msgspec into the dozen fields
used (``NodeFields``), the rest of the bytes (images, conditions' messages, managed fields) skipped by
the parser without building Python objects. What is kept is per group: the record, the node it was
learned from and at most one other Ready node that would teach something different, and for each label
key found to vary, the last value of each node that carries it (until they agree again,
providers/node_labels.py); per node only the few nodes seen Ready before their machine was in a cloud
listing, and only until two listings later.

Writes are rate-limited per ConfigMap (``min_write_interval``), guarded by the resourceVersion read just
before (a conflicting writer makes us re-read and merge), skipped when nothing changed, kept under the
API server's 1 MiB limit (groups at zero first), and made only by the leader: a follower reads each
ConfigMap once at start and makes no further call for them. Records of node groups the cloud has not
listed for ``forget_after`` are deleted. No call to the API server runs in an RPC or under a backend
lock: the watch and the writes have threads of their own, and an unreachable API server only delays
learning (logged, counted in ``ca_externalgrpc_kube_api_errors_total``); the templates already known keep
serving.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from providers.backend import Backend
from providers.model import LearnedTemplate, NodeTemplate, Taint
from providers.node_labels import GroupLabels, KeyPatterns, LabelAgreement, machine_names
from providers.registry import Registry
from server.kube.client import KubeConnection, core_path
from server.kube.settings import LearnedTemplatesConfig
from server.node_encoding import is_valid_quantity

log = logging.getLogger(__name__)

FEATURE = "learned_templates"
FORMAT_VERSION = 1
# The API server ends a watch after this long; the next one resumes from the last resourceVersion.
WATCH_SECONDS = 60
# Nodes per page of the list: a page of kubelet Nodes (50 images each) is about 15 KiB a node, so the
# bytes of one page, the only thing held whole, stay near 1.5 MiB however large the cluster.
LIST_PAGE = 100
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
FOLLOWER_RECHECK = 2.0  # a follower with records to write asks its own Leadership this often (no API call)
# A node seen Ready whose providerID no cloud listing maps to a group is forgotten after this many
# listings of every backend (its machine is not one of ours); its next change is looked at again.
UNMAPPED_LISTINGS = 2
# The API server refuses a ConfigMap whose data exceeds 1 MiB; what is written stays below this.
CONFIGMAP_BUDGET = 1024 * 1024 - 32 * 1024
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410

# Taints that come and go with a node's condition or with the autoscaler's own work, never with the group:
# not learned even when the config names them.
TRANSIENT_TAINTS = frozenset(
    {
        "ToBeDeletedByClusterAutoscaler",  # the CA marks a node it is removing
        "DeletionCandidateOfClusterAutoscaler",  # ... or may remove soon
        "node.cloudprovider.kubernetes.io/uninitialized",  # until the cloud controller has seen the node
        "node.cloudprovider.kubernetes.io/shutdown",
        "node.cilium.io/agent-not-ready",  # until the CNI agent runs on the node
    }
)
TRANSIENT_TAINT_PREFIXES = (
    "node.kubernetes.io/",  # not-ready, unreachable, unschedulable, *-pressure, network-unavailable, out-of-service
    "ignore-taint.cluster-autoscaler.kubernetes.io/",  # the CA's own startup/status taint conventions
    "startup-taint.cluster-autoscaler.kubernetes.io/",
    "status-taint.cluster-autoscaler.kubernetes.io/",
)
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# A ConfigMap key: what the API server accepts.
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------------------- what is read
# The fields of a Node the learner uses; msgspec skips every other byte of the JSON without building it.
class _Meta(msgspec.Struct):
    name: str = ""
    labels: dict[str, str] = {}
    deletionTimestamp: str | None = None  # noqa: N815 - the API's field name
    resourceVersion: str = ""  # noqa: N815


class _Taint(msgspec.Struct):
    key: str = ""
    value: str = ""
    effect: str = ""


class _Spec(msgspec.Struct):
    providerID: str = ""  # noqa: N815
    taints: list[_Taint] = []


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""


class _Status(msgspec.Struct):
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    conditions: list[_Condition] = []


class NodeFields(msgspec.Struct):
    """A Node as the learner reads it (also a watch BOOKMARK's object: only its resourceVersion is set)."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815
    continue_: str = msgspec.field(default="", name="continue")


class _NodePage(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[NodeFields] = []


class _WatchEvent(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"{}")  # a Node, or a Status for an ERROR event


class _StatusObject(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


_PAGE = msgspec.json.Decoder(_NodePage)
_EVENT = msgspec.json.Decoder(_WatchEvent)
_NODE = msgspec.json.Decoder(NodeFields)
_STATUS = msgspec.json.Decoder(_StatusObject)


def node_fields(node: Mapping[str, Any]) -> NodeFields:
    """The learner's view of a Node given as its JSON object (dicts)."""
    return msgspec.convert(node, NodeFields)


class WatchError(Exception):
    """The watch answered an ERROR event (a Status): ``status`` is its HTTP code (410: expired)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason


# ---------------------------------------------------------------------------------------- pure rules
@dataclass(frozen=True)
class LearningRules:
    """What a node may teach: the labels that describe its group (``GroupLabels``, with the config's
    ``labels``), the taints of the config's ``taints``."""

    labels: GroupLabels = field(default_factory=GroupLabels)
    taints: KeyPatterns = field(default_factory=lambda: KeyPatterns.of(()))

    @classmethod
    def of(cls, settings: LearnedTemplatesConfig) -> LearningRules:
        return cls(GroupLabels.with_extra(settings.labels), KeyPatterns.of(settings.taints))

    def keep_labels(self, labels: Mapping[str, str], machine: Iterable[str] = ()) -> dict[str, str]:
        return self.labels.keep(labels, machine)

    def keep_taints(self, taints: Iterable[Taint]) -> tuple[Taint, ...]:
        kept = {
            (t.key, t.value, t.effect) for t in taints if self.taints.match(t.key) and not is_transient_taint(t.key)
        }
        return tuple(Taint(key, value, effect) for key, value, effect in sorted(kept))

    def filter(self, template: NodeTemplate) -> NodeTemplate:
        """A template (a stored record) cut down to what these rules learn."""
        return NodeTemplate(
            labels=self.keep_labels(template.labels),
            taints=self.keep_taints(template.taints),
            capacity=template.capacity,
            allocatable=template.allocatable,
        )


DEFAULT_RULES = LearningRules()


def is_ready(node: NodeFields) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def is_transient_taint(key: str) -> bool:
    return key in TRANSIENT_TAINTS or key.startswith(TRANSIENT_TAINT_PREFIXES)


def template_from_node(node: NodeFields, rules: LearningRules = DEFAULT_RULES) -> NodeTemplate | None:
    """What a new node of the group will look like, from a Ready node of it; None when it is not Ready,
    is being deleted, or reports no capacity."""
    if node.metadata.deletionTimestamp is not None or not is_ready(node):
        return None
    capacity = node.status.capacity
    if not capacity.get("cpu") or not capacity.get("memory"):
        return None
    taints = (Taint(t.key, t.value, t.effect) for t in node.spec.taints if t.key and t.effect in _EFFECTS)
    return NodeTemplate(
        labels=rules.keep_labels(node.metadata.labels, machine_names(node.metadata.name, node.spec.providerID)),
        taints=rules.keep_taints(taints),
        capacity=dict(capacity),
        allocatable=dict(node.status.allocatable or capacity),
    )


def encode_learned(learned: LearnedTemplate) -> str:
    t = learned.template
    record: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "node": learned.node_name,
        "learned_at": learned.learned_at,
        "labels": dict(sorted(t.labels.items())),
        "taints": [{"key": x.key, "value": x.value, "effect": x.effect} for x in t.taints],
        "capacity": dict(sorted(t.capacity.items())),
        "allocatable": dict(sorted(t.allocatable.items())),
    }
    if learned.varying_labels:
        # Optional (an older server ignores it): the label keys kept out because they vary.
        record["varying_labels"] = sorted(learned.varying_labels)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


class BadRecord(ValueError):
    """A ConfigMap value that is not a learned template of this format (edited by hand, or newer)."""


def _string_map(data: Mapping[str, Any], key: str, quantities: bool = False) -> dict[str, str]:
    value = data.get(key)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRecord(f"{key} is not a map of strings")
    if quantities:
        bad = [f"{k}={v}" for k, v in value.items() if not is_valid_quantity(v)]
        if bad:
            raise BadRecord(f"{key} holds invalid quantities: {', '.join(bad[:3])}")
    return dict(value)


def decode_learned(text: str) -> LearnedTemplate:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise BadRecord(f"not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        raise BadRecord(f"not a learned template of format {FORMAT_VERSION}")
    taints = data.get("taints")
    if not isinstance(taints, list) or not all(
        isinstance(t, dict) and isinstance(t.get("key"), str) and t.get("effect") in _EFFECTS for t in taints
    ):
        raise BadRecord("taints is not a list of {key, value, effect}")
    capacity = _string_map(data, "capacity", quantities=True)
    if not capacity.get("cpu") or not capacity.get("memory"):
        raise BadRecord("capacity has no cpu or memory")
    node, learned_at = data.get("node"), data.get("learned_at")
    if not isinstance(node, str) or not isinstance(learned_at, str):
        raise BadRecord("node or learned_at is not a string")
    template = NodeTemplate(
        labels=_string_map(data, "labels"),
        taints=tuple(Taint(t["key"], str(t.get("value") or ""), t["effect"]) for t in taints),
        capacity=capacity,
        allocatable=_string_map(data, "allocatable", quantities=True),
    )
    varying = data.get("varying_labels", [])
    if not isinstance(varying, list) or not all(isinstance(k, str) for k in varying):
        raise BadRecord("varying_labels is not a list of label keys")
    return LearnedTemplate(template, node, learned_at, frozenset(varying))


def configmap_name(settings: LearnedTemplatesConfig, backend: str) -> str:
    return f"{settings.configmap_prefix}-{backend}"


def fit_in_budget(
    encoded: Mapping[str, str], at_zero: Callable[[str], bool], budget: int = CONFIGMAP_BUDGET
) -> tuple[dict[str, str], list[str]]:
    """The records to store when all of them would pass the ConfigMap size limit, and the groups left out.

    Groups at zero come first (their record is the only description of a new node they have); among
    equals the smaller record first, so that as many groups as possible keep theirs. A group with Ready
    nodes that is left out is learned again from them after a restart."""
    size = sum(len(k) + len(v) for k, v in encoded.items())
    if size <= budget:
        return dict(encoded), []
    kept: dict[str, str] = {}
    left_out: list[str] = []
    used = 0
    for key in sorted(encoded, key=lambda k: (not at_zero(k), len(encoded[k]), k)):
        cost = len(key) + len(encoded[key])
        if used + cost <= budget:
            kept[key] = encoded[key]
            used += cost
        else:
            left_out.append(key)
    return kept, sorted(left_out)


# ---------------------------------------------------------------------------------------- the learner
GroupKey = tuple[str, str]  # (backend name, node group id)


@dataclass(slots=True)
class _Unmapped:
    """A Ready node whose providerID no listing maps to a group yet (its machine may be newer)."""

    provider_id: str
    template: NodeTemplate
    listings: dict[str, int]  # backend name -> snapshot version when the node was seen


@dataclass(slots=True)
class _Teaching:
    """Who taught a group's record, and who would teach next."""

    teacher: str  # the record's node
    teacher_current: bool  # that node is still Ready with the recorded template (as last seen)
    candidate: tuple[str, NodeTemplate] | None = None  # another Ready node whose template differs


class TemplateLearner:
    """Watches Nodes, keeps each group's learned template, and persists them in one ConfigMap per backend."""

    def __init__(
        self,
        connection: KubeConnection,
        registry: Registry,
        settings: LearnedTemplatesConfig,
        on_api_error: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        leads: Callable[[], bool] = lambda: True,
    ) -> None:
        self.connection = connection
        # With leader election every replica reads its ConfigMaps at start (a follower has the templates
        # ready when it takes over) and watches once it has a cloud listing; only the leader writes.
        self._leads = leads
        self.registry = registry
        self.settings = settings
        self.rules = LearningRules.of(settings)
        self._on_api_error = on_api_error
        self._clock = clock
        self._backends = {b.name: b for b in registry.backends}
        self._lock = threading.Lock()  # guards the fields below; never held over an API call
        self._records: dict[str, dict[str, LearnedTemplate]] = {name: {} for name in self._backends}
        self._teaching: dict[GroupKey, _Teaching] = {}
        # Per group: what its nodes' labels agree on (a key that differs between nodes or over time varies).
        self._agreements: dict[GroupKey, LabelAgreement] = {}
        self._roles: dict[str, GroupKey] = {}  # node name -> the group it teaches or would teach
        self._unmapped: dict[str, _Unmapped] = {}
        self._absent_since: dict[GroupKey, float] = {}  # groups with a record the cloud does not list
        self._forgotten: set[GroupKey] = set()  # records deleted for that: not adopted again from the ConfigMap
        self._dirty: set[str] = set()
        self._written_at: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._listed = threading.Event()  # some backend has a cloud listing: nodes can be mapped
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Read the ConfigMaps (bounded by the request timeout), then watch Nodes and write in the background."""
        for name in self._backends:
            self._sync_configmap(name, write=False)
        for backend in self._backends.values():
            backend.listeners.append(self._backend_synced)
            if backend.health().synced:
                self._listed.set()
        for target, name in ((self._watch_loop, "learn-templates-watch"), (self._write_loop, "learn-templates-write")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._listed.set()
        for backend in self._backends.values():
            if self._backend_synced in backend.listeners:
                backend.listeners.remove(self._backend_synced)
        # Write what was learned since the last write, within one request timeout, so a restart keeps it.
        if self._leads():
            for name in self._pending():
                self._sync_configmap(name)
        for thread in self._threads:
            thread.join(timeout=1.0)  # a watch blocked in a read ends when the connection closes

    def _pending(self) -> list[str]:
        with self._lock:
            return sorted(self._dirty)

    def _api_error(self, operation: str, err: BaseException) -> None:
        if self._on_api_error is not None:
            self._on_api_error(FEATURE, operation)
        log.warning(
            "learned templates: Kubernetes API call failed; the templates already known keep serving",
            extra={"operation": operation, "error": _describe(err)},
        )

    # ------------------------------------------------------------------ what is learned
    def _backend_synced(self, backend: Backend) -> None:
        """After a cloud listing: nodes seen before their machine was listed now map to a group, nodes of
        no group are forgotten, and records of groups the cloud no longer lists age towards deletion."""
        if not backend.health().synced:
            return
        self._listed.set()
        versions = {b.name: b.snapshot.version for b in self._backends.values()}
        with self._lock:
            waiting = list(self._unmapped.items())
        for name, node in waiting:
            found = self.registry.group_for_provider_id(node.provider_id)
            if found is not None:
                with self._lock:
                    if self._unmapped.get(name) is not node:
                        continue  # changed or gone meanwhile
                    del self._unmapped[name]
                self._consider(found[0], found[1], name, node.template)
            elif all(versions[b] >= seen + UNMAPPED_LISTINGS for b, seen in node.listings.items()):
                with self._lock:
                    if self._unmapped.get(name) is node:
                        del self._unmapped[name]
        self._age_records(backend)

    def _age_records(self, backend: Backend) -> None:
        listed = set(backend.snapshot.groups)
        forgotten: list[str] = []
        with self._lock:
            self._forgotten = {key for key in self._forgotten if key[0] != backend.name or key[1] not in listed}
            for group_id in list(self._records.get(backend.name, {})):
                if self._expired((backend.name, group_id), listed):
                    self._forget_group((backend.name, group_id))
                    forgotten.append(group_id)
            if forgotten:
                self._dirty.add(backend.name)
        for group_id in forgotten:
            backend.set_learned_template(group_id, None)
        if forgotten:
            log.info(
                "learned templates: forgot the records of node groups the cloud no longer lists",
                extra={
                    "backend": backend.name,
                    "node_groups": forgotten[:20],
                    "forget_after": self.settings.forget_after,
                },
            )
            self._wake.set()

    def _expired(self, key: GroupKey, listed: set[str]) -> bool:
        """Under the lock: the group has been missing from the cloud's listings for ``forget_after``."""
        if key[1] in listed:
            self._absent_since.pop(key, None)
            return False
        since = self._absent_since.setdefault(key, self._clock())
        return self._clock() - since >= self.settings.forget_after

    def _forget_group(self, key: GroupKey) -> None:
        """Under the lock: drop a group's record and who taught it."""
        self._records.get(key[0], {}).pop(key[1], None)
        self._agreements.pop(key, None)
        self._absent_since.pop(key, None)
        self._forgotten.add(key)
        teaching = self._teaching.pop(key, None)
        if teaching is not None:
            for name in (teaching.teacher, teaching.candidate[0] if teaching.candidate else None):
                if name is not None and self._roles.get(name) == key:
                    del self._roles[name]

    def observe(self, node: NodeFields) -> None:
        """A Node added or changed (from the list or the watch)."""
        name, provider_id = node.metadata.name, node.spec.providerID
        template = template_from_node(node, self.rules) if provider_id else None
        found = self.registry.group_for_provider_id(provider_id) if template is not None else None
        with self._lock:
            role = self._roles.get(name)
            if found is None:
                if template is not None:
                    versions = {b.name: b.snapshot.version for b in self._backends.values()}
                    self._unmapped[name] = _Unmapped(provider_id, template, versions)
                else:
                    self._unmapped.pop(name, None)
            else:
                self._unmapped.pop(name, None)
        if role is not None and (found is None or (found[0].name, found[1]) != role):
            self._stops_teaching(name, role)  # not Ready any more, or no longer of that group
        if found is not None and template is not None:
            self._consider(found[0], found[1], name, template)

    def forget(self, name: str) -> None:
        """A Node deleted: what it taught stays (that is the point: its group may now be at zero)."""
        with self._lock:
            self._unmapped.pop(name, None)
            role = self._roles.get(name)
        if role is not None:
            self._stops_teaching(name, role)

    def _stops_teaching(self, name: str, key: GroupKey) -> None:
        """``name`` no longer teaches ``key``'s template: the record stays; a waiting candidate takes over."""
        with self._lock:
            teaching = self._teaching.get(key)
            if self._roles.get(name) == key:
                del self._roles[name]
            if teaching is None:
                return
            if teaching.candidate is not None and teaching.candidate[0] == name:
                teaching.candidate = None
                return
            if teaching.teacher != name:
                return
            teaching.teacher_current = False
            candidate, teaching.candidate = teaching.candidate, None
        if candidate is not None:
            backend = self._backends.get(key[0])
            if backend is not None:
                self._consider(backend, key[1], candidate[0], candidate[1])

    def _consider(self, backend: Backend, group_id: str, name: str, template: NodeTemplate) -> None:
        key = (backend.name, group_id)
        with self._lock:
            # Labels first: a key whose value this node shows differently from another node of the group,
            # or from what it showed before, varies; it leaves the template, and the record if it is there.
            # A key that varied comes back, into the record too, once the nodes agree again (node_labels.py).
            agreement = self._agreements.setdefault(key, LabelAgreement())
            seen = agreement.observe(template.labels, name, self._clock())
            template = replace(template, labels=agreement.agreed(template.labels))
            records = self._records.setdefault(backend.name, {})
            current = records.get(group_id)
            amended: LearnedTemplate | None = None
            if current is not None and (seen.varied & current.template.labels.keys() or seen.agreed_again):
                labels = {**agreement.agreed(current.template.labels), **seen.agreed_again}
                kept = replace(current.template, labels=labels)
                amended = current = replace(current, template=kept, varying_labels=frozenset(agreement.varying))
                records[group_id] = current
                self._dirty.add(backend.name)
            learned = self._teach_locked(key, current, name, template, frozenset(agreement.varying))
        changed = learned or amended
        if changed is None:
            return
        backend.set_learned_template(group_id, changed)
        if learned is None:
            if seen.varied:
                log.info(
                    "labels that differ between a node group's nodes, or change on a node, left its template",
                    extra={"backend": backend.name, "node_group": group_id, "labels": sorted(seen.varied)[:20]},
                )
            if seen.agreed_again:
                log.info(
                    "labels the node group's nodes agree on again came back into its template",
                    extra={"backend": backend.name, "node_group": group_id, "labels": dict(seen.agreed_again)},
                )
        else:
            log.info(
                "learned the template of a node group from its node",
                extra={
                    "backend": backend.name,
                    "node_group": group_id,
                    "node": name,
                    "allocatable": dict(template.allocatable),
                    **({"varying_labels": sorted(learned.varying_labels)[:20]} if learned.varying_labels else {}),
                },
            )
        self._wake.set()

    def _teach_locked(
        self, key: GroupKey, current: LearnedTemplate | None, name: str, template: NodeTemplate, varying: frozenset[str]
    ) -> LearnedTemplate | None:
        """Under the lock: ``name``'s template (labels agreed) against the group's record; the new record
        when it replaces it, else None."""
        teaching = self._teaching.get(key)
        if current is not None and current.template == template:
            if teaching is not None and teaching.teacher == name:
                teaching.teacher_current = True
                self._roles[name] = key
            elif teaching is not None and teaching.candidate is not None and teaching.candidate[0] == name:
                teaching.candidate = None  # it teaches what is recorded: nothing to take over
                self._roles.pop(name, None)
            return None
        if current is not None and teaching is not None and teaching.teacher != name and teaching.teacher_current:
            # Its teacher is still Ready and unchanged: nodes that differ slightly (memory reported a
            # few KiB apart) must not make the record flap. Remember one, to take over if it goes.
            if teaching.candidate is not None and self._roles.get(teaching.candidate[0]) == key:
                del self._roles[teaching.candidate[0]]
            teaching.candidate = (name, template)
            self._roles[name] = key
            return None
        learned = LearnedTemplate(template, name, _utc_now(), varying)
        self._records.setdefault(key[0], {})[key[1]] = learned
        if teaching is not None:
            for old in (teaching.teacher, teaching.candidate[0] if teaching.candidate else None):
                if old is not None and old != name and self._roles.get(old) == key:
                    del self._roles[old]
        self._teaching[key] = _Teaching(name, True)
        self._roles[name] = key
        self._dirty.add(key[0])
        return learned

    def learned(self, backend: str) -> dict[str, LearnedTemplate]:
        with self._lock:
            return dict(self._records.get(backend, {}))

    # ------------------------------------------------------------------ the Node list and watch
    def _watch_loop(self) -> None:
        resource_version: str | None = None
        backoff = BACKOFF_FIRST
        # Until a cloud listing exists no node can be mapped to a group (a follower has none until it
        # leads): reading Nodes before that would only hold them in memory.
        while not self._listed.wait(timeout=1.0):
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._relist()
                resource_version = self._watch(resource_version)
                backoff = BACKOFF_FIRST
            except Exception as err:  # the watch must survive anything the API server or network does
                if self._stop.is_set():
                    return
                if getattr(err, "status", None) == HTTP_GONE:
                    log.info("learned templates: the Node watch or list expired (410 Gone); listing again")
                    resource_version = None
                    continue
                self._api_error("watch_nodes", err)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _relist(self) -> str:
        """List every Node, a page at a time; the resourceVersion to watch from."""
        with self._lock:
            tracked = set(self._roles) | set(self._unmapped)
        seen: set[str] = set()
        token = ""
        while True:
            query: list[tuple[str, str | int | bool]] = [("limit", LIST_PAGE)]
            if token:
                query.append(("continue", token))
            page = _PAGE.decode(self.connection.request_bytes("GET", core_path("nodes"), query=query))
            for node in page.items:
                if node.metadata.name in tracked:
                    seen.add(node.metadata.name)
                self.observe(node)
            token = page.metadata.continue_
            if not token or self._stop.is_set():
                break
        for name in tracked - seen:  # deleted while we were not watching
            self.forget(name)
        return page.metadata.resourceVersion

    def _watch(self, resource_version: str) -> str:
        query: list[tuple[str, str | int | bool]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        timeout = (self.connection.request_timeout, WATCH_SECONDS + 15)
        with self.connection.stream_lines(core_path("nodes"), query=query, timeout=timeout) as lines:
            for line in lines:
                if self._stop.is_set():
                    break
                event = _EVENT.decode(line)
                if event.type == "ERROR":
                    status = _STATUS.decode(event.object)
                    raise WatchError(status.code, status.reason, status.message)
                node = _NODE.decode(event.object)
                resource_version = node.metadata.resourceVersion or resource_version
                if event.type in ("ADDED", "MODIFIED"):
                    self.observe(node)
                elif event.type == "DELETED":
                    self.forget(node.metadata.name)
                # BOOKMARK: only the resourceVersion to resume from
        return resource_version

    # ------------------------------------------------------------------ the ConfigMaps
    def _write_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self._next_due())
            self._wake.clear()
            if self._stop.is_set():
                return
            for backend in self._backends.values():
                if backend.health().synced:
                    self._age_records(backend)  # a group missing from the last listing for forget_after
            if not self._leads():
                continue  # a follower writes nothing, and reads nothing: it asks again in FOLLOWER_RECHECK
            now = self._clock()
            for name in self._pending():
                if now >= self._due(name):
                    self._sync_configmap(name)

    def _due(self, name: str) -> float:
        with self._lock:
            written = self._written_at.get(name)
            retry = self._retry_at.get(name, 0.0)
        interval_due = written + self.settings.min_write_interval if written is not None else 0.0
        return max(interval_due, retry)

    def _next_due(self) -> float:
        with self._lock:
            absent = min(self._absent_since.values(), default=None)
        forget_at = absent + self.settings.forget_after - self._clock() if absent is not None else 3600.0
        pending = self._pending()
        if not pending:
            return max(0.05, min(forget_at, 3600.0))
        if not self._leads():
            return FOLLOWER_RECHECK
        return max(0.05, min(forget_at, *(self._due(n) - self._clock() for n in pending)))

    def _sync_configmap(self, backend_name: str, write: bool = True) -> None:
        """Read the backend's ConfigMap, adopt the groups it knows that we do not, and (``write``) write
        ours when they differ.

        A failure leaves the backend dirty and retries after a backoff; a conflict (another writer got in
        between) retries at once with a fresh read.
        """
        for _attempt in range(3):
            try:
                if self._read_merge_write(backend_name, write):
                    break
            except Exception as err:  # an API failure delays the write; it never reaches an RPC
                self._api_error("write_configmap" if write else "read_configmap", err)
                with self._lock:
                    if not write:
                        self._dirty.add(backend_name)  # read (and merged) again at the first write
                    failures = self._failures[backend_name] = self._failures.get(backend_name, 0) + 1
                    self._retry_at[backend_name] = self._clock() + min(BACKOFF_FIRST * 2 ** (failures - 1), BACKOFF_MAX)
                return
        with self._lock:
            self._failures.pop(backend_name, None)
            self._retry_at.pop(backend_name, None)

    def _read_merge_write(self, backend_name: str, write: bool) -> bool:
        """One read-merge-write round; False on a write conflict (read again)."""
        from kubernetes.client.exceptions import ApiException

        name, namespace = configmap_name(self.settings, backend_name), self.connection.namespace
        path = core_path("configmaps", namespace, name)
        try:
            existing: dict[str, Any] | None = self.connection.request("GET", path)
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise
            existing = None
        stored: dict[str, str] = dict((existing or {}).get("data") or {})
        self._adopt(backend_name, stored)
        if not write:
            return True
        backend = self._backends.get(backend_name)
        listed = set(backend.snapshot.groups) if backend is not None and backend.health().synced else None
        with self._lock:
            ours = {gid: encode_learned(rec) for gid, rec in self._records.get(backend_name, {}).items()}
            # Entries we cannot read (hand-edited, a newer format) stay while their group is listed.
            foreign = {
                gid: text
                for gid, text in stored.items()
                if gid not in ours and (backend_name, gid) not in self._forgotten and (listed is None or gid in listed)
            }
            self._dirty.discard(backend_name)  # a change from now on makes it dirty again
        unstorable = sorted(gid for gid in ours if not _CONFIGMAP_KEY.match(gid))
        if unstorable:
            # Served from memory all the same; only a restart loses them.
            log.warning(
                "learned templates: node group ids that cannot be ConfigMap keys are not stored",
                extra={"backend": backend_name, "node_groups": unstorable[:10]},
            )
        encoded = {**foreign, **{gid: text for gid, text in ours.items() if gid not in unstorable}}
        wanted, left_out = fit_in_budget(encoded, lambda gid: self._at_zero(backend, gid))
        if left_out:
            log.warning(
                "learned templates: the records do not all fit in the ConfigMap's 1 MiB; the groups left out "
                "keep their template in memory and are learned again from their nodes after a restart",
                extra={
                    "configmap": name,
                    "stored": len(wanted),
                    "left_out": len(left_out),
                    "node_groups": left_out[:10],
                },
            )
        if existing is not None and wanted == stored:
            return True
        if existing is None and not wanted:
            return True  # nothing learned yet: no empty ConfigMap
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "ca-externalgrpc", "app.kubernetes.io/component": FEATURE},
            },
            "data": wanted,
        }
        try:
            if existing is None:
                self.connection.request("POST", core_path("configmaps", namespace), body=body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                self.connection.request("PUT", path, body=body)
        except ApiException as err:
            with self._lock:
                self._dirty.add(backend_name)
            if err.status == HTTP_CONFLICT:
                return False  # someone wrote in between (or created it): read again and merge
            raise
        except Exception:
            with self._lock:
                self._dirty.add(backend_name)
            raise
        with self._lock:
            self._written_at[backend_name] = self._clock()
        log.info(
            "learned templates written", extra={"configmap": name, "namespace": namespace, "node_groups": len(wanted)}
        )
        return True

    @staticmethod
    def _at_zero(backend: Backend | None, group_id: str) -> bool:
        if backend is None:
            return False
        try:
            return not backend.group(group_id).instances
        except Exception:  # noqa: BLE001 - not listed (yet): treat as a group without nodes
            return True

    def _adopt(self, backend_name: str, stored: Mapping[str, str]) -> None:
        """Install the stored templates of groups we have learned nothing about (at start: all of them),
        cut down to what the rules learn (a record written with other rules, or by an older version)."""
        backend = self._backends.get(backend_name)
        if backend is None:
            return
        adopted: list[tuple[str, LearnedTemplate]] = []
        with self._lock:
            records = self._records.setdefault(backend_name, {})
            for group_id, text in stored.items():
                if group_id in records or (backend_name, group_id) in self._forgotten:
                    continue
                try:
                    learned = decode_learned(text)
                except BadRecord as err:
                    log.warning(
                        "learned templates: ignoring a ConfigMap entry that is not a learned template",
                        extra={"backend": backend_name, "node_group": group_id, "error": str(err)},
                    )
                    continue
                kept = self.rules.filter(learned.template)
                if kept != learned.template:
                    learned = replace(learned, template=kept)
                    self._dirty.add(backend_name)  # rewrite it without what these rules do not learn
                records[group_id] = learned
                key = (backend_name, group_id)
                # Its node's labels stand until a node shows others; the keys it found varying stay out.
                self._agreements[key] = LabelAgreement(dict(kept.labels), set(learned.varying_labels))
                self._teaching[key] = _Teaching(learned.node_name, False)
                self._roles.setdefault(learned.node_name, key)
                adopted.append((group_id, learned))
        for group_id, learned in adopted:
            backend.set_learned_template(group_id, learned)
        if adopted:
            log.info(
                "learned templates loaded",
                extra={"backend": backend_name, "node_groups": [gid for gid, _ in adopted]},
            )


def _describe(err: BaseException) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:300]


def start_learning(
    connection: KubeConnection,
    registry: Registry,
    settings: LearnedTemplatesConfig,
    on_api_error: Callable[[str, str], None] | None = None,
    leads: Callable[[], bool] = lambda: True,
) -> TemplateLearner:
    """``leads`` (leader election's ``Leadership.holds``): ConfigMap writes only while it is true."""
    learner = TemplateLearner(connection, registry, settings, on_api_error, leads=leads)
    learner.start()
    return learner
