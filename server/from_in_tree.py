"""``ca-externalgrpc config from-in-tree``: what an in-tree provider of the CA reads, as this server's config.

A cluster moving off ``--cloud-provider=scaleway`` or ``--cloud-provider=bizflycloud`` already has
everything the server needs, in the shape the CA's own provider reads it (CA 1.36.1):

- ``scaleway``: the ``--cloud-config`` JSON file (keys ``cluster_id``, ``secret_key``, ``region``,
  ``api_url``, matched whatever their case, as Go's ``encoding/json`` does) and the variables
  ``CLUSTER_ID``, ``SCW_SECRET_KEY``, ``SCW_REGION``, ``SCW_API_URL``; a non-empty variable wins over
  the file. The provider stops when the cluster id, the secret key or the region is missing (there is
  no default region). Its constructor never actually opens the file (a shadowed variable), so a
  cluster that ran the in-tree provider has them all in variables; the file is still read here, as the
  provider's README documents and as this server does.
- ``bizflycloud``: the variables ``BIZFLYCLOUD_AUTH_METHOD``, ``BIZFLYCLOUD_EMAIL``,
  ``BIZFLYCLOUD_PASSWORD``, ``BIZFLYCLOUD_APP_CREDENTIAL_ID``, ``BIZFLYCLOUD_APP_CREDENTIAL_SECRET``,
  ``BIZFLYCLOUD_REGION`` (default ``HN``), ``BIZFLYCLOUD_API_URL`` (default the production host; only
  its scheme and host are used), ``BIZFLYCLOUD_TENANT_ID`` and ``CLUSTER_NAME`` (the cluster UID). The
  login always goes to the production token URL. A ``--cloud-config`` file is opened (the CA stops if
  it cannot be) and never read.

``convert`` turns that into a server config for one layout (the CA's sidecar, or a Service with mTLS,
as deploy/ ships them) with every secret referenced by the name of the variable that holds it, never
written into the config; ``check`` runs the server's own validation on it. Problems are
``ConfigProblem``s, keyed by the variable or the file they came from, as ``validate`` reports them.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from providers.config_errors import ConfigError, ConfigProblem
from providers.config_values import validate_cloud_settings
from server.config import CLOUD_MODELS, Validation, validate

#: ``--cloud-provider`` values of the CA this command converts, and the backend type each becomes
IN_TREE_PROVIDERS: Mapping[str, str] = {"scaleway": "scaleway", "bizflycloud": "bizfly"}
LAYOUTS = ("sidecar", "service")

SCALEWAY_VARIABLES = {"cluster_id": "CLUSTER_ID", "secret_key": "SCW_SECRET_KEY", "region": "SCW_REGION"}
SCALEWAY_API_URL = "SCW_API_URL"
BIZFLY_AUTH_METHOD = "BIZFLYCLOUD_AUTH_METHOD"
BIZFLY_EMAIL = "BIZFLYCLOUD_EMAIL"
BIZFLY_PASSWORD = "BIZFLYCLOUD_PASSWORD"
BIZFLY_APP_ID = "BIZFLYCLOUD_APP_CREDENTIAL_ID"
BIZFLY_APP_SECRET = "BIZFLYCLOUD_APP_CREDENTIAL_SECRET"
BIZFLY_REGION = "BIZFLYCLOUD_REGION"
BIZFLY_API_URL = "BIZFLYCLOUD_API_URL"
BIZFLY_TENANT_ID = "BIZFLYCLOUD_TENANT_ID"
BIZFLY_CLUSTER = "CLUSTER_NAME"
#: where gobizfly (vendored in the CA) logs in, whatever BIZFLYCLOUD_API_URL says
BIZFLY_PRODUCTION_TOKEN_URL = "https://manage.bizflycloud.vn/api/token"
BIZFLY_DEFAULT_REGION = "HN"
#: our ``bizfly:`` keys -> the variable each comes from (a problem at the key is reported at the variable)
BIZFLY_ORIGINS = {
    "cluster_name": BIZFLY_CLUSTER,
    "auth_method": BIZFLY_AUTH_METHOD,
    "email": BIZFLY_EMAIL,
    "password": BIZFLY_PASSWORD,
    "password_env": BIZFLY_PASSWORD,
    "app_credential_id": BIZFLY_APP_ID,
    "app_credential_secret": BIZFLY_APP_SECRET,
    "app_credential_secret_env": BIZFLY_APP_SECRET,
    "region": BIZFLY_REGION,
    "api_url": BIZFLY_API_URL,
    "token_url": BIZFLY_API_URL,
    "project_id": BIZFLY_TENANT_ID,
}

# The layouts as deploy/ ships them (tests/unit/test_from_in_tree.py keeps the two equal).
SERVER_SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "sidecar": {"listen": "127.0.0.1:8086", "http_listen": "[::]:8087", "shutdown_grace": "15s"},
    "service": {
        "listen": "[::]:8086",
        "http_listen": "[::]:8087",
        "tls": {
            "cert": "/etc/ca-externalgrpc/tls/tls.crt",
            "key": "/etc/ca-externalgrpc/tls/tls.key",
            "client_ca": "/etc/ca-externalgrpc/tls/ca.crt",
        },
        "shutdown_grace": "15s",
        # Two replicas behind the Service: only the Lease holder writes (docs/explanation/kubernetes.md).
        "kubernetes": {
            "leader_election": {
                "enabled": True,
                "lease_name": "ca-externalgrpc",
                "lease_duration": "15s",
                "renew_deadline": "10s",
                "retry_period": "2s",
                "follower_connection_age": "5s",
            },
            "journal": {"enabled": True, "configmap": "ca-externalgrpc-journal"},
            "learned_templates": {"enabled": True, "configmap_prefix": "ca-externalgrpc-templates"},
            "events": {"enabled": True, "object_name": "ca-externalgrpc-status"},
        },
    },
}
LOG_SETTINGS = {"format": "json", "level": "info"}
SYNC_SETTINGS = {"interval": "30s", "max_staleness": "10m"}
CA_CLOUD_CONFIG_PATH = "/config/cloud-config"
CA_CLOUD_CONFIGS: Mapping[str, Mapping[str, str]] = {
    "sidecar": {"address": "127.0.0.1:8086", "grpc_timeout": "10s"},
    "service": {
        "address": "ca-externalgrpc-server.kube-system.svc:8086",
        "cert": "/etc/ssl/client-cert/tls.crt",
        "key": "/etc/ssl/client-cert/tls.key",
        "cacert": "/etc/ssl/client-cert/ca.crt",
        "grpc_timeout": "10s",
    },
}
#: the chart's Deployment strategy in both layouts, as deploy/helm's values files set it: one CA pod at a time (a
#: rolling update would run the old and the new CA side by side, and the sidecar's size changes in flight
#: live in its memory)
UPDATE_STRATEGY: Mapping[str, str] = {"type": "Recreate"}
#: the Secret the deploy/ layouts mount into the server; the in-tree CA's variables keep their names there
CREDENTIALS_SECRET = "ca-externalgrpc-credentials"
SIDECAR_IMAGE = "ca-externalgrpc-server:0.2.0"


@dataclass
class Conversion:
    """One in-tree setup as our config; ``problems`` empty when it converted."""

    provider: str
    layout: str
    backend: dict[str, Any] = field(default_factory=dict)
    #: the variables validation sees: the in-tree ones, plus a secret found in the cloud-config file
    env: dict[str, str] = field(default_factory=dict)
    #: config key of the cloud mapping -> where its value came from (a variable, or file: key)
    origins: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[ConfigProblem] = field(default_factory=list)
    #: the --env-file the variables were read from; None: this process's environment
    env_file: str | None = None

    def give(self, variable: str, value: str) -> str:
        """How the operator gives this command a missing variable: where it reads them from."""
        if self.env_file:
            return f"add the line {variable}={value} to {self.env_file}"
        return f"export {variable}={value}"

    @property
    def cloud(self) -> str:
        return IN_TREE_PROVIDERS[self.provider]

    @property
    def config(self) -> dict[str, Any]:
        """The whole server config for the layout, in the key order of deploy/'s files."""
        config = copy.deepcopy(dict(SERVER_SETTINGS[self.layout]))
        config["log"] = dict(LOG_SETTINGS)
        config["backends"] = [
            {"name": self.cloud, "type": self.cloud, self.cloud: dict(self.backend), "sync": dict(SYNC_SETTINGS)}
        ]
        return config


