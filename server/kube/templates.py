"""Learned templates: scale-from-zero templates recorded from the real Ready nodes of each node group.

A template built from cloud metadata (a Bizfly flavor, a Kapsule pool) cannot know what the kubelet
reserves, the labels DaemonSets and operators add once a node has joined, or the taints added at join
time. The Node object of a real node of the group knows all of that. This module watches the Node
objects (list, then watch from the list's resourceVersion; a 410 Gone re-lists; errors back off), maps
each to its node group by ``spec.providerID`` through the registry, and when a node is Ready records its
allocatable, capacity, labels and taints, without what names one machine or what is transient
(``template_from_node``). The record goes to the backend (``Backend.set_learned_template``, which ranks
it between the config override and the cloud's template) and to a ConfigMap per backend,
``<configmap_prefix>-<backend>``, one JSON value per node group, read back at start so that a group
scaled to zero keeps its template across restarts of the server.

Writes are rate-limited per ConfigMap (``min_write_interval``), guarded by the resourceVersion read just
before (a conflicting writer makes us re-read and merge), and skipped when nothing changed. No call to the
API server runs in an RPC or under a backend lock: the watch and the writes have threads of their own,
and an unreachable API server only delays learning (logged, counted in
``ca_externalgrpc_kube_api_errors_total``); the templates already known keep serving.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.backend import Backend
from providers.bizfly.templates import PER_NODE_LABELS as BIZFLY_PER_NODE_LABELS
from providers.model import LearnedTemplate, NodeTemplate, Taint
from providers.registry import Registry
from providers.scaleway.templates import NODE_SPECIFIC_LABELS as SCALEWAY_PER_NODE_LABELS
from server.kube.client import KubeConnection
from server.kube.settings import LearnedTemplatesConfig
from server.node_encoding import is_valid_quantity

log = logging.getLogger(__name__)

FEATURE = "learned_templates"
FORMAT_VERSION = 1
# The API server ends a watch after this long; the next one resumes from the last resourceVersion.
WATCH_SECONDS = 60
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
FOLLOWER_RECHECK = 2.0  # a follower holding back a write looks again this often (it may lead by then)
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410

# Labels that name one machine, never its group: the node's own name, and the per-machine labels each
# cloud package already keeps out of its templates (Bizfly's node and server ids, Kapsule's node id).
PER_NODE_LABELS = frozenset(
    {"kubernetes.io/hostname", "node.kubernetes.io/instance-id"} | BIZFLY_PER_NODE_LABELS | SCALEWAY_PER_NODE_LABELS
)
# Taints that come and go with a node's condition or with the autoscaler's own work, never with the group.
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


# ---------------------------------------------------------------------------------------- pure rules
def is_ready(node: Any) -> bool:
    conditions = (node.status.conditions if node.status is not None else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _machine_names(node: Any) -> set[str]:
    """Values that identify this one machine: its name, its providerID and the id at the providerID's end."""
    names = {node.metadata.name}
    provider_id = (node.spec.provider_id if node.spec is not None else None) or ""
    if provider_id:
        names.add(provider_id)
        names.add(provider_id.rstrip("/").rsplit("/", 1)[-1])
    return {n for n in names if n}


def group_labels(node: Any) -> dict[str, str]:
    """The node's labels that every node of its group carries: per-node ones (PER_NODE_LABELS, and any
    label whose value is the node's name or its machine's id) are dropped, since a template carrying them
    would describe one existing machine and a pod that selects on them would be placed on a copy of it."""
    machine = _machine_names(node)
    labels = node.metadata.labels or {}
    return {k: v for k, v in labels.items() if k not in PER_NODE_LABELS and v not in machine}


def is_transient_taint(key: str) -> bool:
    return key in TRANSIENT_TAINTS or key.startswith(TRANSIENT_TAINT_PREFIXES)


def group_taints(node: Any) -> tuple[Taint, ...]:
    taints = (node.spec.taints if node.spec is not None else None) or []
    kept = {
        (t.key, t.value or "", t.effect)
        for t in taints
        if t.key and t.effect in _EFFECTS and not is_transient_taint(t.key)
    }
    return tuple(Taint(key, value, effect) for key, value, effect in sorted(kept))


def template_from_node(node: Any) -> NodeTemplate | None:
    """What a new node of the group will look like, from a Ready node of it; None when it is not Ready,
    is being deleted, or reports no capacity."""
    if node.metadata.deletion_timestamp is not None or not is_ready(node) or node.status is None:
        return None
    capacity = {str(k): str(v) for k, v in (node.status.capacity or {}).items()}
    allocatable = {str(k): str(v) for k, v in (node.status.allocatable or {}).items()}
    if not capacity.get("cpu") or not capacity.get("memory"):
        return None
    return NodeTemplate(
        labels=group_labels(node),
        taints=group_taints(node),
        capacity=capacity,
        allocatable=allocatable or dict(capacity),
    )


