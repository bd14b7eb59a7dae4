"""The container image run the way the manifests run it (devstack/container.py): as UID 65532 with a
read-only root filesystem and no capabilities, the config mounted read-only at /etc/ca-externalgrpc,
the credentials from an env file (the Secret's envFrom), a writable /tmp, on host networking in front
of both simulated clouds. It serves them on the native engine, answers health, reflection and the
``status`` command of the host, and drains on SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from deploy.sbom import counts as sbom_counts
from devstack.clouds import bizfly_cluster_uid
from devstack.container import RUN_AS_UID, ContainerServer, podman
from devstack.harness import SCW_SECRET
from protos import externalgrpc_pb2 as pb
from simulators.bizfly import DEFAULT_APP_CREDENTIALS, BizflySimulator
from simulators.common import Fault
from simulators.scaleway import ScalewaySimulator
from tests.install.conftest import REPO, autoscaled_pool_ids
from tests.support.imagebuild import SBOM_IN_IMAGE

OVERLAYS = REPO / "deploy" / "kubernetes" / "overlays"
SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
#: what the builder takes out of the Kubernetes client's dependencies (deploy/Dockerfile)
REMOVED_IN_THE_IMAGE = {"aiohttp", "aiohttp-retry", "aiosignal", "aiohappyeyeballs", "attrs", "frozenlist",
                        "multidict", "propcache", "yarl"}  # fmt: skip


def labels(image: str) -> dict[str, str]:
    return dict(json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout))


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions() -> dict[str, str]:
    """requirements/runtime.txt: package -> the locked version."""
    text = (REPO / "requirements" / "runtime.txt").read_text()
    return {normalized(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.MULTILINE)}


def locked_hashes() -> dict[str, set[str]]:
    """requirements/runtime.txt: package -> every sha256 the lock allows for it."""
    text = (REPO / "requirements" / "runtime.txt").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)
    return {
        normalized(entry.split("==", 1)[0]): set(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
        for entry in entries
        if "==" in entry
    }


#: run in the container: for each folder named, whether a file can be created in it
WRITE_PROBE = """
import os, sys
for folder in sys.argv[1:]:
    try:
        open(os.path.join(folder, "probe"), "w").close()
        print(folder, "writable")
    except OSError as err:
        print(folder, err.strerror)
