"""Process edge: build the gRPC server (TLS, health, reflection, metrics), run it, drain on SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.backend import Backend
from providers.registry import Registry
from server.clouds import cloud_type
from server.config import ServerConfig
from server.decoding import DecodingInterceptor
from server.service import SERVICE_NAME, CloudProviderService

log = logging.getLogger(__name__)

BACKEND_HEALTH_PREFIX = "ca-externalgrpc.backend."


def register_secrets(config: ServerConfig) -> None:
    """Mask every configured credential in all later log output (server/logs.py)."""
    from server.logs import register_secret

    for bc in config.backends:
        for secret in getattr(bc.cloud, "secrets", ()):
            register_secret(secret)


def build_backends(config: ServerConfig) -> list[Backend]:
    backends = []
    for bc in config.backends:
        adapter = cloud_type(bc.type).build_adapter(bc.cloud)
        overrides = {gid: g.template for gid, g in bc.groups.items() if g.template is not None}
        backends.append(Backend(bc.name, adapter, bc.sync, template_overrides=overrides))
    return backends


def _credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if tls is None:
        return None
    pair = (tls.key.read_bytes(), tls.cert.read_bytes())
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([pair])
    # Same semantics as the CA's cloud-config and the upstream example: a CA given => client cert required.
    return grpc.ssl_server_credentials([pair], root_certificates=tls.client_ca.read_bytes(), require_client_auth=True)


@dataclass
class RunningServer:
    config: ServerConfig
    grpc_server: grpc.Server
    registry: Registry
    service: CloudProviderService
    health: health.HealthServicer
    port: int
    http: object | None = None
    metrics: object | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        host = self.config.listen[0]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def ready(self) -> tuple[bool, str]:
        """Ready while at least one backend serves its groups (the isolation rule: one cloud's outage must
        not take the whole server out of its Service); the body names every backend that does not."""
        problems = []
        serving = 0
        for backend in self.registry.backends:
            h = backend.health()
            if h.serving:
                serving += 1
            elif not h.synced:
                problems.append(f"{backend.name}: not synced yet ({h.last_error or 'first sync pending'})")
            else:
                problems.append(f"{backend.name}: snapshot {h.age:.0f}s old ({h.last_error})")
        if not problems:
            return True, "ready"
        if serving:
            return True, "ready, degraded: " + "; ".join(problems)
        return False, "; ".join(problems)

    def update_health(self, backend: Backend) -> None:
        h = backend.health()
        status = health_pb2.HealthCheckResponse.NOT_SERVING if h.stale else health_pb2.HealthCheckResponse.SERVING
        self.health.set(BACKEND_HEALTH_PREFIX + backend.name, status)

    def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, stop accepting, let in-flight calls finish (bounded), stop syncing."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        grace = self.config.shutdown_grace if grace is None else grace
        self.grpc_server.stop(grace).wait(grace + 1)
        self.registry.stop()
        if self.http is not None:
            self.http.stop()  # type: ignore[attr-defined]
        log.info("server stopped")

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


def start(config: ServerConfig, backends: list[Backend] | None = None, start_backends: bool = True) -> RunningServer:
    register_secrets(config)
    registry = Registry(backends if backends is not None else build_backends(config))
    metrics = _metrics()
    # Outermost first: metrics see every answer, including INVALID_ARGUMENT for undecodable bytes.
    interceptors = ([metrics.interceptor()] if metrics is not None else []) + [DecodingInterceptor()]
    options = {gid: g.options for bc in config.backends for gid, g in bc.groups.items() if g.options is not None}
    service = CloudProviderService(
        registry, options, on_scale_action=metrics.scale_action if metrics is not None else None
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc"),
        interceptors=interceptors,
        options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 16 * 1024 * 1024)],
    )
    pb_grpc.add_CloudProviderServicer_to_server(service, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    host, port = config.listen
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    creds = _credentials(config)
    bound = server.add_secure_port(bind, creds) if creds is not None else server.add_insecure_port(bind)
    if bound == 0:
        raise OSError(f"cannot listen on {bind} (address in use or not local)")
    running = RunningServer(config, server, registry, service, health_servicer, bound, metrics=metrics)
    for backend in registry.backends:
        backend.listeners.append(running.update_health)
        if metrics is not None:
            backend.listeners.append(metrics.observe_backend)
            backend.adapter.instrument(metrics)
    if start_backends:
        registry.start()
    for backend in registry.backends:
        running.update_health(backend)
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    if config.http_listen is not None:
        running.http = _serve_http(config, running)
    log.info(
        "serving",
        extra={
            "address": running.address,
            "tls": config.tls is not None,
            "mtls": bool(config.tls and config.tls.client_ca),
            "backends": [b.name for b in registry.backends],
        },
    )
    return running


def _metrics():  # type: ignore[no-untyped-def]
    try:
        from server.metrics import ServerMetrics
    except ImportError:
        return None
    return ServerMetrics()


def _serve_http(config: ServerConfig, running: RunningServer):  # type: ignore[no-untyped-def]
    from server.probes import serve_probes

    host, port = config.http_listen  # type: ignore[misc]
    return serve_probes(host, port, running)


def run_until_signalled(running: RunningServer) -> None:
    """Block until SIGTERM/SIGINT, then drain."""
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; draining", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    running.stop()
