"""The probe/metrics port's HTTP/1.1 server: one asyncio loop on one thread, every resource a client can
hold bounded.

The port is plaintext and, in the sidecar layouts, reachable from the whole pod network, so anyone can
connect; kubelet's probes must still be answered within their one-second timeout. The standard
library's ``ThreadingHTTPServer`` this replaces kept one thread per connection for as long as the peer
kept it open (README, "Hand-written parts"). Here a connection is a small object on one loop, and:

* ``max_connections``: at the cap a new connection is admitted by closing the one that has waited
  longest on its peer (for its request, for its next request, or to take its answer). A flood thus
  costs a bounded number of sockets and never keeps a newcomer out: kubelet's probe connection is the
  newest, and its request arrives at once.
* ``request_timeout``: a request's line and headers must arrive within it, from the first byte (from the
  connection's accept for its first request), and an answer must be taken within it; trickling bytes
  does not reset it. A late request is answered 408 and closed.
* ``idle_timeout``: how long a keep-alive connection may wait for its next request.
* request line at most 8 KiB (414), header block at most 16 KiB and 100 fields (431), GET and HEAD only
  (405 with ``Allow``), no request body (413), at most 1,000 requests per connection.
* fairness: one request per connection and loop turn (pipelining cannot hold the loop), reading paused
  while a client leaves its answers unread or its buffer is full, and no path's answers computed more
  than a quarter of the time once a short burst is spent (``BoundedHttpServer.ask``; past it, answers up
  to a second old are given again), so floods of /metrics requests leave the probes their turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

log = logging.getLogger(__name__)

#: what a route answers: (status, body, content type)
Answer = tuple[int, bytes, str]
#: path (without the query) -> its answer; called on the server's loop, so it must not block
Route = Callable[[str], Answer]

TEXT = "text/plain; charset=utf-8"
ALLOWED_METHODS = ("GET", "HEAD")
SERVER_NAME = "ca-externalgrpc"
#: how long a connection refused for a bad request may keep sending before it is reset: enough for the
#: answer to reach the client, which a reset with unread bytes would destroy
LINGER_SECONDS = 1.0
DROP_LOG_INTERVAL = 60.0
#: computing one path's answers may take this share of the loop's time over a long run ...
ANSWER_SHARE = 0.25
#: ... and this many seconds at a stretch: a scraper is never slowed, a client that asks without pause is
ANSWER_BURST = 0.25
#: once the share is spent, how old an answer may be given again
ANSWER_REUSE = 1.0


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold on the port (the operator's keys are ``http.*`` in server/config.py)."""

    max_connections: int = 100
    request_timeout: float = 5.0
    idle_timeout: float = 30.0
    max_request_line: int = 8 * 1024
    max_header_bytes: int = 16 * 1024
    max_header_fields: int = 100
    max_requests_per_connection: int = 1000
    backlog: int = 1024


class _Refused(Exception):
    """A request answered with ``status`` and closed: malformed, over a limit, or not one we serve."""

    def __init__(self, status: HTTPStatus, body: str, allow: bool = False) -> None:
        super().__init__(body)
        self.status = status
        self.body = body
        self.allow = allow


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    keep_alive: bool


