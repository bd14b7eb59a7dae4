"""The ``bizfly:`` mapping of a backend; the upstream environment variables override it.

Its keys are described under each field below (and in docs/reference/config.md, generated from them).
When this is the only Bizfly backend, the upstream variables override the file:
``BIZFLYCLOUD_AUTH_METHOD``, ``BIZFLYCLOUD_EMAIL``, ``BIZFLYCLOUD_PASSWORD``,
``BIZFLYCLOUD_APP_CREDENTIAL_ID``, ``BIZFLYCLOUD_APP_CREDENTIAL_SECRET``, ``BIZFLYCLOUD_REGION``,
``BIZFLYCLOUD_API_URL``, ``BIZFLYCLOUD_PROJECT_ID`` (the Bizfly Terraform provider's name),
``BIZFLYCLOUD_TENANT_ID``, ``CLUSTER_NAME`` (an empty variable counts as unset).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails

from providers.bizfly.regions import normalize_region, region_code
from providers.config_values import (
    CloudSettings,
    Secret,
    api_base_url,
    not_checked,
    one_of,
    problem,
    rule_error,
    validate_cloud_settings,
)

PASSWORD = "password"
APPLICATION_CREDENTIAL = "application_credential"
AUTH_METHODS = (PASSWORD, APPLICATION_CREDENTIAL)

DEFAULT_API_URL = "https://manage.bizflycloud.vn"
DEFAULT_REGION = "HN"
_EXAMPLE_URL = "https://manage.bizflycloud.vn"
# Path segments are joined unescaped by the API client, so the cluster UID must be one plain segment.
_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Bizfly projects are OpenStack Keystone projects: their ids are 32 hexadecimal characters.
_PROJECT = re.compile(r"^[0-9a-fA-F]{32}$")
_PROJECT_EXAMPLE = "fd109a330e1a4ffbb85c336972d5aed4"
# A Kubernetes label value (63 characters at most).
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")
# What each login needs, and how to give it.
_REQUIRED = {
    PASSWORD: {
        "email": "set email (or BIZFLYCLOUD_EMAIL) to the account's login e-mail",
        "password": "set password_env (or BIZFLYCLOUD_PASSWORD) to the account password",
    },
    APPLICATION_CREDENTIAL: {
        "app_credential_id": "set app_credential_id (or BIZFLYCLOUD_APP_CREDENTIAL_ID)",
        "app_credential_secret": "set app_credential_secret_env (or BIZFLYCLOUD_APP_CREDENTIAL_SECRET)",
    },
}
_SECRETS = ("password", "app_credential_secret")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise problem(f"expected a string, got {type(value).__name__}", "quote it")
    return value.strip()


Text = Annotated[str, BeforeValidator(_text)]


def _cluster_name(value: Any, info: ValidationInfo) -> str:
    text = _text(value)
    fix = "set cluster_name (or CLUSTER_NAME) to the cluster UID from the Bizfly dashboard, e.g. ke1m4ea3j8w6kkvp"
    if not text:
        # Upstream then lists every cluster as if it were one and silently manages 0 groups.
        if (info.context or {}).get("offline"):
            raise not_checked("not in the file; expected from CLUSTER_NAME at run time", fix)
        raise problem("the cluster UID is missing", fix)
    if not _CLUSTER.match(text):
        raise problem(
            f"{text!r} is not a cluster UID (it must be one URL path segment)",
            "use the cluster UID (letters, digits, '-', '_', '.'), not a display name with spaces or slashes",
        )
    return text


def _region(value: Any) -> str:
    region = normalize_region(_text(value))
    if not region:
        raise problem("the region is empty", "use HN (Ha Noi) or HCM (Ho Chi Minh)")
    return region


def _project_id(value: Any) -> str:
    text = _text(value)
    if text and not _PROJECT.match(text):
        raise problem(
            f"{text!r} is not a Bizfly project id (32 hexadecimal characters)",
            f"use the project's ID from the Bizfly dashboard, like {_PROJECT_EXAMPLE}, not its name; or leave it "
            "unset to use the project the login gives",
        )
    return text.lower()


def _region_label(value: Any) -> str:
    text = _text(value)
    if not _LABEL_VALUE.match(text):
        raise problem(
            f"{text!r} is not a Kubernetes label value",
            "write the value your nodes carry in topology.kubernetes.io/region, e.g. HN",
        )
    return text


def _given(raw: Mapping[str, Any], key: str) -> bool:
    return raw.get(key) not in (None, "")


def infer_auth_method(raw: Mapping[str, Any]) -> str:
    """The login the mapping asks for: explicit, or the only kind of credential given; "" when unclear."""
    method = raw.get("auth_method")
    if isinstance(method, str) and method.strip():
        return method.strip().lower()
    has_password = _given(raw, "email") or _given(raw, "password")
    has_app = _given(raw, "app_credential_id") or _given(raw, "app_credential_secret")
    if has_password != has_app:
        return PASSWORD if has_password else APPLICATION_CREDENTIAL
    return ""


class BizflyConfig(CloudSettings):
    ENV_OVERRIDES: ClassVar[Mapping[str, str]] = {
        "auth_method": "BIZFLYCLOUD_AUTH_METHOD",
        "email": "BIZFLYCLOUD_EMAIL",
        "password": "BIZFLYCLOUD_PASSWORD",
        "app_credential_id": "BIZFLYCLOUD_APP_CREDENTIAL_ID",
        "app_credential_secret": "BIZFLYCLOUD_APP_CREDENTIAL_SECRET",
        "region": "BIZFLYCLOUD_REGION",
        "api_url": "BIZFLYCLOUD_API_URL",
        "project_id": "BIZFLYCLOUD_PROJECT_ID",
        "tenant_id": "BIZFLYCLOUD_TENANT_ID",
        "cluster_name": "CLUSTER_NAME",
    }
    SECRET_FIELDS: ClassVar[tuple[str, ...]] = _SECRETS

    cluster_name: Annotated[str, BeforeValidator(_cluster_name)] = Field("", validate_default=True)
    """The cluster UID as the API expects it in paths (e.g. `ke1m4ea3j8w6kkvp`), not its display name."""
    # Upstream sends any value to the token endpoint unchecked; refuse it here instead.
    auth_method: one_of(AUTH_METHODS, "login method", normalise=str.lower, allow_empty=True) = ""  # type: ignore[valid-type]
    """The login: with `email` and `password`, or with `app_credential_id` and `app_credential_secret`.
    Unset: the only kind of credential given."""
    region: Annotated[str, BeforeValidator(_region)] = "HaNoi"
    """The cluster's region: `HaNoi` (`HN`), `HoChiMinh` (`HCM`) or `VC-HaNoi`; any spelling (`hn`, `ha-noi`,
    `Ha Noi`...) is normalised."""
    api_url: api_base_url(_EXAMPLE_URL) = DEFAULT_API_URL  # type: ignore[valid-type]
    """Base of the service catalog (`<api_url>/api/auth/service`) and of the default `token_url`."""
    token_url: api_base_url(_EXAMPLE_URL) = ""  # type: ignore[valid-type]
    """The token endpoint. Unset: `<api_url>/api/token`."""
    kubernetes_engine_url: api_base_url(f"{_EXAMPLE_URL}/api/kubernetes-engine") | None = None  # type: ignore[valid-type]
    """The Kubernetes Engine endpoint. Unset: the one the service catalog names."""
    email: Text = ""
    """The account's login e-mail (password login)."""
    project_id: Annotated[str, BeforeValidator(_project_id)] = ""
    """The project the cluster belongs to (32 hexadecimal characters: the project's ID in the dashboard, not
    its name). It scopes the login and is sent as `X-Project-ID`; needed when the cluster is not in the
    account's default project. Unset: the project the login answers with."""
    tenant_id: Annotated[str, BeforeValidator(_project_id)] = ""
    """The older name of `project_id` (the in-tree provider's `BIZFLYCLOUD_TENANT_ID`). Given with
    `project_id`, both must name the same project."""
    region_label: Annotated[str, BeforeValidator(_region_label)] = ""
    """The value of `topology.kubernetes.io/region` on the cluster's nodes, put in scale-from-zero
    templates; set it only when the nodes carry something else than the region's short code. Unset: `HN`
    or `HCM`."""
    app_credential_id: Text = ""
    """The application credential's id (application-credential login)."""
    password: Secret = ""
    """The account's password (password login). Keep it out of the file: give it in the environment
    variable below, or name another one in `password_env`."""
    app_credential_secret: Secret = ""
    """The application credential's secret. Keep it out of the file: give it in the environment variable
    below, or name another one in `app_credential_secret_env`."""

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        errors = _project_rules(raw)
        return errors + cls._login_rules(raw, context)

    @classmethod
    def _login_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        offline = bool(context.get("offline"))
        method = infer_auth_method(raw)
        if not method:
            both = _given(raw, "email") or _given(raw, "password")
            fix = "set auth_method (or BIZFLYCLOUD_AUTH_METHOD) to password or application_credential"
            if offline and not both:
                return [rule_error("auth_method", "no credentials in the file; read at run time", fix, checked=False)]
            text = "cannot tell which login to use" + (" (both kinds of credentials are set)" if both else "")
            return [rule_error("auth_method", text, fix)]
        errors = []
        for key, fix in _REQUIRED.get(method, {}).items():
            if not _given(raw, key):
                text = f"{key} is required by auth method {method}" + (" (expected from the environment)" * offline)
                errors.append(rule_error(key, text, fix, checked=not offline))
        return errors

    @model_validator(mode="after")
    def _settle_the_login(self) -> BizflyConfig:
        method = self.auth_method or infer_auth_method(self.__dict__)
        # The other flow's secrets are not kept around; the token URL follows api_url by default.
        self.__dict__.update(
            auth_method=method,
            project_id=self.project_id or self.tenant_id,
            region_label=self.region_label or region_code(self.region),
            token_url=self.token_url or default_token_url(self.api_url),
            password=self.password if method == PASSWORD else "",
            app_credential_id=self.app_credential_id if method == APPLICATION_CREDENTIAL else "",
            app_credential_secret=self.app_credential_secret if method == APPLICATION_CREDENTIAL else "",
        )
        return self


