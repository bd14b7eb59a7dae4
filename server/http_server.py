"""The probe/metrics port's HTTP/1.1 server: h11 parses, this module decides; one asyncio loop on one
thread, and everything a client can hold is bounded.

The port is plaintext and, in the sidecar layouts, reachable from the whole pod network, so anyone can
connect; kubelet's probes must still be answered within their one-second timeout. h11 (a sans-IO HTTP/1.1
implementation) reads request heads and writes answers, so the protocol's rules (request-line grammar,
``Host`` required once, ``Content-Length`` digits and conflicts, ``Transfer-Encoding``, keep-alive and
``Connection: close``, HTTP/1.0) are the library's; what stays here is the policy (README, "Hand-written
parts"):

* **Only fixed state.** The routes are given at construction (``/healthz``, ``/readyz``, ``/metrics``);
  any other target is answered 404 from a constant, so no path, header, method or query a client sends
  leaves anything behind once its connection is gone.
* ``max_connections``: at the cap a newcomer is admitted by closing the connection with the least claim
  to stay (``claim``), and among equals the one that has waited longest on its peer (for its request,
  for its next request, or to take its answer). Claims, lowest first: (0) nothing of a request, or a
  request line older than a second, or answers left unread; (1) a complete request line in the last
  second (``RECENT_REQUEST``), its headers still to come, or a new connection in its first 50 ms
  (``NEW_CONNECTION``: time for its request to arrive); (2) a complete request head, whose answer is
  owed (computed now, or in this loop turn). A new connection ranks with a request line, not below it:
  kubelet's probe is a new connection until its bytes arrive, and in a flood of request lines, the
  newest of its rank, it is the last to be closed (ranked below, it was closed at 1,000 a second on a
  loaded machine); the price is that a burst of silent connections accepted within 50 ms can close a
  client still sending its headers. A connection owed its answer is never closed for room;
  when every connection at the cap is owed one, the newcomer is closed instead. What a connection sent
  is looked at (peeked) as soon as it is accepted and again before it is closed for room, so kubelet's
  probe, which sends its whole request with the connection, is owed its answer before its bytes are
  read, and neither a flood of silent connections nor one of bare request lines pushes it out. (When a
  request line counted like a whole request for its second, 250 such connections a second made most
  probes fail: docs/evidence/review-defects.md.) Choosing whom to close is one pass over the
  connections with no allocation: it runs for every newcomer of a flood at the cap.
* ``request_timeout``: a request's line and headers must arrive within it, from the first byte (from
  the accept for the first request), and an answer must be taken within it; trickling bytes does not
  reset it. A late request is answered 408 and closed. ``idle_timeout``: how long a keep-alive
  connection may wait for its next request.
* request line at most 8 KiB (414), header block at most 16 KiB and 100 fields (431), GET and HEAD only
  (405 with ``Allow``), no request body (413), HTTP/1.0 and 1.1 only (505), at most 1,000 requests per
  connection. Whatever h11 refuses is answered with the status it names (400 mostly) and closed.
* fairness: one request per connection and loop turn (pipelining cannot hold the loop), reading paused
  while a client leaves its answers unread or its buffer is full, and no route's answers computed more
  than a quarter of the time once a short burst is spent (``BoundedHttpServer.ask``; past it, answers up
  to a second old are given again), so floods of /metrics requests leave the probes their turn.
* log lines about refused requests and closed connections: at most one a minute, with counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

import h11

log = logging.getLogger(__name__)

#: what a route answers: (status, body, content type)
Answer = tuple[int, bytes, str]
#: computes a route's answer; called on the server's loop, so it must not block
Route = Callable[[], Answer]

TEXT = "text/plain; charset=utf-8"
ALLOWED_METHODS = ("GET", "HEAD")
SERVER_NAME = "ca-externalgrpc"
NOT_FOUND: Answer = (404, b"not found: try /metrics, /healthz, /readyz\n", TEXT)
#: how long a connection refused for a bad request may keep sending before it is reset: enough for the
#: answer to reach the client, which a reset with unread bytes would destroy
LINGER_SECONDS = 1.0
#: at most one warning line this often about refused requests and closed connections
REFUSAL_LOG_INTERVAL = 60.0
#: a connection that sent a complete request line this recently ranks above one that sent nothing
RECENT_REQUEST = 1.0
#: a new connection ranks as one that sent its request line for this long: the time a client needs to
#: send its request once connected (a round trip and its own scheduling), after which only what it sent
#: counts; a probe whose request has not arrived yet when the next newcomer comes is not closed for it
NEW_CONNECTION = 0.05
#: computing one route's answers may take this share of the loop's time over a long run ...
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


# How strongly a connection keeps its place at the connection cap (see the module doc), lowest first.
#: nothing of a request yet, a request line older than RECENT_REQUEST, or answers left unread
NO_CLAIM = 0
#: a complete request line in the last RECENT_REQUEST, its headers still to come; or a new connection
REQUEST_LINE = 1
#: a complete request head: its answer is owed; never closed for room
OWED = 2


class _Refused(Exception):
    """A request answered with ``status`` and closed: malformed, over a limit, or not one we serve."""

    def __init__(self, status: int, body: str, allow: bool = False) -> None:
        super().__init__(body)
        self.status = status
        self.body = body
        self.allow = allow


@dataclass(frozen=True)
class _Request:
    method: str
    route: str | None  # a key of the server's routes, or None: answered NOT_FOUND


@dataclass
class _RouteState:
    """A route's share of the loop: seconds of credit (as of ``since``), its last answer, who waits."""

    compute: Route
    credit: float = ANSWER_BURST
    since: float = 0.0
    last: tuple[Answer, float] | None = None  # (answer, loop time its computing started)
    waiting: list[_Connection] = field(default_factory=list)