def _variable(env: Mapping[str, str], name: str) -> str:
    """What ``os.Getenv`` gives the provider, trimmed; an empty variable counts as unset, as upstream."""
    return (env.get(name) or "").strip()


def _missing(variable: str, what: str, upstream_error: str, fix: str) -> ConfigProblem:
    return ConfigProblem(variable, f"{what} is not set (the in-tree provider stops with {upstream_error!r})", fix)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``kubectl create secret --from-env-file``'s format); ConfigError when unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ConfigError.single(
            "--env-file", f"cannot read {path}: {err.strerror or err}", "pass a readable KEY=VALUE file"
        ) from None
    found: dict[str, str] = {}
    problems = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            problems.append(
                ConfigProblem(f"{path}:{number}", "not a KEY=VALUE line", "write one VARIABLE=value per line")
            )
            continue
        found[key.strip()] = value
    if problems:
        raise ConfigError(problems)
    return found


# ---------------------------------------------------------------------------- scaleway


def _scaleway_file(path: Path | None, conversion: Conversion) -> dict[str, str]:
    """The cloud-config JSON's known keys (Go matches JSON keys without case and ignores the others)."""
    if path is None:
        return {}
    try:
        text = path.read_text()
    except OSError as err:
        conversion.problems.append(
            ConfigProblem(
                "--cloud-config",
                f"cannot read {path}: {err.strerror or err}",
                "pass the file the CA's --cloud-config names, or leave the flag out if the CA had none",
            )
        )
        return {}
    try:
        raw = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        conversion.problems.append(
            ConfigProblem(
                str(path), f"not valid JSON ({err.msg} at line {err.lineno})", "fix the JSON, or pass the variables"
            )
        )
        return {}
    if not isinstance(raw, dict):
        conversion.problems.append(
            ConfigProblem(str(path), "expected a JSON object", 'write {"cluster_id": "...", "region": "..."}')
        )
        return {}
    values: dict[str, str] = {}
    for key in ("cluster_id", "secret_key", "region", "api_url"):
        for found, value in raw.items():
            if isinstance(found, str) and found.lower() == key and isinstance(value, str) and value.strip():
                values[key] = value.strip()
    return values


