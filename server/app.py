"""Process edge: start the serving engine (TLS, health, reflection, metrics) and the backends, drain on SIGTERM."""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from protos import diagnostics_pb2
from providers.backend import Backend
from providers.config_errors import ConfigError
from providers.node_labels import GroupLabels
from providers.registry import Registry
from server.clouds import cloud_type
from server.config import ServerConfig
from server.diagnosis import DiagnosticsService
from server.group_overrides import UnmatchedOverrideCheck
from server.http_server import BoundedHttpServer, bindable_host
from server.kube.integration import KubeFeatures, start_features
from server.kube.leader import Leadership
from server.metrics import Metrics
from server.native_front import INSTALL_NATIVE, NativeEngineMissing, NativeFront, load_extension
from server.probes import Liveness, serve_probes
from server.rpc import Dispatcher, reflection_data, service_methods
from server.service import SERVICE, SERVICE_NAME, CloudProviderService, log_rpc_calls

if TYPE_CHECKING:
    from server.grpcio_engine import GrpcioEngine

log = logging.getLogger(__name__)

BACKEND_HEALTH_PREFIX = "ca-externalgrpc.backend."
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION_SERVICE = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
DIAGNOSTICS_SERVICE = diagnostics_pb2.DESCRIPTOR.services_by_name["Diagnostics"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Engine(Protocol):
    """What the server needs of a serving engine (server/grpcio_engine.py, server/native_front.py)."""

    @property
    def port(self) -> int: ...

    def start(self) -> None: ...

    def set_health(self, service: str, status: int) -> None: ...

    def shutdown_health(self) -> None: ...

    def submit(self, task: Callable[[], object]) -> object: ...

    def drop_connections(self, grace: float) -> None:
        """GOAWAY to every client connection, open calls get ``grace`` seconds, the port keeps listening:
        clients reconnect (through the Service, to the replica that leads now)."""
        ...

    def follow(self, age: float, late_age: float, grace: float) -> None:
        """This replica does not lead: every connection, open or to come, goes away (GOAWAY, its calls get
        ``grace``) ``age`` seconds from now, or about ``late_age`` after it opened when it comes later."""
        ...

    def lead(self) -> None:
        """This replica leads: connections live ``serving.max_connection_age`` again."""
        ...

    def stop(self, grace: float) -> None: ...


def register_secrets(config: ServerConfig) -> None:
    """Mask every configured credential in all later log output (server/logs.py)."""
    from server.logs import register_secret

    for bc in config.backends:
        for secret in getattr(bc.cloud, "secrets", ()):
            register_secret(secret)


def build_backends(config: ServerConfig) -> list[Backend]:
    backends = []
    # One rule for the labels a real node teaches about its group, here and in learned templates.
    group_labels = GroupLabels.with_extra(config.kubernetes.learned_templates.labels)
    for bc in config.backends:
        adapter = cloud_type(bc.type).build_adapter(bc.cloud)
        overrides = {gid: g.template for gid, g in bc.groups.items() if g.template is not None}
        backend = Backend(
            bc.name,
            adapter,
            bc.sync,
            template_overrides=overrides,
            group_labels=group_labels,
            diagnose=bc.advisor.diagnose,
        )
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


def _tls_files(config: ServerConfig) -> tuple[bytes, bytes, bytes | None] | None:
    """(cert, key, client CA) as read from the configured PEM files; None without TLS."""
    tls = config.tls
    if tls is None:
        return None
    client_ca = _read_pem("tls.client_ca", tls.client_ca) if tls.client_ca is not None else None
    return _read_pem("tls.cert", tls.cert), _read_pem("tls.key", tls.key), client_ca


@dataclass
class RunningServer:
    config: ServerConfig
    engine: Engine  # grpcio's server or the native front: owns the CA-facing port
    registry: Registry
    service: CloudProviderService
    dispatcher: Dispatcher  # every call Python answers, whichever engine received it
    port: int
    liveness: Liveness
    metrics: Metrics
    http: BoundedHttpServer | None = None
    kube: KubeFeatures | None = None
    leadership: Leadership | None = None  # with leader election on: this replica's role
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return _join(self.config.listen[0], self.port)

    @property
    def http_address(self) -> str | None:
        """``host:port`` of the HTTP probes and /metrics (the bound port, also with port 0), if served."""
        if self.http is None or self.config.http_listen is None:
            return None
        return _join(self.config.http_listen[0], self.http.port)

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
        self.engine.set_health(BACKEND_HEALTH_PREFIX + backend.name, NOT_SERVING if h.stale else SERVING)

    def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, stop accepting, let in-flight calls finish (bounded), stop syncing."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.engine.shutdown_health()
        self.engine.stop(self.config.shutdown_grace if grace is None else grace)
        self.registry.stop()
        if self.kube is not None:
            self.kube.stop()
        if self.http is not None:
            self.http.stop()
        log.info("server stopped")


#: seconds a connection that reaches a replica after it stopped leading (and its follower_connection_age
#: passed) stays: enough for a call a client sent directly (grpcurl) to be answered
FOLLOWER_LATE_AGE = 1.0


class FollowerConnections:
    """With leader election, the CA follows the leader: while this replica does not serve as the leader,
    every gRPC connection it holds or accepts goes elsewhere (docs/explanation/kubernetes.md, "The CA follows the
    leader").

    /readyz fails first, at once (``Leadership.readiness``), so the Service stops sending clients here;
    ``leader_election.follower_connection_age`` later every connection is sent away (GOAWAY, its calls
    get ``serving.max_connection_age_grace``): by then the kubelet has seen the replica unready and the
    endpoints dropped it, so the client's reconnection through the Service reaches the leader (or finds
    no endpoint until a new leader is Ready, never this replica). A connection that arrives later, while
    it still follows (a client that comes directly, or a Service late to see it unready), goes once it
    has been open ``FOLLOWER_LATE_AGE``. From the moment it serves as the leader again, connections live
    ``serving.max_connection_age``.
    """

    def __init__(self, engine: Engine, leadership: Leadership, age: float, grace: float) -> None:
        self._engine = engine
        self._leadership = leadership
        self._age = age
        self._grace = grace
        self._lock = threading.Lock()  # one engine change at a time, in the order the role changed
        self._following: bool | None = None

    def update(self) -> None:
        """Follow or lead as the role is now: at start, at each step-down and when a new term serves."""
        with self._lock:
            following = not self._leadership.serving()
            if following == self._following:
                return
            first = self._following is None
            self._following = following
            if following:
                self._engine.follow(self._age, FOLLOWER_LATE_AGE, self._grace)
            else:
                self._engine.lead()
        if following and not first:
            log.info(
                "not the leader: every gRPC connection is sent elsewhere after follower_connection_age "
                "(readiness failed already), and any that arrives later after a moment, while this replica "
                "does not lead",
                extra={"follower_connection_age": self._age, "grace": self._grace},
            )
        elif not following:
            log.info("the leader: gRPC connections stay", extra={"identity": self._leadership.identity})


#: file descriptors the process needs besides its client connections (cloud and Kubernetes API
#: connections, log and config files, the runtime's own)
FD_RESERVE = 256


def ensure_file_descriptors(max_connections: int, http_connections: int = 0) -> None:
    """Raise the soft limit on open files to what ``serving.max_connections`` and ``http.max_connections``
    need, as Go's runtime raises it to the hard limit; a hard limit below that is a configuration the
    process cannot honour."""
    needed = max_connections + http_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError.single(
            "serving.max_connections",
            f"{max_connections} gRPC and {http_connections} probe/metrics connections need about {needed} open "
            f"files, but this process may open {hard} (its hard RLIMIT_NOFILE)",
            f"lower serving.max_connections to at most {max(hard - http_connections - FD_RESERVE, 1)} (or "
            "http.max_connections), or raise the container's open-files limit",
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))


