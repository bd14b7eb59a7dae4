"""server.logs: Kubernetes structured-logging JSON lines, a text format, and secrets never written."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from server.logs import MASK, clear_registered_secrets, configure_logging, kubernetes_key, redact, register_secret


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


def test_json_line_has_the_kubernetes_fields_and_camel_case_extra_fields(capture):
    out = capture("json")
    logging.getLogger("server.rpc").info(
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
    assert list(doc)[:5] == ["ts", "caller", "logger", "msg", "v"]
    assert doc["msg"] == "scaled up"
    assert doc["v"] == 0
    assert doc["logger"] == "server.rpc"
    assert doc["caller"].startswith("unit/test_logs.py:")
    assert doc["delta"] == 2 and doc["durationMs"] == 12.5
    assert doc["grpcMethod"] == "NodeGroupIncreaseSize" and doc["nodeGroup"] == "pool-a"
    for key in ("grpcCode", "backend", "result"):
        assert key in doc
    assert "level" not in doc and "grpc_method" not in doc


def test_json_timestamp_is_unix_milliseconds(capture):
    out = capture("json")
    before = time.time() * 1000
    logging.getLogger("x").warning("w")
    after = time.time() * 1000
    ts = lines(out)[0]["ts"]
    assert isinstance(ts, float) and before - 1 <= ts <= after + 1


def test_verbosity_follows_klog_info_is_0_debug_is_4_errors_have_none(capture):
    out = capture("json", "debug")
    log = logging.getLogger("x")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e", extra={"error": "cloud said no"})
    docs = {d["msg"]: d for d in lines(out)}
    assert (docs["d"]["v"], docs["i"]["v"], docs["w"]["v"]) == (4, 0, 0)
    assert "v" not in docs["e"]
    assert docs["e"]["err"] == "cloud said no"


def test_every_line_is_valid_json_even_with_exceptions_and_odd_values(capture):
    out = capture("json")
    log = logging.getLogger("x")
    try:
        raise RuntimeError("boom\nwith newline")
    except RuntimeError:
        log.exception("failed", extra={"obj": object(), "items": [1, "a"]})
    docs = lines(out)
    assert len(docs) == 1
    assert docs[0]["err"] == "RuntimeError: boom\nwith newline"
    assert "Traceback" in docs[0]["stacktrace"] and "v" not in docs[0]


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
    log = logging.getLogger("providers.scaleway.client")
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
    assert doc["secretKey"] == MASK and doc["password"] == MASK


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


@pytest.mark.parametrize(
    "name, key",
    [
        ("grpc_method", "grpcMethod"),
        ("node_group", "nodeGroup"),
        ("backend", "backend"),
        ("error", "err"),
        ("snapshot_age_s", "snapshotAgeSeconds"),
        ("duration_ms", "durationMs"),
    ],
)
def test_extra_field_names_become_kubernetes_keys(name, key):
    assert kubernetes_key(name) == key


def test_an_extra_field_never_replaces_a_top_level_field(capture):
    out = capture("json")
    logging.getLogger("x").info("real", extra={"ts": "fake", "caller": "fake", "v": 9})
    doc = lines(out)[0]
    assert doc["msg"] == "real" and isinstance(doc["ts"], float) and doc["v"] == 0
    assert doc["caller"] != "fake"
