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

from providers.config_values import (
    CloudSettings,
    Secret,
    api_base_url,
    give_variable,
    not_checked,
    problem,
    validate_cloud_settings,
)

DEFAULT_API_URL = "https://api.scaleway.com"
DEFAULT_REGION = "fr-par"

# Ids go into URL paths: refuse anything that could change the path (/, ?, #, spaces).
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Scaleway regions look like fr-par, nl-ams, pl-waw, it-mil.
_REGION = re.compile(r"^[a-z]{2}-[a-z0-9]{2,8}$")


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

    def __str__(self) -> str:
        return f"scaleway cluster {self.cluster_id} in {self.region} via {self.api_url}"


def parse_config(key: str, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool) -> ScalewayConfig:
    """One ``scaleway:`` mapping on its own; ConfigError names every bad key and its fix."""
    config: ScalewayConfig = validate_cloud_settings(ScalewayConfig, key, raw, env, env_applies)
    return config