class BoundedHttpServer:
    """Serves ``route`` on ``host:port`` in a daemon thread; ``.port`` is the bound port (with port 0).

    The socket is bound here, so a busy or forbidden address raises ``OSError`` in the caller.
    """

    def __init__(self, host: str, port: int, route: Route, limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self.route = route
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=self.limits.backlog)
        self.host = host
        self.port = int(self._socket.getsockname()[1])
        self.loop = asyncio.new_event_loop()
        self._connections: dict[_Connection, None] = {}  # admission order
        self._drops: dict[str, int] = {}
        self._waiting: dict[str, list[_Connection]] = {}  # path -> connections waiting for its answer
        self._compute_budget: dict[str, tuple[float, float]] = {}  # path -> (seconds of credit, as of)
        self._last_answer: dict[str, tuple[Answer, float]] = {}  # path -> (answer, loop time it was started)
        self._drops_logged_at = time.monotonic() - DROP_LOG_INTERVAL  # the first drop is logged at once
        self._listening: asyncio.AbstractServer | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="http-probes", daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._listening = self.loop.run_until_complete(
                self.loop.create_server(lambda: _Connection(self), sock=self._socket, backlog=self.limits.backlog)
            )
        finally:
            started.set()
        self.loop.run_forever()
        assert self._listening is not None
        self._listening.close()
        for connection in list(self._connections):
            connection.abort()
        self.loop.run_until_complete(self._listening.wait_closed())
        self.loop.close()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop has just closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    @property
    def connections(self) -> int:
        return len(self._connections)

    def ask(self, path: str, connection: _Connection) -> None:
        """Answer ``connection``'s request for ``path`` now, or with the others that wait for it.

        Computing a path's answers may take a quarter of the loop's time: a token bucket of compute time,
        ANSWER_SHARE of the time passed, at most ANSWER_BURST saved up. Within it, every answer is computed
        after its request arrived (the requests of one loop turn share one). Once a client that asks for
        /metrics without pause, or a crowd of them, has spent it, they get the last answer while it is
        at most ANSWER_REUSE old, or wait for the next: the probes keep their turn.
        """
        now = self.loop.time()
        credit = self._credit(path, now)
        last = self._last_answer.get(path)
        if path not in self._waiting and credit <= 0 and last is not None and now - last[1] <= ANSWER_REUSE:
            connection.deliver(last[0])
            return
        waiting = self._waiting.setdefault(path, [])
        waiting.append(connection)
        if len(waiting) == 1:
            self.loop.call_later(0.0 if credit > 0 else -credit / ANSWER_SHARE, self._answer, path)

    def _credit(self, path: str, now: float) -> float:
        """Seconds of computing ``path`` may take now (negative: it took more than its share lately)."""
        credit, since = self._compute_budget.get(path, (ANSWER_BURST, now))
        return min(ANSWER_BURST, credit + (now - since) * ANSWER_SHARE)

    def _answer(self, path: str) -> None:
        waiting = self._waiting.pop(path, [])
        started = self.loop.time()
        credit = self._credit(path, started)
        try:
            answer = self.route(path)
        except Exception:
            log.exception("the probe/metrics port failed to answer %s", path)
            answer = 500, b"internal error\n", TEXT
        finished = self.loop.time()
        self._compute_budget[path] = (credit - (finished - started), finished)
        self._last_answer[path] = (answer, started)
        for connection in waiting:
            connection.deliver(answer)

    # ---------------------------------------------------------------- called on the loop

    def admit(self, connection: _Connection) -> None:
        if len(self._connections) >= self.limits.max_connections:
            oldest = min(self._connections, key=lambda c: c.waiting_since)
            oldest.drop("max_connections")
        self._connections[connection] = None

    def forget(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)

    def count_drop(self, reason: str) -> None:
        """At most one warning a minute, so that a flood does not become a flood of log lines."""
        self._drops[reason] = self._drops.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._drops_logged_at >= DROP_LOG_INTERVAL:
            counts = ", ".join(f"{n} at http.{why}" for why, n in sorted(self._drops.items()))
            log.warning(
                "probe/metrics port: closed connections that held it (%s) in the last %.0fs",
                counts,
                now - self._drops_logged_at,
            )
            self._drops.clear()
            self._drops_logged_at = now


