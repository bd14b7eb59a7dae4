"""The server config: every mistake at once, each with its key and fix; one duration type; env precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devstack.certs import make_pki
from providers.config_errors import ConfigError
from providers.config_values import format_duration, parse_go_duration, validate_cloud_settings
from server.cloud_config import check_cloud_config
from server.config import CLOUD_MODELS, parse, validate
from server.http_server import HttpLimits

ROOT = Path(__file__).resolve().parents[2]
SECRET = "9c1d7a52-3b4e-4f60-8a71-2d3c4b5a6f70"
CLUSTER = "11111111-2222-4333-8444-555555555555"
MINIMAL = {"scaleway": {"cluster_id": CLUSTER, "secret_key": SECRET}, "bizfly": {"cluster_name": "ke1m4ea3j8w6kkvp"}}
BIZFLY_LOGIN = {"email": "ops@example.com", "password": SECRET}


def scaleway(**overrides):
    raw = {"cluster_id": CLUSTER, "secret_key": SECRET}
    raw.update(overrides)
    return {"type": "scaleway", "scaleway": raw}


def config(**top):
    return {"backends": [scaleway()], **top}


def problems(raw, env=None, **kwargs):
    result = validate(raw, env={} if env is None else env, **kwargs)
    assert result.config is None, "expected problems"
    return result.problems


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        timeout=60,
    )


# ---------------------------------------------------------------------------- every mistake, with its fix


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"backends": []}, "backends"),
        (config(listen="nonsense"), "listen"),
        (config(listen="0.0.0.0:8086"), "listen"),  # plaintext on a non-loopback address
        (config(tls={"cert": "/nonexistent.crt", "key": "/nonexistent.key"}), "tls.cert"),
        (config(tls={"cert": "/nonexistent.crt"}), "tls.key"),
        (config(log={"format": "xml"}), "log.format"),
        (config(max_workers=0), "max_workers"),
        (config(http={"max_connections": 2}), "http.max_connections"),
        (config(http={"max_connections": "many"}), "http.max_connections"),
        (config(http={"request_timeout": 5}), "http.request_timeout"),
        (config(http={"request_timeout": "10m"}), "http.request_timeout"),
        (config(http={"idle_timeout": "0s"}), "http.idle_timeout"),
        (config(http={"keepalive": "30s"}), "http.keepalive"),
        (config(serving={"engine": "rust"}), "serving.engine"),
        (config(serving={"max_connections": 0}), "serving.max_connections"),
        (config(serving={"max_header_list_size": "16KiB"}), "serving.max_header_list_size"),
        (config(serving={"keepalive_time": 60}), "serving.keepalive_time"),
        (config(serving={"handshake_timeout": "0s"}), "serving.handshake_timeout"),
        (config(serving={"request_buffer": 1024}), "serving.request_buffer"),
        (config(unknown_key=1), "unknown_key"),
        (config(shutdown_grace=15), "shutdown_grace"),
        ({"backends": [{"type": "aws"}]}, "backends[0].type"),
        ({"backends": [scaleway(secret_key="")]}, "backends[0].scaleway.secret_key"),
        ({"backends": [{**scaleway(), "bizfly": {}}]}, "backends[0].bizfly"),
        ({"backends": [scaleway(), scaleway()]}, "backends"),
        (
            {"backends": [{**scaleway(), "node_groups": {"g": {"options": {"scale_down_unneeded_time": "soon"}}}}]},
            "backends[0].node_groups.g.options.scale_down_unneeded_time",
        ),
        (
            {"backends": [{**scaleway(), "node_groups": {"g": {"template": {"capacity": {"memory": "2 GB"}}}}}]},
            "backends[0].node_groups.g.template.capacity.memory",
        ),
        (
            {"backends": [{**scaleway(), "sync": {"interval": "10m", "max_staleness": "1m"}}]},
            "backends[0].sync.max_staleness",
        ),
        ({"backends": [{**scaleway(), "sync": {"follow_refresh": "sometimes"}}]}, "backends[0].sync.follow_refresh"),
        (config(kubernetes={"learned_templates": {"labels": ["Not A Key"]}}), "kubernetes.learned_templates.labels"),
        (config(kubernetes={"learned_templates": {"taints": "maintenance"}}), "kubernetes.learned_templates.taints"),
        (config(kubernetes={"learned_templates": {"forget_after": 60}}), "kubernetes.learned_templates.forget_after"),
    ],
)
def test_a_bad_value_names_its_key_and_a_fix(raw, key):
    with pytest.raises(ConfigError) as info:
        parse(raw, env={})
    assert key in info.value.keys, info.value.keys
    assert all(problem.fix for problem in info.value.problems)
    assert "Fix:" in str(info.value)
    assert SECRET not in str(info.value)


def test_the_http_keys_become_the_probe_port_limits():
    limits = parse(config(http={"max_connections": 8, "request_timeout": "1.5s", "idle_timeout": "1m"}), env={})
    assert (limits.http.limits.max_connections, limits.http.limits.request_timeout) == (8, 1.5)
    assert limits.http.limits.idle_timeout == 60.0
    assert parse(config(), env={}).http.limits == HttpLimits()


def test_every_mistake_is_reported_in_one_run():
    raw = {
        "listen": "nonsense",
        "log": {"level": "chatty"},
        "backends": [
            scaleway(region="Paris", request_timeout=30),
            {"type": "bizfly", "bizfly": {**BIZFLY_LOGIN, "cluster_name": "my cluster"}, "colour": "blue"},
        ],
    }
    keys = [p.key for p in problems(raw)]
    assert sorted(keys) == sorted(
        [
            "listen",
            "log.level",
            "backends[0].scaleway.region",
            "backends[0].scaleway.request_timeout",
            "backends[1].bizfly.cluster_name",
            "backends[1].colour",
        ]
    )


FIVE_MISTAKES = """\
listen: 0.0.0.0:8086            # 1. plaintext off loopback
shutdown_grace: 15              # 2. a duration without a unit
backends:
  - type: scaleway
    scaleway:
      cluster_id: 11111111-2222-4333-8444-555555555555
      secret_key_env: SCW_KEY   # 3. the variable is not set
      region: paris             # 4. not a region name
    node_groups:
      pool-1:
        options: {scale_down_unneeded_tme: 5m}   # 5. a misspelt key
