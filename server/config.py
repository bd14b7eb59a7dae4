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
    Shown,
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


PemFile = Annotated[Path, BeforeValidator(_pem_file), Shown("path of a PEM file, relative to the config file")]
Address = Annotated[tuple[str, int], BeforeValidator(_address), Shown("`host:port` or `[v6]:port`")]
Quantity = Annotated[str, BeforeValidator(_quantity), Shown("Kubernetes quantity")]
Ratio = Annotated[float, BeforeValidator(_ratio), Shown("ratio, 0 to 1")]
GroupDuration = duration(0, 7 * 24 * 3600)


# ---------------------------------------------------------------------------- server keys


class TLSConfig(ConfigModel):
    cert: PemFile = Field(None, validate_default=True)
    """The server certificate (PEM). Checked at start: readable, and `tls.key` is its key."""
    key: PemFile = Field(None, validate_default=True)
    """The server certificate's private key (PEM)."""
    client_ca: PemFile | None = None
    """CA bundle (PEM) of the client certificates: when set, every client must present a certificate it
    signed (mTLS). Required when `listen` is not a loopback address, unless
    `tls.allow_unauthenticated_clients` is true."""
    allow_unauthenticated_clients: Flag = False
    """Serve TLS on a non-loopback address without asking clients for a certificate: only where something
    else admits clients (a service mesh, a strict network policy). A warning is logged when it is used."""

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

    engine: one_of(("auto", "grpcio", "native"), "serving engine", normalise=str.lower) = "auto"  # type: ignore[valid-type]
    """Who answers on the gRPC port. `native`: a Rust front (the `ca-externalgrpc-native` wheel) owns the
    port and its TLS, answers the CA's hot reads from answers Python built and hands every other call to
    Python in the same process (about 3 times faster per call, and grpcio is never loaded); the server fails
    at start when it is not installed. `grpcio`: the Python gRPC server answers everything. `auto`: `native`
    when it is installed (the image, `make install`, pip's `[native]` extra), else `grpcio` with one warning
    saying why. Codes and messages do not depend on the engine. With `log.level: debug` the native front
    hands every call to Python, so that every read is logged."""
    max_connections: whole_number(1, 100_000, 256) = 256  # type: ignore[valid-type]
    """Open client connections on the gRPC port. At the limit a new connection closes the one idle the
    longest (no call open), so idle connections never lock out the CA or a health prober; when every
    connection has a call open, the new one is closed. The server raises its open-files soft limit to this
    plus 256 at start, and refuses to start, naming this key, when the hard limit is lower."""
    max_concurrent_streams: whole_number(1, 10_000, 100) = 100  # type: ignore[valid-type]
    """Calls open at once on one connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`); the CA uses a
    handful."""
    max_header_list_size: whole_number(1024, 1024 * 1024, 16384) = 16384  # type: ignore[valid-type]
    """Bytes of request metadata (the HTTP/2 header list: names, values and 32 per field). Over it, that
    call alone is answered RESOURCE_EXHAUSTED; the other calls of the connection go on."""
    keepalive_time: duration(0, 7 * 24 * 3600) = 60.0  # type: ignore[valid-type]
    """The server pings a connection after this long without traffic and closes it when the answer does not
    come within `serving.keepalive_timeout`, so a dead or partitioned client does not keep its connection.
    `0s` turns the pings off."""
    keepalive_timeout: duration(1, 3600) = 20.0  # type: ignore[valid-type]
    """How long the answer to a keepalive ping may take before the connection is closed."""
    min_ping_interval: duration(1, 24 * 3600) = 300.0  # type: ignore[valid-type]
    """While a client has a call open its pings may come this often (without one, every 2 hours); the third
    ping too early gets GOAWAY `too_many_pings`, as grpc-go and grpcio enforce it."""
    handshake_timeout: duration(1, 600) = 10.0  # type: ignore[valid-type]
    """From a connection's accept to the client's HTTP/2 preface and SETTINGS, the TLS handshake included;
    a connection that does not get there in time is closed."""
    idle_timeout: duration(0, 7 * 24 * 3600) = 300.0  # type: ignore[valid-type]
    """A connection with no call open for this long gets GOAWAY (its client reconnects when it next calls);
    `0s`: never. The CA calls every scan interval, so its connection never idles."""
    max_connection_age: duration(0, 7 * 24 * 3600) = 300.0  # type: ignore[valid-type]
    """A connection open this long (spread by 10 % either way) gets GOAWAY, its calls in flight get
    `serving.max_connection_age_grace`, then it is closed; the client reconnects on its next call (grpc-go's
    `MaxConnectionAge`). `0s`: never. With two replicas behind a Service it is the backstop that sends the
    CA through the Service again, to the replica that leads."""
    max_connection_age_grace: duration(0, 3600) = 10.0  # type: ignore[valid-type]
    """What the calls in flight get to finish after their connection was sent away (its age, or a replica
    that stopped leading), before it is closed (grpc-go's `MaxConnectionAgeGrace`)."""
    request_buffer: whole_number(4 * 1024 * 1024, 16 * 1024**3, 64 * 1024 * 1024) = 64 * 1024 * 1024  # type: ignore[valid-type]
    """Bytes of request messages the native front holds at once, being received or waiting for Python; a
    message that does not fit is refused RESOURCE_EXHAUSTED at once. One connection holds at most 16 MiB
    besides. The grpcio engine has no such bound."""


