"""Hostile and broken HTTP/1.1 clients for the probe/metrics port, on raw sockets.

Each opens its connections without waiting for the server (non-blocking connects, so a server with a
tiny listen backlog cannot make the flood itself take minutes), sends what the attack sends and keeps
the sockets until ``close``; ``closed_by_server`` says how many the server has closed since.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections.abc import Iterator

HALF_REQUEST_LINE = b"GET /heal"


class Flood:
    """``count`` connections to ``port`` that each send ``payload`` once connected, then nothing.

    They are opened ``batch`` at a time, ``pause`` seconds apart: a server that accepts slowly (a listen
    backlog of 5, a thread started per connection) then holds them all, as it would against a patient
    attacker, instead of leaving most of them in the kernel's queues.
    """

    def __init__(
        self,
        port: int,
        count: int,
        payload: bytes = HALF_REQUEST_LINE,
        budget: float = 20.0,
        batch: int = 5,
        pause: float = 0.005,
    ) -> None:
        self.sockets: list[socket.socket] = []
        self.connected = 0
        self._payload = payload
        self._pending = 0
        with selectors.DefaultSelector() as selector:
            for index in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                self.sockets.append(sock)
                if sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS):
                    selector.register(sock, selectors.EVENT_WRITE)
                    self._pending += 1
                if index % batch == batch - 1:
                    time.sleep(pause)
                    self._settle(selector, 0)
            end = time.monotonic() + budget
            while self._pending and time.monotonic() < end:
                self._settle(selector, 0.2)

    def _settle(self, selector: selectors.BaseSelector, timeout: float) -> None:
        for key, _ in selector.select(timeout=timeout):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            selector.unregister(sock)
            self._pending -= 1
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                self.connected += 1
                if self._payload:
                    with contextlib.suppress(OSError):
                        sock.send(self._payload)

    def closed_by_server(self) -> int:
        """How many of the connections the server has closed (EOF or reset) by now."""
        closed = 0
        for sock in self.sockets:
            try:
                if sock.recv(65536, socket.MSG_PEEK) == b"":
                    closed += 1
                    continue
                # An answer (a 408 or 503 before closing) also counts once the close follows it.
                while sock.recv(65536):
                    pass
                closed += 1
            except BlockingIOError:
                continue
            except OSError:
                closed += 1
        return closed

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def __enter__(self) -> Flood:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def flood(port: int, count: int, payload: bytes = HALF_REQUEST_LINE) -> Iterator[Flood]:
    with Flood(port, count, payload) as opened:
        yield opened


def exchange(port: int, request: bytes, timeout: float = 5.0, read_all: bool = True) -> bytes:
    """Send ``request`` on a new connection and return what comes back until the server closes it
    (``read_all``) or until the first answer's head has arrived."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(request)
        received = b""
        with contextlib.suppress(OSError):
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
                if not read_all and b"\r\n\r\n" in received:
                    break
        return received


def status_of(answer: bytes) -> int:
    """The status code of the first answer in ``answer`` (0 when there is none)."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and answer.startswith(b"HTTP/1.") and parts[1].isdigit() else 0


def head_of(answer: bytes) -> dict[str, str]:
    """The header fields of the first answer, lower-cased names."""
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head)}
