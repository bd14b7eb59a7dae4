"""Logging setup: Kubernetes structured-logging JSON lines or human text, secrets masked first.

JSON lines have the shape the cluster-autoscaler writes with ``--logging-format=json`` (the
Kubernetes component-base JSON logger), so one log pipeline parses both containers of the pod:

* ``ts``: Unix time in milliseconds, a float;
* ``caller``: ``directory/file.py:line`` of the call;
* ``logger``: the Python logger name (``server.rpc``, ``providers.backend``, ...);
* ``msg``: the message;
* ``v``: the verbosity of an info record: 0 for info and warning (as ``klog.Warning`` writes them),
  4 for debug. Error records have no ``v``, like the CA's;
* ``err``: the error text, when the record carries one (an exception, or an ``error`` field);
* then every ``extra={...}`` field as a key/value pair, its key written in lowerCamelCase as
  Kubernetes names them (``grpc_method`` becomes ``grpcMethod``); a traceback goes in ``stacktrace``.

The text format is for people on a terminal: ``<time> <LEVEL> <logger> <msg> key=value ...``.

Redaction happens in a filter attached to the handler, so it applies to records from every logger
(including ``urllib3`` and ``grpc``), and it runs on the final text: message, arguments, extra
fields and the formatted traceback.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any, TextIO

MASK = "***"

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys() | {"message", "asctime", "taskName"}
)

_secrets: set[str] = set()
_secrets_lock = threading.Lock()
_secrets_pattern: re.Pattern[str] | None = None

#: key names whose values are secrets, in headers, key=value, "key": "value" and YAML-ish text
_SECRET_KEYS = (
    r"x-auth-token|x-subject-token|authorization|password|passwd|secret[_-]?key|"
    r"app[_-]?credential[_-]?secret|client[_-]?secret|api[_-]?key|access[_-]?token|"
    r"refresh[_-]?token|token"
)
_KEY_VALUE_PATTERNS = (
    # "password": "value" (JSON), 'token': 'value' (Python repr)
    re.compile(rf"""(?i)(["']?(?:[\w-]{{0,32}}?(?:{_SECRET_KEYS}))["']?\s*:\s*)(["'])(?:\\.|(?!\2).)*\2"""),
    # X-Auth-Token: value / Authorization: Bearer value (header style, up to end of line or comma)
    re.compile(rf"(?i)\b((?:{_SECRET_KEYS})\s*:\s*)(?:bearer\s+|basic\s+)?[^\s,;'\"}}]+"),
    # password=value, secret_key=value, token=value (query strings, CLI, key=value logs)
    re.compile(rf"(?i)\b([\w-]{{0,32}}?(?:{_SECRET_KEYS})\s*=\s*)(?:\"[^\"]*\"|'[^']*'|[^\s&,;'\"}}]+)"),
)
# e.g. a Scaleway secret key is a UUID; we do not mask every UUID (ids are UUIDs too) — only
# registered values and values next to a secret-looking key are masked.


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in any later log output. Short values are ignored
    (masking "a" everywhere would destroy the logs and protect nothing)."""
    global _secrets_pattern
    if not value or len(value) < 4:
        return
    with _secrets_lock:
        if value in _secrets:
            return
        _secrets.add(value)
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first: no partial leftovers
        _secrets_pattern = re.compile("|".join(re.escape(s) for s in ordered))


def clear_registered_secrets() -> None:
    """For tests."""
    global _secrets_pattern
    with _secrets_lock:
        _secrets.clear()
        _secrets_pattern = None


def redact(text: str) -> str:
    """Return ``text`` with registered secrets and secret-looking key/value pairs masked."""
    pattern = _secrets_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for kv in _KEY_VALUE_PATTERNS:
        text = kv.sub(_mask_value, text)
    return text