class HttpConfig(ConfigModel):
    """What one client may hold on the probe/metrics port (``http_listen``; server/http_server.py)."""

    max_connections: whole_number(4, 10_000, 100) = 100  # type: ignore[valid-type]
    """Connections the probe/metrics port holds at once. At the cap a newcomer is admitted by closing the
    one with the least claim to stay, the longest waiting among equals: one that sent nothing, or whose
    request line is over a second old, goes before one that sent a request line in the last second or is
    in its first 50 ms, and one whose whole request has arrived is never closed; so a flood costs a bounded
    number of sockets and does not push the kubelet's probes out. Kubelet and Prometheus need a handful."""
    request_timeout: duration(0.5, 60) = 5.0  # type: ignore[valid-type]
    """Time a client of the probe/metrics port has to send a request's line and headers, counted from its
    first byte, and to take the answer; a late one is answered 408 and closed."""
    idle_timeout: duration(1, 3600) = 30.0  # type: ignore[valid-type]
    """How long a kept-alive connection to the probe/metrics port may stay silent between two requests."""

    @property
    def limits(self) -> HttpLimits:
        return HttpLimits(
            max_connections=self.max_connections,
            request_timeout=self.request_timeout,
            idle_timeout=self.idle_timeout,
        )


class LogConfig(ConfigModel):
    format: one_of(("json", "text"), "log format") = "json"  # type: ignore[valid-type]
    """`json`: one JSON object a line, with the fields of the Kubernetes JSON logger (the CA's own); `text`:
    for people. `serve --log-format` overrides it."""
    level: one_of(("debug", "info", "warning", "error"), "log level", normalise=str.lower) = "info"  # type: ignore[valid-type]
    """`debug` also logs every read the CA makes. `serve --log-level` overrides it."""


# ---------------------------------------------------------------------------- per node group


class GroupOptions(ConfigModel):
    """NodeGroupGetOptions values for one group; keys left out keep the CA's own defaults."""

    scale_down_utilization_threshold: Ratio | None = None
    """The group's `--scale-down-utilization-threshold`: a node using less is a scale-down candidate."""
    scale_down_gpu_utilization_threshold: Ratio | None = None
    """The group's `--scale-down-gpu-utilization-threshold`, for GPU nodes."""
    scale_down_unneeded_time: GroupDuration | None = None  # type: ignore[valid-type]
    """The group's `--scale-down-unneeded-time`: how long a node must be unneeded before it is removed."""
    scale_down_unready_time: GroupDuration | None = None  # type: ignore[valid-type]
    """The group's `--scale-down-unready-time`: how long an unready node must be unneeded before it is
    removed."""
    max_node_provision_time: GroupDuration | None = None  # type: ignore[valid-type]
    """The group's `--max-node-provision-time`: how long a new node may take to register."""
    zero_or_max_node_scaling: Flag | None = None
    """The group scales from zero to its maximum and back, never in between."""
    ignore_daemonsets_utilization: Flag | None = None
    """The group's `--ignore-daemonsets-utilization`: DaemonSet pods do not count in a node's use."""


class TaintConfig(ConfigModel):
    key: str
    """The taint's key."""
    value: str = ""
    """The taint's value."""
    effect: one_of(_EFFECTS, "taint effect") = "NoSchedule"  # type: ignore[valid-type]
    """The taint's effect."""


