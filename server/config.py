"""The server's YAML configuration as one typed schema: every mistake reported at once, each with its fix.

The models below (and each cloud's, in ``providers/<cloud>/config.py``) are the schema; the value types
and the error reporting they share are in ``providers/config_values.py``. ``validate`` returns every
problem; ``parse``/``load`` raise them together in one ConfigError.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from providers.backend import SyncSettings
from providers.bizfly.config import BizflyConfig
from providers.config_errors import ConfigError, ConfigProblem
from providers.config_values import (
    CloudSettings,
    ConfigModel,
    Flag,
    describe_errors,
    duration,
    duration_seconds,
    is_loopback,
    not_checked,
    one_of,
    problem,
    render_key,
    rule_error,
    whole_number,
)
from providers.model import NodeTemplate, Taint
from providers.scaleway.config import ScalewayConfig
from server.compat import OptionsOverride
from server.http_server import HttpLimits
from server.kube.settings import KubernetesConfig
from server.node_encoding import is_valid_quantity
from server.pem_files import ca_bundle_problem, key_pair_problem, unreadable

__all__ = [
    "CLOUDS",
    "BackendConfig",
    "ConfigError",
    "GroupConfig",
    "HttpConfig",
    "ServerConfig",
    "ServingConfig",
    "TLSConfig",
    "Validation",
    "load",
    "parse",
    "parse_address",
    "validate",
    "validate_file",
]

log = logging.getLogger(__name__)

CLOUD_MODELS: Mapping[str, type[CloudSettings]] = {"scaleway": ScalewayConfig, "bizfly": BizflyConfig}
#: the clouds a backend's ``type`` may name
CLOUDS = tuple(CLOUD_MODELS)
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ADDRESS = re.compile(r"^\[(?P<v6>[^\]]+)\]:(?P<p6>\d+)$|^(?P<host>[^:\[\]]*):(?P<port>\d+)$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# ---------------------------------------------------------------------------- values


def _address(value: Any) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); an empty host means every IPv4 address."""
    text = value if isinstance(value, str) else ""
    match = _ADDRESS.match(text.strip())
    if not match:
        raise problem(f"{value!r} is not host:port", "write e.g. 127.0.0.1:8086 or [::1]:8086")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    port = int(match.group("p6") or match.group("port"))
    if port > 65535:
        raise problem(f"port {port} is out of range", "use a port from 1 to 65535 (0 picks a free one)")
    return host, port


def _optional_address(value: Any) -> tuple[str, int] | None:
    return None if value in (None, "", False) else _address(value)


def parse_address(key: str, value: Any) -> tuple[str, int]:
    """One address outside the schema (tests compare the CA's cloud-config with the server's listen)."""
    try:
        return _address(value)
    except PydanticCustomError as err:
        ctx = err.context or {}
        raise ConfigError.single(key, str(ctx["problem"]), str(ctx["fix"])) from None


def _pem_file(value: Any, info: ValidationInfo) -> Path:
    if value in (None, ""):
        raise problem(
            "TLS needs both a certificate and its key",
            "set tls.cert and tls.key (PEM files), or remove the tls section for plaintext",
        )
    if not isinstance(value, str):
        raise problem("expected the path of a PEM file", "write a path, absolute or relative to the config file")
    context = info.context or {}
    path = Path(value.strip())
    if not path.is_absolute():
        path = Path(context.get("base") or Path.cwd()) / path
    if context.get("offline"):
        raise not_checked(f"file {path} not read (offline)", "run validate without --offline where it is mounted")
    reason = unreadable(path)
    if reason:
        raise problem(reason, "mount the file or fix the path")
    return path


def _quantity(value: Any) -> str:
    text = str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    if not is_valid_quantity(text):
        raise problem(f"{value!r} is not a Kubernetes quantity", 'write e.g. "4", "1500m", "16Gi" or "110"')
    return text


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise problem(f"{value!r} is not a ratio", "use a number from 0 to 1, e.g. 0.5")
    return float(value)