def _scaleway(env: Mapping[str, str], cloud_config: Path | None, conversion: Conversion) -> None:
    from_file = _scaleway_file(cloud_config, conversion)
    checks = {
        "cluster_id": (
            "the cluster id",
            "cluster ID is not provided",
            conversion.give("CLUSTER_ID", "<the Kapsule cluster id>"),
        ),
        "secret_key": (
            "the secret key",
            "scaleway secret key is not provided",
            conversion.give("SCW_SECRET_KEY", "<an IAM secret key>") + " (the CA's Secret holds it)",
        ),
        "region": (
            "the region",
            "region is not provided",
            conversion.give("SCW_REGION", "<the cluster's region, e.g. fr-par>"),
        ),
    }
    values: dict[str, str] = {}
    for key, variable in [*SCALEWAY_VARIABLES.items(), ("api_url", SCALEWAY_API_URL)]:
        value = _variable(env, variable)
        conversion.origins[key] = variable
        if value:
            values[key] = value
        elif key in from_file:
            values[key], conversion.origins[key] = from_file[key], f"{cloud_config}: {key}"
        elif key in checks:
            what, upstream, fix = checks[key]
            conversion.problems.append(_missing(variable, what, upstream, fix))
    file_only = sorted(k for k, origin in conversion.origins.items() if origin.startswith(f"{cloud_config}:"))
    if file_only:
        conversion.notes.append(
            f"{', '.join(file_only)} came from {cloud_config} only: the in-tree provider of CA <= 1.36.1 never "
            "opens its --cloud-config (a shadowed variable), so check these are the values your cluster runs with"
        )
    backend: dict[str, Any] = {}
    for key in ("cluster_id", "region", "api_url"):
        if key in values:
            backend[key] = values[key]
    backend["secret_key_env"] = SCALEWAY_VARIABLES["secret_key"]
    conversion.env = dict(env)
    if "secret_key" in values and conversion.origins["secret_key"] != SCALEWAY_VARIABLES["secret_key"]:
        # Checked as the server will see it; the value is never written into the config.
        conversion.env[SCALEWAY_VARIABLES["secret_key"]] = values["secret_key"]
        conversion.notes.append(
            f"the secret key was in {cloud_config}: the config names the variable SCW_SECRET_KEY instead; put the "
            f"key into the server's environment under that name (Secret {CREDENTIALS_SECRET}) and remove it from "
            "the file"
        )
    conversion.origins["secret_key_env"] = conversion.origins["secret_key"]
    conversion.backend = backend


