"""Process edge: build the gRPC server (TLS, health, reflection, metrics), run it, drain on SIGTERM."""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.backend import Backend
from providers.config_errors import ConfigError
from providers.registry import Registry
from server.clouds import cloud_type
from server.config import ServerConfig
from server.decoding import DecodingInterceptor
from server.group_overrides import UnmatchedOverrideCheck
from server.kube.integration import KubeFeatures, start_features
from server.kube.leader import Leadership
from server.metrics import GRPC_BUCKETS, Metrics
from server.native_front import NativeEngineMissing, NativeFront
from server.prewrapped import PrewrappingServer
from server.probes import HttpEndpoint, Liveness, serve_probes
from server.service import SERVICE_NAME, CloudProviderService, log_rpc_calls

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
        backend = Backend(bc.name, adapter, bc.sync, template_overrides=overrides)
        if bc.groups:
            backend.listeners.append(UnmatchedOverrideCheck(bc.groups))
        backends.append(backend)
    return backends


class ListenError(OSError):
    """A port the config names cannot be bound; ``setting`` is the config key that chose it."""

    def __init__(self, setting: str, address: str, purpose: str, reason: str) -> None:
        super().__init__(f"cannot listen on {address} for {purpose}: {reason}")
        self.setting = setting
        self.address = address


def _bind_problem(host: str, port: int) -> str | None:
    """Why binding ``host:port`` would fail, found with a throwaway socket before grpcio tries.

    grpcio only raises "Failed to bind" and writes the reason to stderr itself, so the reason is
    taken from the same bind done here (with SO_REUSEADDR, as grpcio binds).
    """
    if port == 0:
        return None
    try:
        candidates = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return f"{host!r} does not resolve to an address"
    problems = []
    for family, kind, proto, _name, sockaddr in candidates:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
                return None
            except OSError as err:
                problems.append(_bind_reason(err))
    return problems[0] if problems else None