"""


def run(image: str, *args: str) -> subprocess.CompletedProcess[str]:
    return podman(
        "run", "--rm", "--pull=never", "--read-only", f"--user={RUN_AS_UID}:{RUN_AS_UID}", "--cap-drop=all",
        image, *args, check=False,
    )  # fmt: skip


def manifest_config() -> dict[str, Any]:
    """The two cloud overlays' server configs as one (both backends), as their ConfigMaps hold them,
    with the ports on loopback port 0 (the harness reads the bound ones back)."""
    scaleway = yaml.safe_load((OVERLAYS / "scaleway" / "config.yaml").read_text())
    bizfly = yaml.safe_load((OVERLAYS / "bizfly" / "config.yaml").read_text())
    return {**scaleway, "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
            "backends": scaleway["backends"] + bizfly["backends"]}  # fmt: skip


def manifest_credentials(scaleway: ScalewaySimulator, bizfly: BizflySimulator) -> dict[str, str]:
    """The Secret ``ca-externalgrpc-credentials`` for both overlays: every key their
    ``credentials.env.example`` lists, filled in for the simulators, plus the API URLs pointing at them."""
    (credential_id, credential_secret), *_ = DEFAULT_APP_CREDENTIALS.items()
    values = {
        "SCW_SECRET_KEY": scaleway.secret_key,
        "CLUSTER_ID": scaleway.cluster_id,
        "SCW_REGION": scaleway.region,
        "BIZFLYCLOUD_AUTH_METHOD": "application_credential",
        "BIZFLYCLOUD_APP_CREDENTIAL_ID": credential_id,
        "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": credential_secret,
        "BIZFLYCLOUD_REGION": "HN",
        "BIZFLYCLOUD_PROJECT_ID": bizfly.project_id,
        "CLUSTER_NAME": bizfly_cluster_uid(bizfly),
    }
    for overlay in ("scaleway", "bizfly"):
        example = (OVERLAYS / overlay / "credentials.env.example").read_text().splitlines()
        keys = {line.split("=", 1)[0] for line in example if "=" in line and not line.startswith("#")}
        assert keys <= set(values), f"{overlay}/credentials.env.example has keys this test does not fill: {keys}"
    return {**values, "SCW_API_URL": scaleway.url, "BIZFLYCLOUD_API_URL": bizfly.url}


@pytest.fixture
def serving(image: str, clouds: tuple[ScalewaySimulator, BizflySimulator], tmp_path: Path) -> Iterator[ContainerServer]:
    server = ContainerServer(image, manifest_config(), manifest_credentials(*clouds), tmp_path)
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


def test_runs_as_non_root_and_answers_version_and_help_with_a_read_only_root(image: str) -> None:
    configured = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert configured["User"] == f"{RUN_AS_UID}:{RUN_AS_UID}"
    version = run(image, "--version")
    assert version.returncode == 0, version
    lines = version.stdout.strip().splitlines()
    assert lines[0] == f"ca-externalgrpc {VERSION}"
    # No git in the image: the commit is the one make image recorded at build, the revision label's.
    revision = labels(image)["org.opencontainers.image.revision"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", revision), revision
    assert lines[1] == f"commit: {revision} (recorded at build)"
    assert lines[2] == "engine: native (serving.engine: auto)"
    locked = locked_versions()
    assert lines[3] == (
        f"libraries: grpcio {locked['grpcio']}, protobuf {locked['protobuf']} (upb), ca-externalgrpc-native {VERSION}"
    )
    usage = run(image, "--help")
    assert usage.returncode == 0 and all(c in usage.stdout for c in ("serve", "validate", "status")), usage
    for command in ("serve", "validate", "status"):
        assert run(image, command, "--help").returncode == 0, command


def test_is_labelled_and_carries_a_bill_of_materials_of_exactly_the_locked_packages(image: str) -> None:
    """The OCI labels name the version and the commit; the image's CycloneDX document lists every Python
    distribution installed, each at the version and with a hash the lock holds (less what the builder
    takes out of the Kubernetes client), the crates of the wheels' own SBOMs, and the Debian packages."""
    found = labels(image)
    assert found["org.opencontainers.image.version"] == VERSION
    assert found["org.opencontainers.image.source"]  # a published address, or "unknown" from a local clone
    printed = podman(
        "run", "--rm", "--pull=never", "--entrypoint=/opt/ca-externalgrpc/bin/python", image,
        "-c", f"import sys; sys.stdout.write(open({SBOM_IN_IMAGE!r}).read())",
    )  # fmt: skip
    bom = json.loads(printed.stdout)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    root = bom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("ca-externalgrpc-server", VERSION)
    assert {"name": "org.opencontainers.image.revision", "value": found["org.opencontainers.image.revision"]} in root[
        "properties"
    ]
    python = {normalized(c["name"]): c for c in bom["components"] if c.get("purl", "").startswith("pkg:pypi/")}
    versions, hashes = locked_versions(), locked_hashes()
    assert set(python) == set(versions) - REMOVED_IN_THE_IMAGE
    for name, component in python.items():
        assert component["version"] == versions[name], name
        (digest,) = [h["content"] for h in component["hashes"] if h["alg"] == "SHA-256"]
        assert digest in hashes[name], f"{name}: the wheel installed is not one the lock holds"
    local = [c["name"] for c in bom["components"] if c["type"] == "library" and "purl" not in c]
    assert local == ["ca-externalgrpc-native"]
    counts = sbom_counts(bom)
    assert counts["cargo"] > 50 and counts["deb"] > 20, counts
    deb = {c["name"] for c in bom["components"] if c.get("purl", "").startswith("pkg:deb/")}
    assert {"python3.11", "libc6", "libssl3", "ca-certificates"} <= deb


def test_serves_both_clouds_with_config_and_secrets_mounted_as_the_manifests_mount_them(
    serving: ContainerServer, clouds: tuple[ScalewaySimulator, BizflySimulator]
) -> None:
    with grpc.insecure_channel(serving.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {SERVICE, "grpc.health.v1.Health"} <= set(database.get_services())
        assert database.FindFileContainingSymbol(SERVICE).package == "clusterautoscaler.cloudprovider.v1.externalgrpc"
    groups = {g.id for g in serving.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups}
    assert groups == autoscaled_pool_ids(*clouds)

    # `status` of the host's ca-externalgrpc, as an operator runs it against the pod's port.
    status = subprocess.run(
        [str(Path(sys.executable).parent / "ca-externalgrpc"), "status", "--address", serving.address],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stdout + status.stderr
    assert all(group in status.stdout for group in groups), status.stdout
    assert "scaleway" in status.stdout and "bizfly" in status.stdout

    for path in ("/healthz", "/readyz"):
        assert serving.http_get(path)[0] == 200, path
    # The native engine serves (the image's default, serving.engine: auto), as the non-root user.
    started = [json.loads(line) for line in serving.output.splitlines() if line.startswith('{"')]
    (ready,) = [line for line in started if line["msg"] == "serving"]
    assert ready["engine"] == "native", ready
    pid = podman("inspect", "--format", "{{.State.Pid}}", serving.container_name).stdout.strip()
    status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    (uids,) = [line.split()[1:] for line in status_lines if line.startswith("Uid:")]
    assert uids == [str(RUN_AS_UID)] * 4, uids  # real, effective, saved, filesystem
    assert SCW_SECRET not in serving.output and clouds[0].secret_key not in serving.output


def test_the_root_filesystem_is_read_only_and_tmp_is_the_one_writable_place(serving: ContainerServer) -> None:
    folders = ("/", "/opt/ca-externalgrpc", "/etc", "/tmp")
    done = podman("exec", serving.container_name, "/opt/ca-externalgrpc/bin/python", "-c", WRITE_PROBE, *folders)
    assert done.stdout.splitlines() == [
        "/ Read-only file system",
        "/opt/ca-externalgrpc Read-only file system",
        "/etc Read-only file system",
        "/tmp writable",
    ], done.stdout


def test_sigterm_drains_an_in_flight_call_then_exits_0_within_shutdown_grace(
    serving: ContainerServer, clouds: tuple[ScalewaySimulator, BizflySimulator]
) -> None:
    scaleway, _ = clouds
    grace = 15.0  # the overlays' shutdown_grace
    assert manifest_config()["shutdown_grace"] == "15s"
    group = next(p["id"] for p in scaleway.state.snapshot()["pools"] if p["name"] == "general")
    statuses: list[int] = []

    def watch() -> None:
        with grpc.insecure_channel(serving.address) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
            try:
                for answer in stream:
                    statuses.append(answer.status)
            except grpc.RpcError:
                pass  # UNAVAILABLE: the stream ends when the server stops

    result: dict[str, str] = {}

    def increase() -> None:
        try:
            serving.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group, delta=1), timeout=10)
            result["code"] = "OK"
        except grpc.RpcError as err:
            result["code"] = err.code().name

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 10
    while not statuses and time.monotonic() < deadline:
        time.sleep(0.05)
    assert statuses == [health_pb2.HealthCheckResponse.SERVING]
    # The size write to the cloud takes 2 s: SIGTERM arrives while it is in flight.
    scaleway.faults.add(Fault(route="*", method="PATCH", delay=2.0, times=1))
    worker = threading.Thread(target=increase)
    worker.start()
    time.sleep(0.7)
    sent = time.monotonic()
    podman("kill", "--signal=TERM", serving.container_name)
    worker.join(20)
    code = serving.process.wait(timeout=grace + 10)
    took = time.monotonic() - sent
    watcher.join(10)
    assert result.get("code") == "OK", result
    assert code == 0, serving.log_tail()
    assert took < grace, f"exited {took:.1f}s after SIGTERM"
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses, statuses
    assert [r.body for r in scaleway.requests.all() if r.method == "PATCH"] == [{"size": 2}]
    assert "signal received; draining" in serving.output


