"""A small JSON-over-HTTP server for cloud simulators.

It owns everything that is the same for every simulated cloud: routing with path parameters, fault
injection, an optional token-bucket rate limit, the request log, and the ``/_sim/`` control API.
The cloud simulator supplies the routes, its error-body shape and its state.

Order of processing for an API request: route lookup (404/405) -> fault injection -> JSON body
parsing (400) -> rate limit (429) -> handler. Every API request is logged with its route name, the
final status, when it was received and the status the cloud's own handler answered (None when the handler
never ran), so a log tells the writes the cloud applied from those the client saw fail. Control requests
under ``/_sim/`` are never faulted, rate-limited or logged.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from simulators.common.clock import Clock
from simulators.common.faults import Fault, FaultInjector, InvalidFault
from simulators.common.request_log import RecordedRequest, RequestLog

JSON_CONTENT_TYPE = "application/json"
CONTROL_PREFIX = "/_sim/"


@dataclass(frozen=True)
class SimRequest:
    method: str
    path: str
    params: dict[str, str]  # path parameters from the route pattern
    query: dict[str, str]  # first value of each query parameter
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None when the request had no body
    route: str = ""


@dataclass(frozen=True)
class SimResponse:
    status: int = 200
    body: Any = None  # JSON-serialisable value, raw ``bytes``, or None for an empty body
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = JSON_CONTENT_TYPE  # None: no Content-Type header at all


class SimError(Exception):
    """Raised by a handler to answer with the cloud's error body (or ``body`` when given)."""

    def __init__(self, status: int, message: str, *, body: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.body = body
        self.headers = dict(headers or {})


Handler = Callable[[SimRequest], SimResponse]
ErrorBody = Callable[[int, str], Any]
# A whole error answer (status, message, extra headers -> response), for clouds whose errors are not all
# one JSON shape (Scaleway's rate limiter answers with no body at all).
ErrorResponse = Callable[[int, str, dict[str, str]], SimResponse]
# The headers of a rate-limited answer from (requests remaining, seconds until the next one is allowed).
RateLimitHeaders = Callable[[int, float], dict[str, str]]


def default_error_body(status: int, message: str) -> dict[str, Any]:
    return {"status": status, "message": message}


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: str
    name: str
    regex: re.Pattern[str]
    handler: Handler


_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``/a/{x}/b`` -> a regex matching one non-empty path segment per parameter."""
    if not pattern.startswith("/"):
        raise ValueError(f"route pattern must start with '/': {pattern!r}")
    regex = ""
    position = 0
    for match in _PARAM.finditer(pattern):
        regex += re.escape(pattern[position : match.start()]) + f"(?P<{match.group(1)}>[^/]+)"
        position = match.end()
    regex += re.escape(pattern[position:])
    return re.compile(f"^{regex}$")


class _TokenBucket:
    """Token bucket on the real monotonic clock: throttling is about real request rates."""

    def __init__(self, per_second: float, burst: int) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("rate limit needs per_second > 0 and burst >= 1")
        self.per_second = per_second
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> tuple[bool, int, float]:
        """(allowed, tokens remaining, seconds until the next token)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_second)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True, int(self._tokens), 0.0
            return False, 0, (1.0 - self._tokens) / self.per_second


def _header_seconds(value: float) -> str:
    # Retry-After is delta-seconds (an integer) in HTTP; round up so clients never retry too early.
    return str(max(0, math.ceil(value)))