def encode_learned(learned: LearnedTemplate) -> str:
    t = learned.template
    return json.dumps(
        {
            "format": FORMAT_VERSION,
            "node": learned.node_name,
            "learned_at": learned.learned_at,
            "labels": dict(sorted(t.labels.items())),
            "taints": [{"key": x.key, "value": x.value, "effect": x.effect} for x in t.taints],
            "capacity": dict(sorted(t.capacity.items())),
            "allocatable": dict(sorted(t.allocatable.items())),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


class BadRecord(ValueError):
    """A ConfigMap value that is not a learned template of this format (edited by hand, or newer)."""


def _string_map(data: Mapping[str, Any], field: str, quantities: bool = False) -> dict[str, str]:
    value = data.get(field)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRecord(f"{field} is not a map of strings")
    if quantities:
        bad = [f"{k}={v}" for k, v in value.items() if not is_valid_quantity(v)]
        if bad:
            raise BadRecord(f"{field} holds invalid quantities: {', '.join(bad[:3])}")
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
    return LearnedTemplate(template, node, learned_at)


def configmap_name(settings: LearnedTemplatesConfig, backend: str) -> str:
    return f"{settings.configmap_prefix}-{backend}"


# ---------------------------------------------------------------------------------------- the learner
@dataclass(frozen=True, slots=True)
class NodeView:
    """What the learner keeps of one Node: enough to map it to a group and to learn from it."""

    name: str
    provider_id: str
    template: NodeTemplate | None  # None: not Ready (or nothing to learn)


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
        # With leader election every replica watches and reads (a follower has the templates ready when
        # it takes over), and only the leader writes the ConfigMaps.
        self._leads = leads
        self.core = connection.core()
        self.registry = registry
        self.settings = settings
        self._on_api_error = on_api_error
        self._clock = clock
        self._backends = {b.name: b for b in registry.backends}
        self._lock = threading.Lock()  # guards the fields below; never held over an API call
        self._nodes: dict[str, NodeView] = {}
        self._records: dict[str, dict[str, LearnedTemplate]] = {name: {} for name in self._backends}
        self._dirty: set[str] = set(self._backends)  # every ConfigMap is read (and merged) once at start
        self._written_at: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Read the ConfigMaps (bounded by the request timeout), then watch Nodes and write in the background."""
        for name in self._backends:
            self._sync_configmap(name)
        for backend in self._backends.values():
            backend.listeners.append(self._backend_synced)
        for target, name in ((self._watch_loop, "learn-templates-watch"), (self._write_loop, "learn-templates-write")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for backend in self._backends.values():
            if self._backend_synced in backend.listeners:
                backend.listeners.remove(self._backend_synced)
        # Write what was learned since the last write, within one request timeout, so a restart keeps it.
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
        """After a cloud listing: nodes seen before their machine was listed now map to a group."""
        with self._lock:
            views = [v for v in self._nodes.values() if v.template is not None]
        for view in views:
            self._consider(view)

    def observe(self, node: Any) -> None:
        """A Node added or changed (from the list or the watch)."""
        provider_id = (node.spec.provider_id if node.spec is not None else None) or ""
        view = NodeView(node.metadata.name, provider_id, template_from_node(node) if provider_id else None)
        with self._lock:
            self._nodes[view.name] = view
        if view.template is not None:
            self._consider(view)

    def forget(self, name: str) -> None:
        """A Node deleted: what it taught stays (that is the point: its group may now be at zero)."""
        with self._lock:
            self._nodes.pop(name, None)

    def _consider(self, view: NodeView) -> None:
        found = self.registry.group_for_provider_id(view.provider_id)
        if found is None or view.template is None:
            return  # a node of no group this server manages (or its machine is not listed yet)
        backend, group_id = found
        with self._lock:
            records = self._records.setdefault(backend.name, {})
            current = records.get(group_id)
            if current is not None and current.template == view.template:
                return
            if current is not None and current.node_name != view.name:
                teacher = self._nodes.get(current.node_name)
                if teacher is not None and teacher.template == current.template:
                    # Its teacher is still Ready and unchanged: nodes that differ slightly (memory
                    # reported a few KiB apart) must not make the record flap.
                    return
            learned = LearnedTemplate(view.template, view.name, _utc_now())
            records[group_id] = learned
            self._dirty.add(backend.name)
        backend.set_learned_template(group_id, learned)
        log.info(
            "learned the template of a node group from its node",
            extra={
                "backend": backend.name,
                "node_group": group_id,
                "node": view.name,
                "allocatable": dict(view.template.allocatable),
            },
        )
        self._wake.set()

    def learned(self, backend: str) -> dict[str, LearnedTemplate]:
        with self._lock:
            return dict(self._records.get(backend, {}))

    # ------------------------------------------------------------------ the Node watch
    def _watch_loop(self) -> None:
        resource_version: str | None = None
        backoff = BACKOFF_FIRST
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
                    log.info("learned templates: the Node watch expired (410 Gone); listing again")
                    resource_version = None
                    continue
                self._api_error("watch_nodes", err)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _relist(self) -> str:
        listing = self.core.list_node(_request_timeout=self.connection.request_timeout * 4)
        names = set()
        for node in listing.items:
            names.add(node.metadata.name)
            self.observe(node)
        with self._lock:
            for name in set(self._nodes) - names:  # deleted while we were not watching
                del self._nodes[name]
        return str(listing.metadata.resource_version)

    def _watch(self, resource_version: str) -> str:
        from kubernetes import watch

        stream = watch.Watch()
        for event in stream.stream(
            self.core.list_node,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(self.connection.request_timeout, WATCH_SECONDS + 15),
        ):
            if self._stop.is_set():
                stream.stop()
                break
            kind = event["type"]
            if kind in ("ADDED", "MODIFIED"):
                self.observe(event["object"])
            elif kind == "DELETED":
                self.forget(event["object"].metadata.name)
        return str(stream.resource_version or resource_version)

    # ------------------------------------------------------------------ the ConfigMaps
    def _write_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self._next_due())
            self._wake.clear()
            if self._stop.is_set():
                return
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
        pending = self._pending()
        if not pending:
            return 3600.0
        return max(0.05, min(self._due(n) for n in pending) - self._clock())

    def _sync_configmap(self, backend_name: str) -> None:
        """Read the backend's ConfigMap, adopt the groups it knows that we do not, write ours when they differ.

        A failure leaves the backend dirty and retries after a backoff; a conflict (another writer got in
        between) retries at once with a fresh read.
        """
        for _attempt in range(3):
            try:
                if self._read_merge_write(backend_name):
                    break
            except Exception as err:  # an API failure delays the write; it never reaches an RPC
                self._api_error("write_configmap", err)
                with self._lock:
                    failures = self._failures[backend_name] = self._failures.get(backend_name, 0) + 1
                    self._retry_at[backend_name] = self._clock() + min(BACKOFF_FIRST * 2 ** (failures - 1), BACKOFF_MAX)
                return
        with self._lock:
            self._failures.pop(backend_name, None)
            if self._leads():  # a follower keeps its recheck time (set in _read_merge_write)
                self._retry_at.pop(backend_name, None)

    def _read_merge_write(self, backend_name: str) -> bool:
        """One read-merge-write round; False on a write conflict (read again)."""
        from kubernetes.client.rest import ApiException

        core, name, namespace = self.core, configmap_name(self.settings, backend_name), self.connection.namespace
        timeout = self.connection.request_timeout
        try:
            existing = core.read_namespaced_config_map(name, namespace, _request_timeout=timeout)
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise
            existing = None
        stored = dict((existing.data or {}) if existing is not None else {})
        self._adopt(backend_name, stored)
        with self._lock:
            ours = {gid: encode_learned(rec) for gid, rec in self._records.get(backend_name, {}).items()}
            self._dirty.discard(backend_name)  # a change from now on makes it dirty again
        unstorable = sorted(gid for gid in ours if not _CONFIGMAP_KEY.match(gid))
        if unstorable:
            # Served from memory all the same; only a restart loses them.
            log.warning(
                "learned templates: node group ids that cannot be ConfigMap keys are not stored",
                extra={"backend": backend_name, "node_groups": unstorable[:10]},
            )
        wanted = {**stored, **{gid: text for gid, text in ours.items() if gid not in unstorable}}
        if existing is not None and wanted == stored:
            return True
        if not self._leads():
            with self._lock:
                self._dirty.add(backend_name)  # written once this replica leads
                self._retry_at[backend_name] = self._clock() + FOLLOWER_RECHECK
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
                core.create_namespaced_config_map(namespace, body, _request_timeout=timeout)
            else:
                body["metadata"]["resourceVersion"] = existing.metadata.resource_version
                core.replace_namespaced_config_map(name, namespace, body, _request_timeout=timeout)
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

    def _adopt(self, backend_name: str, stored: Mapping[str, str]) -> None:
        """Install the stored templates of groups we have learned nothing about (at start: all of them)."""
        backend = self._backends.get(backend_name)
        if backend is None:
            return
        adopted: list[tuple[str, LearnedTemplate]] = []
        with self._lock:
            records = self._records.setdefault(backend_name, {})
            for group_id, text in stored.items():
                if group_id in records:
                    continue
                try:
                    learned = decode_learned(text)
                except BadRecord as err:
                    log.warning(
                        "learned templates: ignoring a ConfigMap entry that is not a learned template",
                        extra={"backend": backend_name, "node_group": group_id, "error": str(err)},
                    )
                    continue
                records[group_id] = learned
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
