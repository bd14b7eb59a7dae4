"""``config from-in-tree``: the in-tree providers' settings (CA 1.36.1) converted to our config, and checked.

Pure logic (server/from_in_tree.py), then the real command run on an in-tree Scaleway cloud-config and
a Bizfly environment, its output passed through ``ca-externalgrpc validate``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from server import from_in_tree
from server.config import validate
from server.from_in_tree import Conversion, check, convert
from tests.unit.test_config import run_cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CLUSTER = "11111111-2222-3333-4444-555555555555"
REPO = Path(__file__).resolve().parents[2]
SECRET = "3f0c2b4e-5d6a-4b7c-8d9e-0a1b2c3d4e5f"
SCALEWAY_ENV = {"CLUSTER_ID": CLUSTER, "SCW_SECRET_KEY": SECRET, "SCW_REGION": "nl-ams"}
BIZFLY_PASSWORD_ENV = {
    "BIZFLYCLOUD_AUTH_METHOD": "password",
    "BIZFLYCLOUD_EMAIL": "ops@example.com",
    "BIZFLYCLOUD_PASSWORD": "a-password-only-the-env-knows",
    "CLUSTER_NAME": "ke1m4ea3j8w6kkvp",
}
BIZFLY_APP_ENV = {
    "BIZFLYCLOUD_AUTH_METHOD": "application_credential",
    "BIZFLYCLOUD_APP_CREDENTIAL_ID": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": "an-app-secret-only-the-env-knows",
    "BIZFLYCLOUD_REGION": "HCM",
    "BIZFLYCLOUD_TENANT_ID": "8d1f3b0c5e7a4b2f9c6d0e1a2b3c4d5e",
    "CLUSTER_NAME": "ke1m4ea3j8w6kkvp",
}


def problems(conversion: Conversion) -> dict[str, str]:
    """Key -> problem text, after the server's own validation."""
    result = check(conversion)
    return {p.key: p.problem for p in result.problems}


def backend(conversion: Conversion) -> dict[str, Any]:
    assert check(conversion).problems == ()
    return conversion.config["backends"][0][conversion.cloud]


# ---------------------------------------------------------------------------- scaleway


def test_scaleway_variables_become_the_mapping_and_the_secret_stays_a_variable_name() -> None:
    conversion = convert("scaleway", {**SCALEWAY_ENV, "SCW_API_URL": "https://api.scaleway.com"})
    assert backend(conversion) == {
        "cluster_id": CLUSTER,
        "region": "nl-ams",
        "api_url": "https://api.scaleway.com",
        "secret_key_env": "SCW_SECRET_KEY",
    }
    assert conversion.config["backends"][0]["name"] == "scaleway"
    assert SECRET not in from_in_tree.config_yaml(conversion)
    assert conversion.notes == []


def test_scaleway_file_keys_match_without_case_and_a_variable_wins(tmp_path: Path) -> None:
    path = tmp_path / "cloud-config.json"
    path.write_text(json.dumps({"Cluster_ID": CLUSTER, "REGION": "fr-par", "api_url": "", "unknown": 1}))
    conversion = convert("scaleway", {"SCW_SECRET_KEY": SECRET, "SCW_REGION": "pl-waw"}, path)
    assert backend(conversion) == {"cluster_id": CLUSTER, "region": "pl-waw", "secret_key_env": "SCW_SECRET_KEY"}
    (note,) = conversion.notes
    assert note.startswith(f"cluster_id came from {path} only") and "never opens its --cloud-config" in note


def test_scaleway_secret_from_the_file_is_checked_but_never_written(tmp_path: Path) -> None:
    path = tmp_path / "cloud-config.json"
    path.write_text(json.dumps({"cluster_id": CLUSTER, "region": "fr-par", "secret_key": SECRET}))
    conversion = convert("scaleway", {}, path)
    assert backend(conversion)["secret_key_env"] == "SCW_SECRET_KEY"
    assert conversion.env["SCW_SECRET_KEY"] == SECRET  # what validation saw, in memory only
    text = from_in_tree.config_yaml(conversion)
    advice = from_in_tree.guidance(conversion, str(path), from_in_tree.in_tree_values(conversion, "s"), "in-tree", "s")
    assert SECRET not in text and SECRET not in advice
    assert any("put the key into the server's environment under that name" in n for n in conversion.notes)