class JsonApiServer:
    def __init__(
        self,
        error_body: ErrorBody | None = None,
        *,
        port: int = 0,
        clock: Clock | None = None,
        faults: FaultInjector | None = None,
        requests: RequestLog | None = None,
        on_advance: Callable[[float], Any] | None = None,
        state: Callable[[], Any] | None = None,
        rate_limit_headers: RateLimitHeaders | None = None,
        error_response: ErrorResponse | None = None,
    ) -> None:
        """``rate_limit_headers``: every header of a 429 from the rate limit (default: ``Retry-After``).
        ``error_response``: builds every error answer the server makes itself (routing, faults, rate limit,
        a handler's ``SimError`` without a body); default: ``error_body`` as JSON."""
        self.error_body: ErrorBody = error_body or default_error_body
        self._error_response = error_response
        self.clock = clock
        self.faults = faults if faults is not None else FaultInjector()
        self.requests = requests if requests is not None else RequestLog()
        self._requested_port = port
        self._on_advance = on_advance
        self._state = state
        self._rate_limit_headers = rate_limit_headers
        self._routes: list[_Route] = []
        self._control_routes: list[_Route] = []
        self._bucket: _TokenBucket | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._register_control_api()

    # -- configuration -------------------------------------------------------------------------

    def route(self, method: str, pattern: str, name: str, handler: Handler) -> None:
        if pattern.startswith(CONTROL_PREFIX):
            raise ValueError(f"API routes cannot live under {CONTROL_PREFIX}: {pattern}")
        self._routes.append(_Route(method.upper(), pattern, name, compile_pattern(pattern), handler))

    def control_route(self, method: str, pattern: str, handler: Handler) -> None:
        """Register an extra control route; ``pattern`` is under ``/_sim/`` (the prefix may be omitted)."""
        if not pattern.startswith(CONTROL_PREFIX):
            pattern = CONTROL_PREFIX + pattern.lstrip("/")
        name = "control:" + pattern[len(CONTROL_PREFIX) :]
        self._control_routes.append(_Route(method.upper(), pattern, name, compile_pattern(pattern), handler))

    def rate_limit(self, per_second: float | None, burst: int = 1) -> None:
        """Throttle API requests (all routes together); ``None`` removes the limit."""
        self._bucket = None if per_second is None else _TokenBucket(per_second, burst)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> JsonApiServer:
        if self._httpd is not None:
            return self
        handler_class = type("BoundSimHandler", (_SimHandler,), {"sim": self})
        httpd = _SimHTTPServer(("127.0.0.1", self._requested_port), handler_class)
        self._httpd = httpd
        # A short poll interval keeps stop() quick: shutdown() waits for the serve loop to notice.
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"sim-http-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("simulator HTTP server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def now(self) -> float:
        return self.clock.now() if self.clock is not None else time.time()

    # -- dispatch (called from request threads) -------------------------------------------------

    def _find(self, routes: list[_Route], method: str, path: str) -> tuple[_Route | None, dict[str, str], bool]:
        """(route, params, path_known): path_known is True when some route matched the path only."""
        path_known = False
        for candidate in routes:
            match = candidate.regex.match(path)
            if match is None:
                continue
            if candidate.method == method:
                return candidate, match.groupdict(), True
            path_known = True
        return None, {}, path_known

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> SimResponse:
        if self._error_response is not None:
            return self._error_response(status, message, dict(headers or {}))
        return SimResponse(status, self.error_body(status, message), dict(headers or {}))

    def _run_handler(self, route: _Route, request: SimRequest) -> SimResponse:
        try:
            return route.handler(request)
        except SimError as exc:
            if exc.body is None:
                return self._error(exc.status, exc.message, exc.headers)
            return SimResponse(exc.status, exc.body, exc.headers)
        except Exception as exc:  # a simulator bug must still produce a well-formed answer
            traceback.print_exc()
            return self._error(500, f"internal simulator error: {type(exc).__name__}: {exc}")

    # -- the control API -----------------------------------------------------------------------

    def _register_control_api(self) -> None:
        self.control_route("POST", "advance", self._control_advance)
        self.control_route("GET", "faults", lambda _r: SimResponse(200, [f.to_dict() for f in self.faults.active()]))
        self.control_route("POST", "faults", self._control_add_faults)
        self.control_route("DELETE", "faults", self._control_clear_faults)
        self.control_route("GET", "requests", self._control_requests)
        self.control_route("DELETE", "requests", self._control_clear_requests)
        self.control_route("GET", "state", lambda _r: SimResponse(200, self._state() if self._state else {}))
        self.control_route("POST", "rate_limit", self._control_rate_limit)

    def _control_advance(self, request: SimRequest) -> SimResponse:
        body = request.body if isinstance(request.body, dict) else {}
        seconds = body.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise SimError(400, 'body must be {"seconds": <number >= 0>}')
        if self._on_advance is not None:
            self._on_advance(float(seconds))
        elif self.clock is not None and hasattr(self.clock, "advance"):
            self.clock.advance(float(seconds))
        else:
            raise SimError(400, "this simulator has no clock that can be advanced")
        return SimResponse(200, {"now": self.now()})

    def _control_add_faults(self, request: SimRequest) -> SimResponse:
        items = request.body if isinstance(request.body, list) else [request.body]
        try:
            parsed = [Fault.from_dict(item) for item in items]
        except InvalidFault as exc:
            raise SimError(400, str(exc)) from exc
        for fault in parsed:
            self.faults.add(fault)
        return SimResponse(200, [f.to_dict() for f in self.faults.active()])

    def _control_clear_faults(self, _request: SimRequest) -> SimResponse:
        self.faults.clear()
        return SimResponse(200, [])

    def _control_requests(self, request: SimRequest) -> SimResponse:
        entries = self.requests.filter(request.query.get("route"), request.query.get("method"))
        return SimResponse(200, [entry.to_dict() for entry in entries])

    def _control_clear_requests(self, _request: SimRequest) -> SimResponse:
        self.requests.clear()
        return SimResponse(200, [])

    def _control_rate_limit(self, request: SimRequest) -> SimResponse:
        body = request.body if isinstance(request.body, dict) else {}
        per_second = body.get("per_second")
        try:
            self.rate_limit(None if per_second is None else float(per_second), int(body.get("burst", 1)))
        except (TypeError, ValueError) as exc:
            raise SimError(400, f"bad rate limit: {exc}") from exc
        return SimResponse(200, {"per_second": per_second, "burst": body.get("burst", 1)})


