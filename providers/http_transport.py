"""Shared JSON-over-HTTP transport for the cloud clients (Scaleway, Bizfly).

One ``urllib3.PoolManager`` per cloud client (a ``ProxyManager`` when the environment names a proxy for
the API's URL, see "Connections" below). Every call takes its timeouts from the caller's
``Deadline``, retries a bounded number of times with exponential backoff and full jitter (honouring
``Retry-After``), and goes through a circuit breaker so a dead cloud API fails fast instead of eating
every CA deadline. Errors are ``providers.errors`` types with actionable messages that never contain
credentials: auth headers are built per attempt and never logged, and the values passed in
``secrets=`` are masked from every message this module produces.

Retry rules (why): an idempotent call (GET/HEAD/PUT/DELETE by default) may be repeated safely after
any transient failure; for the clouds' node DELETE that holds because deleting a node that is already
being deleted changes nothing (no second size decrement). A non-idempotent call (POST/PATCH) is
repeated only when the request certainly did not reach the cloud: 429 (refused by the rate limiter) or
a connection that never opened. Any 500/502/503/504, read timeout or dropped connection may come after
the cloud applied the write, with or without ``Retry-After``, so it is never repeated blindly.

A write (POST/PUT/PATCH/DELETE) that ends in such a failure raises ``CloudOutcomeUnknown``: the change
may have been applied, and the backend reads the cloud back before answering or changing anything else.

A write's 2xx answer is done when its body is empty or the API's JSON (a JSON object: what every write
answer of both clouds is, the records or a message). Any other body (an HTML page, JSON cut short, a JSON
value that is not an object) is not the API's answer: a proxy, gateway or captive portal in the path may
have answered without passing the request on, or after it did. That is an unknown outcome too, for every
write of every cloud: ``CloudOutcomeUnknown``, read back, never taken as applied. A read's 2xx with such
a body is a "malformed answer" (``CloudUnavailable``).

The write gate (leader election): with one set (``guard_writes``), every attempt of a cloud-changing
request asks it once its connection is ready (name resolved, TCP connected, TLS handshake done, which
can take up to the connect timeout) and just before the request's bytes go out, retries included, so a
replica whose leadership lapsed meanwhile sends nothing. The gate answers how long the replica may still
write, and the request must be sent within that: the socket's send timeout is cut to it. What is sent
in time reaches the cloud after the network's own delay; the lease margin (``lease_duration -
renew_deadline``, docs/explanation/kubernetes.md) is what keeps a new leader from writing before it. This is the one
place such requests leave the process. A gate may name the writer (``WriteGrant``): the request then
carries it in the ``WRITER_HEADER`` header, decided in the same step that let it go (with leader election,
the Lease holder and its term, so each cloud write can be told to one leadership term).

Connections (urllib3 directly; ``requests`` and its charset detection, IDNA tables and certifi bundle
cost about 4 MiB of the process's RSS for nothing this client uses):

- TLS is always verified (certificate chain and host name). The trust store is the system's, as
  OpenSSL finds it (``ssl.get_default_verify_paths()``: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set,
  else the OpenSSL directory, on Debian and the image ``/etc/ssl/certs`` from ``ca-certificates``).
  ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` (a PEM file or a hashed directory), which the earlier
  requests-based client honoured, still replace it. One context is shared by every transport.
- Proxies come from the environment as requests took them: ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``
  (lower case first) by the API URL's scheme, ``NO_PROXY`` host suffixes, ``*`` and CIDR ranges; a
  proxy URL's ``user:password@`` becomes a ``Proxy-Authorization`` header. Read when the transport is
  made (the server makes its transports at start).
- Redirects are not followed: a 3xx is refused with the address it points to. Following one would
  send the credentials headers to wherever a misconfigured or hostile endpoint points.
- urllib3 retries nothing (``retries=False``): the retry loop below is the only one. Up to 10 pooled
  keep-alive connections per host, as requests' defaults were.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import email.utils
import functools
import ipaddress
import json
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit, urlunsplit

import urllib3
import urllib3.connection
import urllib3.exceptions
from urllib3.util.ssl_ import create_urllib3_context

from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import (
    CloudAuthFailed,
    CloudOutcomeUnknown,
    CloudRequestRejected,
    CloudTimeout,
    CloudUnavailable,
    NotLeader,
)

log = logging.getLogger("providers.http")

#: statuses that say "try again later" rather than "your request is wrong"
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Answers with which the service itself says it failed: it is done with the request.
_FINISHED_FAILURES = frozenset({500, 503})
_MASK = "***"
# Bodies quoted in error messages are cut to this length: enough to read the cloud's reason.
_MAX_QUOTED_BODY = 300
# Shortest time worth starting an attempt with; below this the attempt would only time out.
_MIN_ATTEMPT_TIMEOUT = 0.05
# Pooled connections per host and hosts per transport: requests' HTTPAdapter defaults (urllib3's own
# default of one connection per host would reopen a connection for every parallel call).
_POOL_MAXSIZE = 10
_POOL_HOSTS = 10
# What requests sent on every call; urllib3 decodes gzip and deflate bodies.
_ACCEPT_ENCODING = "gzip, deflate"

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter."""

    attempts: int = 4  # total attempts including the first
    base_delay: float = 0.2
    max_delay: float = 5.0
    max_retry_after: float = 30.0  # a longer Retry-After (or one past the deadline) => give up now

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("RetryPolicy delays must not be negative")

    def backoff(self, retry_number: int, rng: Callable[[], float]) -> float:
        """Full jitter: uniform in [0, min(max_delay, base_delay * 2**(retry_number-1))]."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** max(retry_number - 1, 0)))
        return rng() * ceiling


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """After ``failure_threshold`` consecutive failed calls the breaker opens for ``reset_after``
    seconds (calls fail fast); then one probe call decides between closed and open again."""

    failure_threshold: int = 5
    reset_after: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("BreakerSettings.failure_threshold must be at least 1")
        if self.reset_after < 0:
            raise ValueError("BreakerSettings.reset_after must not be negative")


@dataclass(frozen=True, slots=True)
class JsonResponse:
    status: int
    headers: Mapping[str, str]  # case-insensitive (urllib3's HTTPHeaderDict)
    body: Any  # parsed JSON, or None for an empty body


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(when.timestamp() - now(), 0.0)


_CHANGE_WAITS = contextvars.ContextVar("change_waits", default=False)

#: A write gate: raises ``NotLeader`` to stop a request, else returns the seconds it may still take to be
#: sent (None: no bound), a ``WriteGrant`` to name the writer too.
WriteGate = Callable[[str], float | None]
#: The header a gated write carries when its gate names the writer (docs/reference/kubernetes-features.md): clouds
#: ignore an unknown header; a proxy's or the cloud's request log shows which replica, in which term, sent it.
WRITER_HEADER = "Ca-Externalgrpc-Writer"


class WriteGrant(float):
    """What a gate answers when it names who writes: the seconds the request may still take to be sent
    (it is that float), and ``writer``, sent in ``WRITER_HEADER``."""

    writer: str

    def __new__(cls, seconds: float, writer: str) -> WriteGrant:
        grant = super().__new__(cls, seconds)
        grant.writer = writer
        return grant


# The gate of the attempt this thread is sending (set around one attempt of a gated request).
_SEND_GATE: contextvars.ContextVar[Callable[[], float | None] | None] = contextvars.ContextVar(
    "send_gate", default=None
)


class _GatedHTTPConnection(urllib3.connection.HTTPConnection):
    """A connection that, for a gated request, connects first and asks the gate only then (see module doc)."""

    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **options: Any) -> None:  # type: ignore[override]
        headers = _ask_gate_when_connected(self, headers)
        super().request(method, url, body=body, headers=headers, **options)


class _GatedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **options: Any) -> None:  # type: ignore[override]
        headers = _ask_gate_when_connected(self, headers)
        super().request(method, url, body=body, headers=headers, **options)


def _ask_gate_when_connected(conn: urllib3.connection.HTTPConnection, headers: Any) -> Any:
    """Ask the gate of a gated request once ``conn`` is ready; the headers to send (with the writer's,
    when the gate names one)."""
    gate = _SEND_GATE.get()
    if gate is None:
        return headers
    if conn.sock is None:  # plain HTTP connects lazily; urllib3 has connected an HTTPS one already
        conn.connect()
    left = gate()  # NotLeader propagates: urllib3 closes the connection, nothing was sent
    if left is not None and (conn.timeout is None or left < conn.timeout):
        conn.timeout = max(left, 0.001)  # request() applies it to the socket for the sending
    if isinstance(left, WriteGrant):
        headers = urllib3.HTTPHeaderDict(headers or {})
        headers[WRITER_HEADER] = left.writer
    return headers


class _GatedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _GatedHTTPConnection


class _GatedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _GatedHTTPSConnection


@contextlib.contextmanager
def change_waiting() -> Iterator[None]:
    """Within this block, a request to a cloud whose breaker is open is sent as the breaker's probe at once.

    A size change or deletion the CA is waiting for would otherwise be refused until ``reset_after``
    has passed, and the CA answers a failed scale-up by backing the group off for minutes, long after
    the cloud is back. Sending it as the probe is safe: a probe is a single attempt, an unclear
    answer to a write is read back like any other, and while the cloud is still down such a call costs
    its own requests (one attempt each) while listings keep failing fast.
    """
    token = _CHANGE_WAITS.set(True)
    try:
        yield
    finally:
        _CHANGE_WAITS.reset(token)


class _Breaker:
    """Consecutive-failure circuit breaker; thread-safe. Only one probe runs while half-open."""

    def __init__(self, settings: BreakerSettings, clock: Callable[[], float], on_change: Callable[[str], None]):
        self._settings = settings
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == OPEN and self._clock() - self._opened_at >= self._settings.reset_after:
                return HALF_OPEN
            return self._state

    def admit(self, urgent: bool = False) -> tuple[bool, bool, float]:
        """(admitted, is_probe, seconds until the next probe is allowed); ``urgent``: probe before reset_after."""
        changed = None
        with self._lock:
            if self._state == CLOSED:
                return True, False, 0.0
            waited = self._clock() - self._opened_at
            if self._state == OPEN and (urgent or waited >= self._settings.reset_after):
                self._state = changed = HALF_OPEN
            if urgent:
                # Not limited to one in flight: a change's requests may run side by side (a Bizfly
                # read-back is two GETs, a scale-down many DELETEs), each a single attempt.
                admitted = (True, True, 0.0)
            elif self._state == HALF_OPEN and not self._probe_in_flight:
                self._probe_in_flight = True
                admitted = (True, True, 0.0)
            else:
                admitted = (False, False, max(self._settings.reset_after - waited, 0.0))
        if changed:
            self._on_change(changed)
        return admitted

    def record(self, success: bool, probe: bool) -> None:
        changed = None
        with self._lock:
            if probe:
                self._probe_in_flight = False
            if success:
                self._failures = 0
                if self._state != CLOSED:
                    self._state = changed = CLOSED
            else:
                self._failures += 1
                if self._state == HALF_OPEN or (
                    self._state == CLOSED and self._failures >= self._settings.failure_threshold
                ):
                    self._state = changed = OPEN
                    self._opened_at = self._clock()
        if changed:
            self._on_change(changed)

    def release_probe(self) -> None:
        """A probe that ended without saying anything about the cloud (e.g. DeadlineTooShort)."""
        with self._lock:
            self._probe_in_flight = False


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One attempt's result before it is turned into an answer or an error."""

    response: urllib3.BaseHTTPResponse | None = None
    error: Exception | None = None
    label: str = ""  # status code or error kind, for metrics/logs
    reached_cloud: bool = True  # False only when the request certainly never reached the cloud
    seconds: float = 0.0  # how long the attempt took
    # what bounded the attempt's time: "request_timeout" (the config's cap) or "deadline" (what the
    # caller's deadline left, less than the cap); a timeout is told by this, its real cause
    limit: str = ""
    timeout: float = 0.0


