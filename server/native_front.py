"""The native serving engine (``serving.engine: native``, and ``auto`` when installed): a Rust front, no grpcio.

grpcio costs about 500 µs per call here whatever the handler does, twice grpc-go, and the CA's loop is
thousands of strictly sequential reads; grpcio also costs about 15 MiB of RSS (docs/explanation/performance.md).
With this engine the extension ``ca_externalgrpc_native`` (``native/``) owns the CA-facing socket,
plaintext or TLS with the same rules as the grpcio path, the process never imports grpcio, and the
front

* answers the hot reads (NodeGroups, NodeGroupForNode, NodeGroupTargetSize, NodeGroupGetOptions,
  NodeGroupNodes) from tables of serialized answers that this module builds with the servicer's own
  code and publishes after every sync attempt and every mutating call, so the bytes are the servicer's.
  GetOptions of a group with per-group options depends on the defaults the caller sends: the front
  hands the first such call to Python and then gives Python's answer to every call with the same
  defaults. TemplateNodeInfo likewise: the first call per group after a publication is Python's, the
  next ones get its answer, until the group's template may have changed (labels recorded). When recorded
  labels change a group's debug string (it names the template's source), every table is published again:
  the front never serves an answer Python would no longer give (tests/integration/test_engine_differential.py);
* hands every other CloudProvider call to Python: the request bytes go to ``Dispatcher.call``
  (server/rpc.py) on the front's pool of blocking threads, the same code path as on the grpcio engine:
  errors (empty id, unknown group, undecodable bytes), Refresh, mutations, templates, pricing, with
  their codes, messages, metrics and logs. A request the tables cannot answer exactly goes there too;
* answers grpc.health.v1 (Check and Watch) from the statuses Python sets, and server reflection
  (v1 and v1alpha, for grpcurl) from the descriptors Python hands it at start.

NodeGroupForNode records a group's node labels once per snapshot (templates for scale-from-zero): a
call that carries labels for a group not recorded in the current snapshot goes to Python, and Python
marks the group recorded in the front once it has them. With per-call debug logging on (``log.level:
debug``) nothing is published, so every call reaches Python and is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.errors import DomainError
from server.config import ServingConfig
from server.rpc import MAX_ANSWER_BYTES, Dispatcher, ReflectionData
from server.service import UNMANAGED_ANSWER, CloudProviderService

log = logging.getLogger(__name__)

NativeCalls = list[tuple[str, str, int, list[int], float]]


#: how to get the extension, for every message that says it is missing
INSTALL_NATIVE = (
    "install the server with its native extra, pip install 'ca-externalgrpc-server[native]' (the "
    "ca-externalgrpc-native wheel, which make wheels builds), or run make install in a checkout"
)


class NativeEngineMissing(ImportError):
    """The extension is not installed in this environment (or does not load here)."""


def load_extension() -> Any:
    try:
        import ca_externalgrpc_native
    except ImportError as err:
        # ImportError also covers an extension that is there but cannot load (a glibc older than the
        # one it was linked against): the reason says which.
        raise NativeEngineMissing(f"the native serving engine is not installed ({err})") from None
    return ca_externalgrpc_native


class NativeFront:
    """The running front and what feeds it; ``publish`` after any change the hot reads could see."""

    def __init__(
        self,
        host: str,
        port: int,
        buckets: Sequence[float],
        dispatcher: Dispatcher,
        reflection: ReflectionData,
        tls: tuple[bytes, bytes, bytes | None] | None,
        python_threads: int,
        serving: ServingConfig,
        # One network thread: the CA's calls come one at a time on one connection, and a second thread
        # only added wake-ups of its own to each call (docs/evidence/performance.md, "One write per call").
        threads: int = 1,
    ) -> None:
        extension = load_extension()
        cert, key, client_ca = tls if tls is not None else (None, None, None)
        self._front = extension.Front(
            host,
            port,
            list(buckets),
            dispatcher.native,
            list(dispatcher.methods),
            cert=cert,
            key=key,
            client_ca=client_ca,
            threads=threads,
            python_threads=python_threads,
            **front_limits(serving),
        )
        self._front.set_reflection(reflection.services, reflection.files, reflection.symbols)
        self._lock = threading.Lock()  # one publication at a time: a slower, older one never lands last
        self._service: CloudProviderService | None = None
        self._lookups: NodeLookups | None = None  # what the last published for_node table was built from
        self._groups: dict[str, bytes] = {}  # each group's NodeGroupForNode answer as last published

    @property
    def port(self) -> int:
        return int(self._front.port)

    def start(self) -> None:
        """Nothing to do: the front serves from its construction (calls reach Python at once)."""

    def set_health(self, service: str, status: int) -> None:
        self._front.set_health(service, status)

    def shutdown_health(self) -> None:
        """Every service NOT_SERVING from now on, whatever is set later."""
        self._front.shutdown_health()

    def submit(self, task: Callable[[], object]) -> None:
        """Run ``task`` on the pool that runs Python's calls (the liveness canary, server/probes.py)."""
        self._front.submit(task)

    def feed_from(self, service: CloudProviderService) -> None:
        """Publish ``service``'s answers now and after every change it reports."""
        self._service = service
        service.after_mutation = self.publish
        service.on_labels_recorded = self._front.mark_observed
        service.on_options_answered = self._front.learn_options
        service.on_template_answered = self._learn_template
        service.on_template_changed = self._forget_template
        self.publish()

    def _learn_template(self, gid: str, key: object, answer: Any) -> None:
        """Python answered TemplateNodeInfo of ``gid``: the front gives that answer until the next
        publication, if the template is still the one it was built from (checked under the publication
        lock, so a newer snapshot or newly recorded labels can never be overwritten by an older answer)."""
        data = _fits(answer)
        service = self._service
        if data is None or service is None:
            return
        with self._lock:
            try:
                current = service.registry.backend_for_group(gid).template_key(gid)
            except DomainError:
                return  # the group left with a newer snapshot
            if current == key:
                self._front.learn_template(gid, data)

    def _forget_template(self, gid: str) -> None:
        """A node's labels changed the template of ``gid``: its TemplateNodeInfo answer goes back to Python,
        and when the group's debug string (which names the template's source: ``template=none`` before a
        Bizfly pool with an unknown flavor shows a node, ``template=cloud`` after) changed with it, every
        table is published again, so NodeGroups and NodeGroupForNode say what Python says now."""
        service = self._service
        with self._lock:
            self._front.forget_template(gid)
            published = self._groups.get(gid)
        if service is None or published is None:
            return
        try:
            backend = service.registry.backend_for_group(gid)
            now = service.for_node_response(backend, gid).SerializeToString()
        except DomainError:
            return  # the group left with a newer snapshot, whose publication follows
        if now != published:
            self.publish()

    def on_sync(self, _backend: object) -> None:
        """Backend listener: a sync attempt may have swapped the snapshot, or a learned template changed."""
        self.publish()

    def publish(self) -> None:
        service = self._service
        if service is None:
            return
        with self._lock:
            try:
                tables, lookups = build_tables(service, self._lookups)
            except Exception:  # a failed publication leaves the last one; Python still answers the rest
                log.exception("building the native engine's answers failed")
                return
            self._front.publish(**tables)
            self._lookups = lookups
            self._groups = dict(tables["groups"])

    def drop_connections(self, grace: float) -> None:
        """GOAWAY to every client connection; open calls get ``grace`` seconds; the port keeps listening."""
        self._front.drop_connections(grace)

    def follow(self, age: float, late_age: float, grace: float) -> None:
        """This replica does not lead: every connection, open or to come, gets GOAWAY ``age`` seconds from
        now, or once it has been open ``late_age`` when it comes later; its calls get ``grace``."""
        self._front.follow(age, late_age, grace)

    def lead(self) -> None:
        """This replica leads: connections live ``serving.max_connection_age`` again."""
        self._front.lead()

    def native_calls(self) -> NativeCalls:
        calls: NativeCalls = self._front.native_calls()
        return calls

    def stop(self, grace: float) -> None:
        """Stop accepting, let open calls (Python's too) finish for at most ``grace`` seconds."""
        self._front.stop(grace)