def test_scaleway_what_the_in_tree_provider_stops_on_is_one_problem_each_with_its_fix() -> None:
    result = check(convert("scaleway", {}))
    assert [(p.key, p.problem) for p in result.problems] == [
        ("CLUSTER_ID", "the cluster id is not set (the in-tree provider stops with 'cluster ID is not provided')"),
        (
            "SCW_SECRET_KEY",
            "the secret key is not set (the in-tree provider stops with 'scaleway secret key is not provided')",
        ),
        ("SCW_REGION", "the region is not set (the in-tree provider stops with 'region is not provided')"),
    ]
    assert all(p.fix.startswith("export ") for p in result.problems)


def test_scaleway_bad_values_are_reported_at_the_variable_or_file_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "cloud-config.json"
    path.write_text(json.dumps({"cluster_id": "abc/def", "region": "fr-par"}))
    env = {"SCW_SECRET_KEY": SECRET, "SCW_REGION": "paris", "SCW_API_URL": "http://api.scaleway.com"}
    found = problems(convert("scaleway", env, path))
    assert found == {
        f"{path}: cluster_id": "'abc/def' is not a cluster id",
        "environment variable SCW_REGION (for backends[0].scaleway.region)": "'paris' is not a Scaleway region",
        "environment variable SCW_API_URL (for backends[0].scaleway.api_url)": (
            "'http://api.scaleway.com' would send credentials unencrypted"
        ),
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot read"), ("{not json", "not valid JSON"), ('["a list"]', "expected a JSON object")],
)
def test_scaleway_unreadable_cloud_config_is_a_problem(tmp_path: Path, content: str | None, problem: str) -> None:
    path = tmp_path / "cloud-config.json"
    if content is not None:
        path.write_text(content)
    result = check(convert("scaleway", SCALEWAY_ENV, path))
    assert [p.problem.split(" ")[:2] for p in result.problems] == [problem.split(" ")[:2]]


# ---------------------------------------------------------------------------- bizfly


def test_bizfly_password_login() -> None:
    conversion = convert("bizflycloud", BIZFLY_PASSWORD_ENV)
    assert backend(conversion) == {
        "cluster_name": "ke1m4ea3j8w6kkvp",
        "auth_method": "password",
        "email": "ops@example.com",
        "password_env": "BIZFLYCLOUD_PASSWORD",
        "region": "HN",  # the in-tree default
    }
    assert "a-password-only-the-env-knows" not in from_in_tree.config_yaml(conversion)


def test_bizfly_application_credential_login() -> None:
    conversion = convert("bizflycloud", BIZFLY_APP_ENV)
    assert backend(conversion) == {
        "cluster_name": "ke1m4ea3j8w6kkvp",
        "auth_method": "application_credential",
        "app_credential_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        "app_credential_secret_env": "BIZFLYCLOUD_APP_CREDENTIAL_SECRET",
        "region": "HCM",
        "project_id": "8d1f3b0c5e7a4b2f9c6d0e1a2b3c4d5e",  # the in-tree X-Tenant-Id, now X-Project-ID
    }


def test_bizfly_api_url_keeps_scheme_and_host_and_the_login_stays_at_production() -> None:
    conversion = convert("bizflycloud", {**BIZFLY_PASSWORD_ENV, "BIZFLYCLOUD_API_URL": "https://hn.example.vn/api/x"})
    mapping = backend(conversion)
    assert mapping["api_url"] == "https://hn.example.vn"
    assert mapping["token_url"] == "https://manage.bizflycloud.vn/api/token"
    assert len(conversion.notes) == 2 and "path is dropped" in conversion.notes[0]


def test_bizfly_unset_login_method_follows_the_only_kind_of_credential_given() -> None:
    env = {k: v for k, v in BIZFLY_APP_ENV.items() if k != "BIZFLYCLOUD_AUTH_METHOD"}
    conversion = convert("bizflycloud", env)
    assert backend(conversion)["auth_method"] == "application_credential"
    assert "BIZFLYCLOUD_AUTH_METHOD is not set" in conversion.notes[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"CLUSTER_NAME": "c1"},
            {
                "BIZFLYCLOUD_AUTH_METHOD": (
                    "not set, and no credentials are given (the in-tree client's login is refused)"
                )
            },
        ),
        (
            {**BIZFLY_PASSWORD_ENV, **BIZFLY_APP_ENV, "BIZFLYCLOUD_AUTH_METHOD": ""},
            {
                "BIZFLYCLOUD_AUTH_METHOD": (
                    "not set, and credentials of both kinds are given: the login the CA made cannot be told"
                )
            },
        ),
        (
            {**BIZFLY_PASSWORD_ENV, "BIZFLYCLOUD_AUTH_METHOD": "token"},
            {"BIZFLYCLOUD_AUTH_METHOD": "'token' is not a login method (the token endpoint refuses it)"},
        ),
        (
            {"BIZFLYCLOUD_AUTH_METHOD": "password", "BIZFLYCLOUD_EMAIL": "ops@example.com"},
            {
                "CLUSTER_NAME": (
                    "the cluster UID is not set (the in-tree provider then lists every cluster as if it were one "
                    "and manages no node group at all)"
                ),
                "BIZFLYCLOUD_PASSWORD": (
                    "the password is not set (the in-tree provider stops with 'you have to provide password variable')"
                ),
            },
        ),
        (
            {"BIZFLYCLOUD_AUTH_METHOD": "application_credential", "CLUSTER_NAME": "a b"},
            {
                "BIZFLYCLOUD_APP_CREDENTIAL_ID": (
                    "the application credential id is not set (the in-tree provider stops with 'you have to provide "
                    "application credential ID')"
                ),
                "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": (
                    "the application credential secret is not set (the in-tree provider stops with 'you have to "
                    "provide application credential secret')"
                ),
                "environment variable CLUSTER_NAME (for backends[0].bizfly.cluster_name)": (
                    "'a b' is not a cluster UID (it must be one URL path segment)"
                ),
            },
        ),
    ],
    ids=["no-login", "both-logins", "unknown-method", "password-without-cluster", "app-credential-incomplete"],
)
def test_bizfly_what_the_in_tree_provider_would_refuse(env: dict[str, str], expected: dict[str, str]) -> None:
    assert problems(convert("bizflycloud", env)) == expected


