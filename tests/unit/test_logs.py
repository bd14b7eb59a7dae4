"""server.logs: JSON lines with the documented fields, a text format, and secrets never written."""

from __future__ import annotations

import io
import json
import logging

import pytest

from server.logs import MASK, clear_registered_secrets, configure_logging, redact, register_secret


@pytest.fixture
def capture():
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()

    def make(fmt: str = "json", level: str = "debug") -> io.StringIO:
        configure_logging(fmt, level, stream=stream)
        return stream

    yield make
    clear_registered_secrets()
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_line_has_ts_level_logger_msg_and_extra_fields(capture):
    out = capture("json")
    logging.getLogger("server.service").info(
        "scaled %s",
        "up",
        extra={
            "grpc_method": "NodeGroupIncreaseSize",
            "grpc_code": "OK",
            "node_group": "pool-a",
            "backend": "scw-par",
            "delta": 2,
            "result": "ok",
            "duration_ms": 12.5,
        },
    )
    (doc,) = lines(out)
    assert doc["msg"] == "scaled up"
    assert doc["level"] == "info"
    assert doc["logger"] == "server.service"
    assert doc["ts"].endswith("Z") and "T" in doc["ts"]
    assert doc["delta"] == 2 and doc["duration_ms"] == 12.5
    for key in ("grpc_method", "grpc_code", "node_group", "backend", "result"):
        assert key in doc


def test_json_timestamp_is_rfc3339(capture):
    import datetime as dt

    out = capture("json")
    logging.getLogger("x").warning("w")
    ts = lines(out)[0]["ts"]
    parsed = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None


def test_every_line_is_valid_json_even_with_exceptions_and_odd_values(capture):
    out = capture("json")
    log = logging.getLogger("x")
    try:
        raise RuntimeError("boom\nwith newline")
    except RuntimeError:
        log.exception("failed", extra={"obj": object(), "items": [1, "a"]})
    docs = lines(out)
    assert len(docs) == 1
    assert "RuntimeError" in docs[0]["exc"]


def test_level_filters_debug(capture):
    out = capture("json", "info")
    logging.getLogger("x").debug("hidden")
    logging.getLogger("x").info("shown")
    assert [d["msg"] for d in lines(out)] == ["shown"]


def test_text_format_is_one_human_line_with_extras(capture):
    out = capture("text")
    logging.getLogger("server.app").info("serving", extra={"address": "127.0.0.1:8086"})
    line = out.getvalue().strip()
    assert "INFO" in line and "server.app serving" in line and "address=127.0.0.1:8086" in line


def test_registered_secret_masked_in_message_args_extra_and_traceback(capture):
    out = capture("json")
    secret = "8f0d2c3a-11aa-4bbb-9ccc-0123456789ab"
    register_secret(secret)
    log = logging.getLogger("providers.scaleway")
    log.info("calling with %s", secret, extra={"header": f"X-Other: {secret}", "nested": {"k": [secret]}})
    try:
        raise ValueError(f"rejected key {secret}")
    except ValueError:
        log.exception("oops")
    text = out.getvalue()
    assert secret not in text
    assert MASK in text


@pytest.mark.parametrize(
    "raw, leaked",
    [
        ("X-Auth-Token: gAAAAABsecretvalue", "gAAAAABsecretvalue"),
        ("headers={'X-Auth-Token': 'tok-123456'}", "tok-123456"),
        ('{"password": "hunter2-long", "email": "a@b.c"}', "hunter2-long"),
        ("secret_key=abcd-efgh-ijkl", "abcd-efgh-ijkl"),
        ("POST /token?password=p4ssw0rd&user=x", "p4ssw0rd"),
        ('{"app_credential_secret":"cred-secret-1"}', "cred-secret-1"),
        ("Authorization: Bearer eyJhbGciOi.payload", "eyJhbGciOi.payload"),
        ("token=abc123def", "abc123def"),
    ],
)
def test_secret_looking_pairs_are_masked(raw, leaked):
    assert leaked not in redact(raw)


def test_non_secret_text_is_left_alone():
    text = "node group pool-a target 3 -> 5 (grpc_timeout=5s)"
    assert redact(text) == text


def test_extra_field_with_secret_name_is_masked_whole(capture):
    out = capture("json")
    logging.getLogger("x").info("cfg", extra={"secret_key": "zzzz-yyyy", "password": "pw-1234"})
    doc = lines(out)[0]
    assert doc["secret_key"] == MASK and doc["password"] == MASK


def test_text_format_masks_secrets_too(capture):
    out = capture("text")
    register_secret("super-secret-value")
    logging.getLogger("x").error("failed with super-secret-value", extra={"detail": "super-secret-value"})
    assert "super-secret-value" not in out.getvalue()


def test_reconfiguring_replaces_our_handler_instead_of_stacking(capture):
    out = capture("json")
    capture("json")
    logging.getLogger("x").info("once")
    assert len(lines(out)) == 1


def test_bad_format_or_level_is_rejected():
    with pytest.raises(ValueError):
        configure_logging("xml", "info", stream=io.StringIO())
    with pytest.raises(ValueError):
        configure_logging("json", "loud", stream=io.StringIO())
