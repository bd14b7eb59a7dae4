"""A TCP relay on loopback between a client and a simulated cloud that can break the network path.

Faults a cloud simulator cannot show from inside its HTTP server, because they happen before HTTP:

- ``hang``: the port accepts connections and never answers (a firewall that drops replies, a stuck
  load balancer): the client waits for its own timeout;
- ``refuse``: nothing listens (the connection is refused at once);
- ``forward``: bytes go through both ways.

A change of mode closes the connections relayed so far, as an outage does; the client's next request
opens a new one, which meets the new mode. The port stays the same throughout (``refuse`` closes the
listening socket, ``forward`` and ``hang`` bind the same port again).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

Mode = Literal["forward", "hang", "refuse"]
_CHUNK = 65536


class TcpFaults:
    def __init__(self, upstream_host: str, upstream_port: int, mode: Mode = "forward") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode: Mode = "refuse"
        self.port = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self.set(mode)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: Mode) -> None:
        with self._lock:
            if mode == self.mode:
                return
            self.mode = mode
            for conn in list(self._open):
                _close(conn)
            self._open.clear()
            if mode == "refuse":
                if self._listener is not None:
                    _close(self._listener)
                    self._listener = None
            elif self._listener is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", self.port))
                listener.listen(64)
                self.port = listener.getsockname()[1]
                self._listener = listener
                threading.Thread(target=self._accept, args=(listener,), name="tcp-faults", daemon=True).start()

    def stop(self) -> None:
        self.set("refuse")

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed by set("refuse") or stop()
            with self._lock:
                mode = self.mode
                self._open.add(conn)
            if mode == "forward":
                threading.Thread(target=self._forward, args=(conn,), daemon=True).start()
            else:
                threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        """Read what the client sends and never answer, until either side closes."""
        with contextlib.suppress(OSError):
            while conn.recv(_CHUNK):
                pass
        self._forget(conn)

    def _forward(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self._forget(conn)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
        _pipe(conn, upstream)
        self._forget(conn)
        self._forget(upstream)

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.discard(conn)
        _close(conn)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()
