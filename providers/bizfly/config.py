"""The ``bizfly:`` mapping of a backend, validated; the upstream environment variables override it.

Keys (all strings):

==========================  ====================================================================
``auth_method``             ``password`` or ``application_credential`` (inferred when only one kind
                            of credential is given)
``email`` / ``password``    password flow; ``email`` is also sent as ``X-Tenant-Name`` like upstream
``app_credential_id`` /     application-credential flow
``app_credential_secret``
``password_env``,           names of environment variables holding those secrets, so the file can
``app_credential_secret_env``  stay free of them
``region``                  default ``HN``; any spelling of a known region (``hn``, ``HaNoi``,
                            ``ha-noi``...) is normalised (providers/bizfly/regions.py)
``api_url``                 default ``https://manage.bizflycloud.vn``: base of the service catalog
                            (``<api_url>/api/auth/service``) and of the default token URL
``token_url``               default ``<api_url>/api/token`` (upstream hard-codes the production URL)
``kubernetes_engine_url``   the Kubernetes Engine endpoint; when set, the catalog is not read
``tenant_id``               sent as ``X-Tenant-Id`` (empty when unset, as upstream)
``cluster_name``            the cluster UID as the API expects it in paths (upstream ``CLUSTER_NAME``)
``request_timeout``         seconds, cap for one HTTP attempt (default 30)
==========================  ====================================================================

When this is the only Bizfly backend (``env_applies``), the upstream variables override the file:
``BIZFLYCLOUD_AUTH_METHOD``, ``BIZFLYCLOUD_EMAIL``, ``BIZFLYCLOUD_PASSWORD``,
``BIZFLYCLOUD_APP_CREDENTIAL_ID``, ``BIZFLYCLOUD_APP_CREDENTIAL_SECRET``, ``BIZFLYCLOUD_REGION``,
``BIZFLYCLOUD_API_URL``, ``BIZFLYCLOUD_TENANT_ID``, ``CLUSTER_NAME`` (an empty variable counts as unset).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.bizfly.regions import normalize_region
from providers.config_errors import ConfigError
from providers.config_values import api_base_url

PASSWORD = "password"
APPLICATION_CREDENTIAL = "application_credential"
AUTH_METHODS = (PASSWORD, APPLICATION_CREDENTIAL)

DEFAULT_API_URL = "https://manage.bizflycloud.vn"
DEFAULT_REGION = "HN"
DEFAULT_REQUEST_TIMEOUT = 30.0

# Config key -> upstream environment variable that overrides it.
ENV_OVERRIDES: Mapping[str, str] = {
    "auth_method": "BIZFLYCLOUD_AUTH_METHOD",
    "email": "BIZFLYCLOUD_EMAIL",
    "password": "BIZFLYCLOUD_PASSWORD",
    "app_credential_id": "BIZFLYCLOUD_APP_CREDENTIAL_ID",
    "app_credential_secret": "BIZFLYCLOUD_APP_CREDENTIAL_SECRET",
    "region": "BIZFLYCLOUD_REGION",
    "api_url": "BIZFLYCLOUD_API_URL",
    "tenant_id": "BIZFLYCLOUD_TENANT_ID",
    "cluster_name": "CLUSTER_NAME",
}
_SECRET_ENV_KEYS = {"password_env": "password", "app_credential_secret_env": "app_credential_secret"}
_STRING_KEYS = (
    "auth_method",
    "email",
    "password",
    "app_credential_id",
    "app_credential_secret",
    "region",
    "api_url",
    "token_url",
    "kubernetes_engine_url",
    "tenant_id",
    "cluster_name",
)
ALLOWED_KEYS = frozenset({*_STRING_KEYS, *_SECRET_ENV_KEYS, "request_timeout"})
# Path segments are joined unescaped by the API client, so the cluster UID must be one plain segment.
_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True)
class BizflyConfig:
    cluster_name: str
    auth_method: str
    region: str  # canonical (regions.normalize_region)
    api_url: str
    token_url: str
    kubernetes_engine_url: str | None = None
    email: str = ""
    tenant_id: str = ""
    app_credential_id: str = ""
    # Secrets: kept out of repr so a config dump or a traceback never shows them.
    password: str = field(default="", repr=False)
    app_credential_secret: str = field(default="", repr=False)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.password, self.app_credential_secret) if s)


def parse_config(key: str, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool) -> BizflyConfig:
    """Validate one backend's ``bizfly:`` mapping; ``key`` is its path for error messages."""
    unknown = sorted(set(raw) - ALLOWED_KEYS)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}", "unknown key", f"remove it or use one of: {', '.join(sorted(ALLOWED_KEYS))}"
        )
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name in _STRING_KEYS:
        if name in raw and raw[name] is not None:
            if not isinstance(raw[name], str | int | float) or isinstance(raw[name], bool):
                raise ConfigError(f"{key}.{name}", f"expected a string, got {type(raw[name]).__name__}", "quote it")
            values[name] = str(raw[name]).strip()
            sources[name] = f"{key}.{name}"
    for env_key, target in _SECRET_ENV_KEYS.items():
        if raw.get(env_key):
            var = str(raw[env_key])
            if not env.get(var):
                raise ConfigError(
                    f"{key}.{env_key}",
                    f"environment variable {var} is not set or empty",
                    f"export {var} with the {target.replace('_', ' ')} or remove {env_key}",
                )
            values[target] = env[var]
            sources[target] = f"{key}.{env_key}"
    if env_applies:
        for name, var in ENV_OVERRIDES.items():
            if env.get(var):
                values[name] = env[var].strip()
                sources[name] = var

    def where(name: str) -> str:
        return sources.get(name, f"{key}.{name}")

    method = _auth_method(values, where)
    if method == PASSWORD:
        _require(values, "email", where, "set email (or BIZFLYCLOUD_EMAIL) to the account's login e-mail")
        _require(values, "password", where, "set password_env (or BIZFLYCLOUD_PASSWORD) to the account password")
    else:
        _require(values, "app_credential_id", where, "set app_credential_id (or BIZFLYCLOUD_APP_CREDENTIAL_ID)")
        _require(
            values,
            "app_credential_secret",
            where,
            "set app_credential_secret_env (or BIZFLYCLOUD_APP_CREDENTIAL_SECRET)",
        )
    cluster = values.get("cluster_name", "")
    if not cluster:
        # Upstream sends GET <k8s>/_/ (the cluster *list*) and silently manages 0 groups.
        raise ConfigError(
            where("cluster_name"),
            "the cluster UID is missing",
            "set cluster_name (or CLUSTER_NAME) to the cluster UID from the Bizfly dashboard, e.g. ke1m4ea3j8w6kkvp",
        )
    if not _CLUSTER.match(cluster):
        raise ConfigError(
            where("cluster_name"),
            f"{cluster!r} is not a cluster UID (it must be one URL path segment)",
            "use the cluster UID (letters, digits, '-', '_', '.'), not a display name with spaces or slashes",
        )
    region = normalize_region(values.get("region") or DEFAULT_REGION)
    if not region:
        raise ConfigError(where("region"), "the region is empty", "use HN (Ha Noi) or HCM (Ho Chi Minh)")
    example = "https://manage.bizflycloud.vn"
    api_url = api_base_url(where("api_url"), values.get("api_url") or DEFAULT_API_URL, example)
    token_url = api_base_url(where("token_url"), values.get("token_url") or default_token_url(api_url), example)
    k8s_url = values.get("kubernetes_engine_url")
    if k8s_url:
        k8s_url = api_base_url(where("kubernetes_engine_url"), k8s_url, f"{example}/api/kubernetes-engine")
    return BizflyConfig(
        cluster_name=cluster,
        auth_method=method,
        region=region,
        api_url=api_url,
        token_url=token_url,
        kubernetes_engine_url=k8s_url or None,
        email=values.get("email", ""),
        tenant_id=values.get("tenant_id", ""),
        app_credential_id=values.get("app_credential_id", "") if method == APPLICATION_CREDENTIAL else "",
        password=values.get("password", "") if method == PASSWORD else "",
        app_credential_secret=values.get("app_credential_secret", "") if method == APPLICATION_CREDENTIAL else "",
        request_timeout=_timeout(f"{key}.request_timeout", raw.get("request_timeout", DEFAULT_REQUEST_TIMEOUT)),
    )


