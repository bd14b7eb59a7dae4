"""The pure-Python serving engine (``serving.engine: grpcio``): grpcio owns the CA-facing socket.

Imported only when this engine is chosen: with the native engine the process never loads grpcio.
Every CloudProvider method is registered as a raw-bytes handler that runs ``Dispatcher.call``
(server/rpc.py), the same code path the native engine calls, so decoding, error mapping, metrics and
logs do not depend on the engine. Health and reflection are grpcio's own servicers here.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server.config import ServerConfig
from server.rpc import MAX_ANSWER_BYTES, Code, Dispatcher

#: grpc.StatusCode by our numbers
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


class GrpcioEngine:
    """grpcio's server, its worker pool and health servicer, bound but not yet started."""

    def __init__(self, config: ServerConfig, dispatcher: Dispatcher, service_name: str) -> None:
        self.executor = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc")
        self.server = grpc.server(
            self.executor,
            options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", MAX_ANSWER_BYTES)],
        )
        handlers = {
            m.name: grpc.unary_unary_rpc_method_handler(_behavior(dispatcher, m.path))
            for m in dispatcher.methods.values()
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
        self.server.add_registered_method_handlers(service_name, handlers)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        self.port = 0

    def bind(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Add the listening port (0 when grpcio could not bind it); the kernel's port for port 0."""
        try:
            if credentials is not None:
                self.port = self.server.add_secure_port(address, credentials)
            else:
                self.port = self.server.add_insecure_port(address)
        except RuntimeError:  # lost a race for the port since the caller's check
            self.port = 0
        return self.port

    def start(self) -> None:
        self.server.start()

    def set_health(self, service: str, status: int) -> None:
        self.health.set(service, status)

    def shutdown_health(self) -> None:
        self.health.enter_graceful_shutdown()

    def submit(self, task: Any) -> Any:
        return self.executor.submit(task)

    def stop(self, grace: float) -> None:
        self.server.stop(grace).wait(grace + 1)


def credentials(cert: bytes, key: bytes, client_ca: bytes | None) -> grpc.ServerCredentials:
    if client_ca is None:
        return grpc.ssl_server_credentials([(key, cert)])
    # Same semantics as the CA's cloud-config and the upstream example: a CA given => client cert required.
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=True)


def _behavior(dispatcher: Dispatcher, path: str) -> Any:
    call = dispatcher.call

    def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
        code, details, body = call(path, request, context)
        if code is not Code.OK:
            context.abort(_STATUS[code], details)
        return body

    return behavior
