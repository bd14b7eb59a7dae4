"""Answer undecodable request bytes with INVALID_ARGUMENT instead of grpcio's INTERNAL.

grpcio turns a request deserializer that raises into INTERNAL "Exception deserializing request!",
which tells a client nothing and reads like a server bug. This interceptor gives every unary method
a deserializer that never raises: bytes that are not a valid message become a ``Malformed`` marker,
and the wrapped handler answers it with INVALID_ARGUMENT naming the expected message type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from server.interceptors import UnaryInterceptor


@dataclass(frozen=True, slots=True)
class Malformed:
    message_type: str
    error: str


class DecodingInterceptor(UnaryInterceptor):
    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:
            return handler  # raw-bytes handlers have nothing to decode
        return _wrap(handler)


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
