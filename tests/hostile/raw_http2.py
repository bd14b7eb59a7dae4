"""A raw HTTP/2 gRPC client (the ``h2`` package) that can misbehave on purpose: half-sent requests,
bodies that never end, floods of pings and resets, headers no gRPC library would send.

It speaks to the server over one socket, on the test's thread, and records per stream when the answer
came and with which ``grpc-status``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def grpc_frame(message: bytes, compressed: bool = False, length: int | None = None) -> bytes:
    """``message`` with its 5-byte prefix; ``length`` announces another size (a body that never ends)."""
    return struct.pack(">BI", int(compressed), len(message) if length is None else length) + message


def split_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


@dataclass
class Answer:
    """What one stream got back."""

    opened: float
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    ended_at: float | None = None
    reset: int | None = None

    @property
    def status(self) -> int | None:
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return int(value) if value is not None else None

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    @property
    def seconds(self) -> float | None:
        """From opening the stream to its end (answer or reset)."""
        return None if self.ended_at is None else self.ended_at - self.opened


class RawGrpc:
    """One HTTP/2 connection to a gRPC server; ``pump`` reads what the server sent."""

    def __init__(self, address: str, tls: ssl.SSLContext | None = None, timeout: float = 5.0) -> None:
        host, port = split_address(address)
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.answers: dict[int, Answer] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def start(self, path: str, timeout: str | None = None, extra: list[tuple[str, str]] | None = None) -> int:
        """Open a gRPC call on ``path`` (headers only, the body stays open)."""
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if timeout is not None:
            headers.append(("grpc-timeout", timeout))
        headers += extra or []
        self.conn.send_headers(stream_id, headers)
        self.answers[stream_id] = Answer(opened=time.monotonic())
        self.flush()
        return stream_id

    def send(self, stream_id: int, data: bytes, end: bool = False) -> int:
        """Send as much of ``data`` as flow control allows now; how many bytes went."""
        window = min(self.conn.local_flow_control_window(stream_id), len(data))
        sent = 0
        frame = self.conn.max_outbound_frame_size
        while sent < window:
            chunk = data[sent : min(window, sent + frame)]
            self.conn.send_data(stream_id, chunk)
            sent += len(chunk)
        if end and sent == len(data):
            self.conn.end_stream(stream_id)
        self.flush()
        return sent

    def call(self, path: str, message: bytes, timeout: str | None = "5S", end: bool = True) -> int:
        stream_id = self.start(path, timeout)
        self.send(stream_id, grpc_frame(message), end=end)
        return stream_id

    def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id)
        self.flush()

    def ping(self, payload: bytes = b"12345678") -> None:
        self.conn.ping(payload)
        self.flush()

    def pump(self, seconds: float) -> None:
        """Read and handle what the server sends for up to ``seconds`` (less once it closed)."""
        until = time.monotonic() + seconds
        while not self.closed:
            left = until - time.monotonic()
            if left <= 0:
                return
            readable, _, _ = select.select([self.sock], [], [], min(left, 0.05))
            if not readable and not (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()):
                continue
            try:
                data = self.sock.recv(65536)
            except (ConnectionError, ssl.SSLError, OSError):
                data = b""
            if not data:
                self.closed = True
                return
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True
                return
            self._handle(events)
            self.flush()

    def _handle(self, events: list[h2.events.Event]) -> None:
        now = time.monotonic()
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            answer = self.answers.get(stream_id) if stream_id else None
            if isinstance(event, h2.events.ResponseReceived) and answer:
                answer.headers = dict(event.headers)
            elif isinstance(event, h2.events.TrailersReceived) and answer:
                answer.trailers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                if answer:
                    answer.data += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and answer:
                answer.ended_at = now
            elif isinstance(event, h2.events.StreamReset) and answer:
                answer.reset = event.error_code
                answer.ended_at = answer.ended_at or now
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event

    def wait(self, stream_ids: list[int], seconds: float) -> None:
        """Pump until every stream of ``stream_ids`` ended, or ``seconds`` passed."""
        until = time.monotonic() + seconds
        while time.monotonic() < until and not self.closed:
            if all(self.answers[s].ended_at is not None for s in stream_ids):
                return
            self.pump(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.closed = True


def open_silent(address: str, send: bytes = b"") -> socket.socket:
    """A TCP connection that sends ``send`` (nothing, half a preface...) and then nothing."""
    sock = socket.create_connection(split_address(address), timeout=5)
    if send:
        sock.sendall(send)
    sock.setblocking(False)
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed this socket (EOF or reset, TLS or not), whatever it sent before."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    except OSError:
        return True