def start(
    config: ServerConfig,
    backends: list[Backend] | None = None,
    start_backends: bool = True,
    metrics: Metrics | None = None,
) -> RunningServer:
    """Start serving ``config``; ``metrics`` (a fresh ``Metrics()`` by default) receives every series."""
    register_secrets(config)
    ensure_file_descriptors(config.serving.max_connections, config.http.max_connections)
    registry = Registry(backends if backends is not None else build_backends(config))
    metrics = metrics if metrics is not None else Metrics()
    options = {gid: g.options for bc in config.backends for gid, g in bc.groups.items() if g.options is not None}
    service = CloudProviderService(registry, options, on_scale_action=metrics.scale_action)
    diagnostics = DiagnosticsService(registry.backends)
    dispatcher = Dispatcher(
        service_methods(SERVICE, service, metrics.rpc_observer)
        + service_methods(DIAGNOSTICS_SERVICE, diagnostics, metrics.rpc_observer)
    )
    engine: Engine
    engine_name = choose_engine(config.serving.engine)
    if engine_name == "native":
        native = _start_native(config, dispatcher, metrics.grpc_buckets)
        metrics.add_native_calls(native.native_calls)
        engine = native
    else:
        engine = _start_grpcio(config, dispatcher)
    liveness = Liveness(engine)
    running = RunningServer(config, engine, registry, service, dispatcher, engine.port, liveness, metrics)
    if config.kubernetes.leader_election.enabled:
        # Before the ports open: a replica is a follower (refuses mutating RPCs, unready) until elected.
        election = config.kubernetes.leader_election
        running.leadership = Leadership(election)
        service.leader_guard = running.leadership.check_serving
        # A Service keeps established connections on a pod that turned unready: a replica that does not
        # lead sends the CA's connections away, so the CA reconnects through the Service to the leader.
        steering = FollowerConnections(
            engine, running.leadership, election.follower_connection_age, config.serving.max_connection_age_grace
        )
        steering.update()  # a follower until elected
        running.leadership.on_stopped_leading.append(steering.update)
        running.leadership.on_serving.append(steering.update)
    if config.http_listen is not None:
        # Bound before the first sync, so a busy port fails at once and /readyz answers during the sync.
        try:
            http_host, http_port = config.http_listen
            running.http = serve_probes(bindable_host(http_host, "http_listen"), http_port, running)
        except OSError as err:
            engine.stop(0)
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
    if isinstance(engine, NativeFront):
        native = engine
        if log_rpc_calls():
            log.info("per-call debug logs are on: the native engine hands every call to Python")
        else:
            native.feed_from(service)
            for backend in registry.backends:
                backend.listeners.append(native.on_sync)
                # The group debug strings name the template's source, learned ones included.
                backend.template_listeners.append(native.on_sync)
    # Listen before the first sync: meanwhile Refresh answers UNAVAILABLE saying the first sync is
    # pending, which the CA logs, instead of the CA (and the kubelet) meeting a closed port.
    engine.start()
    engine.set_health("", SERVING)
    engine.set_health(SERVICE_NAME, SERVING)
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
            "engine": engine_name,
            "backends": [b.name for b in registry.backends],
        },
    )
    return running


