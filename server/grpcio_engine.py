"""The pure-Python serving engine (``serving.engine: grpcio``): grpcio owns the CA-facing socket.

Imported only when this engine is chosen: with the native engine the process never loads grpcio.
Every CloudProvider method is registered as a raw-bytes handler that runs ``Dispatcher.call``
(server/rpc.py), the same code path the native engine calls, so decoding, error mapping, metrics and
logs do not depend on the engine. Health and reflection are grpcio's own servicers here.

Sending connections away (``drop_connections``, ``follow``, ``lead``): grpcio closes connections only by
stopping a server, so a second server takes the port first (both listen with SO_REUSEPORT) and the first is
*retired*. grpc core fails every call that reaches a server it is stopping, and a client calling back to
back sends its next call before it has read the GOAWAY: stopped at a random moment, a server failed 0.2 to
0.4 such calls per swap (CANCELLED, or a reset fresh connection). So a retired server is stopped while it
answers a call (``_Retiring``): its GOAWAY is written before that call's answer, and a client that waits
for the answer before its next call (the CA's loop) reads it first and calls on a new connection. A
retired server that gets no call is stopped after ``RETIRE_WAIT``: its clients are idle then. And from the
swap on, new connections all go to the new server (``steer_to_the_newest``), so none is queued on the old
one's socket when grpc core closes it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
import threading
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server.config import ServerConfig, ServingConfig
from server.http_server import ipv4_only_guard
from server.rpc import MAX_ANSWER_BYTES, Code, Dispatcher

log = logging.getLogger(__name__)

#: grpc.StatusCode by our numbers
_STATUS = {code.value[0]: code for code in grpc.StatusCode}
#: a retired server that answers no call in this long is stopped anyway: its clients are idle (a client
#: calling back to back calls again within milliseconds), so a GOAWAY comes at most this much later
RETIRE_WAIT = 0.1


class _Retiring:
    """One server's retirement: stopped (GOAWAY to its connections, their calls get the grace) by the first
    call it answers after ``retire``, or ``RETIRE_WAIT`` later, whichever comes first; once."""

    def __init__(self) -> None:
        self.server: grpc.Server | None = None
        self._lock = threading.Lock()
        self._grace: float | None = None  # set: retired
        self._stopped = False
        self._timer: threading.Timer | None = None

    def retire(self, grace: float) -> None:
        with self._lock:
            if self._grace is not None or self._stopped:
                return
            self._grace = grace
            self._timer = threading.Timer(RETIRE_WAIT, self.stop_now)
            self._timer.daemon = True
            self._timer.start()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def answering(self) -> None:
        """A call of this server is being answered: stop it now if it is retired (the call gets the grace)."""
        if self._grace is not None:
            self.stop_now()

    def stop_now(self, grace: float | None = None) -> threading.Event | None:
        """Stop it (with ``grace`` instead of the retirement's, e.g. the engine's own stop); None if done."""
        with self._lock:
            if self._stopped or self.server is None:
                return None
            self._stopped = True
            timer, self._timer = self._timer, None
            grace = grace if grace is not None else (self._grace or 0.0)
        if timer is not None:
            timer.cancel()
        return self.server.stop(grace)


class GrpcioEngine:
    """grpcio's server, its worker pool and health servicer, bound but not yet started."""

    def __init__(self, config: ServerConfig, dispatcher: Dispatcher, service_name: str) -> None:
        self.executor = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc")
        self._serving = config.serving
        self.options = channel_options(config.serving)
        self._dispatcher = dispatcher
        self._services = sorted({m.service for m in dispatcher.methods.values()})  # CloudProvider, Diagnostics
        self._retiring: dict[grpc.Server, _Retiring] = {}  # every server made, until it is stopped
        self.service_name = service_name
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.server = self._new_server(self.options)
        self._server_options = self.options  # what self.server was built with
        self.port = 0
        self._address = ""
        self._credentials: grpc.ServerCredentials | None = None
        self._swap = threading.Lock()
        self._ipv4_only: socket.socket | None = None  # on 0.0.0.0: keeps grpc core off IPv6 while serving
        self._stopping = False  # under _swap: once stop() began, no server is started
        # Under _swap: following (leader election) since follow(), until lead(); the timer that moves the
        # port to a server whose connections live the follower's age; whether that server serves now.
        self._following = False
        self._follow_timer: threading.Timer | None = None
        self._follower_server = False

    def _new_server(self, options: list[tuple[str, int]]) -> grpc.Server:
        """A server with the same handlers, health servicer and pool; its calls tell its ``_Retiring``."""
        retiring = _Retiring()
        server = grpc.server(self.executor, options=options)
        for service in self._services:
            handlers = {
                m.name: grpc.unary_unary_rpc_method_handler(_behavior(self._dispatcher, m.path, retiring))
                for m in self._dispatcher.methods.values()
                if m.service == service
            }
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
            server.add_registered_method_handlers(service, handlers)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (*self._services, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        retiring.server = server
        self._retiring = {s: r for s, r in self._retiring.items() if not r.stopped}
        self._retiring[server] = retiring
        return server

    def _retire(self, server: grpc.Server, grace: float) -> None:
        """Stop ``server``, which no longer holds the port alone, at its next call (see the module doc)."""
        self._retiring[server].retire(grace)

    def bind(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Add the listening port (0 when grpcio could not bind it); the kernel's port for port 0.

        On ``0.0.0.0`` a guard socket keeps grpc core off IPv6 (``ipv4_only_guard``), as on the other ports.
        """
        host, port = address.rsplit(":", 1)
        self._ipv4_only = ipv4_only_guard(host, int(port))
        if self._ipv4_only is not None:
            address = f"{host}:{self._ipv4_only.getsockname()[1]}"
        self.port = self._add_port(self.server, address, credentials)
        if self.port:
            self._address = f"{address.rsplit(':', 1)[0]}:{self.port}"
            self._credentials = credentials
        return self.port

    @staticmethod
    def _add_port(server: grpc.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
        try:
            if credentials is not None:
                return int(server.add_secure_port(address, credentials))
            return int(server.add_insecure_port(address))
        except RuntimeError:  # lost a race for the port since the caller's check
            return 0

    def start(self) -> None:
        self.server.start()

    def set_health(self, service: str, status: int) -> None:
        self.health.set(service, status)

    def shutdown_health(self) -> None:
        self.health.enter_graceful_shutdown()

    def submit(self, task: Any) -> Any:
        return self.executor.submit(task)

    def drop_connections(self, grace: float) -> None:
        """GOAWAY to every client connection while the port keeps listening: clients reconnect.

        grpcio closes connections only by stopping a server, so a second server with the same handlers,
        health servicer and pool starts on the same port first (both listen with SO_REUSEPORT), then the
        first is retired (module doc): GOAWAY, open calls get ``grace`` seconds, and new connections
        reach the second.
        """
        with self._swap:
            if self._stopping:
                return  # stop() drains every connection itself
            old = self._replace_locked(self._server_options)
        self._retire(old, grace)

    def _replace_locked(self, options: list[tuple[str, int]]) -> grpc.Server:
        """Under _swap: a new server with ``options`` takes the port; the old one, returned, still has its
        connections (the caller retires it). A server retired before and not stopped yet is stopped first:
        two servers at most share the port, which is what ``steer_to_the_newest`` relies on."""
        for retired in [r for server, r in self._retiring.items() if server is not self.server]:
            retired.stop_now()
        old = self.server
        new = self._new_server(options)
        if self._ipv4_only is not None:
            # The guard again, after the listening socket: a socket without SO_REUSEPORT bound last makes the
            # kernel check the next bind in full, so the new server's try at [::] meets the guard and falls
            # back to IPv4 (checked against the first server's socket alone, it would take [::] dual-stack).
            self._ipv4_only.close()
            self._ipv4_only = ipv4_only_guard(self._address.rsplit(":", 1)[0], self.port)
        if self._add_port(new, self._address, self._credentials) != self.port:
            raise OSError(f"cannot listen on {self._address} again to send the connections away")
        new.start()
        steer_to_the_newest(self.port)
        self.server = new
        self._server_options = options
        return old

    def follow(self, age: float, late_age: float, grace: float) -> None:
        """This replica does not lead: every connection, open or to come, goes away ``age`` seconds from
        now, or about ``late_age`` after it opened when it comes later (its calls get ``grace``).

        After ``age`` a server whose connections live ``late_age`` (grpc core's ``max_connection_age``, with
        its +/-10 % jitter) takes the port, and the server that held it stops: GOAWAY to what it had,
        connections opened meanwhile included. ``lead()`` before that keeps every connection."""
        with self._swap:
            if self._stopping or self._following:
                return
            self._following = True
            timer = threading.Timer(age, self._serve_as_follower, args=(late_age, grace))
            timer.daemon = True
            self._follow_timer = timer
        timer.start()

    def _serve_as_follower(self, late_age: float, grace: float) -> None:
        with self._swap:
            if self._stopping or not self._following or self._follower_server:
                return
            old = self._replace_locked(channel_options(self._serving, connection_age=(late_age, grace)))
            self._follower_server = True
            self._follow_timer = None
        self._retire(old, grace)

    def lead(self) -> None:
        """This replica leads: connections live ``serving.max_connection_age`` again. Those opened while it
        followed (on the follower's server, if it took the port) get GOAWAY now, their calls the grace."""
        with self._swap:
            if self._stopping or not self._following:
                return
            self._following = False
            timer, self._follow_timer = self._follow_timer, None
            if timer is not None:
                timer.cancel()
            if not self._follower_server:
                return
            self._follower_server = False
            old = self._replace_locked(self.options)
        self._retire(old, self._serving.max_connection_age_grace)

    def stop(self, grace: float) -> None:
        with self._swap:
            self._stopping = True
            timer, self._follow_timer = self._follow_timer, None
            servers = list(self._retiring.values())
        if timer is not None:
            timer.cancel()
        # The serving one and any retired one not stopped yet, all together.
        stopping = [event for r in servers if (event := r.stop_now(grace)) is not None]
        for event in stopping:
            event.wait(grace + 1)
        if self._ipv4_only is not None:
            self._ipv4_only.close()


#: Linux's setsockopt option that gives a SO_REUSEPORT group a classic BPF program choosing its listener
SO_ATTACH_REUSEPORT_CBPF = 51
#: classic BPF "return the constant k" (BPF_RET | BPF_K)
_BPF_RET_K = 0x06


def steer_to_the_newest(port: int) -> None:
    """Send every new connection to ``port`` to the listening socket opened last (the new server's).

    Both servers listen with SO_REUSEPORT while the old one is retired, and the kernel would spread new
    connections over both: one queued on the old server's socket when grpc core closes it is reset (the
    client's call fails UNAVAILABLE). A classic BPF program attached to the group (``SO_ATTACH_REUSEPORT_CBPF``,
    Linux 4.5, no privilege needed) chooses its second socket, the one opened last; once the old socket is
    gone the index is out of range and the kernel picks among the rest as before, which is the new one.
    The program stays with the group for the next swap. The sockets are grpc core's: found among this
    process's file descriptors, listening on ``port``. Where that fails (another OS), the kernel spreads
    the connections as it did.
    """
    code = (ctypes.c_ubyte * 8).from_buffer_copy(struct.pack("=HBBI", _BPF_RET_K, 0, 0, 1))
    program = struct.pack("=HxxxxxxQ", 1, ctypes.addressof(code))  # struct sock_fprog {len; *filter}
    groups: dict[tuple[object, ...], int] = {}  # local address -> a descriptor of its group
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in descriptors:
        try:
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue  # not a socket (or closed meanwhile)
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and sock.getsockname()[1] == port:
                groups.setdefault((sock.family, sock.getsockname()), int(name))
        except OSError:
            pass
        finally:
            sock.detach()
    for fd in groups.values():
        sock = socket.socket(fileno=fd)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, program)
        except OSError as err:
            log.debug("cannot steer new connections to the new server: %s", err)
        finally:
            sock.detach()


def channel_options(serving: ServingConfig, connection_age: tuple[float, float] | None = None) -> list[tuple[str, int]]:
    """The limits of ``serving.*`` as grpcio's channel arguments (docs/reference/config.md says which apply);
    ``connection_age``: (age, grace) of a follower's connections instead of ``serving.max_connection_age``
    and its grace (the shorter one)."""

    def ms(seconds: float) -> int:
        return round(seconds * 1000)

    options = [
        # Both servers of drop_connections listen on the port for a moment; app._bind_problem still
        # refuses a port another process holds (its probe socket does not set SO_REUSEPORT).
        ("grpc.so_reuseport", 1),
        ("grpc.max_send_message_length", MAX_ANSWER_BYTES),
        ("grpc.max_concurrent_streams", serving.max_concurrent_streams),
        ("grpc.max_metadata_size", serving.max_header_list_size),
        ("grpc.absolute_max_metadata_size", serving.max_header_list_size),
        ("grpc.max_allowed_incoming_connections", serving.max_connections),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(serving.min_ping_interval)),
        ("grpc.http2.max_ping_strikes", 2),
        # Keep-alive pings go on without data and without calls, as the native front's do: a dead peer
        # is found on an idle connection or under a silent health Watch too.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.server_handshake_timeout_ms", ms(serving.handshake_timeout)),
    ]
    if serving.keepalive_time:
        options.append(("grpc.keepalive_time_ms", ms(serving.keepalive_time)))
        options.append(("grpc.keepalive_timeout_ms", ms(serving.keepalive_timeout)))
        # grpc core waits for a keep-alive ping's answer this long (1 minute by default), not the above.
        options.append(("grpc.http2.ping_timeout_ms", ms(serving.keepalive_timeout)))
    if serving.idle_timeout:
        options.append(("grpc.max_connection_idle_ms", ms(serving.idle_timeout)))
    age, grace = serving.max_connection_age, serving.max_connection_age_grace
    if connection_age is not None and (not age or connection_age[0] < age):
        age, grace = connection_age
    if age:
        # grpc core spreads it by +/-10 % (as grpc-go), then closes the connection after the grace.
        options.append(("grpc.max_connection_age_ms", ms(age)))
        options.append(("grpc.max_connection_age_grace_ms", ms(grace)))
    return options


def credentials(cert: bytes, key: bytes, client_ca: bytes | None) -> grpc.ServerCredentials:
    if client_ca is None:
        return grpc.ssl_server_credentials([(key, cert)])
    # Same semantics as the CA's cloud-config and the upstream example: a CA given => client cert required.
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=True)


def _behavior(dispatcher: Dispatcher, path: str, retiring: _Retiring) -> Any:
    call = dispatcher.call

    def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
        retiring.answering()
        code, details, body = call(path, request, context)
        if code is not Code.OK:
            context.abort(_STATUS[code], details)
        return body

    return behavior
