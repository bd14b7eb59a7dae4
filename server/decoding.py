"""Answer undecodable request bytes with INVALID_ARGUMENT instead of grpcio's INTERNAL.

grpcio turns a request deserializer that raises into INTERNAL "Exception deserializing request!",
which tells a client nothing and reads like a server bug. This interceptor gives every unary method
a deserializer that never raises: bytes that are not a valid message become a ``Malformed`` marker,
and the wrapped handler answers it with INVALID_ARGUMENT naming the expected message type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True, slots=True)
class Malformed:
    message_type: str
    error: str


class DecodingInterceptor(grpc.ServerInterceptor):
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
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler  # streaming (health Watch, reflection) and unknown methods: grpcio's own way
        wrapped = _wrap(handler)
        self._wrapped[name] = wrapped
        return wrapped


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    decode = handler.request_deserializer
    inner = handler.unary_unary
    type_name = getattr(getattr(decode, "__self__", None), "DESCRIPTOR", None)
    expected = type_name.full_name if type_name is not None else "request"

    def safe_decode(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as err:  # any decode failure is the client's bytes, not our bug
            return Malformed(expected, str(err) or type(err).__name__)

    def behavior(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request bytes are not a valid {request.message_type} message ({request.error[:200]})",
            )
        return inner(request, context)

    return grpc.unary_unary_rpc_method_handler(
        behavior, request_deserializer=safe_decode, response_serializer=handler.response_serializer
    )