def _mask_value(match: re.Match[str]) -> str:
    prefix = match.group(1)
    if len(match.groups()) >= 2 and match.group(2):  # quoted JSON/repr value: keep the quotes
        quote = match.group(2)
        return f"{prefix}{quote}{MASK}{quote}"
    return prefix + MASK


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {k: (MASK if _is_secret_key(k) else _redact_value(v)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact_value(v) for v in value]
    return redact(str(value))


_SECRET_KEY_RE = re.compile(rf"(?i)^[\w-]{{0,32}}?(?:{_SECRET_KEYS})$")


def _is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and bool(_SECRET_KEY_RE.match(key))


class RedactionFilter(logging.Filter):
    """Rewrites a record in place: the message becomes the formatted, redacted text; extra
    fields are redacted (a whole field is masked when its name looks like a secret)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not lose the record
            message = f"{record.msg!r} % {record.args!r}"
        record.msg = redact(message)
        record.args = None
        for key in _extra_keys(record):
            value = record.__dict__[key]
            record.__dict__[key] = MASK if _is_secret_key(key) else _redact_value(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _extra_keys(record: logging.LogRecord) -> Iterable[str]:
    return [k for k in record.__dict__ if k not in _STANDARD_ATTRS and not k.startswith("_")]


def _rfc3339(created: float) -> str:
    stamp = _dt.datetime.fromtimestamp(created, tz=_dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: keys Kubernetes spells differently from a plain camel-casing of ours
_KEY_NAMES = {"error": "err", "snapshot_age_s": "snapshotAgeSeconds", "retry_in_s": "retryInSeconds"}
#: top-level fields of a JSON line; an extra field never replaces one of them
_TOP_LEVEL = frozenset({"ts", "caller", "logger", "msg", "v", "err", "stacktrace"})
#: the ``v`` of a debug record: Kubernetes components log debug detail at 4 (the CA's --v=4 shows it)
DEBUG_VERBOSITY = 4


def kubernetes_key(name: str) -> str:
    """``grpc_method`` -> ``grpcMethod``; ``error`` -> ``err`` (Kubernetes structured-logging keys)."""
    if name in _KEY_NAMES:
        return _KEY_NAMES[name]
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _caller(record: logging.LogRecord) -> str:
    path = record.pathname.replace("\\", "/").rsplit("/", 2)
    return f"{'/'.join(path[-2:])}:{record.lineno}"


def _exception_texts(formatter: logging.Formatter, record: logging.LogRecord) -> tuple[str, str]:
    """``(err, stacktrace)`` of a record's exception, both redacted; empty when there is none."""
    if record.exc_info and not record.exc_text:
        record.exc_text = redact(formatter.formatException(record.exc_info))
    stacktrace = record.exc_text or ""
    err = ""
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        err = redact(f"{type(exc).__name__}: {exc}")
    return err, stacktrace


class JsonFormatter(logging.Formatter):
    """One JSON object per line, shaped like the Kubernetes component-base JSON logger's."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created * 1000, 3),
            "caller": _caller(record),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.levelno < logging.ERROR:
            doc["v"] = 0 if record.levelno >= logging.INFO else DEBUG_VERBOSITY
        err, stacktrace = _exception_texts(self, record)
        if err:
            doc["err"] = err
        for name in _extra_keys(record):
            key = kubernetes_key(name)
            if key not in _TOP_LEVEL or (key == "err" and "err" not in doc):
                doc[key] = record.__dict__[name]
        if stacktrace:
            doc["stacktrace"] = stacktrace
        return json.dumps(doc, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2026-12-02T10:00:00.123Z INFO  server.app serving address=127.0.0.1:8086 tls=false``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_rfc3339(record.created), f"{record.levelname:<5}", record.name, record.getMessage()]
        extras = [f"{kubernetes_key(k)}={_text_value(record.__dict__[k])}" for k in _extra_keys(record)]
        line = " ".join(parts + extras)
        _, stacktrace = _exception_texts(self, record)
        if stacktrace:
            line = f"{line}\n{stacktrace}"
        return line


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return json.dumps(text) if (" " in text or not text) else text


_HANDLER_MARK = "_ca_externalgrpc_handler"


def configure_logging(format: str = "json", level: str = "info", stream: TextIO | None = None) -> logging.Handler:  # noqa: A002
    """Install one handler on the root logger (replacing one we installed before).

    ``format`` is ``json`` or ``text``; ``level`` a standard level name (``debug``, ``info``,
    ``warning``, ``error``). Returns the handler (tests attach it to a StringIO via ``stream``).
    """
    fmt = format.lower()
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be 'json' or 'text', got {format!r}")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactionFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # urllib3 logs every connection at debug and full URLs; keep it quieter than us
    logging.getLogger("urllib3").setLevel(max(numeric, logging.INFO))
    return handler
