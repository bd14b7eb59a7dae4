"""The ``scaleway:`` mapping of a backend; the upstream environment variables override it.

Its keys are described under each field below (and in docs/reference/config.md, generated from them).
Upstream reads only ``CLUSTER_ID``, ``SCW_SECRET_KEY``, ``SCW_REGION`` and ``SCW_API_URL`` (its
config file is never read, because of a shadowed variable). We follow the upstream README instead:
the file is read, and those variables override it when they are non-empty and this is the only
Scaleway backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails

from providers.config_values import (
    CloudSettings,
    ConfigModel,
    Secret,
    api_base_url,
    give_variable,
    not_checked,
    one_of,
    problem,
    rule_error,
    validate_cloud_settings,
    whole_number,
)

DEFAULT_API_URL = "https://api.scaleway.com"
DEFAULT_REGION = "fr-par"

# Ids go into URL paths: refuse anything that could change the path (/, ?, #, spaces).
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Scaleway regions look like fr-par, nl-ams, pl-waw, it-mil.
_REGION = re.compile(r"^[a-z]{2}-[a-z0-9]{2,8}$")
MODES = ("private", "public")
# A pool named in ``pools``: its name (Kapsule: lower-case letters, digits, dashes) or its id (a UUID).
_POOL_KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# The bound of one group's max_size: far above any Kapsule pool, low enough to catch a typo.
MAX_POOL_SIZE = 10_000


def _cluster_id(value: Any, info: ValidationInfo) -> str:
    text = str(value).strip() if isinstance(value, str) else ""
    if value is not None and not isinstance(value, str):
        raise problem(f"expected a string, got {type(value).__name__}", "quote the cluster id")
    if not text:
        fix = "set cluster_id to the cluster's id (Scaleway console > Kubernetes > cluster > ID), or " + give_variable(
            "CLUSTER_ID", "the cluster id", info.context
        )
        if (info.context or {}).get("offline"):
            raise not_checked("not in the file; expected from CLUSTER_ID at run time", fix)
        raise problem("the Kapsule cluster id is not set", fix)
    if not _ID.match(text):
        raise problem(f"{text!r} is not a cluster id", "copy the id (a UUID) as the console shows it")
    return text


def _region(value: Any) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not _REGION.match(text):
        raise problem(f"{value!r} is not a Scaleway region", "use a region name such as fr-par, nl-ams, pl-waw")
    return text


class PoolBounds(ConfigModel):
    """One pool of the public mode: the bounds the CA keeps it within (Kapsule's own are the managed
    autoscaler's, unused while its autoscaling is off)."""

    min_size: whole_number(0, MAX_POOL_SIZE, 0) = Field(..., validate_default=True)  # type: ignore[valid-type]
    """The fewest nodes the CA leaves in the pool (0 allows scale-from-zero)."""
    max_size: whole_number(1, MAX_POOL_SIZE, 10) = Field(..., validate_default=True)  # type: ignore[valid-type]
    """The most nodes the CA asks for; a scale-up beyond it is refused before anything is sent."""

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        low, high = raw.get("min_size"), raw.get("max_size")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and low > high:  # type: ignore[operator]
            return [rule_error("min_size", f"min_size {low} is above max_size {high}", "make min_size <= max_size")]
        return []


def _pool_key(value: Any) -> str:
    if not isinstance(value, str) or not _POOL_KEY.match(value):
        raise problem(
            f"{value!r} is not a Kapsule pool name or id",
            "name the pool as the console or `scw k8s pool list` shows it (its name, or its id)",
        )
    return value


class ScalewayConfig(CloudSettings):
    ENV_OVERRIDES: ClassVar[Mapping[str, str]] = {
        "cluster_id": "CLUSTER_ID",
        "secret_key": "SCW_SECRET_KEY",
        "region": "SCW_REGION",
        "api_url": "SCW_API_URL",
    }
    SECRET_FIELDS: ClassVar[tuple[str, ...]] = ("secret_key",)

    cluster_id: Annotated[str, BeforeValidator(_cluster_id)] = Field("", validate_default=True)
    """The Kapsule cluster's id (Scaleway console > Kubernetes > the cluster > ID)."""
    region: Annotated[str, BeforeValidator(_region)] = DEFAULT_REGION
    """The cluster's region: `fr-par`, `nl-ams`, `pl-waw`..."""
    api_url: api_base_url("https://api.scaleway.com") = DEFAULT_API_URL  # type: ignore[valid-type]
    """The Scaleway API."""
    secret_key: Secret = Field("", validate_default=True)
    """The secret key of an IAM API key (not its access key), sent as `X-Auth-Token`. Keep it out of the
    file: give it in the environment variable below, or name another one in `secret_key_env`."""
    mode: one_of(MODES, "Scaleway mode", normalise=str.lower) = "private"  # type: ignore[valid-type]
    """`private`: every pool whose Kapsule autoscaling is on, with the pool's own bounds, through the private
    autoscaler endpoints the in-tree provider uses (for a migration off it). `public` (self-managed): the pools
    named in `pools`, whose Kapsule autoscaling is off, through Kapsule's public API and the Instance product
    catalog; any IAM key with the right permission sets can use it."""
    pools: dict[Annotated[str, BeforeValidator(_pool_key)], PoolBounds] = {}
    """Public mode only: `{<pool name or id>: {min_size: n, max_size: m}}`, the pools that are node groups and
    their bounds. A named pool whose Kapsule autoscaling is on is left untouched, with one line saying so."""

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        mode = str(raw.get("mode") or "private").strip().lower()
        pools = raw.get("pools")
        if mode == "public" and not pools:
            return [
                rule_error(
                    "pools",
                    "the public mode manages only the pools it is given, and none is",
                    "add pools: {<pool name>: {min_size: 0, max_size: 10}} for each pool the CA should scale",
                )
            ]
        if mode == "private" and pools:
            return [
                rule_error(
                    "pools",
                    "pools is read only in the public mode (the private mode takes every pool whose Kapsule "
                    "autoscaling is on, with the pool's own bounds)",
                    "set mode: public, or remove pools",
                )
            ]
        return []

    @field_validator("secret_key")
    @classmethod
    def _secret_key_is_set(cls, value: str, info: ValidationInfo) -> str:
        if not value:
            fix = "set secret_key_env to the name of an environment variable holding the key, or " + give_variable(
                "SCW_SECRET_KEY", "the secret key", info.context
            )
            if (info.context or {}).get("offline"):
                raise not_checked("no key in the file; read from the environment at run time", fix)
            raise problem("the Scaleway secret key is not set", fix)
        return value

    @property
    def public(self) -> bool:
        return self.mode == "public"

    def __str__(self) -> str:
        return f"scaleway cluster {self.cluster_id} in {self.region} via {self.api_url} ({self.mode} mode)"


def parse_config(key: str, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool) -> ScalewayConfig:
    """One ``scaleway:`` mapping on its own; ConfigError names every bad key and its fix."""
    config: ScalewayConfig = validate_cloud_settings(ScalewayConfig, key, raw, env, env_applies)
    return config