PemFile = Annotated[Path, BeforeValidator(_pem_file)]
Address = Annotated[tuple[str, int], BeforeValidator(_address)]
Quantity = Annotated[str, BeforeValidator(_quantity)]
Ratio = Annotated[float, BeforeValidator(_ratio)]
GroupDuration = duration(0, 7 * 24 * 3600)


# ---------------------------------------------------------------------------- server keys


class TLSConfig(ConfigModel):
    cert: PemFile = Field(None, validate_default=True)
    key: PemFile = Field(None, validate_default=True)
    client_ca: PemFile | None = None  # set => clients must present a certificate signed by it
    allow_unauthenticated_clients: Flag = False

    @field_validator("key")
    @classmethod
    def _key_matches_the_certificate(cls, key: Path, info: ValidationInfo) -> Path:
        cert = info.data.get("cert")
        reason = key_pair_problem(cert, key) if cert is not None else None
        if reason:
            raise problem(reason, "give the certificate and the key it was issued for, both PEM")
        return key

    @field_validator("client_ca")
    @classmethod
    def _client_ca_holds_a_certificate(cls, path: Path | None) -> Path | None:
        reason = ca_bundle_problem(path) if path is not None else None
        if reason:
            raise problem(reason, "give the PEM bundle of the CA that signs the clients' certificates")
        return path


class ServingConfig(ConfigModel):
    """The gRPC port: which engine serves it, and what one client may hold (docs/reference/config.md)."""

    # grpcio: the gRPC server of the Python process answers every call. native: a Rust front owns the
    # gRPC port, answers the hot reads and hands the rest to Python (server/native_front.py); it is a
    # wheel of its own, so a plain `pip install` may not have it. auto: native when it is installed,
    # else grpcio with one log line saying so (server/app.py, choose_engine).
    engine: one_of(("auto", "grpcio", "native"), "serving engine", normalise=str.lower) = "auto"  # type: ignore[valid-type]
    # Open client connections; at the limit the longest-idle one is closed for a new one.
    max_connections: whole_number(1, 100_000, 256) = 256  # type: ignore[valid-type]
    max_concurrent_streams: whole_number(1, 10_000, 100) = 100  # type: ignore[valid-type]
    # Bytes of request metadata (HTTP/2 header list); more is RESOURCE_EXHAUSTED for that call.
    max_header_list_size: whole_number(1024, 1024 * 1024, 16384) = 16384  # type: ignore[valid-type]
    # The server pings each connection this often (0: never) and closes it without an answer in time.
    keepalive_time: duration(0, 7 * 24 * 3600) = 60.0  # type: ignore[valid-type]
    keepalive_timeout: duration(1, 3600) = 20.0  # type: ignore[valid-type]
    # A client's pings may come this often while it has a call open (grpc-go's enforcement policy).
    min_ping_interval: duration(1, 24 * 3600) = 300.0  # type: ignore[valid-type]
    # From accept to the client's HTTP/2 preface and SETTINGS, TLS handshake included.
    handshake_timeout: duration(1, 600) = 10.0  # type: ignore[valid-type]
    # A connection with no call open this long gets GOAWAY (0: never).
    idle_timeout: duration(0, 7 * 24 * 3600) = 300.0  # type: ignore[valid-type]
    # A connection open this long (+/-10 %) gets GOAWAY and its calls get max_connection_age_grace before it
    # is closed (grpc-go's MaxConnectionAge and MaxConnectionAgeGrace; 0: never). The backstop that sends a
    # client through its Service again, to the replica that leads (docs/explanation/kubernetes.md).
    max_connection_age: duration(0, 7 * 24 * 3600) = 300.0  # type: ignore[valid-type]
    # What calls get after their connection was sent away (its age, or a replica that stopped leading).
    max_connection_age_grace: duration(0, 3600) = 10.0  # type: ignore[valid-type]
    # Request message bytes the process holds at once (native engine).
    request_buffer: whole_number(4 * 1024 * 1024, 16 * 1024**3, 64 * 1024 * 1024) = 64 * 1024 * 1024  # type: ignore[valid-type]


