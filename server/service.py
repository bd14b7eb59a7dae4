"""The externalgrpc CloudProvider servicer: proto in, domain call, proto out.

Thin by design (docs/explanation/architecture.md, "Layers"): it never talks HTTP, translates messages, and maps
domain errors through the one table in server/errors.py. Generation quirks live in server/compat.py.
Hot reads are answered from prebuilt messages cached per snapshot version.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import any_pb2

from protos import externalgrpc_pb2 as pb
from providers.backend import Backend
from providers.cloud import CloudAdapter
from providers.deadline import Deadline
from providers.errors import DomainError, InvalidRequest, NodeGroupNotFound, NodeInNoGroup, NotSupported
from providers.model import GroupState, Instance, NodeRef
from providers.registry import Registry
from server import compat
from server.errors import status_for
from server.logs import redact
from server.node_encoding import encode_template
from server.rpc import Abort, CallContext, Code

log = logging.getLogger("server.rpc")

SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"]
SERVICE_NAME = SERVICE.full_name
#: NodeGroupForNode's answer for a node of no group
UNMANAGED_ANSWER = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))
_EMPTY_OPTIONS = pb.NodeGroupAutoscalingOptionsResponse()

R = TypeVar("R")


def _node_ref(node: pb.ExternalGrpcNode) -> NodeRef:
    return NodeRef(node.providerID, node.name, dict(node.labels), dict(node.annotations))


def _instance_pb(inst: Instance) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=pb.InstanceStatus.InstanceState.ValueType(int(inst.state)))
    if inst.error is not None:
        status.errorInfo.errorCode = inst.error.code
        status.errorInfo.errorMessage = inst.error.message
        status.errorInfo.instanceErrorClass = int(inst.error.error_class)
    return pb.Instance(id=inst.id, status=status)


MAX_DEBUG = 512


def _group_pb(group: GroupState, template_source: str) -> pb.NodeGroup:
    # The template's source goes last and always survives the cut (``status`` reads it from there).
    suffix = f" template={template_source}"
    debug = group.debug[: MAX_DEBUG - len(suffix)] + suffix
    return pb.NodeGroup(id=group.id, minSize=group.min_size, maxSize=group.max_size, debug=debug)


@dataclass(frozen=True, slots=True)
class ScaleAction:
    """What one mutating RPC did, for ``CloudProviderService.scale_observers`` (Kubernetes Events)."""

    backend: str
    group_id: str
    action: str  # increase, decrease, delete
    delta: int  # the request's delta (0 for delete)
    nodes: tuple[NodeRef, ...]  # the nodes of a DeleteNodes
    target: int | None  # the group's target size after a success
    error: DomainError | None  # why it failed, None on success


def rpc(mutating: bool = False, leader_only: bool = False) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Map DomainError to its status code, log mutations at info and reads at debug. ``leader_only`` (and
    every mutating call): with leader election, a replica that does not serve as the leader refuses it."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        name = method.__name__

        @functools.wraps(method)
        def handler(self: CloudProviderService, request: Any, context: CallContext) -> R:
            start = time.perf_counter()
            ran = False  # whether the method ran: a call refused before it changed nothing to republish
            try:
                if (mutating or leader_only) and self.leader_guard is not None:
                    self.leader_guard(name)  # a follower replica refuses before anything else
                ran = True
                result = method(self, request, context)
                if mutating:
                    self.mutated()
            except DomainError as err:
                if mutating and ran:
                    self.mutated()  # a failed change may still have moved the pending state
                code = status_for(err)
                message = _details(err)
                _log(name, mutating, request, code.name, start, message)
                raise Abort(code, message) from None
            except Exception:  # a bug must answer INTERNAL, never crash the server or hang
                if mutating:
                    self.mutated()
                log.exception("unexpected failure", extra={"grpc_method": name})
                raise Abort(Code.INTERNAL, f"{name} failed unexpectedly; see the server log") from None
            if mutating or log.isEnabledFor(logging.DEBUG):
                _log(name, mutating, request, "OK", start, "")
            return result

        return handler

    return wrap


# gRPC carries the details in a header: the client drops the whole answer (RESOURCE_EXHAUSTED,
# "metadata size exceeds soft limit") beyond 8 KiB, and a hostile request can make a message echo
# a huge id. Keep well under it.
MAX_DETAILS = 1024
MAX_LOGGED_ID = 256


def _details(err: DomainError) -> str:
    """The error text for the CA: every configured secret masked, cut to a size gRPC always delivers."""
    text = str(err)
    if len(text) > MAX_DETAILS:
        # Cut before redacting (redaction costs time per character); the cut text is redacted whole.
        text = text[: MAX_DETAILS - 16] + " ...(truncated)"
    return redact(text)


def log_rpc_calls() -> bool:
    """Whether every read is logged (debug level), not only mutations and errors."""
    return log.isEnabledFor(logging.DEBUG)


def _log(method: str, mutating: bool, request: Any, code: str, start: float, message: str) -> None:
    level = logging.INFO if mutating or code not in ("OK", "UNIMPLEMENTED", "NOT_FOUND") else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    extra: dict[str, Any] = {
        "grpc_method": method,
        "grpc_code": code,
        "duration_ms": round((time.perf_counter() - start) * 1000, 3),
    }
    group = getattr(request, "id", None)
    if group:
        extra["node_group"] = group[:MAX_LOGGED_ID]  # a hostile id must not make every log line huge
    if hasattr(request, "delta"):
        extra["delta"] = request.delta
    if method == "NodeGroupDeleteNodes":
        extra["nodes"] = [(n.providerID or n.name)[:MAX_LOGGED_ID] for n in request.nodes][:20]
    extra["result"] = "ok" if code == "OK" else "error"
    log.log(level, f"{method} {code}" + (f": {message}" if message else ""), extra=extra)


class CloudProviderService:
    def __init__(
        self,
        registry: Registry,
        options: Mapping[str, compat.OptionsOverride] | None = None,
        on_scale_action: Callable[[Backend, str, str, str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.options = dict(options or {})
        self.on_scale_action = on_scale_action
        # Told of every mutating call's outcome after it is decided; each must return at once (no I/O).
        self.scale_observers: list[Callable[[ScaleAction], None]] = []
        self._group_msgs: dict[str, tuple[object, pb.NodeGroupForNodeResponse]] = {}
        self._nodes_msgs: dict[str, tuple[tuple[Instance, ...], pb.NodeGroupNodesResponse]] = {}
        self._template_msgs: dict[str, tuple[object, pb.NodeGroupTemplateNodeInfoResponse | None]] = {}
        self._observed: dict[str, int] = {}
        # Leader election: raises NotLeader (UNAVAILABLE) for a mutating RPC, or Refresh, on a replica that
        # does not serve as the leader.
        self.leader_guard: Callable[[str], None] | None = None
        # Hooks of the native engine (server/native_front.py): republish the hot answers before a
        # mutation's answer goes out; learn that a group's node labels are recorded for this snapshot;
        # learn the options answer for a group with per-group options and the caller's defaults.
        self.after_mutation: Callable[[], None] | None = None
        self.on_labels_recorded: Callable[[str], None] | None = None
        # (group, serialized defaults, serialized answer) of a GetOptions answer built from per-group options
        self.on_options_answered: Callable[[str, bytes, bytes], None] | None = None
        # (group, template key, answer) of a TemplateNodeInfo answer; and a group whose template may have
        # changed (a node's labels were recorded)
        self.on_template_answered: Callable[[str, object, pb.NodeGroupTemplateNodeInfoResponse], None] | None = None
        self.on_template_changed: Callable[[str], None] | None = None

    # --------------------------------------------------------------- helpers
    @staticmethod
    def _id(request: Any) -> str:
        if not request.id:
            raise InvalidRequest("the node group id is empty; use an id returned by NodeGroups")
        return str(request.id)

    def _backend(self, group_id: str) -> Backend:
        return self.registry.backend_for_group(group_id)

    def _deadline(self, context: CallContext) -> Deadline:
        return Deadline.from_grpc_remaining(context.time_remaining())

    def mutated(self) -> None:
        if self.after_mutation is not None:
            self.after_mutation()

    def labels_recorded(self, group_id: str, version: int) -> bool:
        """Whether a node's labels were recorded for the group in snapshot ``version``."""
        return self._observed.get(group_id) == version

    # --------------------------------------------------------------- answers of the hot reads
    # One place builds each: the handlers below and the native engine's published tables.
    def node_groups_response(self) -> pb.NodeGroupsResponse:
        return pb.NodeGroupsResponse(
            nodeGroups=[_group_pb(g, b.template_source(g.id)) for b, g in self.registry.all_groups()]
        )

    def for_node_response(self, backend: Backend, gid: str) -> pb.NodeGroupForNodeResponse:
        key = backend.template_key(gid)  # the debug string names the template's source
        cached = self._group_msgs.get(gid)
        if cached is None or cached[0] != key:
            group_pb = _group_pb(backend.group(gid), backend.template_source(gid))
            cached = (key, pb.NodeGroupForNodeResponse(nodeGroup=group_pb))
            self._group_msgs[gid] = cached
        return cached[1]

    def target_size_response(self, gid: str) -> pb.NodeGroupTargetSizeResponse:
        return pb.NodeGroupTargetSizeResponse(targetSize=self._backend(gid).target_size(gid))

    def nodes_response(self, gid: str) -> pb.NodeGroupNodesResponse:
        # Keyed by the instances themselves: a listing that finds the group unchanged keeps its tuple
        # (providers/backend.py), so the message is built again only when a machine changed.
        instances = self._backend(gid).instances(gid)
        cached = self._nodes_msgs.get(gid)
        if cached is None or cached[0] is not instances:
            cached = (instances, pb.NodeGroupNodesResponse(instances=[_instance_pb(i) for i in instances]))
            self._nodes_msgs[gid] = cached
        return cached[1]

    def options_response(
        self, gid: str, defaults: pb.NodeGroupAutoscalingOptions | None
    ) -> pb.NodeGroupAutoscalingOptionsResponse | None:
        """The answer for ``gid``; None when it depends on the request's defaults and none are given."""
        self._backend(gid)
        override = self.options.get(gid)
        if override is None:
            return _EMPTY_OPTIONS  # every CA version then uses its own flag defaults
        if defaults is None:
            return None
        return compat.build_options(defaults, override)

    def _scale_action(
        self,
        backend: Backend,
        group_id: str,
        action: str,
        *,
        delta: int = 0,
        nodes: tuple[NodeRef, ...] = (),
        target: int | None = None,
        error: DomainError | None = None,
    ) -> None:
        if self.on_scale_action is not None:
            self.on_scale_action(backend, group_id, action, "ok" if error is None else "error")
        if self.scale_observers:
            done = ScaleAction(backend.name, group_id, action, delta, nodes, target, error)
            for observe in self.scale_observers:
                try:
                    observe(done)
                except Exception:  # an observer must never change the answer to the CA
                    log.exception("scale action observer failed", extra={"node_group": group_id})

    # --------------------------------------------------------------- cloud-provider level
    @rpc()
    def NodeGroups(self, request: pb.NodeGroupsRequest, context: CallContext) -> pb.NodeGroupsResponse:
        return self.node_groups_response()

    @rpc()
    def NodeGroupForNode(
        self, request: pb.NodeGroupForNodeRequest, context: CallContext
    ) -> pb.NodeGroupForNodeResponse:
        node = request.node
        found = self.registry.group_for_provider_id(node.providerID or node.name)
        if found is None:
            return UNMANAGED_ANSWER
        backend, gid = found
        response = self.for_node_response(backend, gid)
        if node.labels:
            version = backend.snapshot.version
            if self._observed.get(gid) != version:
                # A real node of this group: remember its labels for scale-from-zero templates.
                self._observed[gid] = version
                if (
                    backend.observe_node(gid, dict(node.labels), node.name, node.providerID)
                    and self.on_template_changed is not None
                ):
                    self.on_template_changed(gid)
            if self.on_labels_recorded is not None:
                self.on_labels_recorded(gid)
        return response

    @rpc()
    def PricingNodePrice(
        self, request: pb.PricingNodePriceRequest, context: CallContext
    ) -> pb.PricingNodePriceResponse:
        node = _node_ref(request.node)
        start, end = compat.pricing_window(request)
        priced = [b for b in self.registry.backends if _overrides(b.adapter, "node_price")]
        if not priced:
            raise NotSupported("no configured backend prices nodes")
        for backend in priced:
            gid = backend.adapter.group_for_price_node(node) or backend.group_id_for(node.provider_id)
            if gid is not None and backend.has_group(gid):
                return pb.PricingNodePriceResponse(
                    price=backend.adapter.node_price(backend.group(gid), node, start, end)
                )
        if len(priced) < len(self.registry.backends):
            # Most likely a node (or a template node) of a cloud without prices: the CA's price expander
            # must see ErrNotImplemented for it, not an error.
            raise NotSupported("this node belongs to no backend that prices nodes")
        raise NodeInNoGroup(node.name, node.provider_id)

    @rpc()
    def PricingPodPrice(self, request: pb.PricingPodPriceRequest, context: CallContext) -> pb.PricingPodPriceResponse:
        start, end = compat.pricing_window(request)
        for backend in self.registry.backends:
            if _overrides(backend.adapter, "pod_price"):
                return pb.PricingPodPriceResponse(
                    price=backend.adapter.pod_price(compat.pod_bytes(request), start, end)
                )
        raise NotSupported("no configured backend prices pods")

    @rpc()
    def GPULabel(self, request: pb.GPULabelRequest, context: CallContext) -> pb.GPULabelResponse:
        labels = [b.adapter.gpu_label for b in self.registry.backends]
        return pb.GPULabelResponse(label=labels[0] if labels else "")

    @rpc()
    def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: CallContext
    ) -> pb.GetAvailableGPUTypesResponse:
        response = pb.GetAvailableGPUTypesResponse()
        for backend in self.registry.backends:
            for gpu_type in backend.adapter.available_gpu_types():
                response.gpuTypes[gpu_type].CopyFrom(any_pb2.Any())
        return response

    @rpc()
    def Cleanup(self, request: pb.CleanupRequest, context: CallContext) -> pb.CleanupResponse:
        return pb.CleanupResponse()

    @rpc(leader_only=True)
    def Refresh(self, request: pb.RefreshRequest, context: CallContext) -> pb.RefreshResponse:
        # A due snapshot is re-listed on the backend's listing thread (waited for a bounded time); then
        # Refresh refuses only state beyond the staleness bound. With leader election a replica that does
        # not lead refuses it (leader_only): the CA's loop then ends there, instead of deciding a scale-up
        # from a view that no longer syncs and meeting a refused IncreaseSize (a failed scale-up that
        # backs the group off) while its connection is on its way to the leader.
        self.registry.refresh(self._deadline(context))
        return pb.RefreshResponse()

    # --------------------------------------------------------------- node-group level
    @rpc()
    def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: CallContext
    ) -> pb.NodeGroupTargetSizeResponse:
        return self.target_size_response(self._id(request))

    @rpc(mutating=True)
    def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: CallContext
    ) -> pb.NodeGroupIncreaseSizeResponse:
        gid = self._id(request)
        backend = self._backend(gid)
        try:
            target = backend.increase_size(gid, request.delta, self._deadline(context))
        except DomainError as err:
            self._scale_action(backend, gid, "increase", delta=request.delta, error=err)
            raise
        self._scale_action(backend, gid, "increase", delta=request.delta, target=target)
        return pb.NodeGroupIncreaseSizeResponse()

    @rpc(mutating=True)
    def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: CallContext
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        gid = self._id(request)
        backend = self._backend(gid)
        try:
            target = backend.decrease_target_size(gid, request.delta, self._deadline(context))
        except DomainError as err:
            self._scale_action(backend, gid, "decrease", delta=request.delta, error=err)
            raise
        self._scale_action(backend, gid, "decrease", delta=request.delta, target=target)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    @rpc(mutating=True)
    def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: CallContext
    ) -> pb.NodeGroupDeleteNodesResponse:
        gid = self._id(request)
        backend = self._backend(gid)
        nodes = [_node_ref(n) for n in request.nodes]
        try:
            backend.delete_nodes(gid, nodes, self._deadline(context))
        except DomainError as err:
            self._scale_action(backend, gid, "delete", nodes=tuple(nodes), error=err)
            raise
        try:
            target: int | None = backend.target_size(gid)
        except NodeGroupNotFound:  # the group left the snapshot meanwhile; the deletion stands
            target = None
        self._scale_action(backend, gid, "delete", nodes=tuple(nodes), target=target)
        return pb.NodeGroupDeleteNodesResponse()

    @rpc()
    def NodeGroupNodes(self, request: pb.NodeGroupNodesRequest, context: CallContext) -> pb.NodeGroupNodesResponse:
        return self.nodes_response(self._id(request))

    @rpc()
    def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: CallContext
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        gid = self._id(request)
        backend = self._backend(gid)
        key = backend.template_key(gid)
        cached = self._template_msgs.get(gid)
        if cached is None or cached[0] != key:
            template = backend.template(gid)
            response = None
            if template is not None:
                try:
                    response = compat.template_response(encode_template(gid, template))
                except ValueError as err:
                    log.error("template cannot be encoded", extra={"node_group": gid, "error": str(err)})
            cached = (key, response)
            self._template_msgs[gid] = cached
        if cached[1] is not None and self.on_template_answered is not None:
            self.on_template_answered(gid, cached[0], cached[1])
        if cached[1] is None:
            # Never OK-with-empty bytes: that makes the CA dereference a nil NodeInfo and crash
            # (docs/reference/protocol.md, "What crashes the CA or stops its loop").
            raise NotSupported(
                f"no node template for node group {gid!r}; configure node_groups.{gid}.template "
                "(labels, capacity, allocatable) to enable scale-from-zero"
            )
        return cached[1]

    @rpc()
    def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: CallContext
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        gid = self._id(request)
        response = self.options_response(gid, request.defaults)
        assert response is not None  # the request always has defaults (an empty message if unset)
        if self.on_options_answered is not None and gid in self.options:
            self.on_options_answered(gid, request.defaults.SerializeToString(), response.SerializeToString())
        return response


def _overrides(adapter: CloudAdapter, method: str) -> bool:
    return getattr(type(adapter), method) is not getattr(CloudAdapter, method)