def ipv6_available() -> bool:
    """Whether this machine can open an IPv6 socket at all (no: a kernel booted with ``ipv6.disable=1``)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return False
    return True


def bindable_host(host: str, setting: str) -> str:
    """The host to bind for ``host``: ``::`` (every address) becomes ``0.0.0.0`` where the machine has no
    IPv6, said once in a warning naming the setting, so ``[::]`` is safe to ship for IPv4-only, dual-stack
    and IPv6-first clusters alike. Any other host is returned as it is."""
    if host.strip("[]") not in ("", "::") or ipv6_available():
        return host
    log.warning(
        "%s: this machine has no IPv6; listening on every IPv4 address (0.0.0.0) instead of [::]",
        setting,
        extra={"setting": setting},
    )
    return "0.0.0.0"


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port``: ``::`` (or an empty host) is every IPv6 *and* IPv4 address,
    ``0.0.0.0`` every IPv4 one, anything else that address alone. ``OSError`` when it cannot bind."""
    host = host.strip("[]")
    if host in ("", "::"):
        return socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


def ipv4_only_guard(host: str, port: int) -> socket.socket | None:
    """For the grpcio engine on ``0.0.0.0``: a socket that keeps grpc core off IPv6, else None.

    grpc core reads any wildcard, ``0.0.0.0`` included, as "both families": it first binds ``[::]``
    dual-stack and falls back to ``0.0.0.0`` only when that fails. This socket, bound IPv6-only to
    ``[::]:port`` and never listening, makes that first bind fail, so grpc core listens on IPv4 alone
    as the operator wrote. Keep it open while the port is served; with ``port`` 0 its port is the one to
    give grpcio. None on other hosts, or where the machine has no IPv6 (nothing to keep off).
    """
    if host.strip("[]") != "0.0.0.0" or not socket.has_ipv6:
        return None
    guard = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        guard.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        guard.bind(("::", port))
    except OSError:
        guard.close()
        return None
    return guard