class HttpConfig(ConfigModel):
    """What one client may hold on the probe/metrics port (``http_listen``; server/http_server.py)."""

    max_connections: whole_number(4, 10_000, 100) = 100  # type: ignore[valid-type]
    request_timeout: duration(0.5, 60) = 5.0  # type: ignore[valid-type]
    idle_timeout: duration(1, 3600) = 30.0  # type: ignore[valid-type]

    @property
    def limits(self) -> HttpLimits:
        return HttpLimits(
            max_connections=self.max_connections,
            request_timeout=self.request_timeout,
            idle_timeout=self.idle_timeout,
        )


class LogConfig(ConfigModel):
    format: one_of(("json", "text"), "log format") = "json"  # type: ignore[valid-type]
    level: one_of(("debug", "info", "warning", "error"), "log level", normalise=str.lower) = "info"  # type: ignore[valid-type]


# ---------------------------------------------------------------------------- per node group


class GroupOptions(ConfigModel):
    """NodeGroupGetOptions values for one group; keys left out keep the CA's own defaults."""

    scale_down_utilization_threshold: Ratio | None = None
    scale_down_gpu_utilization_threshold: Ratio | None = None
    scale_down_unneeded_time: GroupDuration | None = None  # type: ignore[valid-type]
    scale_down_unready_time: GroupDuration | None = None  # type: ignore[valid-type]
    max_node_provision_time: GroupDuration | None = None  # type: ignore[valid-type]
    zero_or_max_node_scaling: Flag | None = None
    ignore_daemonsets_utilization: Flag | None = None


class TaintConfig(ConfigModel):
    key: str
    value: str = ""
    effect: one_of(_EFFECTS, "taint effect") = "NoSchedule"  # type: ignore[valid-type]


class TemplateOverride(ConfigModel):
    """Explicit template values; they win over what the cloud describes (labels and quantities merged)."""

    labels: dict[str, str] = {}
    taints: tuple[TaintConfig, ...] | None = None
    capacity: dict[str, Quantity] = {}
    allocatable: dict[str, Quantity] = {}

    def __call__(self, base: NodeTemplate | None) -> NodeTemplate | None:
        if base is None and not (self.capacity or self.allocatable):
            return None  # labels alone do not describe a machine
        base = base or NodeTemplate({}, (), {}, {})
        taints = base.taints if self.taints is None else tuple(Taint(t.key, t.value, t.effect) for t in self.taints)
        return NodeTemplate(
            labels={**base.labels, **self.labels},
            taints=taints,
            capacity={**base.capacity, **self.capacity},
            allocatable={**base.allocatable, **(self.allocatable or ({} if base.allocatable else self.capacity))},
        )


class GroupConfig(ConfigModel):
    group_options: GroupOptions | None = Field(None, alias="options")
    template: TemplateOverride | None = None

    @property
    def options(self) -> OptionsOverride | None:
        if self.group_options is None:
            return None
        return OptionsOverride(**self.group_options.model_dump())


# ---------------------------------------------------------------------------- backends


class SyncConfig(ConfigModel):
    interval: duration(1, 24 * 3600) | None = None  # type: ignore[valid-type]
    min_interval: duration(0, 3600) = 5.0  # type: ignore[valid-type]
    max_staleness: duration(1, 7 * 24 * 3600) = 600.0  # type: ignore[valid-type]
    follow_refresh: Flag = True


def _seconds_or_none(value: Any) -> float | None:
    """A raw duration for a rule over several keys; None when it is bad (its own key reports that)."""
    try:
        return duration_seconds(value)
    except PydanticCustomError:
        return None


