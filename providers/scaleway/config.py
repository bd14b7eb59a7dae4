"""The ``scaleway:`` mapping of a backend, validated; the upstream environment variables override it.

Keys:

==================  ===========================================================================
``cluster_id``      the Kapsule cluster id (required)
``region``          default ``fr-par``
``api_url``         default ``https://api.scaleway.com``; ``http://`` only for loopback addresses
``secret_key``      the IAM secret key sent as ``X-Auth-Token`` (or use ``secret_key_env``)
``secret_key_env``  name of an environment variable holding the secret key, so the file can
                    stay free of it
``request_timeout`` cap for one HTTP attempt, seconds or a duration (``30s``, ``500ms``); default 30
``max_attempts``    attempts per idempotent call, including the first (default 4)
==================  ===========================================================================

Upstream reads only ``CLUSTER_ID``, ``SCW_SECRET_KEY``, ``SCW_REGION`` and ``SCW_API_URL`` (its
config file is never read because of a shadowed variable, reference/scaleway-api.md section 1). We
follow the upstream README instead: the file is read, and those variables override it when they are
non-empty and this is the only Scaleway backend (``env_applies``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.config_errors import ConfigError
from providers.config_values import api_base_url

DEFAULT_API_URL = "https://api.scaleway.com"
DEFAULT_REGION = "fr-par"
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 4

# Config key -> upstream environment variable that overrides it (non-empty values only).
ENV_OVERRIDES: Mapping[str, str] = {
    "cluster_id": "CLUSTER_ID",
    "secret_key": "SCW_SECRET_KEY",
    "region": "SCW_REGION",
    "api_url": "SCW_API_URL",
}
KNOWN_KEYS = frozenset(
    {"cluster_id", "region", "api_url", "secret_key", "secret_key_env", "request_timeout", "max_attempts"}
)

# Ids go into URL paths: refuse anything that could change the path (/, ?, #, spaces).
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Scaleway regions look like fr-par, nl-ams, pl-waw, it-mil.
_REGION = re.compile(r"^[a-z]{2}-[a-z0-9]{2,8}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class ScalewayConfig:
    cluster_id: str
    region: str = DEFAULT_REGION
    api_url: str = DEFAULT_API_URL
    secret_key: str = field(default="", repr=False)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __str__(self) -> str:
        return f"scaleway cluster {self.cluster_id} in {self.region} via {self.api_url}"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never appear in messages or logs (for log redaction)."""
        return (self.secret_key,) if self.secret_key else ()


def parse_config(key: str, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool) -> ScalewayConfig:
    """Validate the mapping at ``key``; raise ConfigError naming the key, the problem and the fix."""
    unknown = sorted(str(k) for k in raw if k not in KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}", "unknown key", f"use only: {', '.join(sorted(KNOWN_KEYS))} (check the spelling)"
        )
    values = {name: _text(f"{key}.{name}", raw.get(name)) for name in ("cluster_id", "region", "api_url")}
    overridden: dict[str, str] = {}
    if env_applies:
        for name, variable in ENV_OVERRIDES.items():
            if env.get(variable):
                overridden[name] = variable
    for name in ("cluster_id", "region", "api_url"):
        if name in overridden:
            values[name] = env[overridden[name]].strip()

    def where(name: str) -> str:
        return f"environment variable {overridden[name]}" if name in overridden else f"{key}.{name}"

    cluster_id = values["cluster_id"]
    if not cluster_id:
        raise ConfigError(
            f"{key}.cluster_id",
            "the Kapsule cluster id is not set",
            "set cluster_id to the cluster's id (Scaleway console > Kubernetes > cluster > ID) or export CLUSTER_ID",
        )
    if not _ID.match(cluster_id):
        raise ConfigError(where("cluster_id"), f"{cluster_id!r} is not a cluster id", "copy the id (a UUID) as shown")
    region = values["region"] or DEFAULT_REGION
    if not _REGION.match(region):
        raise ConfigError(
            where("region"), f"{region!r} is not a Scaleway region", "use a region name such as fr-par, nl-ams, pl-waw"
        )
    api_url = api_base_url(where("api_url"), values["api_url"] or DEFAULT_API_URL, "https://api.scaleway.com")
    secret_key = _secret_key(key, raw, env, overridden, env_applies)
    return ScalewayConfig(
        cluster_id=cluster_id,
        region=region,
        api_url=api_url,
        secret_key=secret_key,
        request_timeout=_timeout(f"{key}.request_timeout", raw.get("request_timeout", DEFAULT_REQUEST_TIMEOUT)),
        max_attempts=_attempts(f"{key}.max_attempts", raw.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
    )


def _text(key: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ConfigError(key, f"expected a string, got {type(value).__name__}", "write a plain string value")
    return str(value).strip()


def _secret_key(
    key: str, raw: Mapping[str, Any], env: Mapping[str, str], overridden: dict[str, str], env_applies: bool
) -> str:
    if env_applies and env.get("SCW_SECRET_KEY"):
        return env["SCW_SECRET_KEY"].strip()
    if "secret_key_env" in raw:
        variable = _text(f"{key}.secret_key_env", raw["secret_key_env"])
        if not _ENV_NAME.match(variable):
            raise ConfigError(
                f"{key}.secret_key_env",
                # Do not echo the value: a key pasted here by mistake must not reach the logs.
                "the value is not an environment variable name",
                "give the NAME of the variable that holds the key, e.g. SCW_SECRET_KEY, not the key itself",
            )
        if "secret_key" in raw:
            raise ConfigError(
                f"{key}.secret_key_env",
                "both secret_key and secret_key_env are set",
                "keep only secret_key_env (preferred: it keeps the secret out of the file)",
            )
        value = (env.get(variable) or "").strip()
        if not value:
            raise ConfigError(
                f"{key}.secret_key_env",
                f"environment variable {variable} is not set or empty",
                f"export {variable} with the Scaleway secret key (e.g. from a Kubernetes Secret)",
            )
        return value
    # Never echo the value: only its type.
    given = raw.get("secret_key")
    if given is not None and not isinstance(given, str):
        raise ConfigError(f"{key}.secret_key", f"expected a string, got {type(given).__name__}", "quote the key")
    if not given or not given.strip():
        raise ConfigError(
            f"{key}.secret_key",
            "the Scaleway secret key is not set",
            "set secret_key_env to the name of an environment variable holding the key, or export SCW_SECRET_KEY",
        )
    return given.strip()


def _timeout(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(key, f"{value!r} is not a duration", "write seconds, e.g. 30 or 30s")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ConfigError(key, f"{value!r} is not a duration", "write seconds, e.g. 30 or 30s or 500ms")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not 0.1 <= seconds <= 300:
        raise ConfigError(key, f"{seconds:g}s is out of range", "use between 0.1s and 300s (default 30s)")
    return seconds


def _attempts(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"{value!r} is not a whole number", "write e.g. 4")
    if not 1 <= value <= 10:
        raise ConfigError(key, f"{value} is out of range", "use between 1 and 10 attempts (default 4)")
    return value