def _project_rules(raw: Mapping[str, Any]) -> list[InitErrorDetails]:
    """``project_id`` and its older name ``tenant_id`` may both be given only with the same value."""
    project, tenant = (str(raw.get(k) or "").strip().lower() for k in ("project_id", "tenant_id"))
    if _PROJECT.match(project) and _PROJECT.match(tenant) and project != tenant:
        return [
            rule_error(
                "tenant_id",
                f"names project {tenant!r} while project_id names {project!r}",
                "keep one of them (project_id, or BIZFLYCLOUD_PROJECT_ID, is the current name)",
            )
        ]
    return []


def parse_config(key: str, raw: Mapping[str, Any], env: Mapping[str, str], env_applies: bool) -> BizflyConfig:
    """One ``bizfly:`` mapping on its own; ConfigError names every bad key and its fix."""
    config: BizflyConfig = validate_cloud_settings(BizflyConfig, key, raw, env, env_applies)
    return config


def api_base(api_url: str) -> str:
    """``<api_url>/api`` unless the URL already ends in ``/api`` (as newer gobizfly does)."""
    base = api_url.rstrip("/")
    return base if base.endswith("/api") else base + "/api"


def default_token_url(api_url: str) -> str:
    return api_base(api_url) + "/token"


def catalog_url(api_url: str) -> str:
    return api_base(api_url) + "/auth/service"