class BoundedHttpServer:
    """Serves ``routes`` on ``host:port`` in a daemon thread; ``.port`` is the bound port (with port 0).

    The socket is bound here, so a busy or forbidden address raises ``OSError`` in the caller.
    """

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self._socket = listening_socket(host, port, self.limits.backlog)
        self.host = host
        self.port = int(self._socket.getsockname()[1])
        self.loop = asyncio.new_event_loop()
        self._routes = {path: _RouteState(compute) for path, compute in routes.items()}
        self._connections: dict[_Connection, None] = {}  # admission order
        self._refusals: dict[str, int] = {}  # what was refused or closed (a fixed set of words) -> count
        self._refusals_logged_at = time.monotonic() - REFUSAL_LOG_INTERVAL  # the first is logged at once
        self._date = (0, "")  # (second, Date header value) shared by the answers of one second
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

    # ---------------------------------------------------------------- called on the loop

    def route_of(self, target: bytes) -> str | None:
        """The route a request target names (origin or absolute form, query ignored), or None."""
        text = target.decode("ascii", "replace")
        if not text.startswith("/"):
            split = urllib.parse.urlsplit(text)
            if split.scheme.lower() not in ("http", "https") or not split.netloc:
                return None
            text = split.path or "/"
        path = text.split("?", 1)[0]
        return path if path in self._routes else None

    def ask(self, route: str | None, connection: _Connection) -> None:
        """Answer ``connection``'s request for ``route`` now, or with the others that wait for it.

        Computing a route's answers may take a quarter of the loop's time: a token bucket of compute
        time, ANSWER_SHARE of the time passed, at most ANSWER_BURST saved up. Within it, every answer is
        computed after its request arrived (the requests of one loop turn share one). Once a client that
        asks for /metrics without pause, or a crowd of them, has spent it, they get the last answer while
        it is at most ANSWER_REUSE old, or wait for the next: the probes keep their turn.
        """
        if route is None:
            connection.deliver(NOT_FOUND)
            return
        state = self._routes[route]
        now = self.loop.time()
        credit = _credit(state, now)
        if not state.waiting and credit <= 0 and state.last is not None and now - state.last[1] <= ANSWER_REUSE:
            connection.deliver(state.last[0])
            return
        state.waiting.append(connection)
        if len(state.waiting) == 1:
            self.loop.call_later(0.0 if credit > 0 else -credit / ANSWER_SHARE, self._answer, route)

    def _answer(self, route: str) -> None:
        state = self._routes[route]
        waiting, state.waiting = state.waiting, []
        started = self.loop.time()
        credit = _credit(state, started)
        try:
            answer = state.compute()
        except Exception:
            log.exception("the probe/metrics port failed to answer %s", route)
            answer = 500, b"internal error\n", TEXT
        finished = self.loop.time()
        state.credit, state.since = credit - (finished - started), finished
        state.last = (answer, started)
        for connection in waiting:
            connection.deliver(answer)

    def admit(self, connection: _Connection) -> bool:
        """Take ``connection`` in, making room at the cap (see the module doc); False: it was closed."""
        if len(self._connections) >= self.limits.max_connections:
            now = self.loop.time()
            passed: set[_Connection] = set()
            while (candidate := self._least_claim(now, passed)) is not None:
                # What it sent since it was last looked at may have made its answer owed (a probe whose
                # request arrived after its accept, not read yet): look again before closing it.
                candidate.peek_request_head()
                if candidate.claim(now) < OWED:
                    candidate.drop("max_connections")
                    break
                passed.add(candidate)
            else:
                self.count("max_connections")
                return False
        self._connections[connection] = None
        return True

    def _least_claim(self, now: float, passed: set[_Connection]) -> _Connection | None:
        """The connection with the least claim, the longest waiting among equals; None if every one is owed
        its answer. One pass with no allocation: it runs for every newcomer of a flood at the cap."""
        best: _Connection | None = None
        best_claim, best_since = OWED, math.inf
        for connection in self._connections:
            claim = connection.claim(now)
            if claim == OWED or connection in passed:
                continue
            if claim < best_claim or (claim == best_claim and connection.waiting_since < best_since):
                best, best_claim, best_since = connection, claim, connection.waiting_since
        return best

    def forget(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)

    def count(self, what: str) -> None:
        """Count a refused request or a closed connection; at most one warning a minute says how many."""
        self._refusals[what] = self._refusals.get(what, 0) + 1
        now = time.monotonic()
        if now - self._refusals_logged_at >= REFUSAL_LOG_INTERVAL:
            counts = ", ".join(f"{n} {why}" for why, n in sorted(self._refusals.items()))
            log.warning(
                "probe/metrics port: refused requests and closed connections in the last %.0fs: %s",
                now - self._refusals_logged_at,
                counts,
            )
            self._refusals.clear()
            self._refusals_logged_at = now

    def date(self) -> str:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True))
        return self._date[1]


def _credit(state: _RouteState, now: float) -> float:
    """Seconds of computing the route may take now (negative: it took more than its share lately)."""
    return min(ANSWER_BURST, state.credit + (now - state.since) * ANSWER_SHARE)


def _empty_line_after_a_line(data: bytes) -> bool:
    """Whether ``data``, bytes of a request head from its first, holds its end (a line, then an empty one)."""
    return b"\n\r\n" in data or b"\n\n" in data