class _SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, dropped-connection fault) is normal here, not a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _SimHandler(BaseHTTPRequestHandler):
    sim: JsonApiServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"  # keep-alive, so clients with connection pools behave as against a cloud
    # Headers and body go out in two writes; without TCP_NODELAY the second waits ~40 ms for a delayed ACK.
    disable_nagle_algorithm = True
    timeout = 120  # idle keep-alive connections are closed eventually

    def version_string(self) -> str:
        return "cloud-simulator"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by the base class
        return  # the request log is the record; stderr noise would drown test output

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    # -- plumbing ------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(
        self, response: SimResponse, fault: Fault | None = None, record: Callable[[int], None] | None = None
    ) -> int:
        """Write the answer; ``record`` gets the final status BEFORE any byte is written, so a client
        that has its answer can rely on the request log already holding the request."""
        status = response.status
        headers = {"Content-Type": response.content_type} if response.content_type else {}
        headers.update(response.headers)
        payload = _encode(response.body)
        if fault is not None:
            if fault.empty_body:
                payload = b""
            if fault.malformed:
                status = 200
                # Cut the real answer short so it cannot parse; never leave it accidentally valid.
                payload = (payload[: max(1, len(payload) // 2)] if len(payload) > 2 else b"{") + b'"'
            if fault.retry_after is not None:
                headers["Retry-After"] = _header_seconds(fault.retry_after)
            headers.update(fault.headers or {})
            if fault.content_type is not None:
                headers["Content-Type"] = fault.content_type
                if "json" not in fault.content_type.lower():
                    payload = _html_page(status)
        if status == 204 and not payload:
            headers.pop("Content-Type", None)  # "No Content" carries no media type
        if record is not None:
            record(status)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD" and payload:
            self.wfile.write(payload)
        return status

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may already be gone
            self.connection.shutdown(socket.SHUT_RDWR)

    def _handle(self) -> None:
        sim = self.sim
        split = urlsplit(self.path)
        path = split.path
        query = {name: values[0] for name, values in parse_qs(split.query, keep_blank_values=True).items()}
        headers = {name.lower(): value for name, value in self.headers.items()}
        raw_body = self._read_body()
        method = self.command.upper()

        if path.startswith(CONTROL_PREFIX):
            self._handle_control(method, path, query, headers, raw_body)
            return

        received = sim.now()
        route, params, path_known = sim._find(sim._routes, method, path)
        route_name = route.name if route else "unknown"
        body, body_error = _parse_json(raw_body)
        handled: list[int] = []  # the handler's own status, once it has run

        def log(status: int) -> None:
            entry = RecordedRequest(
                sim.now(),
                method,
                path,
                route_name,
                query,
                headers,
                body,
                status,
                received,
                handled[0] if handled else None,
            )
            sim.requests.append(entry)

        if route is None:
            status = 405 if path_known else 404
            message = "method not allowed" if path_known else f"no such resource: {path}"
            self._send(sim._error(status, message), None, log)
            return

        fault = sim.faults.match(route.name, method)
        if fault is not None and fault.apply and body_error is None:
            request = SimRequest(method, path, params, query, headers, body, route.name)
            self._apply_then_fault(route, request, fault, log, handled)
            return
        if fault is not None:
            if fault.delay > 0:
                time.sleep(fault.delay)
            if fault.drop:
                log(0)
                self._drop()
                return
            if fault.status is not None:
                self._send(self._fault_answer(fault), fault, log)
                return

        if body_error is not None:
            self._send(sim._error(400, f"request body is not valid JSON: {body_error}"), fault, log)
            return

        if sim._bucket is not None:
            allowed, remaining, wait = sim._bucket.take()
            if not allowed:
                if sim._rate_limit_headers is not None:
                    extra = sim._rate_limit_headers(remaining, wait)
                else:
                    extra = {"Retry-After": _header_seconds(wait)}
                self._send(sim._error(429, "too many requests, slow down", extra), fault, log)
                return

        request = SimRequest(method, path, params, query, headers, body, route.name)
        response = sim._run_handler(route, request)
        handled.append(response.status)
        self._send(response, fault, log)

    def _apply_then_fault(
        self, route: _Route, request: SimRequest, fault: Fault, log: Callable[[int], None], handled: list[int]
    ) -> None:
        """Process the request (the cloud's state changes), then spoil the answer as the fault says."""
        response = self.sim._run_handler(route, request)
        handled.append(response.status)
        if fault.delay > 0:
            time.sleep(fault.delay)
        if fault.drop:
            log(0)
            self._drop()
            return
        if fault.status is not None:
            response = self._fault_answer(fault)
        self._send(response, fault, log)

    def _fault_answer(self, fault: Fault) -> SimResponse:
        """The error answer a fault with a status injects: its own body, else the cloud's error shape."""
        assert fault.status is not None
        if fault.body is None:
            return self.sim._error(fault.status, fault.message or f"injected fault ({fault.status})")
        return SimResponse(fault.status, fault.body)

    def _handle_control(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], raw_body: bytes
    ) -> None:
        sim = self.sim
        route, params, path_known = sim._find(sim._control_routes, method, path)
        if route is None:
            status = 405 if path_known else 404
            self._send(SimResponse(status, {"message": f"no control route {method} {path}"}))
            return
        body, body_error = _parse_json(raw_body)
        if body_error is not None:
            self._send(SimResponse(400, {"message": f"request body is not valid JSON: {body_error}"}))
            return
        try:
            response = route.handler(SimRequest(method, path, params, query, headers, body, route.name))
        except SimError as exc:
            response = SimResponse(exc.status, exc.body if exc.body is not None else {"message": exc.message})
        except Exception as exc:  # report simulator bugs to the test instead of hanging up
            traceback.print_exc()
            response = SimResponse(500, {"message": f"{type(exc).__name__}: {exc}"})
        self._send(response)


def _parse_json(raw: bytes) -> tuple[Any, str | None]:
    if not raw.strip():
        return None, None
    try:
        return json.loads(raw), None
    except (ValueError, UnicodeDecodeError) as exc:
        return None, str(exc)


def _encode(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return json.dumps(body, separators=(",", ":")).encode()


def _html_page(status: int) -> bytes:
    # What a load balancer in front of a cloud API answers when the backend is unhealthy.
    return (
        f"<html><head><title>{status}</title></head><body><center><h1>{status}</h1></center>"
        "<hr><center>simulated proxy</center></body></html>"
    ).encode()