def front_limits(serving: ServingConfig) -> dict[str, Any]:
    """``serving.*`` as the front's keyword arguments (seconds; None for "never")."""
    return {
        "max_connections": serving.max_connections,
        "max_concurrent_streams": serving.max_concurrent_streams,
        "max_header_list_size": serving.max_header_list_size,
        "keepalive_time": serving.keepalive_time or None,
        "keepalive_timeout": serving.keepalive_timeout,
        "min_ping_interval": serving.min_ping_interval,
        "handshake_timeout": serving.handshake_timeout,
        "idle_timeout": serving.idle_timeout or None,
        "request_buffer": serving.request_buffer,
        "max_connection_age": serving.max_connection_age or None,
        "max_connection_age_grace": serving.max_connection_age_grace,
    }


def _fits(message: Any) -> bytes | None:
    data: bytes = message.SerializeToString()
    return data if len(data) <= MAX_ANSWER_BYTES else None


@dataclass(frozen=True)
class NodeLookups:
    """What a NodeGroupForNode table is made of: each backend's node -> group mapping and the groups'
    order. Snapshots of a cluster whose machines did not change share their mapping (providers/backend.py),
    so the same objects in the same order mean the same table."""

    mappings: tuple[Mapping[str, str], ...]
    groups: tuple[str, ...]

    def same_as(self, other: NodeLookups | None) -> bool:
        return (
            other is not None
            and self.groups == other.groups
            and len(self.mappings) == len(other.mappings)
            and all(a is b for a, b in zip(self.mappings, other.mappings, strict=True))
        )