def _bind_reason(err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return "the port is already in use by another process"
    if err.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's"
    if err.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return err.strerror or str(err)


def _read_pem(key: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError.single(
            key, f"cannot read {path}: {err.strerror or err}", "make the file readable by the server"
        ) from None


def _credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if tls is None:
        return None
    pair = (_read_pem("tls.key", tls.key), _read_pem("tls.cert", tls.cert))
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([pair])
    # Same semantics as the CA's cloud-config and the upstream example: a CA given => client cert required.
    client_ca = _read_pem("tls.client_ca", tls.client_ca)
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=True)


@dataclass
class RunningServer:
    config: ServerConfig
    grpc_server: grpc.Server
    registry: Registry
    service: CloudProviderService
    health: health.HealthServicer
    port: int
    liveness: Liveness
    metrics: Metrics
    http: HttpEndpoint | None = None
    kube: KubeFeatures | None = None
    leadership: Leadership | None = None  # with leader election on: this replica's role
    native: NativeFront | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return _join(self.config.listen[0], self.port)

    @property
    def http_address(self) -> str | None:
        """``host:port`` of the HTTP probes and /metrics (the bound port, also with port 0), if served."""
        if self.http is None or self.config.http_listen is None:
            return None
        return _join(self.config.http_listen[0], self.http.port)  # type: ignore[attr-defined]

    def draining(self) -> bool:
        """True from the start of ``stop()``: /readyz then fails so a Service stops routing here."""
        return self._stopped.is_set()

    def ready(self) -> tuple[bool, str]:
        """Whether every backend serves its groups (tests wait on this for the first sync).

        Not what /readyz answers: that fails only while draining (server/probes.py), so that one cloud's
        outage never takes the server out of its Service.
        """
        problems = []
        for backend in self.registry.backends:
            h = backend.health()
            if h.serving:
                continue
            if not h.synced:
                problems.append(f"{backend.name}: not synced yet ({h.last_error or 'first sync pending'})")
            else:
                problems.append(f"{backend.name}: snapshot {h.age:.0f}s old ({h.last_error})")
        return (not problems, "; ".join(problems) or "ready")

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
        if self.native is not None:
            # The front holds every client connection, forwarded calls included: drain it first.
            started = time.monotonic()
            self.native.stop(grace)
            grace = max(0.0, grace - (time.monotonic() - started))
        self.grpc_server.stop(grace).wait(grace + 1)
        self.registry.stop()
        if self.kube is not None:
            self.kube.stop()
        if self.http is not None:
            self.http.stop()
        log.info("server stopped")

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


def start(config: ServerConfig, backends: list[Backend] | None = None, start_backends: bool = True) -> RunningServer:
    register_secrets(config)
    registry = Registry(backends if backends is not None else build_backends(config))
    metrics = Metrics()
    executor = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc")
    # Outermost first: metrics see every answer, including INVALID_ARGUMENT for undecodable bytes.
    interceptors = [metrics.interceptor(), DecodingInterceptor()]
    options = {gid: g.options for bc in config.backends for gid, g in bc.groups.items() if g.options is not None}
    service = CloudProviderService(registry, options, on_scale_action=metrics.scale_action)
    server = grpc.server(
        executor, options=[("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 16 * 1024 * 1024)]
    )
    # The interceptors wrap each handler once, as the services register, not on every call.
    registering = PrewrappingServer(server, interceptors)
    pb_grpc.add_CloudProviderServicer_to_server(service, registering)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registering)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), registering)
    native = None
    if config.serving.engine == "native":
        native = _start_native(config)
        metrics.add_native_calls(native.native_calls)
        if server.add_insecure_port(native.grpc_address) == 0:
            native.stop(0)
            raise ListenError(
                "serving.engine",
                native.grpc_address,
                "the gRPC server behind the native front",
                "grpcio could not bind it",
            )
        bound = native.port
    else:
        bound = _bind_grpc(server, config.listen, _credentials(config))
    liveness = Liveness(executor)
    running = RunningServer(config, server, registry, service, health_servicer, bound, liveness, metrics)
    if config.kubernetes.leader_election.enabled:
        # Before the ports open: a replica is a follower (refuses mutating RPCs, unready) until elected.
        running.leadership = Leadership(config.kubernetes.leader_election)
        service.mutation_guard = running.leadership.check_mutation
    running.native = native
    if config.http_listen is not None:
        # Bound before the first sync, so a busy port fails at once and /readyz answers during the sync.
        try:
            running.http = serve_probes(*config.http_listen, running)
        except OSError as err:
            server.stop(None)
            if native is not None:
                native.stop(0)
            http_host, http_port = config.http_listen
            raise ListenError(
                "http_listen", _join(http_host, http_port), "the HTTP probes and /metrics", _bind_reason(err)
            ) from None
    for backend in registry.backends:
        backend.listeners.append(running.update_health)
        backend.listeners.append(liveness.sync_attempt_ended)
        backend.listeners.append(metrics.observe_backend)
        backend.adapter.instrument(metrics.for_backend(backend.name))
    metrics.watch_backends(registry.backends)
    for backend in registry.backends:
        running.update_health(backend)
    if native is not None:
        if log_rpc_calls():
            log.info("per-call debug logs are on: the native engine forwards every call to Python")
        else:
            native.feed_from(service)
            for backend in registry.backends:
                backend.listeners.append(native.on_sync)
                # The group debug strings name the template's source, learned ones included.
                backend.template_listeners.append(native.on_sync)
    # Listen before the first sync: meanwhile Refresh answers UNAVAILABLE saying the first sync is
    # pending, which the CA logs, instead of the CA (and the kubelet) meeting a closed port.
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    try:
        running.kube = start_features(
            config.kubernetes,
            registry,
            leadership=running.leadership,
            service=service,
            metrics=metrics,
            liveness=liveness,
            start_backends=start_backends,
        )
    except BaseException:
        running.stop(grace=0)
        raise
    # With leader election the backends start syncing when this replica leads (server/kube/leader.py).
    if start_backends and running.leadership is None:
        log.info("listening; first sync with the cloud", extra={"address": running.address})
        liveness.watch(registry.backends)
        try:
            registry.start()
        except BaseException:
            running.stop(grace=0)
            raise
    log.info(
        "serving",
        extra={
            "address": running.address,
            "http_address": running.http_address,
            "tls": config.tls is not None,
            "mtls": bool(config.tls and config.tls.client_ca),
            "engine": config.serving.engine,
            "backends": [b.name for b in registry.backends],
        },
    )
    return running


def _start_native(config: ServerConfig) -> NativeFront:
    """Bind the CA-facing port with the native front (same TLS rules as ``_credentials``)."""
    host, port = config.listen
    tls = None
    if config.tls is not None:
        client_ca = _read_pem("tls.client_ca", config.tls.client_ca) if config.tls.client_ca is not None else None
        tls = (_read_pem("tls.cert", config.tls.cert), _read_pem("tls.key", config.tls.key), client_ca)
    problem = _bind_problem(host, port)
    if problem is None:
        try:
            return NativeFront(host, port, GRPC_BUCKETS, tls)
        except NativeEngineMissing as err:
            raise ConfigError.single(
                "serving.engine", str(err), "run make install, or set serving.engine: grpcio"
            ) from None
        except ValueError as err:  # the extension's word on the PEM files
            raise ConfigError.single("tls", str(err), "give PEM files the server can use") from None
        except OSError as err:
            problem = _bind_reason(err)
    raise ListenError("listen", _join(host, port), "gRPC", problem)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_grpc(server: grpc.Server, listen: tuple[str, int], creds: grpc.ServerCredentials | None) -> int:
    """Bind the gRPC port; the bound port (the one chosen by the kernel for port 0)."""
    host, port = listen
    bind = _join(host, port)
    problem = _bind_problem(host, port)
    if problem is None:
        try:
            bound = server.add_secure_port(bind, creds) if creds is not None else server.add_insecure_port(bind)
        except RuntimeError:  # lost a race for the port since the check
            bound = 0
        if bound == 0:
            problem = _bind_problem(host, port) or "grpcio could not bind it"
    if problem is not None:
        raise ListenError("listen", bind, "gRPC", problem)
    return bound


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
