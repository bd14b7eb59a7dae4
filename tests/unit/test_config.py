"""The server config: a bad value fails at start-up with the key and the fix; env overrides the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from providers.config_errors import ConfigError
from server.config import parse

ROOT = Path(__file__).resolve().parents[2]
SECRET = "9c1d7a52-3b4e-4f60-8a71-2d3c4b5a6f70"


def scaleway(**overrides):
    raw = {"cluster_id": "11111111-2222-4333-8444-555555555555", "secret_key": SECRET}
    raw.update(overrides)
    return {"type": "scaleway", "scaleway": raw}


def config(**top):
    return {"backends": [scaleway()], **top}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"backends": []}, "backends"),
        (config(listen="nonsense"), "listen"),
        (config(listen="0.0.0.0:8086"), "listen"),  # plaintext on a non-loopback address
        (config(tls={"cert": "/nonexistent.crt", "key": "/nonexistent.key"}), "tls.cert"),
        (config(log={"format": "xml"}), "log.format"),
        (config(max_workers=0), "max_workers"),
        (config(unknown_key=1), "unknown_key"),
        ({"backends": [{"type": "aws"}]}, "backends[0].type"),
        ({"backends": [scaleway(secret_key="")]}, "backends[0].scaleway.secret_key"),
        (
            {"backends": [{**scaleway(), "node_groups": {"g": {"options": {"scale_down_unneeded_time": "soon"}}}}]},
            "backends[0].node_groups.g.options.scale_down_unneeded_time",
        ),
        (
            {"backends": [{**scaleway(), "node_groups": {"g": {"template": {"capacity": {"memory": "2 GB"}}}}}]},
            "backends[0].node_groups.g.template.capacity.memory",
        ),
        ({"backends": [{**scaleway(), "sync": {"interval": "10m", "max_staleness": "1m"}}]}, "backends[0].sync"),
    ],
)
def test_a_bad_value_names_its_key_and_a_fix(raw, key):
    with pytest.raises(ConfigError) as info:
        parse(raw, env={})
    assert info.value.key.startswith(key), info.value.key
    assert "Fix:" in str(info.value)
    assert SECRET not in str(info.value)


def test_plaintext_on_a_non_loopback_address_can_be_allowed_explicitly():
    parsed = parse(config(listen="0.0.0.0:8086", allow_plaintext_non_loopback=True), env={})
    assert parsed.listen == ("0.0.0.0", 8086)


def test_upstream_environment_variables_override_the_file():
    env = {"SCW_SECRET_KEY": "from-env-secret", "SCW_REGION": "nl-ams", "CLUSTER_ID": "cluster-from-env"}
    parsed = parse(config(), env=env)
    cloud = parsed.backends[0].cloud
    assert (cloud.secret_key, cloud.region, cloud.cluster_id) == ("from-env-secret", "nl-ams", "cluster-from-env")


def test_environment_does_not_apply_when_two_backends_share_a_type():
    raw = {"backends": [{**scaleway(), "name": "a"}, {**scaleway(), "name": "b"}]}
    parsed = parse(raw, env={"SCW_REGION": "nl-ams"})
    assert {b.cloud.region for b in parsed.backends} == {"fr-par"}


def test_the_secret_never_shows_in_the_parsed_config():
    parsed = parse(config(), env={})
    assert SECRET not in repr(parsed) and SECRET not in str(parsed.backends[0].cloud)


def test_validate_command_reports_ok_and_invalid_without_secrets(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config()))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"backends": [scaleway(region="Paris")]}))
    cloud = tmp_path / "cloud-config.yaml"
    cloud.write_text('address: "127.0.0.1:8086"\ngrpc_timeout: 10\n')
    env = {"PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "server.cli", "validate"]
    ok = subprocess.run([*run, "--config", str(good)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert ok.returncode == 0 and "OK" in ok.stdout
    failed = subprocess.run(
        [*run, "--config", str(bad), "--cloud-config", str(cloud)], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert failed.returncode == 1
    assert "backends[0].scaleway.region" in failed.stdout
    assert "grpc_timeout" in failed.stdout
    assert SECRET not in failed.stdout + failed.stderr + ok.stdout + ok.stderr
