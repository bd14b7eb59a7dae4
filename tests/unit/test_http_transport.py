"""HttpTransport against a tiny scripted HTTP server on 127.0.0.1.

Sleeps are recorded instead of slept (the transport takes ``sleep=``), so retry tests are fast and
the backoff values can be checked exactly; timeouts use real sockets with short deadlines.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import providers.http_transport as http_transport
from devstack.certs import make_pki
from providers.deadline import Deadline
from providers.errors import (
    CloudAuthFailed,
    CloudOutcomeUnknown,
    CloudRequestRejected,
    CloudTimeout,
    CloudUnavailable,
    DeadlineTooShort,
    NotLeader,
)
from providers.http_transport import (
    WRITER_HEADER,
    BreakerSettings,
    HttpTransport,
    RetryPolicy,
    WriteGrant,
    parse_retry_after,
    proxy_for,
)
from tests.support.scripted_http import Scripted, ScriptedServer

SECRET = "0f1e2d3c-secret-token-value"


class RecordingMetrics:
    def __init__(self) -> None:
        self.requests: list[tuple[Any, ...]] = []
        self.breaker: list[str] = []

    def observe_cloud_request(self, provider, endpoint, method, status_or_error, seconds, retried) -> None:  # noqa: ANN001
        self.requests.append((provider, endpoint, method, status_or_error, retried))

    def set_breaker_state(self, provider, state) -> None:  # noqa: ANN001
        self.breaker.append(state)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    yield srv
    srv.stop()


@pytest.fixture
def sleeps() -> list[float]:
    return []


def make(server: ScriptedServer, sleeps: list[float], **kwargs: Any) -> HttpTransport:
    kwargs.setdefault("rng", lambda: 0.5)
    kwargs.setdefault("retry", RetryPolicy(attempts=4, base_delay=0.2, max_delay=5.0))
    return HttpTransport("testcloud", server.url, user_agent="ca-externalgrpc-test/1", sleep=sleeps.append, **kwargs)


def deadline(seconds: float = 5.0) -> Deadline:
    return Deadline.after(seconds)


# ---------------------------------------------------------------------- success path


def test_get_returns_parsed_json_with_case_insensitive_headers(server, sleeps):
    server.answer(Scripted(body={"pools": [1, 2]}, headers={"Cache-Control": "max-age=30"}))
    transport = make(server, sleeps)
    answer = transport.request("GET", "/pools", endpoint="/pools", deadline=deadline(), params={"page": 2})
    assert answer.status == 200
    assert answer.body == {"pools": [1, 2]}
    assert answer.headers["cache-control"] == "max-age=30"
    assert server.seen[0].path == "/pools?page=2"
    assert server.seen[0].headers["user-agent"] == "ca-externalgrpc-test/1"


def test_json_body_is_sent_and_empty_answer_is_none(server, sleeps):
    server.answer(Scripted(status=204))
    transport = make(server, sleeps)
    answer = transport.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 5})
    assert answer.body is None
    assert json.loads(server.seen[0].body) == {"size": 5}
    assert server.seen[0].headers["content-type"] == "application/json"


# ---------------------------------------------------------------------- retries


def test_idempotent_call_is_retried_on_503_with_jittered_backoff(server, sleeps):
    server.answer(Scripted(status=503, body={"message": "busy"}), Scripted(status=502), Scripted(body={"ok": 1}))
    transport = make(server, sleeps, rng=lambda: 0.5)
    assert transport.request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": 1}
    assert len(server.seen) == 3
    # full jitter with rng=0.5: half of base*2**(n-1)
    assert sleeps == [pytest.approx(0.1), pytest.approx(0.2)]


def test_retries_stop_after_the_configured_attempts(server, sleeps):
    server.answer(Scripted(status=500, body={"message": "boom"}))
    transport = make(server, sleeps, retry=RetryPolicy(attempts=3))
    with pytest.raises(CloudUnavailable, match="answered 500") as info:
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert not isinstance(info.value, CloudTimeout)
    assert len(server.seen) == 3
    assert len(sleeps) == 2


@pytest.mark.parametrize("rng_value", [0.0, 0.3, 0.999999])
def test_backoff_stays_within_full_jitter_bounds(rng_value):
    policy = RetryPolicy(attempts=10, base_delay=0.2, max_delay=1.0)
    for retry_number in range(1, 9):
        ceiling = min(1.0, 0.2 * 2 ** (retry_number - 1))
        delay = policy.backoff(retry_number, lambda v=rng_value: v)
        assert 0.0 <= delay <= ceiling
        assert delay == pytest.approx(rng_value * ceiling)


def test_retry_after_seconds_is_honoured(server, sleeps):
    server.answer(Scripted(status=429, headers={"Retry-After": "2"}), Scripted(body={}))
    transport = make(server, sleeps)
    transport.request("GET", "/x", endpoint="/x", deadline=deadline(10))
    assert sleeps == [2.0]


def test_retry_after_http_date_is_parsed():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=lambda: 1445412480.0) == pytest.approx(30.0)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412600.0) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_retry_after_longer_than_the_policy_allows_gives_up_at_once(server, sleeps):
    server.answer(Scripted(status=429, headers={"Retry-After": "120"}))
    transport = make(server, sleeps, retry=RetryPolicy(max_retry_after=30))
    with pytest.raises(CloudUnavailable, match="Retry-After"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline(200))
    assert len(server.seen) == 1
    assert sleeps == []


def test_never_sleeps_past_the_deadline(server, sleeps):
    server.answer(Scripted(status=503, headers={"Retry-After": "3"}))
    transport = make(server, sleeps)
    with pytest.raises(CloudUnavailable, match="deadline"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline(1.0))
    assert sleeps == []
    assert len(server.seen) == 1


def test_too_short_deadline_sends_nothing(server, sleeps):
    transport = make(server, sleeps)
    with pytest.raises(DeadlineTooShort):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline(0.1))
    assert server.seen == []


def test_post_is_not_retried_on_500(server, sleeps):
    server.answer(Scripted(status=500, body={"message": "internal"}))
    transport = make(server, sleeps)
    with pytest.raises(CloudUnavailable):
        transport.request("POST", "/x", endpoint="/x", deadline=deadline(), json_body={})
    assert len(server.seen) == 1


def test_post_is_retried_on_429_only(server, sleeps):
    server.answer(
        Scripted(status=429, headers={"Retry-After": "1"}),
        Scripted(status=429, headers={"Retry-After": "0"}),
        Scripted(body={"done": True}),
    )
    transport = make(server, sleeps)
    assert transport.request("POST", "/x", endpoint="/x", deadline=deadline(), json_body={}).body == {"done": True}
    assert len(server.seen) == 3
    assert sleeps == [1.0]  # Retry-After: 0 needs no sleep


@pytest.mark.parametrize("status", [500, 502, 503, 504])
@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_write_answered_5xx_is_never_repeated_and_may_have_been_applied(server, sleeps, status, method):
    # Even with Retry-After: the service may have applied the write before failing to answer it.
    server.answer(Scripted(status=status, headers={"Retry-After": "0"}), Scripted(body={"done": True}))
    transport = make(server, sleeps)
    with pytest.raises(CloudOutcomeUnknown, match="may have been applied") as info:
        transport.request(method, "/x", endpoint="/x", deadline=deadline(), json_body={"size": 3})
    assert len(server.seen) == 1
    # 500 and 503 come from the service itself: it is done with the request. 502/504: a gateway gave up.
    assert info.value.finished == (status in (500, 503))


def test_an_idempotent_delete_is_retried_but_reports_that_it_may_have_been_applied(server, sleeps):
    server.answer(Scripted(status=500), Scripted(status=502))
    transport = make(server, sleeps, retry=RetryPolicy(attempts=2, base_delay=0))
    with pytest.raises(CloudOutcomeUnknown) as info:
        transport.request("DELETE", "/n/1", endpoint="/n/{id}", deadline=deadline())
    assert len(server.seen) == 2
    assert not info.value.finished  # the 502 may still be applied later


def test_a_write_refused_by_the_rate_limiter_was_not_applied(server, sleeps):
    server.answer(Scripted(status=429, headers={"Retry-After": "0"}))
    transport = make(server, sleeps, retry=RetryPolicy(attempts=2, base_delay=0))
    with pytest.raises(CloudUnavailable) as info:
        transport.request("PATCH", "/x", endpoint="/x", deadline=deadline(), json_body={})
    assert not isinstance(info.value, CloudOutcomeUnknown)
    assert len(server.seen) == 2


def test_idempotent_flag_overrides_the_method_default(server, sleeps):
    server.answer(Scripted(status=502), Scripted(body={}))
    transport = make(server, sleeps)
    transport.request("POST", "/search", endpoint="/search", deadline=deadline(), idempotent=True)
    assert len(server.seen) == 2
    server.seen.clear()
    server.answer(Scripted(status=502))
    with pytest.raises(CloudUnavailable):
        transport.request("PATCH", "/x", endpoint="/x", deadline=deadline(), idempotent=False)
    assert len(server.seen) == 1


def test_a_login_post_that_fails_is_unavailable_not_an_unknown_cloud_change(server, sleeps):
    # A token request changes nothing the server tracks: its 5xx must not read as "the change may have
    # been applied" (which would make an IncreaseSize that never sent its PATCH read the pool back).
    server.answer(Scripted(status=503), Scripted(status=503))
    transport = make(server, sleeps, retry=RetryPolicy(attempts=2, base_delay=0))
    with pytest.raises(CloudUnavailable) as info:
        transport.request(
            "POST", "/token", endpoint="/token", deadline=deadline(), idempotent=True, changes_cloud=False
        )
    assert not isinstance(info.value, CloudOutcomeUnknown)
    assert len(server.seen) == 2


def test_read_timeout_of_non_idempotent_call_is_an_unknown_outcome_at_once(server, sleeps):
    server.answer(Scripted(body={}, delay=1.5))
    transport = make(server, sleeps, max_timeout=0.3)
    with pytest.raises(CloudOutcomeUnknown, match="may or may not"):
        transport.request("PATCH", "/pools/p", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 1})
    assert len(server.seen) == 1
    assert sleeps == []


def test_read_timeout_of_idempotent_call_is_retried_then_cloud_timeout(server, sleeps):
    server.answer(Scripted(body={}, delay=1.0))
    transport = make(server, sleeps, max_timeout=0.2, retry=RetryPolicy(attempts=2, base_delay=0))
    with pytest.raises(CloudTimeout):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert len(server.seen) == 2


def test_a_body_slower_than_the_deadline_is_a_timeout(server, sleeps):
    # The body is read inside the attempt; a stall there is a read timeout like a late answer (with
    # requests it was reported as a failed connection for a GET).
    server.answer(Scripted(body={"pools": list(range(50))}, body_delay=1.0))
    transport = make(server, sleeps, max_timeout=0.2, retry=RetryPolicy(attempts=1))
    with pytest.raises(CloudTimeout, match=r"got no answer within request_timeout \(0.2s, the testcloud backend"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())


def test_a_timeout_names_its_real_cause_request_timeout_or_the_callers_deadline(server, sleeps, caplog):
    # The attempt was cut by request_timeout: the caller's deadline had plenty left.
    server.answer(Scripted(body={}, delay=1.0))
    transport = make(server, sleeps, max_timeout=0.2, retry=RetryPolicy(attempts=1))
    with caplog.at_level(logging.WARNING, logger="providers.http"), pytest.raises(CloudTimeout) as capped:
        transport.request("GET", "/x", endpoint="/x", deadline=Deadline.after(10))
    assert "within request_timeout (0.2s" in str(capped.value) and "caller's deadline" not in str(capped.value)
    assert "-> timeout (no answer within request_timeout (0.2s" in caplog.records[-1].getMessage()
    # The caller's deadline left less than request_timeout: that is what cut the attempt.
    server.answer(Scripted(body={}, delay=2.0))
    transport = make(server, sleeps, max_timeout=30, retry=RetryPolicy(attempts=1))
    with caplog.at_level(logging.WARNING, logger="providers.http"), pytest.raises(CloudTimeout) as cut:
        transport.request("GET", "/x", endpoint="/x", deadline=Deadline.after(1.0))
    message = str(cut.value)
    assert "s the caller's deadline left (below request_timeout, 30s)" in message
    assert "request_timeout (" not in message
    assert "the caller's deadline left" in caplog.records[-1].getMessage()


def test_dropped_connection_of_non_idempotent_call_is_outcome_unknown(server, sleeps):
    server.answer(Scripted(drop=True))
    transport = make(server, sleeps)
    with pytest.raises(CloudOutcomeUnknown, match="may or may not") as info:
        transport.request("DELETE", "/n/1", endpoint="/n/{id}", deadline=deadline(), idempotent=False)
    assert not info.value.finished
    assert len(server.seen) == 1


def test_dropped_connection_of_idempotent_call_is_retried(server, sleeps):
    server.answer(Scripted(drop=True), Scripted(body={"ok": True}))
    transport = make(server, sleeps)
    assert transport.request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": True}
    assert len(server.seen) == 2


def test_connection_refused_is_retried_even_for_post_then_unavailable(sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # nothing listens on ``port`` any more: every connect is refused, so the POST never reached anyone
    transport = HttpTransport("testcloud", f"http://127.0.0.1:{port}", user_agent="t", sleep=sleeps.append)
    with pytest.raises(CloudUnavailable, match="connection refused") as info:
        transport.request("POST", "/x", endpoint="/x", deadline=deadline(), json_body={})
    assert not isinstance(info.value, CloudTimeout)
    assert len(sleeps) == RetryPolicy().attempts - 1


# ---------------------------------------------------------------------- answers and errors


def test_401_refreshes_credentials_once_and_retries_once(server, sleeps):
    calls: list[bool] = []

    def auth(force: bool) -> dict[str, str]:
        calls.append(force)
        return {"X-Auth-Token": "fresh" if force else "stale"}

    server.answer(Scripted(status=401, body={"message": "expired"}), Scripted(body={"ok": True}))
    transport = make(server, sleeps, auth=auth)
    assert transport.request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": True}
    assert calls == [False, True]
    assert [s.headers["x-auth-token"] for s in server.seen] == ["stale", "fresh"]


def test_second_401_is_final_auth_failure(server, sleeps):
    calls: list[bool] = []
    server.answer(Scripted(status=401, body={"message": "authentication is denied"}))
    transport = make(server, sleeps, auth=lambda force: calls.append(force) or {"X-Auth-Token": SECRET})
    with pytest.raises(CloudAuthFailed, match="authentication is denied") as info:
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert calls == [False, True]
    assert len(server.seen) == 2
    assert SECRET not in str(info.value)


def test_403_is_auth_failure_without_refresh(server, sleeps):
    calls: list[bool] = []
    server.answer(Scripted(status=403, body={"message": "permissions denied"}))
    transport = make(server, sleeps, auth=lambda force: calls.append(force) or {})
    with pytest.raises(CloudAuthFailed, match="permission"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert calls == [False]


def test_4xx_is_rejected_with_the_cloud_message_and_status(server, sleeps):
    server.answer(Scripted(status=409, body={"message": "pool is upgrading", "type": "transient_state"}))
    transport = make(server, sleeps, error_message=lambda status, body: f"{body['type']}: {body['message']}")
    with pytest.raises(CloudRequestRejected, match="transient_state: pool is upgrading") as info:
        transport.request("PATCH", "/pools/p", endpoint="/pools/{pool_id}", deadline=deadline(), json_body={})
    assert info.value.status == 409
    assert "/pools/{pool_id}" in str(info.value)
    assert len(server.seen) == 1


def test_error_messages_never_contain_registered_secrets(server, sleeps):
    server.answer(Scripted(status=400, body={"message": f"bad token {SECRET}"}))
    transport = make(server, sleeps, secrets=[SECRET])
    with pytest.raises(CloudRequestRejected) as info:
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert SECRET not in str(info.value)
    assert "***" in str(info.value)


def test_invalid_json_is_a_malformed_answer(server, sleeps):
    server.answer(Scripted(body=b'{"pools": [1, 2'))
    transport = make(server, sleeps)
    with pytest.raises(CloudUnavailable, match="malformed answer"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())


def test_non_json_content_type_is_a_malformed_answer(server, sleeps):
    server.answer(Scripted(body=b"<html>login</html>", content_type="text/html"))
    transport = make(server, sleeps)
    with pytest.raises(CloudUnavailable, match="malformed answer.*text/html"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())


@pytest.mark.parametrize(
    "answer",
    [
        Scripted(status=200),  # empty, no Content-Type
        Scripted(status=204, headers={"Content-Type": "application/json"}),  # empty, a JSON type
        Scripted(status=200, body={"size": 3}),
        Scripted(status=202, body={"message": "Deleting node n1", "force": False}),
    ],
    ids=["empty-200", "empty-204-json", "record", "message"],
)
@pytest.mark.parametrize("method", ["PATCH", "DELETE"])
def test_a_write_answered_2xx_with_no_body_or_the_apis_json_is_done(server, sleeps, answer, method):
    server.answer(answer)
    transport = make(server, sleeps, breaker=BreakerSettings(failure_threshold=1))
    reply = transport.request(method, "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 3})
    assert (reply.status, reply.body) == (answer.status, answer.body or None)
    assert len(server.seen) == 1 and sleeps == []
    assert transport.breaker_state == "closed"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (Scripted(status=200, body=b"OK", content_type="text/plain"), "content type 'text/plain', not JSON"),
        (Scripted(status=202, body=b"<html>accepted</html>", content_type="text/html"), "'text/html', not JSON"),
        (Scripted(status=200, body=b'{"size": 3', content_type="application/json"), "invalid JSON"),
        (Scripted(status=200, body=b'"OK"', content_type="application/json"), "JSON str, not an object"),
    ],
    ids=["text", "html-202", "invalid-json", "not-an-object"],
)
@pytest.mark.parametrize("method", ["PATCH", "DELETE", "POST"])
def test_a_write_answered_2xx_with_a_body_that_is_not_the_apis_is_an_unknown_outcome(
    server, sleeps, answer, problem, method
):
    # Issue 40, item 4: a proxy's page may come whether or not the write went on: read back, never taken as done.
    server.answer(answer)
    transport = make(server, sleeps)
    with pytest.raises(CloudOutcomeUnknown, match="not the API's answer") as unknown:
        transport.request(method, "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 3})
    assert problem in str(unknown.value) and not unknown.value.finished
    assert len(server.seen) == 1 and sleeps == [], "sent once: a write with an unknown outcome is not repeated"


def test_a_read_or_a_login_answered_2xx_with_a_json_value_that_is_not_an_object_is_returned(server, sleeps):
    # Whether a list or a value fits is the caller's to say (a listing checks its own shape).
    server.answer(Scripted(body=[1, 2]), Scripted(body=[3]))
    transport = make(server, sleeps)
    assert transport.request("GET", "/x", endpoint="/x", deadline=deadline()).body == [1, 2]
    assert transport.request("POST", "/t", endpoint="/t", deadline=deadline(), changes_cloud=False).body == [3]


def test_a_429_says_the_rate_limiter_refused(server, sleeps):
    # Scaleway's gateway: no body, no Content-Type, no Retry-After (docs/reference/scaleway.md, "Evidence").
    server.answer(Scripted(status=429, headers={"X-Envoy-Ratelimited": "true"}))
    transport = make(server, sleeps, retry=RetryPolicy(attempts=2, base_delay=0.2))
    with pytest.raises(CloudUnavailable, match=r"answered 429; the cloud's rate limiter refused it"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert len(server.seen) == 2 and sleeps == [pytest.approx(0.1)]  # backoff, as no Retry-After came


def test_a_refusal_carries_the_clouds_json_body(server, sleeps):
    body = {"message": "resource is in a transient state", "current_state": "upgrading", "type": "transient_state"}
    server.answer(Scripted(status=409, body=body))
    with pytest.raises(CloudRequestRejected) as info:
        make(server, sleeps).request("PATCH", "/p", endpoint="/p", deadline=deadline(), json_body={})
    assert info.value.body == body
    server.answer(Scripted(status=409, body=b"<html>conflict</html>", content_type="text/html"))
    with pytest.raises(CloudRequestRejected) as info:
        make(server, sleeps).request("PATCH", "/p", endpoint="/p", deadline=deadline(), json_body={})
    assert info.value.body is None


def test_json_with_charset_is_accepted(server, sleeps):
    server.answer(Scripted(body=b'{"a": 1}', content_type="application/json; charset=utf-8"))
    assert make(server, sleeps).request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"a": 1}


# ---------------------------------------------------------------------- breaker and metrics


def test_breaker_opens_fails_fast_then_half_open_probe_closes_it(server, sleeps):
    clock = FakeClock()
    metrics = RecordingMetrics()
    transport = make(
        server,
        sleeps,
        clock=clock,
        retry=RetryPolicy(attempts=1),
        breaker=BreakerSettings(failure_threshold=2, reset_after=30),
    )
    transport.instrument(metrics)
    server.answer(Scripted(status=500))
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "open"
    with pytest.raises(CloudUnavailable, match="circuit breaker open"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert len(server.seen) == 2  # the third call was not sent

    clock.now += 31
    assert transport.breaker_state == "half-open"
    server.answer(Scripted(body={"ok": True}))
    transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "closed"
    assert metrics.breaker == ["closed", "open", "half-open", "closed"]


def test_failed_half_open_probe_reopens_the_breaker(server, sleeps):
    clock = FakeClock()
    transport = make(
        server, sleeps, clock=clock, retry=RetryPolicy(attempts=3), breaker=BreakerSettings(1, reset_after=10)
    )
    server.answer(Scripted(status=503))
    with pytest.raises(CloudUnavailable):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "open"
    seen_before = len(server.seen)
    clock.now += 11
    with pytest.raises(CloudUnavailable, match="answered 503"):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert len(server.seen) == seen_before + 1  # the probe is a single attempt
    assert transport.breaker_state == "open"


def test_half_open_probe_answered_with_a_refusal_closes_the_breaker(server, sleeps):
    # A 404 (or 401/403) is the cloud answering: it is back, so the breaker must not stay half-open.
    clock = FakeClock()
    transport = make(
        server, sleeps, clock=clock, retry=RetryPolicy(attempts=1), breaker=BreakerSettings(1, reset_after=10)
    )
    server.answer(Scripted(status=503))
    with pytest.raises(CloudUnavailable):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "open"
    clock.now += 11
    server.answer(Scripted(status=404, body={"message": "not found"}))
    with pytest.raises(CloudRequestRejected):
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "closed"


def test_client_errors_do_not_open_the_breaker(server, sleeps):
    transport = make(server, sleeps, breaker=BreakerSettings(failure_threshold=1))
    server.answer(Scripted(status=404, body={"message": "not found"}))
    for _ in range(3):
        with pytest.raises(CloudRequestRejected):
            transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert transport.breaker_state == "closed"


def test_every_attempt_is_reported_with_the_route_template(server, sleeps):
    metrics = RecordingMetrics()
    transport = make(server, sleeps)
    transport.instrument(metrics)
    server.answer(Scripted(status=503), Scripted(body={}))
    transport.request("GET", "/pools/abc-123", endpoint="/pools/{pool_id}", deadline=deadline())
    assert metrics.requests == [
        ("testcloud", "/pools/{pool_id}", "GET", 503, False),
        ("testcloud", "/pools/{pool_id}", "GET", 200, True),
    ]


def test_retry_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        BreakerSettings(failure_threshold=0)


def test_a_403_the_cloud_marks_as_not_about_credentials_is_a_rejection(server, sleeps):
    server.answer(Scripted(status=403, body={"message": "quota(s) exceeded", "type": "quotas_exceeded"}))
    transport = make(server, sleeps, is_auth_failure=lambda status, body: body.get("type") != "quotas_exceeded")
    with pytest.raises(CloudRequestRejected, match="quota") as info:
        transport.request("PATCH", "/x", endpoint="/x", deadline=deadline(), json_body={})
    assert info.value.status == 403


def test_credentials_in_the_base_url_never_reach_messages(sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = HttpTransport(
        "testcloud", f"http://user:{SECRET}@127.0.0.1:{port}", user_agent="t", sleep=sleeps.append
    )
    with pytest.raises(CloudUnavailable) as info:
        transport.request("GET", "/x", endpoint="/x", deadline=deadline())
    assert SECRET not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_bytes_that_are_not_text_are_a_malformed_answer(server, sleeps):
    server.answer(Scripted(body=b'{"a": "\x80"}', content_type="application/json"))
    with pytest.raises(CloudUnavailable, match="malformed answer.*not UTF-8"):
        make(server, sleeps).request("GET", "/x", endpoint="/x", deadline=deadline())


# ---------------------------------------------------------------------- the write gate (leader election)


class Gate:
    """Open until ``close()``; records what it was asked about."""

    def __init__(self) -> None:
        self.open = True
        self.asked: list[str] = []

    def __call__(self, what: str) -> float:
        self.asked.append(what)
        if not self.open:
            raise NotLeader(f"{what} not sent: this replica is not the leader")
        return 5.0


def test_a_closed_write_gate_stops_a_write_before_it_is_sent(server, sleeps):
    gate = Gate()
    transport = make(server, sleeps)
    transport.guard_writes(gate)
    transport.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 2})
    gate.open = False
    with pytest.raises(NotLeader, match="not the leader"):
        transport.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 3})
    assert [s.method for s in server.seen] == ["PATCH"]
    assert gate.asked == ["PATCH /pools/{id}", "PATCH /pools/{id}"]
    assert transport.breaker_state == "closed", "a refusal of our own gate says nothing about the cloud"


def test_the_write_gate_leaves_reads_and_logins_alone(server, sleeps):
    gate = Gate()
    gate.open = False
    transport = make(server, sleeps)
    transport.guard_writes(gate)
    transport.request("GET", "/pools", endpoint="/pools", deadline=deadline())
    transport.request("POST", "/tokens", endpoint="/tokens", deadline=deadline(), changes_cloud=False)
    assert len(server.seen) == 2 and gate.asked == []


def test_a_gate_closing_between_attempts_stops_the_retry_and_keeps_the_unknown_outcome(server, sleeps):
    gate = Gate()
    server.answer(Scripted(status=502))

    def close_gate_then_sleep(seconds: float) -> None:
        gate.open = False
        sleeps.append(seconds)

    transport = HttpTransport(
        "testcloud", server.url, user_agent="ca-externalgrpc-test/1", sleep=close_gate_then_sleep, rng=lambda: 0.5
    )
    transport.guard_writes(gate)
    with pytest.raises(CloudOutcomeUnknown, match="not the leader"):
        transport.request("DELETE", "/nodes/n1", endpoint="/nodes/{id}", deadline=deadline())
    assert len(server.seen) == 1, "the retry of the idempotent DELETE was stopped by the gate"


def test_the_write_gate_is_asked_once_the_connection_is_ready_not_before(server, sleeps):
    # A connection that never opens asks nothing: the gate's answer would be stale by the time a slow
    # connect (or TLS handshake) ended, and a write gated before it could reach the cloud too late.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gate = Gate()
    refused = HttpTransport("testcloud", f"http://127.0.0.1:{port}", user_agent="t", sleep=sleeps.append)
    refused.guard_writes(gate)
    with pytest.raises(CloudUnavailable, match="connection refused"):
        refused.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 2})
    assert gate.asked == []
    # Once connected, it is asked, and what it answers bounds the sending; a closed gate sends nothing.
    transport = make(server, sleeps)
    transport.guard_writes(gate)
    transport.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 2})
    assert gate.asked == ["PATCH /pools/{id}"] and len(server.seen) == 1


def test_a_write_carries_the_writer_its_gate_names_and_only_then(server, sleeps):
    # Issue 30: with leader election every cloud write names the Lease holder and its term, so the cloud's
    # (or a proxy's) request log tells which leadership term made it; reads and ungated writes carry nothing.
    transport = make(server, sleeps)
    transport.guard_writes(lambda what: WriteGrant(5.0, "replica-a_1a2b3c4d; term=7"))
    transport.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 2})
    transport.request("GET", "/pools", endpoint="/pools", deadline=deadline())
    plain = make(server, sleeps)
    plain.guard_writes(Gate())
    plain.request("PATCH", "/pools/p1", endpoint="/pools/{id}", deadline=deadline(), json_body={"size": 3})
    writers = [seen.headers.get(WRITER_HEADER.lower()) for seen in server.seen]
    assert writers == ["replica-a_1a2b3c4d; term=7", None, None]


# ---------------------------------------------------------------------- the wire: query, body, headers, redirects


def test_params_are_encoded_as_requests_encoded_them(server, sleeps):
    transport = make(server, sleeps)
    params = {"page": 2, "name": "a b&c/é", "tag": ["x", "y"], "absent": None, "flag": True}
    transport.request("GET", "/pools", endpoint="/pools", deadline=deadline(), params=params)
    assert server.seen[0].path == "/pools?page=2&name=a+b%26c%2F%C3%A9&tag=x&tag=y&flag=True"
    transport.request("GET", "/pools?order=asc", endpoint="/pools", deadline=deadline(), params={"page": 1})
    assert server.seen[1].path == "/pools?order=asc&page=1"
    transport.request("GET", "/pools", endpoint="/pools", deadline=deadline(), params={"absent": None})
    assert server.seen[2].path == "/pools"


def test_json_body_bytes_and_default_headers_match_what_requests_sent(server, sleeps):
    transport = make(server, sleeps)
    body = {"size": 5, "name": "pool é", "nested": [1, None]}
    transport.request("POST", "/x", endpoint="/x", deadline=deadline(), json_body=body)
    seen = server.seen[0]
    assert seen.body == json.dumps(body).encode()  # default separators, ASCII escapes
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["accept"] == "application/json"
    assert seen.headers["accept-encoding"] == "gzip, deflate"
    transport.request("GET", "/x", endpoint="/x", deadline=deadline(), headers={"accept": "text/plain"})
    assert server.seen[1].headers["accept"] == "text/plain", "a caller's header replaces the default whatever its case"
    assert "content-type" not in server.seen[1].headers


def test_a_body_that_is_not_json_is_refused_before_anything_is_sent(server, sleeps):
    with pytest.raises(ValueError):
        make(server, sleeps).request("POST", "/x", endpoint="/x", deadline=deadline(), json_body={"x": float("nan")})
    assert server.seen == []


def test_gzip_answers_are_decoded(server, sleeps):
    server.answer(Scripted(body=gzip.compress(b'{"ok": 1}'), headers={"Content-Encoding": "gzip"}))
    assert make(server, sleeps).request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": 1}


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_refused_not_followed(server, sleeps, status):
    location = f"http://elsewhere.example/v1/pools?token={SECRET}"
    server.answer(Scripted(status=status, headers={"Location": location}))
    transport = make(server, sleeps)
    with pytest.raises(CloudRequestRejected, match="redirect to http://elsewhere.example/v1/pools;") as info:
        transport.request("GET", "/pools", endpoint="/pools", deadline=deadline(), headers={"X-Auth-Token": SECRET})
    assert info.value.status == status
    assert SECRET not in str(info.value)
    assert len(server.seen) == 1, "neither followed nor retried"
    assert transport.breaker_state == "closed"


# ---------------------------------------------------------------------- proxies from the environment

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No proxy or CA variables from the machine running the tests."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
    http_transport._tls_context.cache_clear()
    yield monkeypatch
    http_transport._tls_context.cache_clear()


def test_proxy_is_chosen_by_the_url_scheme(clean_env):
    clean_env.setenv("HTTPS_PROXY", "http://secure-proxy:3128")
    clean_env.setenv("HTTP_PROXY", "plain-proxy:3128")
    assert proxy_for("https://api.scaleway.com") == "http://secure-proxy:3128"
    assert proxy_for("http://api.scaleway.com") == "http://plain-proxy:3128", "no scheme means http://"
    clean_env.setenv("https_proxy", "http://lower:1")
    assert proxy_for("https://api.scaleway.com") == "http://lower:1", "the lower-case variable wins"
    clean_env.delenv("https_proxy")
    clean_env.delenv("HTTPS_PROXY")
    clean_env.setenv("ALL_PROXY", "http://any:8080")
    assert proxy_for("https://api.scaleway.com") == "http://any:8080"


def test_no_proxy_names_hosts_domains_ports_and_cidr_ranges(clean_env):
    clean_env.setenv("HTTPS_PROXY", "http://proxy:3128")
    clean_env.setenv("NO_PROXY", "internal.example, .corp.example,10.0.0.0/8, pinned.example:8443")
    assert proxy_for("https://internal.example") is None
    assert proxy_for("https://api.internal.example") is None
    assert proxy_for("https://manage.corp.example") is None
    assert proxy_for("https://10.1.2.3:6443") is None
    assert proxy_for("https://pinned.example:8443") is None
    assert proxy_for("https://11.1.2.3") == "http://proxy:3128"
    assert proxy_for("https://notinternal.example") == "http://proxy:3128"
    assert proxy_for("https://api.scaleway.com") == "http://proxy:3128"
    clean_env.setenv("NO_PROXY", "*")
    assert proxy_for("https://api.scaleway.com") is None


def test_no_proxy_in_the_environment_means_direct(clean_env):
    assert proxy_for("https://api.scaleway.com") is None


def test_a_socks_proxy_is_refused_with_a_clear_message(clean_env):
    clean_env.setenv("HTTPS_PROXY", f"socks5://user:{SECRET}@proxy:1080")
    with pytest.raises(ValueError, match="only http:// and https:// proxies") as info:
        HttpTransport("testcloud", "https://api.example.test", user_agent="t")
    assert SECRET not in str(info.value)


def test_calls_go_through_the_proxy_with_its_credentials(clean_env, server, sleeps):
    # The scripted server plays the proxy: a proxied plain-HTTP request carries the absolute URL.
    clean_env.setenv("HTTP_PROXY", server.url.replace("http://", "http://proxy%20user:p%40ss@"))
    transport = HttpTransport("testcloud", "http://api.example.test:8080", user_agent="t", sleep=sleeps.append)
    transport.request("GET", "/pools", endpoint="/pools", deadline=deadline(), params={"page": 1})
    seen = server.seen[0]
    assert seen.path == "http://api.example.test:8080/pools?page=1"
    assert seen.headers["proxy-authorization"] == "Basic cHJveHkgdXNlcjpwQHNz"  # "proxy user:p@ss"


def test_a_refused_proxy_is_a_connection_that_never_opened(clean_env, sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    transport = HttpTransport("testcloud", "http://api.example.test", user_agent="t", sleep=sleeps.append)
    with pytest.raises(CloudUnavailable, match="connection refused") as info:
        transport.request("POST", "/x", endpoint="/x", deadline=deadline(), json_body={})
    assert not isinstance(info.value, CloudOutcomeUnknown)
    assert len(sleeps) == RetryPolicy().attempts - 1, "never sent, so even a POST is retried"


def test_no_proxy_sends_loopback_calls_direct(clean_env, server, sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    clean_env.setenv("NO_PROXY", "127.0.0.0/8")
    assert make(server, sleeps).request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": True}
    assert server.seen[0].path == "/x"


# ---------------------------------------------------------------------- TLS verification


@pytest.fixture
def pki(tmp_path: Path):
    return make_pki(tmp_path / "pki")


def tls_server(cert: Path, key: Path) -> ScriptedServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return ScriptedServer(tls=context)


def test_tls_is_verified_against_the_system_trust_store_by_default(clean_env, pki, sleeps):
    srv = tls_server(pki.server_cert, pki.server_key)
    try:
        transport = make(srv, sleeps, retry=RetryPolicy(attempts=1))
        with pytest.raises(CloudUnavailable, match="connection failed"):
            transport.request("GET", "/x", endpoint="/x", deadline=deadline())
        assert srv.seen == [], "nothing is sent to a server whose certificate does not verify"
    finally:
        srv.stop()


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_a_ca_bundle_from_the_environment_is_trusted(clean_env, pki, sleeps, variable):
    clean_env.setenv(variable, str(pki.ca_cert))
    srv = tls_server(pki.server_cert, pki.server_key)
    try:
        assert make(srv, sleeps).request("GET", "/x", endpoint="/x", deadline=deadline()).body == {"ok": True}
    finally:
        srv.stop()


def test_a_certificate_for_another_host_name_is_refused(clean_env, tmp_path, sleeps):
    other = make_pki(tmp_path / "other", hosts=("api.elsewhere.example",))
    clean_env.setenv("REQUESTS_CA_BUNDLE", str(other.ca_cert))
    srv = tls_server(other.server_cert, other.server_key)
    try:
        with pytest.raises(CloudUnavailable, match="connection failed"):
            make(srv, sleeps, retry=RetryPolicy(attempts=1)).request("GET", "/x", endpoint="/x", deadline=deadline())
        assert srv.seen == []
    finally:
        srv.stop()


def test_an_unreadable_ca_bundle_stops_the_transport_from_being_made(clean_env, tmp_path):
    clean_env.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE .*missing.pem"):
        HttpTransport("testcloud", "https://api.example.test", user_agent="t")


# ---------------------------------------------------------------------- what the server process loads


def test_the_server_loads_neither_requests_nor_its_extras():
    # They cost about 4 MiB of RSS; the transport uses urllib3 directly.
    unwanted = ("requests", "charset_normalizer", "idna", "certifi", "urllib3.contrib")
    probe = f"import sys, server.app; print([m for m in {unwanted!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