class HttpTransport:
    """JSON over HTTP with deadlines, bounded retries, a circuit breaker, metrics and safe messages."""

    def __init__(
        self,
        api: str,
        base_url: str,
        *,
        user_agent: str,
        headers: Mapping[str, str] | None = None,
        auth: Callable[[bool], Mapping[str, str]] | None = None,
        error_message: Callable[[int, Any], str] | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, immutable default
        breaker: BreakerSettings = BreakerSettings(),  # noqa: B008 - frozen, immutable default
        max_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        secrets: Iterable[str] = (),
        is_auth_failure: Callable[[int, Any], bool] | None = None,
    ) -> None:
        """``headers`` go with every request: a static credential (Scaleway's secret key), which a 401
        refuses for good. ``auth(refresh)`` gives the headers of a token that can be renewed (Bizfly's): a
        401 renews it once (``auth(True)``) and repeats the request; a second 401 is final.

        ``is_auth_failure(status, body)`` decides whether a 401/403 is a credentials problem
        (default: always). Some clouds answer 403 for other refusals, e.g. Scaleway's
        ``quotas_exceeded``, which must not read as "check your key"."""
        self.api = api  # the API this transport calls: the `api` label of its metrics and logs
        self.base_url = base_url.rstrip("/")
        # For messages: a URL may carry user:password@ (some proxies); never repeat that part.
        parts = urlsplit(self.base_url)
        self._shown_url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        self._auth = auth
        self._error_message = error_message
        self._is_auth_failure = is_auth_failure
        self._retry = retry
        self._max_timeout = max_timeout
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        # Longest first so a secret that contains another is masked whole.
        self._secrets = tuple(sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True))
        self._metrics: Any = None
        self._backend = ""  # the configured backend these calls serve, for logs (set by instrument)
        self._breaker = _Breaker(breaker, clock, self._breaker_changed)
        self._write_gate: WriteGate | None = None
        self._headers = urllib3.HTTPHeaderDict(
            {"User-Agent": user_agent, "Accept-Encoding": _ACCEPT_ENCODING, "Accept": "application/json"}
        )
        self._headers.update(headers or {})
        self._pool = _pool_manager(self.base_url)

    # ------------------------------------------------------------------ public
    @property
    def breaker_state(self) -> str:
        return self._breaker.state

    def instrument(self, metrics: Any) -> None:
        """Report attempts and breaker changes to ``metrics`` (server/metrics.py ``BackendMetrics``);
        its ``backend`` attribute, when present, is added to every log line of this transport."""
        self._metrics = metrics
        self._backend = str(getattr(metrics, "backend", "") or "")
        if metrics is not None:
            metrics.set_breaker_state(self.api, self._breaker.state)

    def guard_writes(self, gate: WriteGate) -> None:
        """Call ``gate("METHOD endpoint")`` for every attempt of a cloud-changing request once its
        connection is ready; it raises ``NotLeader`` to stop the request unsent, else returns how long the
        sending may take (leader election, server/kube/leader.py)."""
        self._write_gate = gate

    def close(self) -> None:
        self._pool.clear()

    def add_secret(self, value: str | None) -> None:
        """Mask one more value (e.g. a token obtained at run time) in every later message."""
        if value and len(value) >= 4 and value not in self._secrets:
            self._secrets = tuple(sorted({*self._secrets, value}, key=len, reverse=True))

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _MASK)
        return text

    def request(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        deadline: Deadline,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        idempotent: bool | None = None,
        changes_cloud: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> JsonResponse:
        """Send one logical call; return the parsed 2xx answer or raise a ``providers.errors`` type.

        ``endpoint`` is the route template ("GET /pools/{pool_id}" style names are fine) used for
        metrics and messages; the concrete path never appears in them (it may carry ids users grep
        for, but the template keeps metric cardinality bounded). ``changes_cloud`` (default: any
        write method) says whether an unclear answer leaves the cloud's state unknown; a login POST
        changes nothing the server tracks, so its failures are plain ``CloudUnavailable``. A 2xx with an
        empty body comes back as ``body=None``; one whose body is not the API's answer raises (see the
        module doc).
        """
        method = method.upper()
        if idempotent is None:
            idempotent = method in _IDEMPOTENT_METHODS
        if changes_cloud is None:
            changes_cloud = method in _WRITE_METHODS
        admitted, probe, wait = self._breaker.admit(urgent=_CHANGE_WAITS.get())
        if not admitted:
            raise CloudUnavailable(
                f"{self.api} API calls are suspended for {wait:.0f}s more after repeated failures "
                f"(circuit breaker open; {method} {endpoint} not sent); check the cloud's status page and "
                "network path, the breaker probes again automatically"
            )
        try:
            response = self._call(
                method,
                path,
                endpoint,
                deadline,
                params,
                json_body,
                idempotent,
                changes_cloud,
                headers,
                probe,
            )
        except NotLeader:
            # Refused by this replica's own write gate: the cloud was not asked and says nothing.
            if probe:
                self._breaker.release_probe()
            raise
        except CloudUnavailable:
            self._breaker.record(success=False, probe=probe)
            raise
        except (CloudAuthFailed, CloudRequestRejected):
            # The cloud answered (a refusal is still an answer): never a failure for the breaker, and
            # a half-open probe answered this way shows the cloud is back, so the breaker closes.
            if probe:
                self._breaker.record(success=True, probe=True)
            raise
        except BaseException:
            # A too-short deadline (the cloud was never asked) says nothing about the cloud.
            if probe:
                self._breaker.release_probe()
            raise
        self._breaker.record(success=True, probe=probe)
        return response

    # ------------------------------------------------------------------ internals
    def _call(
        self,
        method: str,
        path: str,
        endpoint: str,
        deadline: Deadline,
        params: Mapping[str, Any] | None,
        json_body: Any,
        idempotent: bool,
        changes_cloud: bool,
        extra_headers: Mapping[str, str] | None,
        probe: bool,
    ) -> JsonResponse:
        url = self.base_url + (path if path.startswith("/") else "/" + path)
        query = _encode_params(params) if params else ""
        if query:
            url += ("&" if "?" in url else "?") + query
        # Encoded once for every attempt, as requests did: NaN and infinities are not JSON.
        body = None if json_body is None else json.dumps(json_body, allow_nan=False).encode("utf-8")
        # A half-open probe is a single attempt: its only job is to tell whether the cloud is back.
        attempts = 1 if probe else self._retry.attempts
        auth_refreshed = refresh_auth = False
        attempt = 0
        # A write that reached the cloud and got no clear answer may have been applied (and, unless the
        # service said it failed, may still be applied later).
        maybe_applied = may_land_later = False
        while True:
            attempt += 1
            timeout = deadline.timeout(cap=self._max_timeout, needed=_MIN_ATTEMPT_TIMEOUT)
            send_headers = dict(extra_headers or {})
            if self._auth is not None:
                # auth(True) asks for a fresh token; its answer is used for the repeated request.
                send_headers.update(self._auth(refresh_auth))
                refresh_auth = False
            gate = None
            if changes_cloud and self._write_gate is not None:
                gate = functools.partial(self._write_gate, f"{method} {endpoint}")
            try:
                outcome = self._attempt(method, url, endpoint, timeout, body, send_headers, attempt, gate)
                limit = "request_timeout" if timeout >= self._max_timeout else "deadline"
                outcome = replace(outcome, limit=limit, timeout=timeout)
            except NotLeader as refused:
                if maybe_applied:  # an earlier attempt of this call may have landed: say so, do not hide it
                    raise self._final(CloudUnavailable(str(refused)), True, may_land_later) from None
                raise
            response = outcome.response

            if response is not None and response.status == 401 and self._auth is not None and not auth_refreshed:
                # A token may expire between two calls: refresh it once, then a second 401 is final.
                self._log_attempt(method, endpoint, outcome, attempt, "refreshing the token and repeating")
                auth_refreshed = refresh_auth = True
                attempt -= 1  # the refresh retry does not use up a transient-failure attempt
                continue
            if response is not None and 300 <= response.status < 400:
                self._log_attempt(method, endpoint, outcome, attempt, "redirect, not followed")
                raise self._redirect_error(response, method, endpoint)
            if response is not None and response.status < 400:
                self._log_attempt(method, endpoint, outcome, attempt, "")
                return self._parse_success(response, method, endpoint, changes_cloud)
            if response is not None and response.status not in RETRYABLE_STATUSES:
                self._log_attempt(method, endpoint, outcome, attempt, "refused, not retried")
                raise self._client_error(response, method, endpoint)

            # Transient: a retryable status or no answer at all.
            failure = self._transient_error(outcome, method, endpoint, idempotent)
            if changes_cloud and not self._certainly_not_processed(outcome):
                maybe_applied = True
                may_land_later = may_land_later or response is None or response.status not in _FINISHED_FAILURES
            retry_after = parse_retry_after(response.headers.get("Retry-After")) if response is not None else None
            safe_to_repeat = idempotent or self._certainly_not_processed(outcome)
            if not safe_to_repeat:
                self._log_attempt(method, endpoint, outcome, attempt, "not retried: the change may have been applied")
                raise self._final(failure, maybe_applied, may_land_later)
            if attempt >= attempts:
                self._log_attempt(method, endpoint, outcome, attempt, f"giving up after {attempt} attempt(s)")
                raise self._final(failure, maybe_applied, may_land_later)
            delay = self._retry.backoff(attempt, self._rng) if retry_after is None else retry_after
            if retry_after is not None and retry_after > self._retry.max_retry_after:
                self._log_attempt(method, endpoint, outcome, attempt, f"not retried: Retry-After {retry_after:.0f}s")
                raise self._final(
                    type(failure)(
                        f"{failure} The cloud asked to wait {retry_after:.0f}s (Retry-After), longer than the "
                        f"{self._retry.max_retry_after:.0f}s this server waits inside one call; it will try again "
                        "on the next call"
                    ),
                    maybe_applied,
                    may_land_later,
                )
            room = deadline.remaining() - RESPONSE_MARGIN - _MIN_ATTEMPT_TIMEOUT
            if delay > room:
                self._log_attempt(method, endpoint, outcome, attempt, "not retried: the caller's deadline is near")
                raise self._final(
                    type(failure)(
                        f"{failure} Not retrying: waiting {delay:.2f}s would pass the caller's deadline "
                        f"({max(room, 0.0):.2f}s usable left)"
                    ),
                    maybe_applied,
                    may_land_later,
                )
            self._log_attempt(method, endpoint, outcome, attempt, f"retrying in {delay:.2f}s", retry_in=delay)
            if delay > 0:
                self._sleep(delay)

    def _attempt(
        self,
        method: str,
        url: str,
        endpoint: str,
        timeout: float,
        body: bytes | None,
        headers: Mapping[str, str],
        attempt: int,
        gate: Callable[[], float | None] | None = None,
    ) -> _Outcome:
        """One attempt. With ``gate``, the connection asks it once ready, just before sending (NotLeader
        propagates: nothing was sent, and no attempt is counted)."""
        send_headers = self._headers.copy()
        send_headers.update(headers)  # case-insensitive: the caller's value replaces the default
        if body is not None and "Content-Type" not in send_headers:
            send_headers["Content-Type"] = "application/json"
        started = self._clock()
        token = _SEND_GATE.set(gate)
        try:
            # The body is read here (preload_content), inside the timed section, so a slow body counts
            # as part of the call; the connection then goes back to the pool.
            response = self._pool.urlopen(
                method,
                url,
                body=body,
                headers=send_headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                retries=False,
                redirect=False,
                preload_content=True,
            )
            outcome = _Outcome(response=response, label=str(response.status))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            outcome = _Outcome(error=exc, **_classify(exc))
        finally:
            _SEND_GATE.reset(token)
        seconds = self._clock() - started
        if self._metrics is not None:
            label = outcome.label
            status: int | str = int(label) if label.isdigit() else label
            self._metrics.observe_cloud_request(self.api, endpoint, method, status, seconds, attempt > 1)
        return replace(outcome, seconds=seconds)

    def _timeout_words(self, outcome: _Outcome) -> str:
        """What bounded a timed-out attempt, by its real cause."""
        if outcome.limit == "request_timeout":
            return f"request_timeout ({outcome.timeout:g}s, the {self.api} backend's cap for one attempt)"
        return f"the {outcome.timeout:.2f}s the caller's deadline left (below request_timeout, {self._max_timeout:g}s)"

    def _log_attempt(
        self, method: str, endpoint: str, outcome: _Outcome, attempt: int, next_step: str, retry_in: float | None = None
    ) -> None:
        """One line per attempt, saying what happens next (a retry is one line, not two)."""
        label = outcome.label
        level = logging.DEBUG if label.isdigit() and int(label) < 400 else logging.WARNING
        if not log.isEnabledFor(level):
            return
        extra: dict[str, Any] = {
            "api": self.api,
            "method": method,
            "endpoint": endpoint,
            "status": label,
            "attempt": attempt,
            "duration_ms": round(outcome.seconds * 1000, 1),
        }
        if self._backend:
            extra["backend"] = self._backend
        if retry_in is not None:
            extra["retry_in_s"] = round(retry_in, 3)
        suffix = f"; {next_step}" if next_step else ""
        if label == "timeout" and outcome.limit:
            label = f"timeout (no answer within {self._timeout_words(outcome)})"
            extra["timeout_limit"] = outcome.limit
        log.log(
            level,
            "%s %s %s -> %s in %.0fms%s",
            self.api,
            method,
            endpoint,
            label,
            outcome.seconds * 1000,
            suffix,
            extra=extra,
        )

    def _breaker_changed(self, state: str) -> None:
        log.warning(
            "%s API circuit breaker is now %s",
            self.api,
            state,
            extra={"api": self.api, "breaker": state},
        )
        if self._metrics is not None:
            self._metrics.set_breaker_state(self.api, state)

    @staticmethod
    def _certainly_not_processed(outcome: _Outcome) -> bool:
        """Only a connection that never opened, or the rate limiter's 429, prove nothing was done."""
        if not outcome.reached_cloud:
            return True
        return outcome.response is not None and outcome.response.status == 429

    @staticmethod
    def _final(failure: CloudUnavailable, maybe_applied: bool, may_land_later: bool) -> CloudUnavailable:
        """The error to raise: a write that may have been applied says so in its type and message."""
        if not maybe_applied:
            return failure
        text = str(failure)
        if "may or may not" not in text:
            text += (
                " The change may have been applied anyway (the request reached the cloud); the state is "
                "read back from the cloud before anything else is decided."
            )
        return CloudOutcomeUnknown(text, finished=not may_land_later)

    def _transient_error(self, outcome: _Outcome, method: str, endpoint: str, idempotent: bool) -> CloudUnavailable:
        what = f"{self.api} API {method} {endpoint}"
        if outcome.response is not None:
            detail = self._describe_body(outcome.response)
            why = (
                "the cloud's rate limiter refused it"
                if outcome.response.status == 429
                else "the cloud is overloaded or failing"
            )
            return CloudUnavailable(
                self.redact(f"{what} answered {outcome.response.status}{detail}; {why}, the call will be retried later")
            )
        if outcome.label == "timeout":
            within = self._timeout_words(outcome)
            if idempotent:
                return CloudTimeout(f"{what} got no answer within {within}")
            return CloudTimeout(
                f"{what} got no answer within {within}; the change may or may not have been applied, the state is "
                "re-read from the cloud before any retry"
            )
        if outcome.label == "connection" and not idempotent:
            return CloudTimeout(
                f"{what}: the connection closed without an answer; the change may or may not have been "
                "applied, the state is re-read from the cloud before any retry"
            )
        if outcome.label == "connect_timeout":
            return CloudTimeout(f"{what}: could not connect to {self._shown_url} in time; check the network path")
        reason = "connection refused" if outcome.label == "connection_refused" else "connection failed"
        return CloudUnavailable(
            self.redact(f"{what} failed: {reason} talking to {self._shown_url}; check the api_url and network path")
        )

    def _redirect_error(self, response: urllib3.BaseHTTPResponse, method: str, endpoint: str) -> Exception:
        """A 3xx: refused rather than followed (the credentials would go along to the new address)."""
        location = response.headers.get("Location", "")
        if location:
            # Shown without user:password@ or a query, which may carry tokens.
            parts = urlsplit(location)
            location = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))
            if len(location) > _MAX_QUOTED_BODY:
                location = location[:_MAX_QUOTED_BODY] + "..."
        target = f" to {location}" if location else ""
        return CloudRequestRejected(
            self.redact(
                f"{self.api} API {method} {endpoint} answered {response.status}, a redirect{target}; redirects are "
                f"not followed (the credentials would go along): set the API URL to the address that answers "
                f"itself (now {self._shown_url})"
            ),
            status=response.status,
        )

    def _client_error(self, response: urllib3.BaseHTTPResponse, method: str, endpoint: str) -> Exception:
        status = response.status
        body = _json_or_text(response)
        if self._error_message is not None:
            try:
                reason = self._error_message(status, body)
            except Exception:  # noqa: BLE001 - a bad error body must not hide the real error
                reason = ""
        else:
            reason = ""
        if not reason:
            reason = self._describe_body(response).removeprefix(": ")
        what = f"{self.api} API {method} {endpoint} answered {status}"
        if status in (401, 403) and (self._is_auth_failure is None or self._is_auth_failure(status, body)):
            hint = (
                "the credentials were refused; check the secret key/token and that it may manage this cluster"
                if status == 401
                else "the credentials lack permission for this call; grant the key the needed permissions"
            )
            return CloudAuthFailed(self.redact(f"{what}: {reason or 'unauthorized'} ({hint})"))
        return CloudRequestRejected(
            self.redact(f"{what}: {reason or 'request rejected'}"),
            status=status,
            body=body if isinstance(body, Mapping) else None,
        )

    def _describe_body(self, response: urllib3.BaseHTTPResponse) -> str:
        body = _json_or_text(response)
        if body in (None, ""):
            return ""
        text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"), sort_keys=True)
        if len(text) > _MAX_QUOTED_BODY:
            text = text[:_MAX_QUOTED_BODY] + "..."
        return ": " + self.redact(text)

    def _parse_success(
        self, response: urllib3.BaseHTTPResponse, method: str, endpoint: str, changes_cloud: bool
    ) -> JsonResponse:
        raw = response.data
        if not raw.strip():
            return JsonResponse(response.status, response.headers, None)
        content_type = response.headers.get("Content-Type", "")
        problem = ""
        body: Any = None
        if "json" not in content_type.lower():
            problem = f"content type {content_type or 'none'!r}, not JSON"
        else:
            try:
                body = json.loads(raw)
            except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not text
                why = f"{exc.msg} at byte {exc.pos}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
                problem = f"invalid JSON ({why})"
            else:
                if changes_cloud and not isinstance(body, Mapping):
                    problem = f"JSON {type(body).__name__}, not an object"
        if not problem:
            return JsonResponse(response.status, response.headers, body)
        what = f"{self.api} API {method} {endpoint}"
        if not changes_cloud:
            raise CloudUnavailable(f"malformed answer from {what}: {problem} (a proxy or captive portal in the path?)")
        # Not the API's answer: whatever answered may have passed the write on, or not (module doc).
        raise CloudOutcomeUnknown(
            self.redact(
                f"{what} answered {response.status}{self._describe_body(response)}, which is not the API's answer "
                f"({problem}; a proxy or gateway in the path?); the change may or may not have been applied, the "
                "state is read back from the cloud before anything else is decided"
            ),
            finished=False,
        )