class TemplateOverride(ConfigModel):
    """Explicit template values; they win over what the cloud describes (labels and quantities merged)."""

    labels: dict[str, str] = {}
    """Node labels, merged over the ones the cloud's description of the pool gives. Labels alone do not make
    a template: the CA needs a capacity."""
    taints: tuple[TaintConfig, ...] | None = None
    """Node taints; when given they replace the cloud's."""
    capacity: dict[str, Quantity] = {}
    """Resources of one node (`cpu`, `memory`, `pods`, `nvidia.com/gpu`...), merged over the cloud's. A
    group with neither a cloud description nor a capacity has no template, and the CA cannot scale it up
    from zero."""
    allocatable: dict[str, Quantity] = {}
    """What pods may use of one node, merged over the cloud's; the capacity when neither side has one."""

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
    """Per-group CA options. Without it the server returns none and the CA uses its flags; the keys left
    out are copied from the CA's own defaults of each request. Only when a group really needs other values:
    on CA 1.27 to 1.28 returning options sets the group's MaxNodeProvisionTime to 0, and on CA 1.35 and
    later its MaxNodeStartupTime, because the protocol has no field for them."""
    template: TemplateOverride | None = None
    """The node template for scale-from-zero, merged over what the cloud describes."""

    @property
    def options(self) -> OptionsOverride | None:
        if self.group_options is None:
            return None
        return OptionsOverride(**self.group_options.model_dump())


# ---------------------------------------------------------------------------- backends


class SyncConfig(ConfigModel):
    interval: duration(1, 24 * 3600) | None = None  # type: ignore[valid-type]
    """How old the snapshot may get before the cloud is read again: with `follow_refresh`, at the CA's next
    `Refresh` past it; without, on a timer every interval. Unset: the cloud's cache hint, else 30s."""
    min_interval: duration(0, 3600) = 5.0  # type: ignore[valid-type]
    """Floor between two syncs (after a size change), and the first retry delay after a failed sync,
    doubling up to the interval."""
    max_staleness: duration(1, 7 * 24 * 3600) = 600.0  # type: ignore[valid-type]
    """How old the served snapshot may get while the cloud fails. Past it the `Refresh` that starts every CA
    loop answers UNAVAILABLE, so the CA pauses (no scale-up, no scale-down) instead of acting on old data.
    At least the interval."""
    follow_refresh: Flag = True
    """The CA's `Refresh` starts the next listing once the snapshot is older than the interval (or joins the
    one running) and waits for it at most 3 s, never into the last second of its deadline; without a CA a
    timer lists every four intervals. `false`: a timer lists every interval whether a CA asks or not."""


def _seconds_or_none(value: Any) -> float | None:
    """A raw duration for a rule over several keys; None when it is bad (its own key reports that)."""
    try:
        return duration_seconds(value)
    except PydanticCustomError:
        return None