def build_tables(service: CloudProviderService, last: NodeLookups | None = None) -> tuple[dict[str, Any], NodeLookups]:
    """The hot answers of ``service`` as it would give them now, keyed as the front looks them up, and what
    the node lookups were built from. ``for_node`` is None when they are built from ``last`` (the front then
    keeps the table it has: a 20,000-node table is neither built again nor held twice).

    Only answers the servicer gives with status OK are published; every error is Python's to give.
    """
    registry = service.registry
    groups: list[tuple[str, bytes]] = []
    mappings: list[tuple[Mapping[str, str], dict[str, int]]] = []
    observed: list[str] = []
    target_size: dict[str, bytes] = {}
    options: dict[str, bytes] = {}
    options_by_defaults: list[str] = []
    nodes: dict[str, bytes] = {}
    for backend in registry.backends:
        snapshot = backend.snapshot
        index_of: dict[str, int] = {}
        for gid in snapshot.groups:
            index_of[gid] = len(groups)
            groups.append((gid, service.for_node_response(backend, gid).SerializeToString()))
            if service.labels_recorded(gid, snapshot.version):
                observed.append(gid)
        mappings.append((snapshot.by_provider_id, index_of))
        for gid in snapshot.groups:
            if gid in target_size or registry.backend_for_group(gid) is not backend:
                continue
            try:
                answers = (
                    service.target_size_response(gid),
                    service.options_response(gid, None),
                    service.nodes_response(gid),
                )
            except DomainError:
                continue  # e.g. the snapshot swapped while building: that publication follows this one
            size, group_options, instances = (_fits(a) if a is not None else None for a in answers)
            if size is not None:
                target_size[gid] = size
            if group_options is not None:
                options[gid] = group_options
            elif answers[1] is None:
                options_by_defaults.append(gid)
            if instances is not None:
                nodes[gid] = instances
    lookups = NodeLookups(tuple(m for m, _ in mappings), tuple(gid for gid, _ in groups))
    for_node: dict[str, int] | None = None
    if not lookups.same_as(last):
        for_node = {}
        for by_provider_id, index_of in mappings:
            for provider_id, gid in by_provider_id.items():
                for_node.setdefault(provider_id, index_of[gid])  # the first backend that knows it, as Registry
    tables = {
        "node_groups": service.node_groups_response().SerializeToString(),
        "unmanaged": UNMANAGED_ANSWER.SerializeToString(),
        "groups": groups,
        "for_node": for_node,
        "observed": observed,
        "target_size": target_size,
        "options": options,
        "options_by_defaults": options_by_defaults,
        "nodes": nodes,
    }
    return tables, lookups