def api_base(api_url: str) -> str:
    """``<api_url>/api`` unless the URL already ends in ``/api`` (as newer gobizfly does)."""
    base = api_url.rstrip("/")
    return base if base.endswith("/api") else base + "/api"


def default_token_url(api_url: str) -> str:
    return api_base(api_url) + "/token"


def catalog_url(api_url: str) -> str:
    return api_base(api_url) + "/auth/service"


def _auth_method(values: Mapping[str, str], where: Any) -> str:
    method = values.get("auth_method", "").lower()
    if method:
        if method not in AUTH_METHODS:
            # Upstream sends any value to the token endpoint unchecked; fail here instead.
            raise ConfigError(
                where("auth_method"), f"unknown auth method {method!r}", f"use one of: {', '.join(AUTH_METHODS)}"
            )
        return method
    has_password = bool(values.get("email") or values.get("password"))
    has_app = bool(values.get("app_credential_id") or values.get("app_credential_secret"))
    if has_password != has_app:
        return PASSWORD if has_password else APPLICATION_CREDENTIAL
    raise ConfigError(
        where("auth_method"),
        "cannot tell which login to use" + (" (both kinds of credentials are set)" if has_password else ""),
        "set auth_method (or BIZFLYCLOUD_AUTH_METHOD) to password or application_credential",
    )


def _require(values: Mapping[str, str], name: str, where: Any, fix: str) -> None:
    if not values.get(name):
        raise ConfigError(
            where(name), f"{name} is required by auth method {values.get('auth_method') or 'chosen'}", fix
        )


def _timeout(key: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"{value!r} is not a number of seconds", "use e.g. 30") from None
    if not 1 <= seconds <= 300:
        raise ConfigError(key, f"{seconds:g}s is outside 1..300 s", "use e.g. 30")
    return seconds