# ---------------------------------------------------------------------------------------------- docs' podman lines
def docs_command(doc: str, starts: str, image: str) -> str:
    """The shell command of ``doc`` that starts with ``starts`` (continuation lines joined), with the
    image this run built; run it in the folder holding the files it names, as the docs do."""
    text = (REPO / "docs" / doc).read_text().replace("\\\n", " ")
    (line,) = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(starts)]
    line = re.sub(r"\s+", " ", line).replace(f"localhost/ca-externalgrpc-server:{VERSION}", image)
    return line.replace(
        "CONTAINERS_CONF=deploy/containers.conf", f"CONTAINERS_CONF={REPO / 'deploy' / 'containers.conf'}"
    )


def test_the_migration_guides_podman_line_converts_from_the_image(image: str, tmp_path: Path) -> None:
    # docs/reference/in-tree-differences.md: from-in-tree run from our image, the CA's Secret as a file,
    # `> config.yaml`.
    (tmp_path / "credentials.env").write_text(
        f"CLUSTER_ID=11111111-2222-3333-4444-555555555555\nSCW_SECRET_KEY={SCW_SECRET}\nSCW_REGION=fr-par\n"
    )
    command = docs_command(
        "reference/in-tree-differences.md", "CONTAINERS_CONF=deploy/containers.conf podman run", image
    )
    assert command.endswith(" config from-in-tree --cloud-provider scaleway > config.yaml"), command
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["backends"][0]["scaleway"]["secret_key_env"] == "SCW_SECRET_KEY"
    assert SCW_SECRET not in (tmp_path / "config.yaml").read_text() + done.stderr
    assert "--cloud-provider=scaleway  ->  --cloud-provider=externalgrpc" in done.stderr
    # A broken input: the problems reach the terminal, the file gets no error text.
    (tmp_path / "credentials.env").write_text("SCW_REGION=fr-par\n")
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert (tmp_path / "config.yaml").read_text() == ""
    assert done.stderr.startswith("in-tree scaleway settings: INVALID: 2 problems")


def test_the_upgrade_steps_validate_line_runs_from_the_image(image: str, tmp_path: Path) -> None:
    # docs/how-to/upgrading.md: validate the new config with the new image before rolling it out.
    block = (REPO / "README.md").read_text().split("A minimal sidecar config:", 1)[1].split("```yaml\n", 1)[1]
    config = block.split("```", 1)[0].replace("<pool-id>", "2f0c6a7e-8b1d-4c3e-9f4a-0d1e2f3a4b5c")
    (tmp_path / "config.yaml").write_text(config)
    (tmp_path / "config.yaml").chmod(0o644)
    (tmp_path / "credentials.env").write_text(f"SCW_SECRET_KEY={SCW_SECRET}\n")
    command = docs_command("how-to/upgrading.md", "CONTAINERS_CONF=deploy/containers.conf podman run --rm -v", image)
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("/c.yaml: OK: listen 127.0.0.1:8086 (plaintext); backends: scw (scaleway")
