"""The server config and the CA cloud-config that the manifests ship pass ``ca-externalgrpc validate``,
run as the real console script with the environment the pod would get from its Secret."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from devstack.certs import make_pki
from tests.deploy.chart import CHARTS, ChartSource, helm_template
from tests.deploy.rendering import DEPLOY, KUBERNETES, OVERLAYS, REPO, one, render

#: Values standing in for the placeholders of credentials.env.example (``<...>``). Values that are
#: not placeholders (regions, the auth method) are used as written, so they get validated too.
_DUMMIES = {
    "SCW_SECRET_KEY": str(uuid.UUID(int=1)),
    "CLUSTER_ID": str(uuid.UUID(int=2)),
    "BIZFLYCLOUD_APP_CREDENTIAL_ID": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": "dummy-application-credential-secret",
    "BIZFLYCLOUD_EMAIL": "ops@example.com",
    "BIZFLYCLOUD_PASSWORD": "dummy-password",
    "BIZFLYCLOUD_PROJECT_ID": "8d1f3b0c5e7a4b2f9c6d0e1a2b3c4d5e",
    "CLUSTER_NAME": "ke1m4ea3j8w6kkvp",
}


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("ca-externalgrpc")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "server.cli"]


def _validate(config: Path, cloud_config: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    # Only PATH from the outer environment: real SCW_*/BIZFLYCLOUD_* variables of the machine running
    # the tests must not leak into the check.
    return subprocess.run(
        [*_cli(), "validate", *options, "--config", str(config), "--cloud-config", str(cloud_config)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=REPO,
        timeout=60,
        check=False,
    )


def _secret_env(overlay: str) -> dict[str, str]:
    """The environment the pod gets from the Secret made from the overlay's credentials.env.example."""
    directory = {"overlays/mtls-service": "server-mtls"}.get(overlay, overlay)
    lines = (KUBERNETES / directory / "credentials.env.example").read_text().splitlines()
    data = dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    env = {}
    for key, value in data.items():
        if value.startswith("<") and value.endswith(">"):
            assert key in _DUMMIES, f"no dummy value for the Secret placeholder {key}"
            env[key] = _DUMMIES[key]
        else:
            env[key] = value
    return env


def _write_rendered(overlay: str, directory: Path) -> tuple[Path, Path]:
    docs = render(overlay)
    config = directory / "config.yaml"
    config.write_text(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    cloud_config = directory / "cloud-config"
    cloud_config.write_text(one(docs, "ConfigMap", "cluster-autoscaler-cloud-config")["data"]["cloud-config"])
    return config, cloud_config


def _point_tls_at_test_certificates(config: Path, cloud_config: Path, directory: Path) -> None:
    """The pods mount cert-manager's Secrets; here the same files come from a throwaway PKI."""
    pki = make_pki(directory / "pki")
    raw = yaml.safe_load(config.read_text())
    before = {k: v for k, v in raw.items() if k != "tls"}
    raw["tls"] = {"cert": str(pki.server_cert), "key": str(pki.server_key), "client_ca": str(pki.ca_cert)}
    config.write_text(yaml.safe_dump(raw))
    assert {k: v for k, v in yaml.safe_load(config.read_text()).items() if k != "tls"} == before
    ca_side = yaml.safe_load(cloud_config.read_text())
    if ca_side.get("cert"):
        ca_side.update(cert=str(pki.client_cert), key=str(pki.client_key), cacert=str(pki.ca_cert))
        cloud_config.write_text(yaml.safe_dump(ca_side))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_configs_pass_validate_with_the_secret_environment(overlay: str, tmp_path: Path) -> None:
    config, cloud_config = _write_rendered(overlay, tmp_path)
    if "tls" in yaml.safe_load(config.read_text()):
        _point_tls_at_test_certificates(config, cloud_config, tmp_path)
    result = _validate(config, cloud_config, _secret_env(overlay))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{config}: OK" in result.stdout
    assert f"{cloud_config}: OK" in result.stdout
    expected_mode = "mTLS" if overlay in ("overlays/mtls-service", "server-mtls") else "plaintext"
    assert f"({expected_mode})" in result.stdout


@pytest.mark.parametrize("overlay", ["overlays/scaleway", "overlays/bizfly"])
def test_rendered_config_is_rejected_without_its_secret(overlay: str, tmp_path: Path) -> None:
    """The credentials really come from the Secret: without it the same file does not validate."""
    config, cloud_config = _write_rendered(overlay, tmp_path)
    result = _validate(config, cloud_config, {})
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{config}: INVALID" in result.stdout
    assert f"{cloud_config}: OK" in result.stdout


def test_mtls_configs_are_rejected_when_the_certificate_files_are_not_mounted(tmp_path: Path) -> None:
    """The server and the CA both stop at start-up on a missing certificate file, so validate says so."""
    config, cloud_config = _write_rendered("server-mtls", tmp_path)
    result = _validate(config, cloud_config, _secret_env("server-mtls"))
    assert result.returncode == 1
    assert "tls.cert: file /etc/ca-externalgrpc/tls/tls.crt does not exist" in result.stdout
    assert f"{cloud_config}: INVALID: 'cert': file /etc/ssl/client-cert/tls.crt does not exist" in result.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_configs_pass_validate_offline_without_any_secret(overlay: str, tmp_path: Path) -> None:
    """Shape only: no Secret, no mounted file; what is left for the pod is listed, not failed."""
    config, cloud_config = _write_rendered(overlay, tmp_path)
    result = _validate(config, cloud_config, {}, "--offline")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{config}: OK (offline: shape only)" in result.stdout
    assert f"{cloud_config}: OK (offline: shape only)" in result.stdout
    assert "not checked: backends[0]." in result.stdout


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_helm_sidecar_configs_pass_validate_with_the_secret_environment(source: ChartSource, tmp_path: Path) -> None:
    """The server config and the CA cloud-config that values-sidecar.yaml puts in extraObjects."""
    docs = helm_template(source, (DEPLOY / "helm" / "values-sidecar.yaml",), "1.34.0")
    config = tmp_path / "config.yaml"
    config.write_text(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    cloud_config = tmp_path / "cloud-config"
    cloud_config.write_text(one(docs, "ConfigMap", "cluster-autoscaler-cloud-config")["data"]["cloud-config"])
    result = _validate(config, cloud_config, _secret_env("overlays/scaleway"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{config}: OK: listen 127.0.0.1:8086 (plaintext)" in result.stdout
    assert f"{cloud_config}: OK" in result.stdout