class _Connection(asyncio.Protocol):
    """One client connection: an h11 state machine, a buffer of bytes not yet given to it, one timer."""

    def __init__(self, server: BoundedHttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        # h11 is given at most one chunk at a time (see _next_event), so its own buffer stays small
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_head())
        self.buffer = bytearray()  # received, not yet given to h11
        self.head_bytes = 0  # bytes of the current request head given to h11 so far
        self.line_checked = False  # the current head's request line is known to be within its limit
        self.line_at: float | None = None  # when the current head's request line was complete
        self.begun = False  # a byte of the current request head (other than empty lines before it) arrived
        self.head_done = False  # the current head is complete: its answer is owed (OWED)
        self.tail = b""  # the last bytes of the current head received, to find its end across reads
        self.peeked = 0  # bytes looked at in the socket (peek_request_head) and not received yet
        self.served = 0
        self.accepted_at = self.waiting_since = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None
        self.idle = False  # between two requests of a keep-alive connection, nothing of the next yet
        self.write_blocked = False  # the client does not take its answers
        self.reading_paused = False
        self.scheduled = False  # _serve_next is queued on the loop
        self.peer_done = False  # the client has half-closed: answer what it sent, then close
        self.asked: _Request | None = None  # a request whose answer the server is computing
        self.closing = False

    def _max_head(self) -> int:
        return self.limits.max_request_line + self.limits.max_header_bytes

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peek_request_head()
        if not self.server.admit(self):
            self.abort()
            return
        self._wait(self.limits.request_timeout)

    def peek_request_head(self) -> None:
        """Look at what the client sent and the loop has not read yet (on accept, and before the
        connection is closed for room): a request sent with the connection (kubelet's probe) gives it its
        claim before its bytes are read (the rest of the accepted backlog is admitted first)."""
        transport_socket = self.transport.get_extra_info("socket") if self.transport is not None else None
        if transport_socket is None or self.closing or self.head_done or self.asked is not None:
            return
        # asyncio's socket wrapper has no recv: a socket object on the same descriptor, detached after
        peek = socket.socket(fileno=transport_socket.fileno())
        try:
            ahead = peek.recv(self._max_head(), socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            return
        finally:
            peek.detach()
        if len(ahead) > self.peeked:
            self._look_at_head(ahead[self.peeked :])
            self.peeked = len(ahead)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # lingering after a refusal: what the client still sends is dropped
        if self.idle:
            self.idle = False
            self._wait(self.limits.request_timeout)
        unseen = data[self.peeked :]  # the first bytes were looked at when accepted
        self.peeked = max(self.peeked - len(data), 0)
        if unseen and not self.head_done and self.asked is None:
            self._look_at_head(unseen)
        self.buffer += data
        self._flow()
        self._schedule()

    def _look_at_head(self, data: bytes) -> None:
        """Follow the current request head through ``data``: its request line, then its end."""
        if not self.begun:
            data = data.lstrip(b"\r\n")  # the empty lines a client may send before a request count for nothing
            self.begun = bool(data)
        if self.line_at is None and b"\n" in data:
            self.line_at = self.loop.time()
        window = self.tail + data
        self.head_done = self.line_at is not None and _empty_line_after_a_line(window)
        self.tail = window[-2:]

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

    def claim(self, now: float) -> int:
        """How strongly it keeps its place at the connection cap (see the module doc): NO_CLAIM,
        REQUEST_LINE or OWED."""
        if self.asked is not None:
            return OWED
        if self.closing or self.write_blocked:
            return NO_CLAIM
        if self.head_done:
            return OWED
        if self.line_at is not None and now - self.line_at < RECENT_REQUEST:
            return REQUEST_LINE
        if not self.served and not self.begun and now - self.accepted_at < NEW_CONNECTION:
            return REQUEST_LINE
        return NO_CLAIM

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
        elif self.write_blocked or not (self.buffer or self.head_bytes):
            self.drop("request_timeout")  # silent since accept, or not taking its answers: nothing to answer
        else:
            self._refuse(_Refused(HTTPStatus.REQUEST_TIMEOUT, "the request did not arrive in time"))

    def _next_request(self) -> None:
        self.line_at, self.begun, self.head_done, self.tail = None, False, False, b""
        if self.buffer or self.head_bytes:  # the next request has begun (pipelined)
            self.idle = False
            self._wait(self.limits.request_timeout)
        else:
            self.idle = True
            self._wait(self.limits.idle_timeout)

    def _flow(self) -> None:
        """Read while the buffer is small and the client takes its answers; pause reading otherwise."""
        pause = self.write_blocked or len(self.buffer) > self._max_head()
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
            request = self._next_request_head()
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
        self.server.ask(request.route, self)

    def deliver(self, answer: Answer) -> None:
        """The answer to the request asked: write it, then go on with the next one."""
        request, self.asked = self.asked, None
        if self.closing or request is None:
            return
        self.served += 1
        last = self.served >= self.limits.max_requests_per_connection
        status, body, content_type = answer
        log.debug("http %s %s %d", request.method, request.route, status)
        self._write(status, body, content_type, close=last, head_only=request.method == "HEAD")
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            self._close()  # the client asked to close (or HTTP/1.0), or this was its last request
            return
        self.h11.start_next_cycle()
        self._flow()
        if self.write_blocked:
            return  # pause_writing has armed the timer: the client must take this answer first
        self._next_request()
        if not self.idle or self.peer_done:
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
        self.server.count(f"answered {refused.status}")
        extra = [("Allow", ", ".join(ALLOWED_METHODS))] if refused.allow else []
        self._write(refused.status, refused.body.encode() + b"\n", TEXT, close=True, extra=extra)
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
        close: bool,
        head_only: bool = False,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        headers = [
            ("Server", SERVER_NAME),
            ("Date", self.server.date()),
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            *(extra or []),
        ]
        if close:
            headers.append(("Connection", "close"))
        reason = HTTPStatus(status).phrase.encode()
        try:
            out = self.h11.send(h11.Response(status_code=status, headers=headers, reason=reason))
            if not head_only:
                out += self.h11.send(h11.Data(data=body))
            out += self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # h11 cannot answer in its state (an answer already begun)
            self.abort()
            return
        assert self.transport is not None and out is not None
        self.transport.write(out)

    def drop(self, reason: str | None) -> None:
        """Close at once, without an answer; ``reason``, the limit it held the port past, is counted."""
        if reason is not None:
            self.server.count(f"closed at http.{reason}")
        self.server.forget(self)
        self.abort()

    def abort(self) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- reading a request (h11)

    def _next_request_head(self) -> _Request | None:
        """The next complete request in what the client sent, checked against the policy; None while
        its head is incomplete. Raises ``_Refused`` for a request that is answered with an error."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as err:
                raise _Refused(err.error_status_hint, _protocol_error(err)) from None
            if isinstance(event, h11.Request):
                return self._admit_request(event)
            if event is h11.PAUSED:  # the previous answer is not written yet (it is: see deliver)
                return None
            if event is not h11.NEED_DATA:  # a body (refused before it is read) or the end of one
                continue
            self._check_request_line()
            if not self.buffer:
                return None
            chunk = bytes(self.buffer[: self._max_head()])
            del self.buffer[: len(chunk)]
            self.head_bytes += len(chunk)
            self.h11.receive_data(chunk)
            self._flow()

    def _check_request_line(self) -> None:
        """414 once an incomplete head's first line is over the limit (h11 only bounds the whole head)."""
        if self.line_checked or self.head_bytes <= self.limits.max_request_line:
            return
        pending, _ = self.h11.trailing_data
        start = pending.lstrip(b"\r\n")
        if b"\n" not in start[: self.limits.max_request_line + 1]:
            raise _Refused(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {self.limits.max_request_line} bytes")
        self.line_checked = True

    def _admit_request(self, event: h11.Request) -> _Request:
        """Our policy for a request h11 has read: version, size of the head, method, no body."""
        pending, _ = self.h11.trailing_data  # what follows this head: the start of the next request
        self.head_bytes, self.line_checked = len(pending), False
        if event.http_version not in (b"1.0", b"1.1"):
            version = event.http_version.decode("ascii", "replace")[:10]
            raise _Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"HTTP/{version} is not served: use HTTP/1.1")
        if len(event.method) + len(event.target) + len(b"  HTTP/1.1\r\n") > self.limits.max_request_line:
            raise _Refused(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {self.limits.max_request_line} bytes")
        headers = event.headers
        if len(headers) > self.limits.max_header_fields:
            raise _Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {self.limits.max_header_fields} header fields"
            )
        if sum(len(name) + len(value) + 4 for name, value in headers) > self.limits.max_header_bytes:
            raise _Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"header fields over {self.limits.max_header_bytes} bytes"
            )
        method = event.method.decode("ascii", "replace")
        if method not in ALLOWED_METHODS:
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, f"{method[:20]} is not served: use GET", allow=True)
        if any(name in (b"content-length", b"transfer-encoding") and value != b"0" for name, value in headers):
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "this server takes no request body")
        self.h11.next_event()  # the end of a request without a body: h11 has it already
        return _Request(method, self.server.route_of(event.target))


def _protocol_error(err: h11.RemoteProtocolError) -> str:
    """h11's reason, without the client's bytes it may quote (an answer never echoes them)."""
    reason = str(err).split(":", 1)[0] if "illegal" in str(err) else str(err)
    return f"bad request: {reason[:100]}"