class _Connection(asyncio.Protocol):
    """One client connection: a buffer, one timer, and where it is in its exchange."""

    def __init__(self, server: BoundedHttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.served = 0
        self.waiting_since = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None
        self.idle = False  # between two requests of a keep-alive connection, nothing of the next yet
        self.write_blocked = False  # the client does not take its answers
        self.reading_paused = False
        self.scheduled = False  # _serve_next is queued on the loop
        self.peer_done = False  # the client has half-closed: answer what it sent, then close
        self.asked: _Request | None = None  # a request whose answer the server is computing
        self.closing = False

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.admit(self)
        self._wait(self.limits.request_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # lingering after a refusal: what the client still sends is dropped
        if self.idle:
            self.idle = False
            self._wait(self.limits.request_timeout)
        self.buffer += data
        self._flow()
        self._schedule()

    def eof_received(self) -> bool:
        if self.closing:
            return False  # close now
        self.peer_done = True  # keep the connection half-open until the requests sent are answered
        self._schedule()
        return True

    def pause_writing(self) -> None:
        # The client does not take its answers (a pipelined flood): read nothing more until it does.
        self.write_blocked = True
        self._flow()
        self._wait(self.limits.request_timeout)

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self.closing:
            return
        self._flow()
        self._next_request()
        self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        self.server.forget(self)

    # ---------------------------------------------------------------- the exchange

    def _wait(self, seconds: float) -> None:
        """Start waiting on the peer: the one timer, and the age the connection limit compares."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(seconds, self._timed_out)
        self.waiting_since = self.loop.time()

    def _timed_out(self) -> None:
        self.timer = None
        if self.closing:
            self.abort()
        elif self.idle and not self.write_blocked:
            self.drop(None)  # a keep-alive connection that asked nothing more: the normal end
        elif self.write_blocked or not self.buffer:
            self.drop("request_timeout")  # silent since accept, or not taking its answers: nothing to answer
        else:
            self.server.count_drop("request_timeout")
            self._refuse(_Refused(HTTPStatus.REQUEST_TIMEOUT, "the request did not arrive in time"))

    def _next_request(self) -> None:
        if self.buffer:
            self.idle = False
            self._wait(self.limits.request_timeout)
        else:
            self.idle = True
            self._wait(self.limits.idle_timeout)

    def _flow(self) -> None:
        """Read while the buffer is small and the client takes its answers; pause reading otherwise."""
        pause = self.write_blocked or len(self.buffer) > self.limits.max_request_line + self.limits.max_header_bytes
        if pause != self.reading_paused and self.transport is not None and not self.closing:
            self.reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _schedule(self) -> None:
        """One request per connection and loop turn: a pipelining client cannot hold the loop."""
        if not self.scheduled and not self.closing and not self.write_blocked and self.asked is None:
            self.scheduled = True
            self.loop.call_soon(self._serve_next)

    def _serve_next(self) -> None:
        self.scheduled = False
        if self.closing or self.write_blocked or self.asked is not None:
            return
        try:
            request = self._parse()
        except _Refused as refused:
            self._refuse(refused)
            return
        if request is None:
            if self.peer_done:
                self._close()
            return
        self.asked = request
        if self.timer is not None:  # the server's own wait is bounded: no timeout while it computes
            self.timer.cancel()
            self.timer = None
        self.server.ask(request.path, self)

    def deliver(self, answer: Answer) -> None:
        """The answer to the request asked: write it, then go on with the next one."""
        request, self.asked = self.asked, None
        if self.closing or request is None:
            return
        self.served += 1
        keep_alive = request.keep_alive and self.served < self.limits.max_requests_per_connection
        status, body, content_type = answer
        log.debug("http %s %s %d", request.method, request.path, status)
        self._write(status, body, content_type, keep_alive, head_only=request.method == "HEAD")
        if not keep_alive:
            self._close()
            return
        self._flow()
        if self.write_blocked:
            return  # pause_writing has armed the timer: the client must take this answer first
        self._next_request()
        if self.buffer or self.peer_done:
            self._schedule()

    def _close(self) -> None:
        """Close once the answers written are flushed; request_timeout still bounds that."""
        self.closing = True
        assert self.transport is not None
        self.transport.close()
        self._wait(self.limits.request_timeout)

    def _refuse(self, refused: _Refused) -> None:
        """Answer ``refused`` and close; keep reading (and dropping) for a moment so that the client's
        unread bytes do not reset the connection before it reads the answer."""
        log.debug("http refused: %d %s", refused.status, refused.body)
        extra = {"Allow": ", ".join(ALLOWED_METHODS)} if refused.allow else {}
        self._write(refused.status, refused.body.encode() + b"\n", TEXT, False, extra=extra)
        self.closing = True
        self.buffer.clear()
        assert self.transport is not None
        if self.reading_paused:  # read again, to drop what the client still sends
            self.reading_paused = False
            self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._wait(LINGER_SECONDS)

    def _write(
        self,
        status: int,
        body: bytes,
        content_type: str,
        keep_alive: bool,
        head_only: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Server: {SERVER_NAME}",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in (extra or {}).items()),
            "Connection: keep-alive" if keep_alive else "Connection: close",
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        assert self.transport is not None
        self.transport.write(head if head_only else head + body)

    def drop(self, reason: str | None) -> None:
        """Close at once, without an answer; ``reason``, the limit it held the port past, is counted."""
        if reason is not None:
            self.server.count_drop(reason)
        self.server.forget(self)
        self.abort()

    def abort(self) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- parsing

    def _parse(self) -> _Request | None:
        """The next complete request head in the buffer, removed from it; None while it is incomplete."""
        buffer = self.buffer
        while buffer[:2] == b"\r\n" or buffer[:1] == b"\n":  # empty lines before a request are allowed
            del buffer[: 2 if buffer[:1] == b"\r" else 1]
        limits = self.limits
        line_end = buffer.find(b"\n", 0, limits.max_request_line + 1)
        if line_end < 0:
            if len(buffer) > limits.max_request_line:
                raise _Refused(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {limits.max_request_line} bytes")
            return None
        head_end = _end_of_head(buffer, line_end, limits.max_header_bytes)
        if head_end < 0:
            if len(buffer) - line_end > limits.max_header_bytes:
                raise _Refused(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"header fields over {limits.max_header_bytes} bytes"
                )
            return None
        head = bytes(buffer[:head_end]).decode("latin-1")
        del buffer[:head_end]
        request_line, *fields = head.rstrip("\r\n").split("\n")
        return self._request(request_line.rstrip("\r"), [f.rstrip("\r") for f in fields])

    def _request(self, request_line: str, fields: list[str]) -> _Request:
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"malformed request line {request_line[:100]!r}")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            if version.startswith("HTTP/"):
                raise _Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"{version[:20]} is not served: use HTTP/1.1")
            raise _Refused(HTTPStatus.BAD_REQUEST, f"malformed request line {request_line[:100]!r}")
        if len(fields) > self.limits.max_header_fields:
            raise _Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {self.limits.max_header_fields} header fields"
            )
        headers: dict[str, str] = {}
        for field in fields:
            name, colon, value = field.partition(":")
            if not colon or not name or name != name.strip() or field[:1] in (" ", "\t"):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"malformed header field {field[:100]!r}")
            key = name.lower()
            value = value.strip()
            if key == "content-length" and key in headers and headers[key] != value:
                raise _Refused(HTTPStatus.BAD_REQUEST, "conflicting Content-Length fields")
            headers[key] = f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise _Refused(HTTPStatus.BAD_REQUEST, f"Content-Length {length[:30]!r} is not a number")
        has_body = int(length) > 0 or "transfer-encoding" in headers
        if method not in ALLOWED_METHODS:
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, f"{method[:20]} is not served: use GET", allow=True)
        if has_body:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "this server takes no request body")
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
        return _Request(method, target.split("?", 1)[0], keep_alive)


def _end_of_head(buffer: bytearray, line_end: int, max_header_bytes: int) -> int:
    """The index just past the empty line that ends the head starting at the request line, or -1."""
    stop = line_end + max_header_bytes + 4
    crlf, lf = buffer.find(b"\n\r\n", line_end, stop), buffer.find(b"\n\n", line_end, stop)
    ends = [index + size for index, size in ((crlf, 3), (lf, 2)) if index >= 0]
    return min(ends) if ends else -1