"""


def test_validate_names_five_mistakes_with_their_fixes_over_the_real_cli(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(FIVE_MISTAKES)
    result = run_cli("validate", "--config", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path}: INVALID: 5 problems"
    expected = {
        "listen": "set allow_plaintext_non_loopback: true",
        "shutdown_grace": "write 15s",
        "backends[0].scaleway.secret_key_env": "export SCW_KEY",
        "backends[0].scaleway.region": "fr-par",
        "backends[0].node_groups.pool-1.options.scale_down_unneeded_tme": "scale_down_unneeded_time",
    }
    for key, fix_words in expected.items():
        [line] = [line for line in lines if line.startswith(f"  - {key}: ")]
        assert "Fix:" in line and fix_words in line.split("Fix:", 1)[1], line


# ---------------------------------------------------------------------------- one duration type


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("10m", 600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("2h45m30.5s", 9930.5),
        ("0", 0),
        ("0s", 0),
        ("1500us", 0.0015),
        ("1500µs", 0.0015),
        ("5.s", 5),
        (".5s", 0.5),
        ("-2m", -120),
    ],
)
def test_go_duration_syntax_is_read_as_go_reads_it(text, seconds):
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["30", "1 h", "1sec", "s", ".s", "1h30", "", "ten seconds", "1d"])
def test_what_go_refuses_is_not_a_duration(text):
    with pytest.raises(ValueError):
        parse_go_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (0.25, "250ms"), (30, "30s"), (600, "10m"), (5400, "1h30m")])
def test_durations_are_printed_in_the_same_syntax(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "words"),
    [(30, "write 30s"), (1.5, "write 1.5s"), ("soon", "e.g. 500ms"), (True, "e.g. 500ms"), ("-1s", "out of range")],
)
def test_a_config_duration_needs_a_unit_and_the_fix_says_which(value, words):
    [problem] = problems(config(shutdown_grace=value))
    assert problem.key == "shutdown_grace"
    assert words in problem.fix or words in problem.problem


def test_every_duration_key_takes_the_same_syntax():
    raw = {
        "shutdown_grace": "1m30s",
        "backends": [
            {
                **scaleway(request_timeout="1.5s"),
                "sync": {"interval": "45s", "min_interval": "500ms", "max_staleness": "1h"},
                "node_groups": {"g": {"options": {"scale_down_unneeded_time": "1h30m"}}},
            }
        ],
    }
    parsed = parse(raw, env={})
    backend = parsed.backends[0]
    assert parsed.shutdown_grace == 90
    assert backend.cloud.request_timeout == 1.5
    assert (backend.sync.interval, backend.sync.min_interval, backend.sync.max_staleness) == (45, 0.5, 3600)
    assert backend.sync.follow_refresh is True  # the default: the CA's Refresh starts each listing
    options = backend.groups["g"].options
    assert options is not None and options.scale_down_unneeded_time == 5400


def test_the_grpc_port_limits_are_read_and_zero_turns_the_timers_off():
    parsed = parse(
        config(
            serving={
                "max_connections": 50,
                "keepalive_time": "0s",
                "idle_timeout": "0",
                "handshake_timeout": "2s",
                "min_ping_interval": "1m",
            }
        ),
        env={},
    )
    from server.native_front import front_limits

    limits = front_limits(parsed.serving)
    assert limits["max_connections"] == 50 and limits["handshake_timeout"] == 2 and limits["min_ping_interval"] == 60
    assert limits["keepalive_time"] is None and limits["idle_timeout"] is None, "0: never"
    defaults = front_limits(parse(config(), env={}).serving)
    assert (defaults["keepalive_time"], defaults["idle_timeout"], defaults["max_header_list_size"]) == (60, 300, 16384)


def test_the_grpcio_engine_gets_the_same_limits_as_channel_arguments():
    from server.grpcio_engine import channel_options

    options = dict(
        channel_options(parse(config(serving={"max_concurrent_streams": 7, "idle_timeout": "0s"}), env={}).serving)
    )
    assert options["grpc.max_concurrent_streams"] == 7
    assert options["grpc.absolute_max_metadata_size"] == options["grpc.max_metadata_size"] == 16384
    assert options["grpc.keepalive_time_ms"] == 60_000 and options["grpc.http2.ping_timeout_ms"] == 20_000
    assert "grpc.max_connection_idle_ms" not in options, "0s: never"


def test_follow_refresh_can_be_turned_off():
    parsed = parse({"backends": [{**scaleway(), "sync": {"follow_refresh": False}}]}, env={})
    assert parsed.backends[0].sync.follow_refresh is False


# ---------------------------------------------------------------------------- the same keys on every cloud


@pytest.mark.parametrize("kind", sorted(CLOUD_MODELS))
def test_every_cloud_accepts_the_same_common_keys(kind):
    raw = {**MINIMAL[kind], **(BIZFLY_LOGIN if kind == "bizfly" else {})}
    settings = validate_cloud_settings(
        CLOUD_MODELS[kind], f"backends[0].{kind}", {**raw, "request_timeout": "45s", "max_attempts": 2}, {}, True
    )
    assert (settings.request_timeout, settings.max_attempts) == (45, 2)
    defaults = validate_cloud_settings(CLOUD_MODELS[kind], f"backends[0].{kind}", raw, {}, True)
    assert (defaults.request_timeout, defaults.max_attempts) == (30, 4)


@pytest.mark.parametrize("kind", sorted(CLOUD_MODELS))
@pytest.mark.parametrize(("key", "value"), [("request_timeout", "10m"), ("request_timeout", 30), ("max_attempts", 0)])
def test_every_cloud_refuses_the_same_bad_common_values(kind, key, value):
    raw = {**MINIMAL[kind], **(BIZFLY_LOGIN if kind == "bizfly" else {}), key: value}
    with pytest.raises(ConfigError) as info:
        validate_cloud_settings(CLOUD_MODELS[kind], f"backends[0].{kind}", raw, {}, True)
    assert info.value.keys == (f"backends[0].{kind}.{key}",)


# ---------------------------------------------------------------------------- the environment


def test_upstream_environment_variables_override_the_file():
    env = {"SCW_SECRET_KEY": "from-env-secret", "SCW_REGION": "nl-ams", "CLUSTER_ID": "cluster-from-env"}
    cloud = parse(config(), env=env).backends[0].cloud
    assert (cloud.secret_key, cloud.region, cloud.cluster_id) == ("from-env-secret", "nl-ams", "cluster-from-env")


def test_an_empty_variable_counts_as_unset():
    assert parse(config(), env={"SCW_REGION": "", "CLUSTER_ID": " "}).backends[0].cloud.cluster_id == CLUSTER


def test_the_upstream_secret_variable_beats_a_named_one():
    raw = {"backends": [{"type": "scaleway", "scaleway": {"cluster_id": CLUSTER, "secret_key_env": "MY_KEY"}}]}
    env = {"SCW_SECRET_KEY": "upstream", "MY_KEY": "named"}
    assert parse(raw, env=env).backends[0].cloud.secret_key == "upstream"
    assert parse(raw, env={"MY_KEY": "named"}).backends[0].cloud.secret_key == "named"


def test_environment_does_not_apply_when_two_backends_share_a_type():
    raw = {"backends": [{**scaleway(), "name": "a"}, {**scaleway(), "name": "b"}]}
    parsed = parse(raw, env={"SCW_REGION": "nl-ams"})
    assert {b.cloud.region for b in parsed.backends} == {"fr-par"}


def test_a_bad_value_from_the_environment_names_the_variable():
    [problem] = problems(config(), env={"SCW_REGION": "Paris!"})
    assert problem.key == "environment variable SCW_REGION (for backends[0].scaleway.region)"


def test_a_missing_variable_is_fixed_in_the_container_for_serve_and_by_export_for_validate(tmp_path):
    """serve runs in a pod: no shell to export in; the fix is the container's environment (its Secret).
    validate runs in a shell: an export checks it there, and the container still needs the variable."""
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {"backends": [{"type": "scaleway", "scaleway": {"cluster_id": CLUSTER, "secret_key_env": "SCW_KEY"}}]}
        )
    )
    container = "set SCW_KEY in the server container's environment (a key of the Secret its envFrom names)"
    served = run_cli("serve", "--config", str(path))
    assert served.returncode == 2
    assert served.stderr.strip() == (
        "error: backends[0].scaleway.secret_key_env: environment variable SCW_KEY is not set or empty. "
        f"Fix: {container}"
    )
    validated = run_cli("validate", "--config", str(path))
    assert validated.returncode == 1
    assert validated.stdout.splitlines()[1] == (
        "  - backends[0].scaleway.secret_key_env: environment variable SCW_KEY is not set or empty. "
        f"Fix: export SCW_KEY=<the secret key> to check it here; for the server, {container}"
    )
    path.write_text(yaml.safe_dump({"backends": [{"type": "scaleway", "scaleway": {"secret_key_env": "SCW_KEY"}}]}))
    served = run_cli("serve", "--config", str(path), env={"SCW_KEY": SECRET})
    assert served.stderr.strip() == (
        "error: backends[0].scaleway.cluster_id: the Kapsule cluster id is not set. Fix: set cluster_id to the "
        "cluster's id (Scaleway console > Kubernetes > cluster > ID), or set CLUSTER_ID in the server container's "
        "environment (a key of the Secret its envFrom names)"
    )
    assert "export" not in served.stderr


def test_the_secret_never_shows_in_the_parsed_config_or_in_errors():
    parsed = parse(config(), env={})
    assert SECRET not in repr(parsed) and SECRET not in str(parsed.backends[0].cloud)
    raw = {"backends": [{"type": "scaleway", "scaleway": {"cluster_id": CLUSTER, "secret_key_env": SECRET}}]}
    [problem] = problems(raw)
    assert problem.key == "backends[0].scaleway.secret_key_env" and SECRET not in str(problem)
    bad_type = {"backends": [scaleway(secret_key=["not", SECRET])]}
    assert SECRET not in " ".join(str(p) for p in problems(bad_type))


# ---------------------------------------------------------------------------- exposure rules


def test_plaintext_on_a_non_loopback_address_can_be_allowed_explicitly():
    parsed = parse(config(listen="0.0.0.0:8086", allow_plaintext_non_loopback=True), env={})
    assert parsed.listen == ("0.0.0.0", 8086)


def test_tls_off_loopback_requires_client_authentication(tmp_path):
    pki = make_pki(tmp_path)
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    [problem] = problems(config(listen="0.0.0.0:8086", tls=tls))
    assert problem.key == "tls.client_ca"
    assert "tls.client_ca" in problem.fix and "tls.allow_unauthenticated_clients: true" in problem.fix
    with_ca = parse(config(listen="0.0.0.0:8086", tls={**tls, "client_ca": str(pki.ca_cert)}), env={})
    assert with_ca.tls is not None and with_ca.tls.client_ca == pki.ca_cert
    allowed = parse(config(listen="0.0.0.0:8086", tls={**tls, "allow_unauthenticated_clients": True}), env={})
    assert allowed.tls is not None and allowed.tls.client_ca is None
    assert parse(config(listen="127.0.0.1:8086", tls=tls), env={}).tls is not None  # loopback: no client auth needed


def test_tls_files_are_loaded_not_only_found(tmp_path):
    pki = make_pki(tmp_path)
    mismatched = {"cert": str(pki.server_cert), "key": str(pki.client_key), "client_ca": str(pki.server_key)}
    keys = [p.key for p in problems(config(tls=mismatched))]
    assert keys == ["tls.key", "tls.client_ca"]


def test_relative_tls_paths_are_relative_to_the_config_file(tmp_path):
    make_pki(tmp_path / "pki")
    tls = {"cert": "pki/server.crt", "key": "pki/server.key"}
    assert parse(config(tls=tls), env={}, base=tmp_path).tls is not None


# ---------------------------------------------------------------------------- validate --offline


def test_offline_needs_no_secret_and_says_what_it_left_unchecked():
    raw = {
        "listen": "0.0.0.0:8086",
        "tls": {"cert": "/etc/tls/tls.crt", "key": "/etc/tls/tls.key", "client_ca": "/etc/tls/ca.crt"},
        "backends": [{"type": "scaleway", "scaleway": {"secret_key_env": "SCW_KEY"}}, {"type": "bizfly"}],
    }
    result = validate(raw, env={}, offline=True)
    assert result.problems == ()
    unchecked = {p.key for p in result.unchecked}
    assert unchecked == {
        "tls.cert",
        "tls.key",
        "tls.client_ca",
        "backends[0].scaleway.cluster_id",
        "backends[0].scaleway.secret_key_env",
        "backends[1].bizfly.cluster_name",
        "backends[1].bizfly.auth_method",
    }
    online = validate(raw, env={})
    assert {p.key for p in online.problems} >= {"tls.cert", "backends[0].scaleway.secret_key_env"}


def test_offline_still_finds_shape_mistakes():
    result = validate(config(listen="0.0.0.0:8086", max_workers="many"), env={}, offline=True)
    assert {p.key for p in result.problems} == {"listen", "max_workers"}


def test_offline_does_not_read_secret_variables():
    result = validate({"backends": [{"type": "scaleway", "scaleway": {"cluster_id": CLUSTER}}]}, env={}, offline=True)
    assert [p.key for p in result.unchecked] == ["backends[0].scaleway.secret_key"]


# ---------------------------------------------------------------------------- the CA's cloud-config


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('address: "127.0.0.1"\n', "host:port"),
        ('address: "127.0.0.1:8086"\ngrpc_timeout: 10\n', "Go duration"),
        ('address: "127.0.0.1:8086"\ngrpc_timeout: "0s"\n', "zero"),
        ('address: "127.0.0.1:8086"\ngrpc_timeout: "-5s"\n', "zero or less"),
        ('address: "127.0.0.1:8086"\nkey: /k\n', "PLAINTEXT"),
        ('address: "127.0.0.1:8086"\nAddress: "x:1"\n', "CA 1.28"),
        ('address: "127.0.0.1:8086"\ntimeout: 5s\n', "unknown key"),
        ('address: "127.0.0.1:http"\n', "port"),
    ],
)
def test_cloud_config_problems_the_ca_would_hit(tmp_path, text, words):
    check = check_cloud_config(write(tmp_path / "cloud-config", text))
    assert any(words in problem for problem in check.problems), check.problems


@pytest.mark.parametrize("timeout", ["10s", "1m30s", "1.5s", "750ms"])
def test_cloud_config_takes_go_durations(tmp_path, timeout):
    check = check_cloud_config(write(tmp_path / "cc", f'address: "[::1]:8086"\ngrpc_timeout: "{timeout}"\n'))
    assert check.problems == []


def test_cloud_config_certificate_files_must_exist_and_load(tmp_path):
    pki = make_pki(tmp_path / "pki")
    good = f"address: localhost:8086\ncert: {pki.client_cert}\nkey: {pki.client_key}\ncacert: {pki.ca_cert}\n"
    assert check_cloud_config(write(tmp_path / "good", good)).problems == []
    missing = "address: localhost:8086\ncert: /missing/tls.crt\nkey: /missing/tls.key\ncacert: /missing/ca.crt\n"
    check = check_cloud_config(write(tmp_path / "missing", missing))
    assert len(check.problems) == 3 and all("does not exist" in p for p in check.problems), check.problems
    swapped = f"address: localhost:8086\ncert: {pki.client_cert}\nkey: {pki.server_key}\ncacert: {pki.client_key}\n"
    check = check_cloud_config(write(tmp_path / "swapped", swapped))
    assert [p.split(":", 1)[0] for p in check.problems] == ["'cert'/'key'", "'cacert'"], check.problems
    offline = check_cloud_config(tmp_path / "missing", offline=True)
    assert offline.problems == [] and len(offline.unchecked) == 3


def test_validate_command_reports_ok_and_invalid_without_secrets(tmp_path):
    good = write(tmp_path / "good.yaml", yaml.safe_dump(config()))
    bad = write(tmp_path / "bad.yaml", yaml.safe_dump({"backends": [scaleway(region="Paris")]}))
    cloud = write(tmp_path / "cloud-config.yaml", 'address: "127.0.0.1:8086"\ngrpc_timeout: 10\n')
    ok = run_cli("validate", "--config", str(good))
    assert ok.returncode == 0 and f"{good}: OK: listen 127.0.0.1:8086 (plaintext)" in ok.stdout
    failed = run_cli("validate", "--config", str(bad), "--cloud-config", str(cloud))
    assert failed.returncode == 1
    assert "backends[0].scaleway.region" in failed.stdout
    assert "grpc_timeout" in failed.stdout
    assert SECRET not in failed.stdout + failed.stderr + ok.stdout + ok.stderr


def test_validate_offline_over_the_real_cli_needs_no_environment(tmp_path):
    path = write(tmp_path / "config.yaml", "backends:\n  - type: scaleway\n    scaleway: {}\n")
    result = run_cli("validate", "--offline", "--config", str(path))
    assert result.returncode == 0, result.stdout
    assert f"{path}: OK (offline: shape only)" in result.stdout
    assert "not checked: backends[0].scaleway.cluster_id" in result.stdout
    assert "not checked: backends[0].scaleway.secret_key" in result.stdout
    assert run_cli("validate", "--config", str(path)).returncode == 1


# ---------------------------------------------------------------------------- the docs' own examples


def yaml_blocks(path: Path, after_heading: str) -> list[str]:
    text = path.read_text().split(after_heading, 1)[1]
    return [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]


def test_the_readme_minimal_config_is_refused_for_its_placeholder_alone():
    block = yaml_blocks(ROOT / "README.md", "## Configure")[0]
    result = validate(yaml.safe_load(block), env={}, offline=True)
    assert [(p.key, p.problem) for p in result.problems] == [
        ("backends[0].node_groups.<pool-id>", "'<pool-id>' is a placeholder from an example")
    ]
    assert [p.key for p in result.unchecked] == ["backends[0].scaleway.secret_key_env"]
    filled = yaml.safe_load(block.replace("<pool-id>", "2f0c6a7e-8b1d-4c3e-9f4a-0d1e2f3a4b5c"))
    assert validate(filled, env={}, offline=True).problems == ()
    assert validate(filled, env={"SCW_SECRET_KEY": SECRET}).config is not None


def test_the_operations_guide_example_validates():
    block = yaml_blocks(ROOT / "docs" / "how-to" / "configure.md", "## Serve two clusters or two clouds")[0]
    parsed = parse(yaml.safe_load(block), env={"SCW_PAR_KEY": SECRET, "SCW_AMS_KEY": SECRET})
    assert [b.name for b in parsed.backends] == ["scw-par", "scw-ams"]


def test_the_scaleway_public_mode_example_validates():
    # docs/reference/scaleway.md, "Public mode": the first yaml block after that heading.
    doc = next(p for p in (ROOT / "docs").rglob("scaleway.md") if "## Public mode" in p.read_text())
    block = yaml_blocks(doc, "## Public mode")[0]
    (backend,) = parse(yaml.safe_load(block), env={"SCW_SECRET_KEY": SECRET}).backends
    assert backend.cloud.public and sorted(backend.cloud.pools) == ["gpu-l4", "workers"]


@pytest.mark.parametrize(
    ("limits", "max_connections", "expected"),
    [
        ((300, 4096), 256, "soft 4096"),  # raised to the hard limit, as Go's runtime does
        ((1024, 4096), 256, "soft 1024"),  # enough already: left alone
        ((300, 400), 256, "serving.max_connections"),  # the hard limit cannot hold them: refused, naming the key
    ],
)
def test_the_open_files_limit_is_raised_for_max_connections_or_the_key_refused(limits, max_connections, expected):
    script = (
        "import resource\n"
        "from server.app import ensure_file_descriptors\n"
        "from server.config import ConfigError\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, {limits})\n"
        "try:\n"
        f"    ensure_file_descriptors({max_connections})\n"
        "    print('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "except ConfigError as err:\n"
        "    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert expected in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------------------- issue 32: one precise error each
def _backend(**extra):
    scw = {"cluster_id": "11111111-2222-3333-4444-555555555555", "region": "fr-par", "secret_key_env": "SCW_KEY"}
    return {"name": "scw", "type": "scaleway", "scaleway": scw, **extra}


def test_a_misspelt_type_is_one_problem_that_says_did_you_mean():
    raw = {"backends": [_backend(type="scalway")]}
    result = validate(raw, env={}, offline=True)
    assert [(p.key, p.problem, p.fix) for p in result.problems] == [
        ("backends[0].type", "'scalway' is not a supported cloud (did you mean scaleway?)", "write scaleway")
    ]  # and no "scaleway.secret_key_env: unknown key ... use one of: ..., secret_key_env"


@pytest.mark.parametrize(
    ("backend", "env"),
    [
        ({"type": "scalway", "scaleway": {"region": "fr-par"}}, {"CLUSTER_ID": CLUSTER, "SCW_SECRET_KEY": SECRET}),
        (
            {"type": "bizfy", "bizfly": {"region": "HN"}},
            {
                "CLUSTER_NAME": "ke1m4ea3j8w6kkvp",
                "BIZFLYCLOUD_EMAIL": "ops@example.com",
                "BIZFLYCLOUD_PASSWORD": SECRET,
            },
        ),
    ],
    ids=["scaleway", "bizfly"],
)
def test_a_misspelt_type_does_not_hide_what_the_upstream_variables_set(backend, env):
    """The shipped layouts give the cluster and the key in the upstream variables: with a misspelt type
    they still apply to the backend's one cloud mapping, so the did-you-mean is the only problem (it
    came with two false "is not set" ones)."""
    result = validate({"backends": [backend]}, env=env)
    cloud = next(key for key in backend if key != "type")
    assert [(p.key, p.fix) for p in result.problems] == [("backends[0].type", f"write {cloud}")]
    fixed = validate({"backends": [{**backend, "type": cloud}]}, env=env)
    assert fixed.config is not None, fixed.problems  # the type was the one mistake


def test_a_type_far_from_any_cloud_lists_the_clouds():
    (only,) = validate({"backends": [_backend(type="aws")]}, env={}, offline=True).problems
    assert only.fix == "use one of: scaleway, bizfly"


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ({"node_groups": {"<pool-id>": {"options": {"scale_down_unneeded_time": "5m"}}}}, "node_groups.<pool-id>"),
        (
            {"scaleway": {"cluster_id": "<the cluster id>", "region": "fr-par", "secret_key_env": "K"}},
            "scaleway.cluster_id",
        ),
    ],
)
def test_placeholders_are_refused_once_each(where, key):
    problems = validate({"backends": [_backend(**where)]}, env={"K": SECRET}, offline=True).problems
    assert [p.key for p in problems] == [f"backends[0].{key}"]
    assert "placeholder from an example" in problems[0].problem


@pytest.mark.parametrize(
    ("listen", "address", "cert", "expected"),
    [
        ("127.0.0.1:8086", "127.0.0.1:8086", "", None),
        (
            "127.0.0.1:8086",
            "127.0.0.1:9999",
            "",
            "'address' port 9999 is not the server's listen port (127.0.0.1:8086)",
        ),
        ("127.0.0.1:8086", "ca-externalgrpc-server.kube-system.svc:8086", "", "listens on 127.0.0.1:8086 only"),
        ("127.0.0.1:8086", "127.0.0.1:8086", "/c.crt", "'cert' is set, so the CA dials with TLS"),
    ],
)
def test_validate_checks_the_cloud_config_address_against_listen(tmp_path, listen, address, cert, expected):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"listen": listen, "backends": [_backend()]}))
    cloud_config = tmp_path / "cloud-config"
    cloud_config.write_text(
        yaml.safe_dump({"address": address, **({"cert": cert, "key": cert, "cacert": cert} if cert else {})})
    )
    done = run_cli("validate", "--offline", "--config", str(config), "--cloud-config", str(cloud_config))
    cloud_lines = [line for line in done.stdout.splitlines() if line.startswith(str(cloud_config))]
    if expected is None:
        assert done.returncode == 0, done.stdout
        assert cloud_lines == [f"{cloud_config}: OK (offline: shape only): a valid CA externalgrpc cloud-config"]
    else:
        assert done.returncode == 1
        (line,) = cloud_lines
        assert line.startswith(f"{cloud_config}: INVALID: ") and expected in line and f"(in {config})" in line