def test_bizfly_cloud_config_is_only_opened(tmp_path: Path) -> None:
    readable = tmp_path / "anything"
    readable.write_text("not read by the provider")
    assert problems(convert("bizflycloud", BIZFLY_PASSWORD_ENV, readable)) == {}
    found = problems(convert("bizflycloud", BIZFLY_PASSWORD_ENV, tmp_path / "missing"))
    assert list(found) == ["--cloud-config"] and "Couldn't open cloud provider configuration" in found["--cloud-config"]


# ---------------------------------------------------------------------------- layouts as deploy/ ships them


def _without_backends(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "backends"}


@pytest.mark.parametrize(
    ("provider", "layout", "shipped"),
    [
        ("scaleway", "sidecar", "kubernetes/overlays/scaleway/config.yaml"),
        ("bizflycloud", "sidecar", "kubernetes/overlays/bizfly/config.yaml"),
        ("scaleway", "service", "kubernetes/server-mtls/config.yaml"),
    ],
)
def test_converted_config_is_the_shipped_one_with_the_cloud_mapping_filled_in(
    provider: str, layout: str, shipped: str
) -> None:
    env = SCALEWAY_ENV if provider == "scaleway" else BIZFLY_PASSWORD_ENV
    conversion = convert(provider, env, layout=layout)
    ours = conversion.config
    theirs = yaml.safe_load((DEPLOY / shipped).read_text())
    assert _without_backends(ours) == _without_backends(theirs)
    (our_backend,) = ours["backends"]
    (their_backend,) = theirs["backends"]
    cloud = conversion.cloud
    our_backend.pop(cloud)
    their_backend.pop(cloud)
    assert our_backend == their_backend
    assert list(ours) == list(theirs)  # the same order, so a diff against the shipped file is small