def choose_engine(setting: str) -> str:
    """The engine ``serving.engine`` asks for; for ``auto``, native when its extension loads, else grpcio.

    A plain ``pip install`` of the server has no native engine (it is a wheel of its own, the
    ``[native]`` extra): it serves on grpcio rather than refusing to start, and says so in one line.
    """
    if setting != "auto":
        return setting
    try:
        load_extension()
    except NativeEngineMissing as err:
        log.warning(
            "serving on the grpcio engine (serving.engine: auto): %s; for about 3x faster calls and less memory, %s",
            err,
            INSTALL_NATIVE,
            extra={"engine": "grpcio"},
        )
        return "grpcio"
    return "native"


def _start_native(config: ServerConfig, dispatcher: Dispatcher, buckets: Sequence[float]) -> NativeFront:
    """Bind the CA-facing port with the native front (TLS as on the grpcio engine)."""
    host, port = config.listen
    host = bindable_host(host, "listen")
    tls = _tls_files(config)
    services = (SERVICE, DIAGNOSTICS_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE)
    problem = _bind_problem(host, port)
    if problem is None:
        try:
            return NativeFront(
                host,
                port,
                buckets,
                dispatcher,
                reflection_data(services),
                tls,
                python_threads=config.max_workers,
                serving=config.serving,
            )
        except NativeEngineMissing as err:
            fix = f"{INSTALL_NATIVE}; or set serving.engine: auto, which serves on grpcio without it"
            raise ConfigError.single("serving.engine", str(err), fix) from None
        except ValueError as err:  # the extension's word on the PEM files
            raise ConfigError.single("tls", str(err), "give PEM files the server can use") from None
        except OSError as err:
            problem = _bind_reason(err)
    raise ListenError("listen", _join(host, port), "gRPC", problem)


def _start_grpcio(config: ServerConfig, dispatcher: Dispatcher) -> GrpcioEngine:
    """grpcio's server with every service, bound to the CA-facing port (the kernel's port for port 0)."""
    from server import grpcio_engine  # only this engine loads grpcio

    tls = _tls_files(config)
    engine = grpcio_engine.GrpcioEngine(config, dispatcher, SERVICE_NAME)
    host, port = config.listen
    host = bindable_host(host, "listen")
    bind = _join(host, port)
    problem = _bind_problem(host, port)
    if problem is None:
        credentials = grpcio_engine.credentials(*tls) if tls is not None else None
        if engine.bind(bind, credentials) == 0:
            problem = _bind_problem(host, port) or "grpcio could not bind it"
    if problem is not None:
        raise ListenError("listen", bind, "gRPC", problem)
    return engine


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run_until_signalled(running: RunningServer) -> None:
    """Block until SIGTERM/SIGINT, then drain."""
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received; draining", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Python runs a signal's handler in the main thread, the next time that thread runs bytecode. The
    # kernel may hand SIGTERM to any thread that does not block it, the native front's among them, and
    # then nothing interrupts a main thread blocked in a plain wait(): it would sleep through SIGTERM
    # (seen on a loaded machine, until the kubelet's SIGKILL). Python's own low-level handler, on
    # whichever thread it runs, writes the signal's number to the wakeup fd; the main thread blocks
    # reading it, so it wakes for the signal at once and runs the handler, and never wakes otherwise
    # (an idle server spends no CPU).
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    try:
        while not done.is_set():
            os.read(wake_read, 64)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_read)
        os.close(wake_write)
    running.stop()