class BackendConfig(ConfigModel):
    # ``type`` names the backend's cloud; the YAML key keeps its name so existing configs stay valid
    type: one_of(CLOUDS, "supported cloud") = Field("", validate_default=True)  # type: ignore[valid-type]
    name: str = Field("", validate_default=True)
    scaleway: ScalewayConfig | None = None
    bizfly: BizflyConfig | None = None
    sync_config: SyncConfig = Field(SyncConfig(), alias="sync")
    node_groups: dict[str, GroupConfig] = {}
    # where each cloud setting came from (a key of the file, a *_env variable, an upstream variable)
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("name", mode="before")
    @classmethod
    def _name_defaults_to_the_cloud(cls, value: Any, info: ValidationInfo) -> str:
        name = value if value not in (None, "") else info.data.get("type", "")
        if name and (not isinstance(name, str) or not _NAME.match(name)):
            raise problem(f"{name!r} is not a valid name", "use lower-case letters, digits and '-'")
        return str(name)

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        cloud = raw.get("type")
        errors = []
        for other in CLOUDS:
            if other != cloud and other in raw and cloud in CLOUDS:
                errors.append(
                    rule_error(other, f"a {other} mapping in a {cloud} backend", f"remove it, or set type: {other}")
                )
        sync = raw.get("sync")
        if cloud in CLOUDS and isinstance(sync, Mapping):
            from server.clouds import cloud_type  # late: keeps this module importable without every cloud

            interval = _seconds_or_none(sync["interval"]) if "interval" in sync else None
            staleness = _seconds_or_none(sync.get("max_staleness", "10m"))
            effective = interval if interval is not None else cloud_type(cloud).default_sync_interval
            if staleness is not None and staleness < effective:
                errors.append(
                    rule_error(
                        ("sync", "max_staleness"),
                        "the staleness bound is shorter than the sync interval",
                        "make max_staleness several times the interval, e.g. 10m",
                    )
                )
        return errors

    @property
    def cloud(self) -> Any:
        """The cloud's own validated settings (ScalewayConfig, BizflyConfig)."""
        return getattr(self, self.type)

    @property
    def sync(self) -> SyncSettings:
        from server.clouds import cloud_type

        return SyncSettings(
            interval=self.sync_config.interval,
            default_interval=cloud_type(self.type).default_sync_interval,
            min_interval=self.sync_config.min_interval,
            max_staleness=self.sync_config.max_staleness,
            follow_refresh=self.sync_config.follow_refresh,
        )

    @property
    def groups(self) -> Mapping[str, GroupConfig]:
        return self.node_groups

    @property
    def advisor(self) -> Any:
        """What to check when the cloud refuses this backend (server/diagnosis.py)."""
        from server.diagnosis import Advisor

        return Advisor(self.type, self.cloud, self._origins)


# ---------------------------------------------------------------------------- the file


class ServerConfig(ConfigModel):
    listen: Address = ("127.0.0.1", 8086)
    http_listen: Annotated[tuple[str, int] | None, BeforeValidator(_optional_address)] = ("127.0.0.1", 8087)
    http: HttpConfig = HttpConfig()
    allow_plaintext_non_loopback: Flag = False
    tls: Annotated[TLSConfig | None, BeforeValidator(lambda value: value or None)] = None  # tls: {} = no TLS
    shutdown_grace: duration(0, 3600) = 15.0  # type: ignore[valid-type]
    log: LogConfig = LogConfig()
    max_workers: whole_number(1, 256, 16) = 16  # type: ignore[valid-type]
    serving: ServingConfig = ServingConfig()
    backends: tuple[BackendConfig, ...] = ()
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        errors = _exposure_rules(raw)
        backends = raw.get("backends")
        if backends in (None, [], ()):
            errors.append(
                rule_error("backends", "no backend is configured", "add at least one entry with type: scaleway")
            )
        elif isinstance(backends, list):
            names = [b.get("name") or b.get("type") for b in backends if isinstance(b, Mapping)]
            for name in sorted({n for n in names if n and names.count(n) > 1}):
                errors.append(
                    rule_error("backends", f"two backends are named {name!r}", "give every backend a unique name")
                )
        return errors

    @property
    def log_format(self) -> str:
        return str(self.log.format)

    @property
    def log_level(self) -> str:
        return str(self.log.level)