@pytest.mark.parametrize(
    ("layout", "shipped"),
    [("sidecar", "kubernetes/components/loopback/cloud-config"), ("service", "kubernetes/server-mtls/cloud-config")],
)
def test_the_ca_cloud_config_is_the_shipped_one(layout: str, shipped: str) -> None:
    assert yaml.safe_load(from_in_tree.ca_cloud_config_yaml(layout)) == yaml.safe_load((DEPLOY / shipped).read_text())


def test_helm_values_are_the_shipped_ones_with_the_converted_config() -> None:
    conversion = convert("scaleway", SCALEWAY_ENV)
    values = from_in_tree.migrated_values(conversion, {"cloudProvider": "scaleway", "envFromSecret": "x"}, "x")
    shipped = yaml.safe_load((DEPLOY / "helm" / "values-sidecar.yaml").read_text())
    (ours,) = values["initContainers"]
    (theirs,) = shipped["initContainers"]
    assert ours == {**theirs, "envFrom": [{"secretRef": {"name": "x"}}]}
    assert values["extraVolumes"] == shipped["extraVolumes"]
    assert values["extraVolumeMounts"] == shipped["extraVolumeMounts"]
    assert values["extraArgs"]["cloud-config"] == shipped["extraArgs"]["cloud-config"]
    assert values["updateStrategy"] == shipped["updateStrategy"] == {"type": "Recreate"}
    assert "envFromSecret" not in values and values["cloudProvider"] == "externalgrpc"
    objects = {o["metadata"]["name"]: o["data"] for o in values["extraObjects"]}
    assert yaml.safe_load(objects["ca-externalgrpc-config"]["config.yaml"]) == conversion.config
    shipped_objects = {o["metadata"]["name"]: o.get("data") for o in shipped["extraObjects"]}
    assert yaml.safe_load(objects["cluster-autoscaler-cloud-config"]["cloud-config"]) == yaml.safe_load(
        shipped_objects["cluster-autoscaler-cloud-config"]["cloud-config"]
    )


def test_helm_values_of_the_service_layout_are_the_shipped_ones() -> None:
    conversion = convert("bizflycloud", BIZFLY_PASSWORD_ENV, layout="service")
    values = from_in_tree.migrated_values(conversion, {"cloudProvider": "bizflycloud", "extraArgs": {"v": 4}}, "x")
    shipped = yaml.safe_load((DEPLOY / "helm" / "values-mtls-service.yaml").read_text())
    for key in ("extraVolumes", "extraVolumeMounts", "podLabels", "updateStrategy"):
        assert values[key] == shipped[key], key
    assert values["extraArgs"] == {"v": 4, "cloud-config": "/config/cloud-config"}  # the operator's flags stay
    assert "initContainers" not in values and "extraObjects" not in values


# ---------------------------------------------------------------------------- the command


