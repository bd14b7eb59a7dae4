"""Load and validate the server's YAML configuration; every error names the key and the fix."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from providers.backend import SyncSettings
from providers.config_errors import ConfigError
from providers.config_values import is_loopback
from providers.model import NodeTemplate, Taint
from server.compat import OptionsOverride
from server.node_encoding import is_valid_quantity

__all__ = [
    "ConfigError",
    "ServerConfig",
    "BackendConfig",
    "GroupConfig",
    "TLSConfig",
    "load",
    "parse",
    "parse_duration",
    "parse_address",
]

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CLOUD_TYPES = ("scaleway", "bizfly")


def parse_duration(key: str, value: Any) -> float:
    """'90s', '10m', '1.5h', '250ms' or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(key, f"{value!r} is not a duration", "write e.g. 30s, 10m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ConfigError(key, f"{value!r} is not a duration", "write e.g. 30s, 10m or 1h")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(key, "a duration cannot be negative", "use a positive value such as 30s")
    return seconds


def parse_address(key: str, value: Any) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port)."""
    text = str(value or "")
    match = re.match(r"^\[(?P<v6>[^\]]+)\]:(?P<p6>\d+)$|^(?P<host>[^:\[\]]*):(?P<port>\d+)$", text)
    if not match:
        raise ConfigError(key, f"{text!r} is not host:port", "write e.g. 127.0.0.1:8086 or [::1]:8086")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    port = int(match.group("p6") or match.group("port"))
    if not 0 <= port <= 65535:
        raise ConfigError(key, f"port {port} is out of range", "use a port between 1 and 65535")
    return host, port


@dataclass(frozen=True)
class TLSConfig:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set => clients must present a certificate signed by it


@dataclass(frozen=True)
class GroupConfig:
    options: OptionsOverride | None = None
    template: Callable[[NodeTemplate | None], NodeTemplate | None] | None = None


@dataclass(frozen=True)
class BackendConfig:
    name: str
    type: str
    cloud: Any  # the cloud package's own validated config object
    sync: SyncSettings
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerConfig:
    listen: tuple[str, int] = ("127.0.0.1", 8086)
    http_listen: tuple[str, int] | None = ("127.0.0.1", 8087)
    allow_plaintext_non_loopback: bool = False
    tls: TLSConfig | None = None
    shutdown_grace: float = 15.0
    log_format: str = "json"
    log_level: str = "info"
    max_workers: int = 16
    backends: tuple[BackendConfig, ...] = ()


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"expected a mapping, got {type(value).__name__}", "write it as key: value pairs")
    return value


def _reject_unknown(key: str, raw: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}" if key else unknown[0],
            "unknown key",
            f"remove it or use one of: {', '.join(sorted(allowed))}",
        )


def _file(key: str, value: Any, base: Path) -> Path:
    path = Path(str(value))
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise ConfigError(key, f"file {path} does not exist or is not readable", "mount the file or fix the path")
    return path


def _tls(raw: Mapping[str, Any], base: Path) -> TLSConfig | None:
    if not raw:
        return None
    _reject_unknown("tls", raw, {"cert", "key", "client_ca"})
    if not raw.get("cert") or not raw.get("key"):
        missing = "tls.cert" if not raw.get("cert") else "tls.key"
        raise ConfigError(
            missing,
            "TLS needs both a certificate and its key",
            "set tls.cert and tls.key (PEM files), or remove the tls section for plaintext",
        )
    ca = _file("tls.client_ca", raw["client_ca"], base) if raw.get("client_ca") else None
    return TLSConfig(_file("tls.cert", raw["cert"], base), _file("tls.key", raw["key"], base), ca)


_OPTION_KEYS: dict[str, str] = {
    "scale_down_utilization_threshold": "ratio",
    "scale_down_gpu_utilization_threshold": "ratio",
    "scale_down_unneeded_time": "duration",
    "scale_down_unready_time": "duration",
    "max_node_provision_time": "duration",
    "zero_or_max_node_scaling": "bool",
    "ignore_daemonsets_utilization": "bool",
}


def _options(key: str, raw: Mapping[str, Any]) -> OptionsOverride:
    _reject_unknown(key, raw, set(_OPTION_KEYS))
    values: dict[str, Any] = {}
    for name, value in raw.items():
        kind = _OPTION_KEYS[name]
        k = f"{key}.{name}"
        if kind == "duration":
            values[name] = parse_duration(k, value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(k, f"{value!r} is not true/false", "write true or false")
            values[name] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ConfigError(k, f"{value!r} is not a ratio", "use a number between 0 and 1, e.g. 0.5")
            values[name] = float(value)
    return OptionsOverride(**values)


def _quantities(key: str, raw: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in _mapping(key, raw).items():
        text = str(value)
        if not is_valid_quantity(text):
            raise ConfigError(
                f"{key}.{name}",
                f"{text!r} is not a Kubernetes quantity",
                'write e.g. "4", "1500m", "16Gi" or "110"',
            )
        out[str(name)] = text
    return out


def _taints(key: str, raw: Any) -> tuple[Taint, ...]:
    if not isinstance(raw, list):
        raise ConfigError(
            key, "expected a list of {key, value, effect}", "write - {key: k, value: v, effect: NoSchedule}"
        )
    taints = []
    for i, item in enumerate(raw):
        item = _mapping(f"{key}[{i}]", item)
        effect = str(item.get("effect", ""))
        if not item.get("key") or effect not in _EFFECTS:
            raise ConfigError(
                f"{key}[{i}]",
                "a taint needs a key and an effect",
                f"set key and effect (one of {', '.join(_EFFECTS)})",
            )
        taints.append(Taint(str(item["key"]), str(item.get("value", "")), effect))
    return tuple(taints)


def _template(key: str, raw: Mapping[str, Any]) -> Callable[[NodeTemplate | None], NodeTemplate | None]:
    """Explicit template values win over what the cloud describes (labels/quantities merged)."""
    _reject_unknown(key, raw, {"labels", "taints", "capacity", "allocatable"})
    labels = {str(k): str(v) for k, v in _mapping(f"{key}.labels", raw.get("labels")).items()}
    capacity = _quantities(f"{key}.capacity", raw.get("capacity"))
    allocatable = _quantities(f"{key}.allocatable", raw.get("allocatable"))
    taints = _taints(f"{key}.taints", raw["taints"]) if "taints" in raw else None

    def apply(base: NodeTemplate | None) -> NodeTemplate | None:
        if base is None and not (capacity or allocatable):
            return None  # labels alone do not describe a machine
        base = base or NodeTemplate({}, (), {}, {})
        return NodeTemplate(
            labels={**base.labels, **labels},
            taints=base.taints if taints is None else taints,
            capacity={**base.capacity, **capacity},
            allocatable={**base.allocatable, **(allocatable or ({} if base.allocatable else capacity))},
        )

    return apply


def _sync(key: str, raw: Mapping[str, Any], default_interval: float) -> SyncSettings:
    _reject_unknown(key, raw, {"interval", "max_staleness", "min_interval"})
    interval = parse_duration(f"{key}.interval", raw["interval"]) if "interval" in raw else None
    min_interval = parse_duration(f"{key}.min_interval", raw.get("min_interval", "5s"))
    max_staleness = parse_duration(f"{key}.max_staleness", raw.get("max_staleness", "10m"))
    if interval is not None and interval < 1:
        raise ConfigError(f"{key}.interval", "a sync interval under 1s would hammer the cloud API", "use 10s or more")
    if max_staleness < (interval or default_interval):
        raise ConfigError(
            f"{key}.max_staleness",
            "the staleness bound is shorter than the sync interval",
            "make max_staleness several times the interval, e.g. 10m",
        )
    return SyncSettings(
        interval=interval,
        default_interval=default_interval,
        min_interval=min_interval,
        max_staleness=max_staleness,
    )


def _backend(index: int, raw: Any, env: Mapping[str, str], counts: Mapping[str, int]) -> BackendConfig:
    from server.clouds import cloud_type  # late: the cloud packages import the domain only

    key = f"backends[{index}]"
    raw = _mapping(key, raw)
    kind = str(raw.get("type", ""))
    if kind not in CLOUD_TYPES:
        raise ConfigError(f"{key}.type", f"unknown backend type {kind!r}", f"use one of: {', '.join(CLOUD_TYPES)}")
    name = str(raw.get("name", kind))
    if not _NAME.match(name):
        raise ConfigError(f"{key}.name", f"{name!r} is not a valid name", "use lower-case letters, digits and '-'")
    _reject_unknown(key, raw, {"name", "type", kind, "sync", "node_groups"})
    cloud = cloud_type(kind)
    cloud_config = cloud.parse_config(f"{key}.{kind}", _mapping(f"{key}.{kind}", raw.get(kind)), env, counts[kind] == 1)
    sync = _sync(f"{key}.sync", _mapping(f"{key}.sync", raw.get("sync")), cloud.default_sync_interval)
    groups: dict[str, GroupConfig] = {}
    for gid, graw in _mapping(f"{key}.node_groups", raw.get("node_groups")).items():
        gkey = f"{key}.node_groups.{gid}"
        graw = _mapping(gkey, graw)
        _reject_unknown(gkey, graw, {"options", "template"})
        options = (
            _options(f"{gkey}.options", _mapping(f"{gkey}.options", graw["options"])) if "options" in graw else None
        )
        template = (
            _template(f"{gkey}.template", _mapping(f"{gkey}.template", graw["template"]))
            if "template" in graw
            else None
        )
        groups[str(gid)] = GroupConfig(options, template)
    return BackendConfig(name, kind, cloud_config, sync, groups)


def parse(raw: Any, env: Mapping[str, str] | None = None, base: Path | None = None) -> ServerConfig:
    env = os.environ if env is None else env
    base = base or Path.cwd()
    raw = _mapping("", raw)
    _reject_unknown(
        "",
        raw,
        {
            "listen",
            "http_listen",
            "allow_plaintext_non_loopback",
            "tls",
            "shutdown_grace",
            "log",
            "backends",
            "max_workers",
        },
    )
    listen = parse_address("listen", raw.get("listen", "127.0.0.1:8086"))
    http_raw = raw.get("http_listen", "127.0.0.1:8087")
    http_listen = None if http_raw in (None, "", False) else parse_address("http_listen", http_raw)
    tls = _tls(_mapping("tls", raw.get("tls")), base)
    allow = raw.get("allow_plaintext_non_loopback", False)
    if not isinstance(allow, bool):
        raise ConfigError("allow_plaintext_non_loopback", f"{allow!r} is not true/false", "write true or false")
    if tls is None and not is_loopback(listen[0]) and allow:
        log.warning(
            "plaintext gRPC allowed on non-loopback address %s (allow_plaintext_non_loopback: true): anyone who "
            "can reach it can resize node groups; use it only behind a network policy or a TLS-terminating mesh",
            listen[0],
        )
    if tls is None and not is_loopback(listen[0]) and not allow:
        raise ConfigError(
            "listen",
            f"plaintext gRPC on non-loopback address {listen[0]} would expose the cloud API "
            "credentials' power to the network",
            "configure tls (cert, key, client_ca) or set allow_plaintext_non_loopback: true",
        )
    log_raw = _mapping("log", raw.get("log"))
    _reject_unknown("log", log_raw, {"format", "level"})
    log_format = str(log_raw.get("format", "json"))
    if log_format not in ("json", "text"):
        raise ConfigError("log.format", f"{log_format!r} is not a log format", "use json or text")
    log_level = str(log_raw.get("level", "info")).lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError("log.level", f"{log_level!r} is not a level", "use debug, info, warning or error")
    max_workers = raw.get("max_workers", 16)
    if not isinstance(max_workers, int) or isinstance(max_workers, bool) or not 1 <= max_workers <= 256:
        raise ConfigError("max_workers", f"{max_workers!r} is not a worker count", "use a number from 1 to 256")
    backends_raw = raw.get("backends")
    if not isinstance(backends_raw, list) or not backends_raw:
        raise ConfigError("backends", "no backend is configured", "add at least one entry with type scaleway or bizfly")
    counts = {
        kind: sum(1 for b in backends_raw if isinstance(b, Mapping) and b.get("type") == kind) for kind in CLOUD_TYPES
    }
    backends = tuple(_backend(i, b, env, counts) for i, b in enumerate(backends_raw))
    names = [b.name for b in backends]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("backends", f"two backends are named {name!r}", "give every backend a unique name")
    return ServerConfig(
        listen=listen,
        http_listen=http_listen,
        allow_plaintext_non_loopback=allow,
        tls=tls,
        shutdown_grace=parse_duration("shutdown_grace", raw.get("shutdown_grace", "15s")),
        log_format=log_format,
        log_level=log_level,
        max_workers=max_workers,
        backends=backends,
    )


def load(path: str | Path, env: Mapping[str, str] | None = None) -> ServerConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(
            "--config", f"cannot read {path}: {err.strerror}", "pass the path of a readable YAML file"
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("--config", f"{path} is not valid YAML ({err})", "fix the YAML syntax") from None
    return parse(raw, env, base=path.parent)