def _exposure_rules(raw: Mapping[str, Any]) -> list[InitErrorDetails]:
    """Off loopback, gRPC needs TLS, and TLS needs client certificates, unless a flag says otherwise."""
    try:
        host = _address(raw.get("listen", "127.0.0.1:8086"))[0]
    except PydanticCustomError:
        return []  # the listen key reports its own mistake
    if is_loopback(host):
        return []
    tls = raw.get("tls")
    if not tls:
        if raw.get("allow_plaintext_non_loopback") is True:
            return []
        return [
            rule_error(
                "listen",
                f"plaintext gRPC on non-loopback address {host} would expose the cloud API credentials' power "
                "to the network",
                "configure tls (cert, key, client_ca) or set allow_plaintext_non_loopback: true",
            )
        ]
    if not isinstance(tls, Mapping) or tls.get("client_ca") or tls.get("allow_unauthenticated_clients") is True:
        return []
    return [
        rule_error(
            ("tls", "client_ca"),
            f"TLS on non-loopback address {host} without client certificates lets any client that reaches "
            "the port resize node groups",
            "set tls.client_ca to the CA bundle that signs the clients' certificates (mTLS), or set "
            "tls.allow_unauthenticated_clients: true if something else (a mesh, a network policy) admits clients",
        )
    ]


# ---------------------------------------------------------------------------- entry points


@dataclass(frozen=True)
class Validation:
    """What ``validate`` found: the config (None when anything is wrong or unchecked) and why."""

    config: ServerConfig | None
    problems: tuple[ConfigProblem, ...] = ()
    unchecked: tuple[ConfigProblem, ...] = ()
    # (listen, tls) read from the file when valid, also when ``config`` is None because secrets were not
    # checked (offline): what the CA's cloud-config must agree with
    shape: tuple[tuple[str, int], bool] | None = None


def _with_environment(
    raw: Mapping[str, Any], env: Mapping[str, str], offline: bool
) -> tuple[dict[str, Any], dict[tuple[Any, ...], str]]:
    """Each cloud mapping with the upstream variables applied, and where each overridden value came from."""
    prepared = dict(raw)
    sources: dict[tuple[Any, ...], str] = {}
    backends = raw.get("backends")
    if not isinstance(backends, list):
        return prepared, sources
    clouds = [str(b.get("type")) if isinstance(b, Mapping) else "" for b in backends]
    prepared_backends: list[Any] = []
    for index, (backend, cloud) in enumerate(zip(backends, clouds, strict=True)):
        if isinstance(backend, Mapping) and cloud not in CLOUD_MODELS:
            # A misspelt or missing type is its own one problem: the cloud mappings present are read as
            # what they say they are (their *_env keys resolved), never reported as unknown keys because of it.
            prepared_backends.append(
                {
                    **backend,
                    **{
                        other: CLOUD_MODELS[other].merge_environment(backend[other], env, False, offline)[0]
                        for other in CLOUD_MODELS
                        if isinstance(backend.get(other), Mapping)
                    },
                }
            )
            continue
        cloud_raw = backend.get(cloud) if isinstance(backend, Mapping) else None
        if not isinstance(cloud_raw, Mapping | None):
            prepared_backends.append(backend)
            continue
        merged, from_env = CLOUD_MODELS[cloud].merge_environment(
            cloud_raw or {}, env, clouds.count(cloud) == 1, offline
        )
        prepared_backends.append({**backend, cloud: merged})
        sources.update({("backends", index, cloud, key): variable for key, variable in from_env.items()})
    prepared["backends"] = prepared_backends
    return prepared, sources


def validate(
    raw: Any, env: Mapping[str, str] | None = None, base: Path | None = None, *, offline: bool = False
) -> Validation:
    """Every problem of a parsed YAML document. ``offline``: needs no secret and reads no named file."""
    env = os.environ if env is None else env
    if not isinstance(raw, Mapping):
        found = "an empty file" if raw is None else f"a {type(raw).__name__}"
        fix = "write key: value pairs, starting from the example in docs/how-to/configure.md"
        return Validation(None, (ConfigProblem("(top level)", f"expected a mapping, found {found}", fix),))
    prepared, sources = _with_environment(raw, env, offline)
    context = {"env": env, "offline": offline, "base": base or Path.cwd()}
    placeholders = _placeholders(raw)
    try:
        config = ServerConfig.model_validate(prepared, context=context)
    except ValidationError as err:
        problems, unchecked = describe_errors(err, ServerConfig, sources=sources)
        # One error per mistake: a placeholder's own line, not also the schema's word on the same key.
        marked = {p.key for p in placeholders}
        problems = [*placeholders, *(p for p in problems if p.key not in marked)]
        return Validation(None, tuple(problems), tuple(unchecked), _shape(raw))
    if placeholders:
        return Validation(None, tuple(placeholders), (), _shape(raw))
    _record_origins(config, raw, sources)
    _warn_about_open_doors(config)
    return Validation(config, shape=(config.listen, config.tls is not None))