def test_from_in_tree_on_a_scaleway_cloud_config_passes_validate(tmp_path: Path) -> None:
    cloud_config = tmp_path / "scaleway.json"
    cloud_config.write_text(json.dumps({"cluster_id": CLUSTER, "region": "fr-par", "secret_key": SECRET}))
    output = tmp_path / "config.yaml"
    done = run_cli(
        "config", "from-in-tree", "--cloud-provider", "scaleway", "--cloud-config", str(cloud_config),
        "--output", str(output),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert SECRET not in output.read_text() + done.stdout + done.stderr
    assert "--cloud-provider=scaleway  ->  --cloud-provider=externalgrpc" in done.stdout
    assert "\n-cloudProvider: scaleway\n" in done.stdout and "\n+cloudProvider: externalgrpc\n" in done.stdout
    # The server reads the key from SCW_SECRET_KEY, as the note says.
    checked = run_cli("validate", "--config", str(output), env={"SCW_SECRET_KEY": SECRET})
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.startswith(f"{output}: OK: listen 127.0.0.1:8086 (plaintext); backends: scaleway")


def test_from_in_tree_on_a_bizfly_environment_passes_validate(tmp_path: Path) -> None:
    env_file = tmp_path / "credentials.env"
    env_file.write_text("# the CA's Secret\n" + "".join(f"{k}={v}\n" for k, v in BIZFLY_APP_ENV.items()))
    done = run_cli("config", "from-in-tree", "--cloud-provider", "bizflycloud", "--env-file", str(env_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--cloud-provider=bizflycloud  ->  --cloud-provider=externalgrpc" in done.stderr  # advice on stderr
    config = tmp_path / "config.yaml"
    config.write_text(done.stdout)  # the config alone on stdout
    checked = run_cli("validate", "--config", str(config), env=BIZFLY_APP_ENV)
    assert checked.returncode == 0, checked.stdout
    assert "backends: bizfly (bizfly" in checked.stdout


def test_from_in_tree_names_every_problem_of_a_broken_input_and_fails(tmp_path: Path) -> None:
    env_file = tmp_path / "credentials.env"
    env_file.write_text("BIZFLYCLOUD_AUTH_METHOD=password\nBIZFLYCLOUD_API_URL=http://api.example.com\nnot a line\n")
    done = run_cli("config", "from-in-tree", "--cloud-provider", "bizflycloud", "--env-file", str(env_file))
    # Problems go to stderr: `... > config.yaml` shows them on the terminal and leaves no error in the file.
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "in-tree bizflycloud settings: INVALID: 1 problem",
        f"  - {env_file}:3: not a KEY=VALUE line. Fix: write one VARIABLE=value per line",
    ]
    env_file.write_text("BIZFLYCLOUD_AUTH_METHOD=password\nBIZFLYCLOUD_API_URL=http://api.example.com\n")
    done = run_cli("config", "from-in-tree", "--cloud-provider", "bizflycloud", "--env-file", str(env_file))
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "in-tree bizflycloud settings: INVALID: 4 problems"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  - CLUSTER_NAME",
        "  - BIZFLYCLOUD_EMAIL",
        "  - BIZFLYCLOUD_PASSWORD",
        "  - environment variable BIZFLYCLOUD_API_URL (for backends[0].bizfly.api_url)",
    ]
    assert all(". Fix: " in line for line in lines[1:])
    # The variables came from the file: the fix is a line of that file, not an export in this shell.
    assert lines[1].endswith(
        "Fix: add the line CLUSTER_NAME=<the cluster UID from the Bizfly dashboard, e.g. ke1m4ea3j8w6kkvp> "
        f"to {env_file}"
    )
    assert lines[2].endswith(f"Fix: add the line BIZFLYCLOUD_EMAIL=<the login e-mail> to {env_file}")
    from_environment = run_cli(
        "config", "from-in-tree", "--cloud-provider", "bizflycloud", env={"BIZFLYCLOUD_AUTH_METHOD": "password"}
    )
    assert from_environment.stderr.splitlines()[2].endswith("Fix: export BIZFLYCLOUD_EMAIL=<the login e-mail>")


@pytest.mark.parametrize(
    ("mapping", "key", "problem"),
    [
        ({"auth_method": "password", "email": "a@b.c", "password": "p"}, "cluster_name", "the cluster UID is missing"),
        (
            {"auth_method": "token", "email": "a@b.c", "password": "p", "cluster_name": "c1"},
            "auth_method",
            "'token' is not a login method",
        ),
    ],
)
def test_the_server_refuses_at_start_what_the_in_tree_bizfly_provider_accepts(
    mapping: dict[str, str], key: str, problem: str
) -> None:
    # The in-tree provider runs with no node group at all, or sends the login the API refuses.
    result = validate({"backends": [{"type": "bizfly", "bizfly": mapping}]}, env={})
    assert [(p.key, p.problem) for p in result.problems] == [(f"backends[0].bizfly.{key}", problem)]


# ---------------------------------------------------------------------------------------------- issue 32
def _scaleway_env_file(tmp_path: Path) -> Path:
    env_file = tmp_path / "credentials.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SCALEWAY_ENV.items()))
    return env_file


def _sidecar_secret(values_diff: str) -> str:
    """The secretRef name the diff gives the sidecar."""
    lines = values_diff.splitlines()
    at = lines.index("+  - secretRef:")
    return lines[at + 1].removeprefix("+      name: ")


def test_from_in_tree_keeps_the_secret_the_helm_values_already_use(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("cloudProvider: scaleway\nenvFromSecret: scw-creds\n")
    done = run_cli(
        "config", "from-in-tree", "--cloud-provider", "scaleway", "--env-file", str(_scaleway_env_file(tmp_path)),
        "--helm-values", str(values), "--output", str(tmp_path / "config.yaml"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The sidecar reads the Secret the pod already has: applied as printed, nothing points at a missing one.
    assert _sidecar_secret(done.stdout) == "scw-creds"
    assert "(Secret scw-creds, same keys" in done.stdout
    assert done.stderr == ""


def test_from_in_tree_says_loudly_when_secret_replaces_the_values_secret(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("cloudProvider: scaleway\nenvFromSecret: scw-creds\n")
    done = run_cli(
        "config", "from-in-tree", "--cloud-provider", "scaleway", "--env-file", str(_scaleway_env_file(tmp_path)),
        "--helm-values", str(values), "--secret", "new-creds",
    )  # fmt: skip
    assert done.returncode == 0
    warning = next(line for line in done.stderr.splitlines() if line.startswith("WARNING: "))
    assert "--secret new-creds replaces the envFromSecret of your values (scw-creds)" in warning
    assert "must exist with the same keys" in warning
    assert _sidecar_secret(done.stderr) == "new-creds"
    assert done.stdout.startswith("# ca-externalgrpc config")  # the config alone on stdout


def test_from_in_tree_service_layout_names_the_secret_server_mtls_reads(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("cloudProvider: scaleway\nenvFromSecret: scw-creds\n")
    done = run_cli(
        "config", "from-in-tree", "--cloud-provider", "scaleway", "--env-file", str(_scaleway_env_file(tmp_path)),
        "--helm-values", str(values), "--layout", "service", "--output", str(tmp_path / "config.yaml"),
    )  # fmt: skip
    assert done.returncode == 0
    assert (
        "WARNING: the service layout (deploy/kubernetes/server-mtls) reads Secret ca-externalgrpc-credentials, "
        "not scw-creds" in done.stderr
    )
    # --output asked for no offline check: no "not checked (offline)" lines about files only the pod has.
    assert "not checked" not in done.stdout + done.stderr
    assert "offline" not in done.stdout


def test_from_in_tree_redirected_to_a_file_leaves_problems_on_the_terminal(tmp_path: Path) -> None:
    # As docs/reference/in-tree-differences.md runs it: `... from-in-tree ... > config.yaml`, here with nothing set.
    config = tmp_path / "config.yaml"
    with config.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "server.cli", "config", "from-in-tree", "--cloud-provider", "scaleway"],
            stdout=out, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=REPO, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert config.read_text() == ""  # no error text in the file
    assert done.stderr.startswith("in-tree scaleway settings: INVALID: 3 problems")
