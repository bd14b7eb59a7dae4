"""The grpcio floor: a CloudProvider server that does nothing but answer from prebuilt messages.

Part of the serving spike (docs/evidence/performance.md). It answers the RPCs the load client sends from a
file of groups and nodes the runner writes, with no domain code, no interceptors and no logging, so
its per-call time is what a Python gRPC engine costs by itself: no tuning of our server's own code
can make a call cheaper than this. Run it with each engine to compare them side by side:

    python -m tests.bench.floor_server --engine threads|aio|aio-uvloop --state FILE --address 127.0.0.1:0

``--raw`` skips protobuf on both sides: a request's bytes are looked up in a cache of answer bytes
(filled on first sight), the most a response cache could save.

TemplateNodeInfo answers UNIMPLEMENTED (the load client counts it as an answer); GetOptions answers
the empty message our server gives when no group overrides its options.

``native_answers`` serializes the same answers for the native floor (``native_floor/``, Rust/tonic),
which serves them as bytes: the cost of a native serving core in front of a Python domain.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from protos import externalgrpc_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["CloudProvider"].full_name
ENGINES = ("threads", "aio", "aio-uvloop")


def state_of(groups: list[dict[str, Any]], nodes: dict[str, str]) -> dict[str, Any]:
    """What the floor server answers from: every group (id, min, max, target size) and node -> group id."""
    return {"groups": groups, "nodes": nodes}


def handlers(state: dict[str, Any]) -> dict[str, tuple[Callable[[Any, Any], Any], Any]]:
    """Method name -> (behaviour, request type); every answer built once, up front."""
    groups = {g["id"]: pb.NodeGroup(id=g["id"], minSize=g["min"], maxSize=g["max"]) for g in state["groups"]}
    sizes = {g["id"]: pb.NodeGroupTargetSizeResponse(targetSize=g["size"]) for g in state["groups"]}
    by_group: dict[str, list[str]] = {gid: [] for gid in groups}
    for provider_id, gid in state["nodes"].items():
        by_group[gid].append(provider_id)
    instances = {
        gid: pb.NodeGroupNodesResponse(
            instances=[
                pb.Instance(id=p, status=pb.InstanceStatus(instanceState=pb.InstanceStatus.instanceRunning))
                for p in ids
            ]
        )
        for gid, ids in by_group.items()
    }
    for_node = {gid: pb.NodeGroupForNodeResponse(nodeGroup=group) for gid, group in groups.items()}
    node_group = {provider_id: for_node[gid] for provider_id, gid in state["nodes"].items()}
    unmanaged = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))
    listing = pb.NodeGroupsResponse(nodeGroups=list(groups.values()))
    options = pb.NodeGroupAutoscalingOptionsResponse()
    refreshed = pb.RefreshResponse()

    def template(request: Any, context: Any) -> Any:
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("the floor server has no templates")
        return pb.NodeGroupTemplateNodeInfoResponse()

    return {
        "Refresh": (lambda r, c: refreshed, pb.RefreshRequest),
        "NodeGroups": (lambda r, c: listing, pb.NodeGroupsRequest),
        "NodeGroupForNode": (lambda r, c: node_group.get(r.node.providerID, unmanaged), pb.NodeGroupForNodeRequest),
        "NodeGroupGetOptions": (lambda r, c: options, pb.NodeGroupAutoscalingOptionsRequest),
        "NodeGroupTargetSize": (lambda r, c: sizes[r.id], pb.NodeGroupTargetSizeRequest),
        "NodeGroupNodes": (lambda r, c: instances[r.id], pb.NodeGroupNodesRequest),
        "NodeGroupTemplateNodeInfo": (template, pb.NodeGroupTemplateNodeInfoRequest),
    }


def native_answers(state: dict[str, Any]) -> dict[str, Any]:
    """The answers of ``handlers`` serialized (base64), keyed as the native floor looks them up."""

    def encoded(message: Any) -> str:
        return base64.b64encode(message.SerializeToString()).decode()

    table = handlers(state)
    gids = [g["id"] for g in state["groups"]]

    def ask(method: str, request: Any) -> Any:
        return table[method][0](request, None)

    return {
        "refresh": encoded(ask("Refresh", pb.RefreshRequest())),
        "node_groups": encoded(ask("NodeGroups", pb.NodeGroupsRequest())),
        "options": encoded(ask("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest())),
        "unmanaged": encoded(pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))),
        "for_node": {
            p: encoded(ask("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(providerID=p))))
            for p in state["nodes"]
        },
        "target_size": {g: encoded(ask("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=g))) for g in gids},
        "nodes": {g: encoded(ask("NodeGroupNodes", pb.NodeGroupNodesRequest(id=g))) for g in gids},
    }


def _generic(
    state: dict[str, Any], wrap: Callable[[Callable[[Any, Any], Any]], Any], raw: bool = False
) -> grpc.GenericRpcHandler:
    if raw:
        table = {
            name: grpc.unary_unary_rpc_method_handler(wrap(_bytes_cached(behaviour, request)))
            for name, (behaviour, request) in handlers(state).items()
        }
    else:
        table = {
            name: grpc.unary_unary_rpc_method_handler(
                wrap(behaviour), request_deserializer=request.FromString, response_serializer=pb_serialize
            )
            for name, (behaviour, request) in handlers(state).items()
        }
    return grpc.method_handlers_generic_handler(SERVICE, table)


def _bytes_cached(behaviour: Callable[[Any, Any], Any], request_type: Any) -> Callable[[bytes, Any], bytes]:
    cache: dict[bytes, bytes] = {}

    def answer(data: bytes, context: Any) -> bytes:
        found = cache.get(data)
        if found is None:
            found = cache[data] = pb_serialize(behaviour(request_type.FromString(data), context))
        return found

    return answer


def pb_serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def serve_threads(state: dict[str, Any], address: str, workers: int, raw: bool) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((_generic(state, lambda behaviour: behaviour, raw),))
    server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


def serve_aio(state: dict[str, Any], address: str) -> None:
    def wrap(behaviour: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        # A coroutine runs on the event loop; a plain function would go to a thread pool.
        async def handler(request: Any, context: Any) -> Any:
            return behaviour(request, context)

        return handler

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_generic(state, wrap),))
        server.add_insecure_port(address)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--workers", type=int, default=16, help="thread pool size (threads engine)")
    parser.add_argument("--raw", action="store_true", help="answer bytes from a cache keyed by request bytes")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--address", default="127.0.0.1:0")
    args = parser.parse_args(argv)
    state = json.loads(args.state.read_text())
    if args.engine == "threads":
        serve_threads(state, args.address, args.workers, args.raw)
        return
    if args.engine == "aio-uvloop":
        import uvloop  # the spike's optional dependency (the dev extra)

        uvloop.install()
    serve_aio(state, args.address)


if __name__ == "__main__":
    main()