#: an example's placeholder left in: ``<pool-id>``, ``<the cluster id>``
_PLACEHOLDER = re.compile(r"^<[^<>]+>$")


def _placeholders(raw: Any, loc: tuple[Any, ...] = ()) -> list[ConfigProblem]:
    """Every key or string value of the file that is still an example's ``<placeholder>``."""
    found: list[ConfigProblem] = []
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            where = (*loc, key)
            if isinstance(key, str) and _PLACEHOLDER.match(key.strip()):
                fix = (
                    "replace it with a node group id as `ca-externalgrpc status` lists it (the pool id)"
                    if loc[-1:] == ("node_groups",)
                    else "replace it with the real value"
                )
                found.append(ConfigProblem(render_key(where), f"{key!r} is a placeholder from an example", fix))
            else:
                found += _placeholders(value, where)
    elif isinstance(raw, list):
        for index, item in enumerate(raw):
            found += _placeholders(item, (*loc, index))
    elif isinstance(raw, str) and _PLACEHOLDER.match(raw.strip()):
        found.append(
            ConfigProblem(render_key(loc), f"{raw!r} is a placeholder from an example", "write the real value")
        )
    return found


def _shape(raw: Mapping[str, Any]) -> tuple[tuple[str, int], bool] | None:
    try:
        listen = _address(raw.get("listen", "127.0.0.1:8086"))
    except PydanticCustomError:
        return None
    return listen, bool(raw.get("tls"))


def _record_origins(config: ServerConfig, raw: Mapping[str, Any], sources: Mapping[tuple[Any, ...], str]) -> None:
    from server.diagnosis import origins

    raw_backends = raw.get("backends") or []
    for index, backend in enumerate(config.backends):
        raw_backend = raw_backends[index] if index < len(raw_backends) else {}
        raw_cloud = raw_backend.get(backend.type) if isinstance(raw_backend, Mapping) else None
        from_env = {key[3]: var for key, var in sources.items() if key[1] == index and len(key) == 4}
        backend._origins = origins(index, backend.type, raw_cloud if isinstance(raw_cloud, Mapping) else None, from_env)


def _warn_about_open_doors(config: ServerConfig) -> None:
    host = config.listen[0]
    if is_loopback(host):
        return
    if config.tls is None:
        log.warning(
            "plaintext gRPC allowed on non-loopback address %s (allow_plaintext_non_loopback: true): anyone who "
            "can reach it can resize node groups; use it only behind a network policy or a TLS-terminating mesh",
            host,
        )
    elif config.tls.client_ca is None:
        log.warning(
            "TLS without client certificates on non-loopback address %s (tls.allow_unauthenticated_clients: "
            "true): any client that reaches it can resize node groups; admit clients by other means",
            host,
        )


def parse(raw: Any, env: Mapping[str, str] | None = None, base: Path | None = None) -> ServerConfig:
    result = validate(raw, env, base)
    if result.config is None:
        raise ConfigError(result.problems or result.unchecked)
    return result.config


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError.single(
            "--config", f"cannot read {path}: {err.strerror}", "pass the path of a readable YAML file"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError.single("--config", f"{path} is not valid YAML ({err})", "fix the YAML syntax") from None


def validate_file(path: str | Path, env: Mapping[str, str] | None = None, *, offline: bool = False) -> Validation:
    path = Path(path)
    try:
        raw = _read_yaml(path)
    except ConfigError as err:
        return Validation(None, err.problems)
    return validate(raw, env, base=path.parent, offline=offline)


def load(path: str | Path, env: Mapping[str, str] | None = None) -> ServerConfig:
    path = Path(path)
    return parse(_read_yaml(path), env, base=path.parent)
