"""The shared shape of our server interceptors: wrap each unary-unary method once, then reuse it.

grpcio asks every interceptor for the handler on every call; rebuilding a wrapper each time costs a
noticeable share of a hot read RPC, so wrappers are built once per method and cached.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import grpc


class UnaryInterceptor(grpc.ServerInterceptor, abc.ABC):
    """Wraps unary-unary handlers (built once per method); streaming and unknown methods pass through."""

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        name = handler_call_details.method
        cached = self._wrapped.get(name)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            # Not cached: unknown methods keep answering UNIMPLEMENTED through grpcio; streaming
            # methods (reflection, health Watch) keep grpcio's own handling.
            return handler
        wrapped = self._wrap(name, handler)
        self._wrapped[name] = wrapped
        return wrapped

    @abc.abstractmethod
    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler to use for ``full_method`` instead of ``handler``."""