class BackendConfig(ConfigModel):
    type: one_of(CLOUDS, "supported cloud") = Field("", validate_default=True)  # type: ignore[valid-type]
    """The backend's cloud."""
    name: str = Field("", validate_default=True)
    """The backend's unique name (lower-case letters, digits and `-`), in metrics, logs and `status`.
    Unset: the cloud's name (`type`)."""
    scaleway: ScalewayConfig | None = None
    """The Scaleway settings of a `type: scaleway` backend; only the mapping of the backend's own cloud is
    allowed."""
    bizfly: BizflyConfig | None = None
    """The Bizfly settings of a `type: bizfly` backend."""
    sync_config: SyncConfig = Field(SyncConfig(), alias="sync")
    """When the cloud is read."""
    node_groups: dict[str, GroupConfig] = {}
    """Per node group settings, by the group's id as `ca-externalgrpc status` prints it (the pool id). After
    a backend's first sync the server logs one warning naming every id that matches none of its groups."""
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
    """The gRPC address. `[::]`: every address, IPv6 and IPv4 alike (where the machine has no IPv6, every
    IPv4 one, with a warning); `0.0.0.0`: every IPv4 address; any other address: itself only. Port 0 picks
    a free port. Off loopback it needs `tls`, or `allow_plaintext_non_loopback`."""
    http_listen: Annotated[
        tuple[str, int] | None, BeforeValidator(_optional_address), Shown("`host:port`, `[v6]:port` or empty")
    ] = ("127.0.0.1", 8087)
    """Plaintext HTTP for `/healthz`, `/readyz` and `/metrics`, the same address forms as `listen`; empty or
    `null` turns it off. In Kubernetes use `"[::]:8087"` (quoted: YAML reads a bare `[` as a list): the
    kubelet probes the pod IP, not loopback."""
    http: HttpConfig = HttpConfig()
    """What one client may hold on the probe/metrics port."""
    allow_plaintext_non_loopback: Flag = False
    """Plaintext gRPC on a non-loopback `listen` is refused unless this is true (anyone who reaches the port
    can resize the node pools); a warning is logged when it is used."""
    tls: Annotated[TLSConfig | None, BeforeValidator(lambda value: value or None)] = None
    """TLS on the gRPC port; absent or empty: plaintext."""
    shutdown_grace: duration(0, 3600) = 15.0  # type: ignore[valid-type]
    """On SIGTERM health goes NOT_SERVING, new calls are refused and the calls in flight get this long to
    finish. Keep it below the pod's `terminationGracePeriodSeconds` (30s in the manifests)."""
    log: LogConfig = LogConfig()
    """The server's log."""
    max_workers: whole_number(1, 256, 16) = 16  # type: ignore[valid-type]
    """Threads that run the calls Python answers: grpcio's worker pool, or the native front's pool for
    Python. The CA calls `NodeGroupNodes` for all groups at once."""
    serving: ServingConfig = ServingConfig()
    """The gRPC port: which engine serves it, and what one client may hold."""
    backends: tuple[BackendConfig, ...] = ()
    """The clouds the server answers for, at least one; each node group belongs to one backend."""
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    """The optional Kubernetes features; each is off unless enabled."""

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


def _intended_cloud(backend: Any) -> str:
    """The cloud a backend is for: its ``type``, or, when that names no cloud (``scalway``, or no type), the
    one cloud mapping it has. A misspelt type is then one problem, its did-you-mean: the mapping gets the
    upstream variables it would get with the right type, so no key they set is reported missing too."""
    if not isinstance(backend, Mapping):
        return ""
    cloud = str(backend.get("type"))
    present = [name for name in CLOUD_MODELS if isinstance(backend.get(name), Mapping)]
    return present[0] if cloud not in CLOUD_MODELS and len(present) == 1 else cloud


def _with_environment(
    raw: Mapping[str, Any], env: Mapping[str, str], offline: bool
) -> tuple[dict[str, Any], dict[tuple[Any, ...], str]]:
    """Each cloud mapping with the upstream variables applied, and where each overridden value came from."""
    prepared = dict(raw)
    sources: dict[tuple[Any, ...], str] = {}
    backends = raw.get("backends")
    if not isinstance(backends, list):
        return prepared, sources
    clouds = [_intended_cloud(b) for b in backends]
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
    raw: Any,
    env: Mapping[str, str] | None = None,
    base: Path | None = None,
    *,
    offline: bool = False,
    shell: bool = False,
) -> Validation:
    """Every problem of a parsed YAML document. ``offline``: needs no secret and reads no named file.
    ``shell``: the command runs in an operator's shell (``validate``), not in the server's container, so a
    missing variable's fix may be a shell export."""
    env = os.environ if env is None else env
    if not isinstance(raw, Mapping):
        found = "an empty file" if raw is None else f"a {type(raw).__name__}"
        fix = "write key: value pairs, starting from the example in docs/how-to/configure.md"
        return Validation(None, (ConfigProblem("(top level)", f"expected a mapping, found {found}", fix),))
    prepared, sources = _with_environment(raw, env, offline)
    context = {"env": env, "offline": offline, "base": base or Path.cwd(), "shell": shell}
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


def validate_file(
    path: str | Path, env: Mapping[str, str] | None = None, *, offline: bool = False, shell: bool = False
) -> Validation:
    path = Path(path)
    try:
        raw = _read_yaml(path)
    except ConfigError as err:
        return Validation(None, err.problems)
    return validate(raw, env, base=path.parent, offline=offline, shell=shell)


def load(path: str | Path, env: Mapping[str, str] | None = None) -> ServerConfig:
    path = Path(path)
    return parse(_read_yaml(path), env, base=path.parent)
