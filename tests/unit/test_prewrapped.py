"""Interceptors applied at registration (server/prewrapped.py) compose as grpcio's own pipeline would."""

from __future__ import annotations

from typing import Any

import grpc

from server.interceptors import UnaryInterceptor
from server.prewrapped import PrewrappingServer, wrap_handler


class Recording(UnaryInterceptor):
    """Appends its name before and after the inner behaviour, to show the nesting."""

    def __init__(self, name: str, trace: list[str]) -> None:
        super().__init__()
        self.name = name
        self.trace = trace
        self.wrapped_methods: list[str] = []

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        self.wrapped_methods.append(full_method)
        inner = handler.unary_unary

        def behaviour(request: Any, context: Any) -> Any:
            self.trace.append(f"{self.name}>")
            try:
                return inner(request, context)
            finally:
                self.trace.append(f"<{self.name}")

        return grpc.unary_unary_rpc_method_handler(behaviour)


class FakeServer:
    """Records what would reach grpcio (a pure-logic stand-in for grpc.Server)."""

    def __init__(self) -> None:
        self.registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self.generic: list[grpc.GenericRpcHandler] = []
        self.started = False

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.registered[service] = handlers

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.generic.extend(handlers)

    def start(self) -> None:
        self.started = True


def _echo(trace: list[str]) -> grpc.RpcMethodHandler:
    def behaviour(request: Any, context: Any) -> Any:
        trace.append("handler")
        return request

    return grpc.unary_unary_rpc_method_handler(behaviour)


def test_the_first_interceptor_is_the_outermost_as_in_grpcio() -> None:
    trace: list[str] = []
    outer, inner = Recording("metrics", trace), Recording("decoding", trace)
    handler = wrap_handler([outer, inner], "/svc/Method", _echo(trace))
    assert handler is not None
    assert handler.unary_unary("request", None) == "request"
    assert trace == ["metrics>", "decoding>", "handler", "<decoding", "<metrics"]


def test_registered_handlers_are_wrapped_once_at_registration() -> None:
    trace: list[str] = []
    interceptor = Recording("metrics", trace)
    server = FakeServer()
    registering = PrewrappingServer(server, [interceptor])  # type: ignore[arg-type]
    registering.add_registered_method_handlers("pkg.Svc", {"Get": _echo(trace)})
    assert interceptor.wrapped_methods == ["/pkg.Svc/Get"]
    for _ in range(3):
        server.registered["pkg.Svc"]["Get"].unary_unary("r", None)
    assert interceptor.wrapped_methods == ["/pkg.Svc/Get"]  # not rebuilt per call
    assert trace.count("metrics>") == 3
    registering.start()  # everything else reaches the real server
    assert server.started


def test_generic_handlers_are_wrapped_and_unknown_methods_stay_unknown() -> None:
    trace: list[str] = []
    server = FakeServer()
    registering = PrewrappingServer(server, [Recording("metrics", trace)])  # type: ignore[arg-type]
    registering.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("pkg.Svc", {"Get": _echo(trace)}),))
    (generic,) = server.generic

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method
            self.invocation_metadata = ()

    assert generic.service(Details("/pkg.Svc/Other")) is None  # type: ignore[arg-type]
    handler = generic.service(Details("/pkg.Svc/Get"))  # type: ignore[arg-type]
    assert handler is not None
    handler.unary_unary("r", None)
    assert trace == ["metrics>", "handler", "<metrics"]
