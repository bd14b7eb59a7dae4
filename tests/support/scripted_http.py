"""A tiny scripted HTTP server on 127.0.0.1 for the HTTP client tests: every answer byte is the test's.

``answer(*items)`` queues the answers for any request, in order (the last one repeats). ``route(method,
path_pattern, *items)`` queues answers for the requests whose method and path (query string excluded)
match the regular expression; a routed request never takes from the default queue. A server that runs
in the background (sync timers) therefore gets the same answer for the same call whatever the order of
its requests. ``seen`` records every request.

It is the one place a test serves an exact answer: a body that is not JSON, a status with no body and
no ``Content-Type``, a header only one recorded answer carries. The simulators model the clouds; this
server replays what a test says the cloud answered.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scripted:
    """One scripted answer of the test server."""

    status: int = 200
    body: Any = None  # dict/list => JSON; bytes => raw
    headers: dict[str, str] = field(default_factory=dict)
    # Sent with a non-empty body unless ``headers`` name one; None: never sent.
    content_type: str | None = "application/json"
    delay: float = 0.0
    drop: bool = False
    body_delay: float = 0.0  # the headers and half the body go out at once, the rest after this


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedServer:
    """Answers requests with the queued ``Scripted`` items in order; the last one of each queue repeats."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.script: list[Scripted] = [Scripted(body={"ok": True})]
        self.routes: list[tuple[str, re.Pattern[str], list[Scripted]]] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with outer._lock:
                    outer.seen.append(
                        Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    item = outer._next(self.command, self.path.split("?", 1)[0])
                if item.delay:
                    time.sleep(item.delay)
                if item.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                raw = (
                    item.body
                    if isinstance(item.body, bytes)
                    else b""
                    if item.body is None
                    else json.dumps(item.body).encode()
                )
                self.send_response(item.status)
                named = {name.lower() for name in item.headers}
                if raw and item.content_type is not None and "content-type" not in named:
                    self.send_header("Content-Type", item.content_type)
                self.send_header("Content-Length", str(len(raw)))
                for name, value in item.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if item.body_delay:
                    self.wfile.write(raw[: len(raw) // 2])
                    self.wfile.flush()
                    time.sleep(item.body_delay)
                    raw = raw[len(raw) // 2 :]
                # A stalled body's client gives up (read timeout): what the test wants, not a traceback.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(raw)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def _next(self, method: str, path: str) -> Scripted:
        """The answer for one request (called with the lock held)."""
        queue = next(
            (items for wanted, pattern, items in self.routes if wanted == method and pattern.fullmatch(path)),
            self.script,
        )
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def answer(self, *items: Scripted) -> None:
        with self._lock:
            self.script = list(items)

    def route(self, method: str, path_pattern: str, *items: Scripted) -> None:
        """Queue ``items`` for ``method`` requests whose path matches ``path_pattern`` (replacing its queue)."""
        with self._lock:
            self.routes = [r for r in self.routes if (r[0], r[1].pattern) != (method.upper(), path_pattern)]
            self.routes.append((method.upper(), re.compile(path_pattern), list(items)))

    def requests(self, method: str, path_pattern: str) -> list[Seen]:
        pattern = re.compile(path_pattern)
        with self._lock:
            return [s for s in self.seen if s.method == method.upper() and pattern.fullmatch(s.path.split("?")[0])]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
