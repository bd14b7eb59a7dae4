"""Apply our server interceptors once, when handlers are registered, instead of on every call.

Given to grpcio as ``interceptors``, an interceptor is asked for the handler on every call: grpcio
builds the call details and walks the pipeline before each RPC, a cost the CA's thousands of
sequential calls per loop pay each time. Our interceptors (server/interceptors.py) decide per method
only, never per call, so the same handler can be built once: ``PrewrappingServer`` stands in for the
``grpc.Server`` while the services register and hands grpcio handlers already wrapped by every
interceptor, outermost first, the order ``grpc.server(interceptors=...)`` applies them in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc


class _Details(NamedTuple):
    """The fields of grpc.HandlerCallDetails an interceptor reads, as at registration time."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def wrap_handler(
    interceptors: Sequence[grpc.ServerInterceptor], method: str, handler: grpc.RpcMethodHandler | None
) -> grpc.RpcMethodHandler | None:
    """``handler`` as the interceptor pipeline would hand it to grpcio for ``method``."""
    details = _Details(method, ())

    def through(index: int) -> Callable[[Any], grpc.RpcMethodHandler | None]:
        if index == len(interceptors):
            return lambda _details: handler
        return lambda call: interceptors[index].intercept_service(through(index + 1), call)

    return through(0)(details)


class _WrappingGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, interceptors: Sequence[grpc.ServerInterceptor]) -> None:
        self._inner = inner
        self._interceptors = interceptors

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None  # not this service's method: grpcio asks the next handler, then says UNIMPLEMENTED
        return wrap_handler(self._interceptors, handler_call_details.method, handler)


class PrewrappingServer:
    """A ``grpc.Server`` whose services register through it get their handlers pre-wrapped."""

    def __init__(self, server: grpc.Server, interceptors: Sequence[grpc.ServerInterceptor]) -> None:
        self._server = server
        self._interceptors = tuple(interceptors)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        wrapped = {name: wrap_handler(self._interceptors, f"/{service}/{name}", h) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, wrapped)

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_WrappingGenericHandler(h, self._interceptors) for h in generic_rpc_handlers)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)
