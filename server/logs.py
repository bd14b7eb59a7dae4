"""Logging setup: JSON lines or human text, with secrets masked before anything is written.

JSON line fields: ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``, then every
``extra={...}`` field given at the call site (``grpc_method``, ``grpc_code``, ``node_group``,
``backend``, ``delta``, ``result``, ``duration_ms``...), then ``exc`` when there is a traceback.

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


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _extra_keys(record):
            if key not in doc:
                doc[key] = record.__dict__[key]
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self.formatException(record.exc_info))
        if record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2026-12-02T10:00:00.123Z INFO  server.app serving address=127.0.0.1:8086 tls=False``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_rfc3339(record.created), f"{record.levelname:<5}", record.name, record.getMessage()]
        extras = [f"{k}={_text_value(record.__dict__[k])}" for k in _extra_keys(record)]
        line = " ".join(parts + extras)
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self.formatException(record.exc_info))
        if record.exc_text:
            line = f"{line}\n{record.exc_text}"
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