def _json_or_text(response: urllib3.BaseHTTPResponse) -> Any:
    raw = response.data
    if not raw or not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace").strip()


def _classify(exc: BaseException) -> dict[str, Any]:
    """An attempt's exception as its metric label and whether the request may have reached the cloud.

    With ``retries=False`` urllib3 raises the error itself (no ``MaxRetryError``); a proxy's is wrapped
    in ``ProxyError`` and classified by what went wrong underneath, the proxy being part of the path.
    """
    if isinstance(exc, urllib3.exceptions.ProxyError) and isinstance(exc.original_error, BaseException):
        exc = exc.original_error
    # NewConnectionError (refused, unreachable, DNS) subclasses ConnectTimeoutError: test it first.
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        exc, urllib3.exceptions.NewConnectionError
    ):
        return {"label": "connect_timeout", "reached_cloud": False}
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return {"label": "timeout"}
    # "Connection refused" / DNS failure: the request was never sent. A reset or a closed connection
    # after sending (ProtocolError), a TLS failure or anything else: it may have been processed.
    if _failed_to_connect(exc):
        return {"label": "connection_refused", "reached_cloud": False}
    return {"label": "connection"}


def _failed_to_connect(exc: BaseException) -> bool:
    """True when the chain shows the TCP connection never opened (refused, unreachable, DNS)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
            return True
        nested = current.args[0] if current.args and isinstance(current.args[0], BaseException) else None
        current = nested or current.__cause__ or current.__context__
    return False


def _encode_params(params: Mapping[str, Any]) -> str:
    """The query string exactly as requests built it: ``None`` values dropped, a list or tuple value
    repeats its key, everything else ``str()``-ed and form-encoded (space as ``+``)."""
    pairs: list[tuple[str, Any]] = []
    for key, values in params.items():
        if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
            values = [values]
        pairs.extend((key, value) for value in values if value is not None)
    return urlencode(pairs)


def _pool_manager(base_url: str) -> urllib3.PoolManager:
    """The connection pools for one transport: direct, or through the proxy the environment names."""
    # Only an https:// API needs the trust store (the loopback simulators are plain HTTP).
    tls = _tls_context(*_ca_bundle_from_env()) if urlsplit(base_url).scheme.lower() == "https" else None
    settings: dict[str, Any] = {"maxsize": _POOL_MAXSIZE, "block": False, "retries": False}
    if tls is not None:
        settings["ssl_context"] = tls
    proxy = proxy_for(base_url)
    manager: urllib3.PoolManager
    if proxy is None:
        manager = urllib3.PoolManager(num_pools=_POOL_HOSTS, **settings)
        return _gated(manager)
    parts = urlsplit(proxy)
    proxy_headers: dict[str, str] = {}
    if parts.username is not None or parts.password is not None:
        credentials = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        proxy_headers = urllib3.make_headers(proxy_basic_auth=credentials)
    manager = urllib3.ProxyManager(
        urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])),
        num_pools=_POOL_HOSTS,
        proxy_headers=proxy_headers,
        proxy_ssl_context=_tls_context(*_ca_bundle_from_env()) if parts.scheme.lower() == "https" else None,
        **settings,
    )
    return _gated(manager)


def _gated(manager: urllib3.PoolManager) -> urllib3.PoolManager:
    """Its pools make connections that ask a write gate once connected (``_GatedHTTPConnection``)."""
    manager.pool_classes_by_scheme = {"http": _GatedHTTPPool, "https": _GatedHTTPSPool}
    return manager


def proxy_for(url: str) -> str | None:
    """The proxy URL requests would have used for ``url`` from the environment, or None to go direct.

    ``<scheme>_proxy`` / ``all_proxy`` (either case, lower case winning), unless ``no_proxy`` names the
    host: ``*``, a host or domain suffix (optionally with a port; a suffix matches whole labels only,
    where requests also matched ``badexample.com`` for ``example.com``), or, for an IP address, a CIDR
    range. A proxy given without a scheme is an ``http://`` one. Only ``http://`` and ``https://``
    proxies are supported.
    """
    # Imported here: urllib.request is large, and the server has it loaded already (prometheus_client).
    from urllib.request import getproxies, proxy_bypass

    proxies = getproxies()
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or not host:
        return None
    no_proxy = proxies.get("no", "")
    with_port = f"{host}:{parts.port}" if parts.port is not None else host
    if proxy_bypass(with_port) or _in_cidr(host, no_proxy):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    proxy_scheme = proxy.partition("://")[0].lower()
    if proxy_scheme not in ("http", "https"):
        shown = urlunsplit(urlsplit(proxy)._replace(netloc=urlsplit(proxy).netloc.rpartition("@")[2]))
        raise ValueError(
            f"the environment names the proxy {shown} for {scheme}:// URLs; only http:// and https:// "
            "proxies are supported: change it or list the API's host in NO_PROXY"
        )
    return proxy


def _in_cidr(host: str, no_proxy: str) -> bool:
    """Whether ``host`` is an IP address inside a CIDR entry of ``no_proxy`` (the stdlib ignores those)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    for entry in no_proxy.split(","):
        entry = entry.strip()
        if "/" not in entry:
            continue
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def _ca_bundle_from_env() -> tuple[str | None, str | None]:
    """(cafile, capath) from ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``, or (None, None) for the system's."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not bundle:
        return None, None
    return (None, bundle) if os.path.isdir(bundle) else (bundle, None)


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """One verifying context per trust store, shared by every transport (and every connection: urllib3
    would otherwise build a context and load the whole store again for each new connection)."""
    context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
    if cafile or capath:
        try:
            context.load_verify_locations(cafile=cafile, capath=capath)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE {cafile or capath} cannot be loaded as PEM CA certificates "
                f"({exc}); point it to a readable bundle or unset it to use the system's trust store"
            ) from None
    else:
        context.load_default_certs()
    return context