# ---------------------------------------------------------------------------- bizfly


def _bizfly_api_url(value: str, conversion: Conversion) -> str:
    """gobizfly resolves ``/api/auth/service`` against BIZFLYCLOUD_API_URL: only scheme and host count."""
    parts = urlsplit(value)
    if not parts.scheme or not parts.netloc:
        return value  # the schema names what is wrong with it
    base = f"{parts.scheme}://{parts.netloc}"
    if parts.path.strip("/"):
        conversion.notes.append(
            f"{BIZFLY_API_URL}={value}: the in-tree client keeps only its scheme and host (the path is dropped when "
            f"it resolves /api/auth/service), so api_url is {base}"
        )
    return base


def _bizfly(env: Mapping[str, str], cloud_config: Path | None, conversion: Conversion) -> None:
    if cloud_config is not None:
        try:
            with cloud_config.open("rb"):
                pass
        except OSError as err:
            conversion.problems.append(
                ConfigProblem(
                    "--cloud-config",
                    f"cannot open {cloud_config}: {err.strerror or err} (the in-tree provider stops with "
                    "'Couldn't open cloud provider configuration')",
                    "pass the file the CA's --cloud-config names, or leave the flag out (the provider never reads it)",
                )
            )
    value = {name: _variable(env, name) for name in (
        BIZFLY_AUTH_METHOD, BIZFLY_EMAIL, BIZFLY_PASSWORD, BIZFLY_APP_ID, BIZFLY_APP_SECRET, BIZFLY_REGION,
        BIZFLY_API_URL, BIZFLY_TENANT_ID, BIZFLY_CLUSTER,
    )}  # fmt: skip
    backend: dict[str, Any] = {}
    conversion.origins.update(BIZFLY_ORIGINS)
    if value[BIZFLY_CLUSTER]:
        backend["cluster_name"] = value[BIZFLY_CLUSTER]
    else:
        conversion.problems.append(
            ConfigProblem(
                BIZFLY_CLUSTER,
                "the cluster UID is not set (the in-tree provider then lists every cluster as if it were one and "
                "manages no node group at all)",
                conversion.give(BIZFLY_CLUSTER, "<the cluster UID from the Bizfly dashboard, e.g. ke1m4ea3j8w6kkvp>"),
            )
        )
    method = value[BIZFLY_AUTH_METHOD].lower()
    has_password = bool(value[BIZFLY_EMAIL] or value[BIZFLY_PASSWORD])
    has_app = bool(value[BIZFLY_APP_ID] or value[BIZFLY_APP_SECRET])
    if not method and has_password != has_app:
        method = "password" if has_password else "application_credential"
        conversion.notes.append(
            f"{BIZFLY_AUTH_METHOD} is not set: the in-tree client sent an empty auth_method; the config says "
            f"{method}, the only kind of credential given"
        )
    if method == "password":
        needed = {
            BIZFLY_EMAIL: ("the login e-mail", "you have to provide username variable"),
            BIZFLY_PASSWORD: ("the password", "you have to provide password variable"),
        }
    elif method == "application_credential":
        needed = {
            BIZFLY_APP_ID: ("the application credential id", "you have to provide application credential ID"),
            BIZFLY_APP_SECRET: (
                "the application credential secret",
                "you have to provide application credential secret",
            ),
        }
    else:
        needed = {}
        if method:
            shown = f"{method!r} is not a login method (the token endpoint refuses it)"
        elif has_password:
            shown = "not set, and credentials of both kinds are given: the login the CA made cannot be told"
        else:
            shown = "not set, and no credentials are given (the in-tree client's login is refused)"
        conversion.problems.append(
            ConfigProblem(
                BIZFLY_AUTH_METHOD,
                shown,
                conversion.give(BIZFLY_AUTH_METHOD, "password")
                + " (with BIZFLYCLOUD_EMAIL and BIZFLYCLOUD_PASSWORD), or application_credential (with "
                "BIZFLYCLOUD_APP_CREDENTIAL_ID and _SECRET)",
            )
        )
    for variable, (what, upstream) in needed.items():
        if not value[variable]:
            conversion.problems.append(_missing(variable, what, upstream, conversion.give(variable, f"<{what}>")))
    if method:
        backend["auth_method"] = method
    if value[BIZFLY_EMAIL] and method != "application_credential":
        backend["email"] = value[BIZFLY_EMAIL]
    if method == "password":
        backend["password_env"] = BIZFLY_PASSWORD
    if method == "application_credential":
        backend["app_credential_id"] = value[BIZFLY_APP_ID]
        backend["app_credential_secret_env"] = BIZFLY_APP_SECRET
    backend["region"] = value[BIZFLY_REGION] or BIZFLY_DEFAULT_REGION
    if value[BIZFLY_API_URL]:
        backend["api_url"] = _bizfly_api_url(value[BIZFLY_API_URL], conversion)
        # The in-tree client logs in at the production URL whatever BIZFLYCLOUD_API_URL says; so does the
        # config, so the switch changes nothing. Without token_url the server logs in at <api_url>/api/token.
        backend["token_url"] = BIZFLY_PRODUCTION_TOKEN_URL
        conversion.notes.append(
            f"token_url is {BIZFLY_PRODUCTION_TOKEN_URL}, where the in-tree client logged in whatever "
            f"{BIZFLY_API_URL} said; remove it to log in at <api_url>/api/token instead"
        )
    if value[BIZFLY_TENANT_ID]:
        # The in-tree client sent it as X-Tenant-Id; it is the project id (the Bizfly cloud-controller-manager
        # passes the same variable on as one), sent as X-Project-ID (docs/reference/bizfly.md, "Authentication").
        backend["project_id"] = value[BIZFLY_TENANT_ID]
    conversion.env = dict(env)
    conversion.backend = backend


# ---------------------------------------------------------------------------- conversion and checks


def convert(
    provider: str,
    env: Mapping[str, str],
    cloud_config: Path | None = None,
    layout: str = "sidecar",
    env_file: str | None = None,
) -> Conversion:
    """The in-tree ``provider``'s settings in ``env`` (read from ``env_file``, or this process's environment,
    and its cloud-config file) as our config."""
    if provider not in IN_TREE_PROVIDERS:
        raise ValueError(f"unknown in-tree provider {provider!r}: use one of {', '.join(IN_TREE_PROVIDERS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    conversion = Conversion(provider, layout, env_file=env_file)
    if provider == "scaleway":
        _scaleway(env, cloud_config, conversion)
    else:
        _bizfly(env, cloud_config, conversion)
    return conversion


def _located(problem: ConfigProblem, conversion: Conversion) -> ConfigProblem:
    """A problem at ``backends[0].<cloud>.<key>`` named by where the operator must fix it."""
    prefix = f"backends[0].{conversion.cloud}."
    key = problem.key.removeprefix(prefix)
    if problem.key.startswith(prefix) and key in conversion.origins:
        return ConfigProblem(conversion.origins[key], problem.problem, problem.fix)
    return problem  # elsewhere, or the schema already names the variable it came from


def check(conversion: Conversion) -> Validation:
    """The server's own validation of the converted config, with the environment the server will have,
    after the conversion's own findings (what the in-tree provider would refuse); one problem per key.

    The Service layout names certificate files that exist only in the pod, so that config is checked
    offline (its shape) and its cloud mapping on its own, online (secrets from the environment).
    """
    offline = conversion.layout == "service"
    result = validate(conversion.config, conversion.env, offline=offline, shell=True)
    found = [_located(p, conversion) for p in result.problems]
    unchecked = [u for u in result.unchecked if not u.key.startswith("backends")]
    if offline and not found:
        model = CLOUD_MODELS[conversion.cloud]
        try:
            validate_cloud_settings(model, f"backends[0].{conversion.cloud}", conversion.backend, conversion.env, True)
        except ConfigError as err:
            found += [_located(p, conversion) for p in err.problems]
    problems = list(conversion.problems)
    reported = {p.key for p in problems}
    for schema_problem in found:
        # "environment variable X (for ...)" when the value came from X: the same place as a finding at X
        variable = schema_problem.key.removeprefix("environment variable ").split(" ", 1)[0]
        if schema_problem.key not in reported and variable not in reported:
            problems.append(schema_problem)
            reported.add(schema_problem.key)
    if problems:
        return Validation(None, tuple(problems), tuple(unchecked))
    return Validation(result.config, (), tuple(unchecked))


# ---------------------------------------------------------------------------- what else changes


class _Dumper(yaml.SafeDumper):
    """YAML as a person writes it: no anchors, multi-line strings (embedded files) as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False)


def config_yaml(conversion: Conversion) -> str:
    head = (
        f"# ca-externalgrpc config converted from the CA's in-tree {conversion.provider} provider "
        f"({conversion.layout} layout; docs/reference/in-tree-differences.md).\n"
        "# Secrets are named by the variable that holds them, never written here.\n"
    )
    return head + dump(conversion.config)


def ca_cloud_config_yaml(layout: str) -> str:
    return dump(dict(CA_CLOUD_CONFIGS[layout]))


def ca_flag_changes(conversion: Conversion, old_cloud_config: str | None, secret: str) -> list[str]:
    """The CA container's flag and environment changes, one line each."""
    read = (
        {*SCALEWAY_VARIABLES.values(), SCALEWAY_API_URL}
        if conversion.provider == "scaleway"
        else {*BIZFLY_ORIGINS.values()}
    )
    variables = sorted(name for name in read if _variable(conversion.env, name)) or ["(none set)"]
    return [
        f"--cloud-provider={conversion.provider}  ->  --cloud-provider=externalgrpc",
        f"--cloud-config={old_cloud_config or '(none)'}  ->  --cloud-config={CA_CLOUD_CONFIG_PATH} "
        f"(the externalgrpc cloud-config below)",
        "every other flag stays as it is (--nodes and --node-group-auto-discovery were ignored by the in-tree "
        "provider and are by externalgrpc: the server lists the groups)",
        f"environment: move {', '.join(variables)} from the CA container to the server's (Secret {secret}, "
        "same keys: the server reads the same variables); the CA needs none of them",
    ]


def _sidecar_container(secret: str) -> dict[str, Any]:
    """The server as a native sidecar of the chart's CA pod, as deploy/helm/values-sidecar.yaml has it."""
    probe = {"httpGet": {"path": "/healthz", "port": "http-probes"}}
    return {
        "name": "ca-externalgrpc",
        "image": SIDECAR_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["serve", "--config=/etc/ca-externalgrpc/config.yaml"],
        "envFrom": [{"secretRef": {"name": secret}}],
        "ports": [
            {"name": "grpc", "containerPort": 8086, "protocol": "TCP"},
            {"name": "http-probes", "containerPort": 8087, "protocol": "TCP"},
        ],
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 30},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http-probes"}, "periodSeconds": 10,
                           "failureThreshold": 3},
        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "server-config", "mountPath": "/etc/ca-externalgrpc", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }  # fmt: skip


def _config_map(name: str, key: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "{{ .Release.Namespace }}"},
        "data": {key: text},
    }


def migrated_values(conversion: Conversion, current: Mapping[str, Any], secret: str) -> dict[str, Any]:
    """``current`` (the in-tree install's Helm values) switched to externalgrpc in the conversion's layout."""
    values = {k: v for k, v in current.items() if k != "envFromSecret"}  # the CA needs no cloud credentials
    values["cloudProvider"] = "externalgrpc"
    values["extraArgs"] = {**(current.get("extraArgs") or {}), "cloud-config": CA_CLOUD_CONFIG_PATH}
    values["updateStrategy"] = dict(UPDATE_STRATEGY)
    if "autoDiscovery" not in values:
        # The chart renders nothing without one of these; externalgrpc makes no flag of it.
        values["autoDiscovery"] = {"clusterName": "my-cluster"}
    volumes = list(current.get("extraVolumes") or [])
    mounts = list(current.get("extraVolumeMounts") or [])
    objects = list(current.get("extraObjects") or [])
    if conversion.layout == "sidecar":
        values["initContainers"] = [*(current.get("initContainers") or []), _sidecar_container(secret)]
        volumes += [
            {"name": "cloud-config", "configMap": {"name": "cluster-autoscaler-cloud-config"}},
            {"name": "server-config", "configMap": {"name": "ca-externalgrpc-config"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ]
        mounts.append({"name": "cloud-config", "mountPath": "/config", "readOnly": True})
        objects += [
            _config_map("cluster-autoscaler-cloud-config", "cloud-config", ca_cloud_config_yaml("sidecar")),
            _config_map("ca-externalgrpc-config", "config.yaml", dump(conversion.config)),
        ]
    else:
        # The server runs apart (deploy/kubernetes/server-mtls, with the config above as its config.yaml),
        # which also creates the CA's cloud-config ConfigMap; the CA mounts it and its client certificate.
        volumes += [
            {"name": "cloud-config", "configMap": {"name": "cluster-autoscaler-cloud-config"}},
            {"name": "client-cert", "secret": {"secretName": "ca-externalgrpc-client-tls"}},
        ]
        mounts += [
            {"name": "cloud-config", "mountPath": "/config", "readOnly": True},
            {"name": "client-cert", "mountPath": "/etc/ssl/client-cert", "readOnly": True},
        ]
        values["podLabels"] = {**(current.get("podLabels") or {}), "ca-externalgrpc/client": "true"}
    values["extraVolumes"], values["extraVolumeMounts"] = volumes, mounts
    if objects:
        values["extraObjects"] = objects
    return values


def choose_secret(given: str | None, values: Mapping[str, Any] | None, layout: str) -> tuple[str, list[str]]:
    """The Secret the server will read, and warnings about any Secret the operator's pod would lose.

    The in-tree install's ``envFromSecret`` already holds the variables the server reads: it is kept
    unless ``--secret`` names another, which is said loudly (the pod would reference a Secret that may
    not exist). The Service layout's kustomize tree reads ``ca-externalgrpc-credentials`` by name.
    """
    in_use = values.get("envFromSecret") if values is not None else None
    in_use = in_use if isinstance(in_use, str) and in_use else None
    secret = given or in_use or CREDENTIALS_SECRET
    warnings = []
    if given and in_use and given != in_use:
        warnings.append(
            f"--secret {given} replaces the envFromSecret of your values ({in_use}): the server will read Secret "
            f"{given}, which must exist with the same keys before you apply the values (kubectl -n kube-system get "
            f"secret {in_use} -o yaml shows them); leave --secret out to keep {in_use}"
        )
    if layout == "service" and secret != CREDENTIALS_SECRET:
        warnings.append(
            f"the service layout (deploy/kubernetes/server-mtls) reads Secret {CREDENTIALS_SECRET}, not {secret}: "
            f"create {CREDENTIALS_SECRET} with the keys of {secret}, or change the secretRef of "
            f"server-mtls/deployment.yaml to {secret}"
        )
    return secret, warnings


def in_tree_values(conversion: Conversion, secret: str) -> dict[str, Any]:
    """The Helm values of an in-tree install, as far as this command knows them: the provider and its Secret."""
    return {"cloudProvider": conversion.provider, "envFromSecret": secret}


def helm_values_diff(conversion: Conversion, current: Mapping[str, Any], label: str, secret: str) -> str:
    """A unified diff from the in-tree install's values to the externalgrpc ones."""
    before = dump(dict(current)).splitlines(keepends=True)
    after = dump(migrated_values(conversion, current, secret)).splitlines(keepends=True)
    target = f"values for --cloud-provider=externalgrpc, {conversion.layout} layout"
    return "".join(difflib.unified_diff(before, after, fromfile=label, tofile=target))


def guidance(
    conversion: Conversion, old_cloud_config: str | None, values: Mapping[str, Any], label: str, secret: str
) -> str:
    """What the operator applies besides the config: notes, CA flags, the CA's cloud-config, Helm values."""
    lines: list[str] = []
    if conversion.notes:
        lines.append("Notes:")
        lines += [f"  - {note}" for note in conversion.notes]
    lines.append("CA flags and environment:")
    lines += [f"  - {change}" for change in ca_flag_changes(conversion, old_cloud_config, secret)]
    lines.append(f"The CA's externalgrpc cloud-config ({CA_CLOUD_CONFIG_PATH}):")
    lines += [f"  {line}" for line in ca_cloud_config_yaml(conversion.layout).splitlines()]
    if conversion.layout == "service":
        lines.append(
            "Server: kubectl apply -k deploy/kubernetes/server-mtls with the config above as its config.yaml "
            f"(two replicas, leader election, cert-manager certificates, whose files the server reads at start; "
            f"it reads Secret {CREDENTIALS_SECRET}: create it with the same keys if yours has another name); "
            "then the Helm values below."
        )
    lines.append("Helm values (official cluster-autoscaler chart):")
    lines.append(helm_values_diff(conversion, values, label, secret).rstrip("\n"))
    lines.append("Rollback: restore the values (or flags) on the left and delete the server; nothing else changed.")
    return "\n".join(lines) + "\n"
