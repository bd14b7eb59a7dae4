"""The README's and the docs' commands that run offline, run as printed, and the outputs they promise.

Each test takes the command or the output block from the document itself, so an edit of the docs that
the code does not follow (or the reverse) fails here. What needs a cluster or a registry is walked
elsewhere: the image's podman lines in tests/install/test_image.py, the Helm and kustomize trees in
tests/deploy, the in-cluster migration in tests/e2e/test_migration.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devstack.clouds import scaleway_backend
from devstack.harness import REPO_ROOT, ChildProcess, ServerProcess, child_env, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario
from tests.support.gobuild import BinaryNotBuilt, binary_path

README = REPO_ROOT / "README.md"
CONFIGURE = REPO_ROOT / "docs" / "how-to" / "configure.md"
TROUBLESHOOTING = REPO_ROOT / "docs" / "how-to" / "troubleshooting.md"
MIGRATION = REPO_ROOT / "docs" / "reference" / "in-tree-differences.md"
DEMO_ADDRESS = "127.0.0.1:8086"  # what the docs write; the tests serve on a free port instead


def blocks(doc: Path, after: str, fence: str = "```sh\n") -> list[str]:
    """The fenced blocks (``fence``) of ``doc`` after the heading or text ``after``."""
    text = doc.read_text().split(after, 1)[1]
    return [part.split("```", 1)[0] for part in text.split(fence)[1:]]


def plain_block(doc: Path, after: str) -> list[str]:
    """The lines of the first unlabelled fenced block after ``after`` (an output the doc shows)."""
    text = doc.read_text().split(after, 1)[1]
    return text.split("```\n", 1)[1].split("```", 1)[0].splitlines()


def cli(*args: str, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=cwd,
        env={**child_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[ChildProcess, str]]:
    """``make run``'s demo (``python -m devstack``) on free ports; its gRPC address."""
    process = ChildProcess(
        [sys.executable, "-m", "devstack", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
        env=child_env(),
    )
    try:
        process.wait_listening()
        deadline = time.monotonic() + 30
        while "Stop with Ctrl-C." not in process.output:
            assert time.monotonic() < deadline, f"the demo printed no banner:\n{process.output}"
            time.sleep(0.1)
        match = re.search(r"gRPC on (127\.0\.0\.1:\d+)", process.output)
        assert match, process.output
        yield process, match.group(1)
    finally:
        assert process.stop() == 0


# ---------------------------------------------------------------------------------------------- README
def test_readme_demo_has_the_pools_the_readme_describes(demo: tuple[ChildProcess, str]) -> None:
    _, address = demo
    text = README.read_text()
    assert "seven autoscaling pools" in text and "three at size 0 (Scaleway `batch` and `gpu`, Bizfly `batch`)" in text
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        groups = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        # the autoscaling pools; the demo's public-mode backend serves pools whose Kapsule autoscaling is off
        groups = [g for g in groups if not g.debug.startswith("backend=scaleway-public-demo ")]
        targets = {
            g.id: stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=g.id), timeout=5).targetSize for g in groups
        }
    assert len(groups) == 7
    empty = [g.debug.split()[0] for g in groups if targets[g.id] == 0]
    assert sorted(empty) == ["backend=bizfly-demo", "backend=scaleway-demo", "backend=scaleway-demo"]
    # and by name, in the scenarios the demo serves
    scw = [p["name"] for p in demo_scenario()["clusters"][0]["pools"] if p.get("autoscaling", True) and not p["size"]]
    bz = [p["name"] for p in bizfly_demo()["clusters"][0]["pools"] if p["enable_autoscaling"] and not p["desired_size"]]
    assert (scw, bz) == (["batch", "gpu"], ["batch"])
    assert all(targets[g.id] < g.maxSize for g in groups)
    assert sum(1 for g in groups if targets[g.id] > 0) == 4


def test_readme_status_command_against_the_demo(demo: tuple[ChildProcess, str]) -> None:
    _, address = demo
    (command,) = [
        line for line in blocks(README, "## Quick start (no cloud account)")[1].splitlines() if "status" in line
    ]
    assert command == f".venv/bin/ca-externalgrpc status --address {DEMO_ADDRESS}"
    done = subprocess.run(
        command.replace(DEMO_ADDRESS, address).split(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backend scaleway-demo (scaleway): healthy, serving, 4 group(s)" in done.stdout
    assert "backend bizfly-demo (bizfly): healthy, serving, 3 group(s)" in done.stdout


def test_readme_grpcurl_walk_against_the_demo_prints_what_the_readme_says(demo: tuple[ChildProcess, str]) -> None:
    _, address = demo
    try:
        grpcurl = str(binary_path("grpcurl"))
    except BinaryNotBuilt as err:
        pytest.fail(str(err), pytrace=False)
    script = blocks(README, "## Debugging with grpcurl")[0]
    assert script.count(DEMO_ADDRESS) >= 8
    # Each command on its own, with the README's variables, so every output can be checked.
    lines = [line for line in script.splitlines() if line and not line.startswith("#")]
    prelude = [line for line in lines if line.startswith(("S=", "ID="))]
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    for line in lines:
        if line.startswith(("S=", "ID=")):
            continue
        shell = "\n".join([*prelude, line.split("   #", 1)[0]])
        shell = shell.replace("grpcurl ", f"{grpcurl} ").replace(DEMO_ADDRESS, address)
        outputs[line] = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    said = README.read_text().split("## Debugging with grpcurl", 1)[1].split("## Configure", 1)[0]
    assert 'TargetSize prints `{"targetSize": 2}`' in said
    assert "the first\nIncreaseSize answers `{}` (success) and the second `FailedPrecondition` naming the max" in said
    assert len(outputs) == 8, list(outputs)
    for line, done in outputs.items():
        if "NodeGroupTargetSize" in line:
            assert done.returncode == 0 and json.loads(done.stdout) == {"targetSize": 2}, done.stdout + done.stderr
        elif '\\"delta\\": 1}' in line:
            assert done.returncode == 0 and json.loads(done.stdout) == {}, done.stderr
        elif '\\"delta\\": 99}' in line:
            assert done.returncode != 0 and "Code: FailedPrecondition" in done.stderr, done.stderr
            assert re.search(r"max \d+", done.stderr), done.stderr
        elif "NodeGroupNodes" in line:
            assert done.returncode == 0 and len(json.loads(done.stdout)["instances"]) == 2
        elif "Health/Check" in line:
            assert done.returncode == 0 and json.loads(done.stdout) == {"status": "SERVING"}
        else:
            assert done.returncode == 0 and done.stdout.strip(), (line, done.stderr)


def test_readme_validate_offline_of_the_minimal_config_prints_what_the_readme_shows(tmp_path: Path) -> None:
    config = blocks(README, "## Configure", fence="```yaml\n")[0]
    (tmp_path / "config.yaml").write_text(config)
    (command,) = [line for line in blocks(README, "## Configure")[0].splitlines() if "--offline" in line]
    assert command.startswith(".venv/bin/ca-externalgrpc validate --offline --config config.yaml")
    done = cli("validate", "--offline", "--config", "config.yaml", cwd=tmp_path)
    assert done.returncode == 1
    shown = plain_block(README, "On the minimal config above as it stands")
    assert done.stdout.splitlines() == shown


# ----------------------------------------------------------------------- how-to/configure.md, how-to/troubleshooting.md
def test_configure_validate_output_is_what_validate_prints(tmp_path: Path) -> None:
    shown = plain_block(CONFIGURE, "it exits 1 and prints one line per problem:")
    # A config with the two mistakes the example names: a bare duration, and SCW_REGION=Paris.
    (tmp_path / "config.yaml").write_text(
        "shutdown_grace: 15\nbackends:\n  - type: scaleway\n"
        "    scaleway: {cluster_id: 11111111-2222-3333-4444-555555555555, secret_key_env: SCW_SECRET_KEY}\n"
    )
    done = cli("validate", "--config", "config.yaml", cwd=tmp_path, env={"SCW_REGION": "Paris", "SCW_SECRET_KEY": "k"})
    assert done.returncode == 1
    assert done.stdout.splitlines() == shown


def test_troubleshooting_status_output_with_a_wrong_secret_key_is_what_status_prints(tmp_path: Path) -> None:
    text = TROUBLESHOOTING.read_text().split("With a wrong secret key it prints", 1)[1]
    shown = [line.removeprefix("  ") for line in text.split("  ```\n", 1)[1].split("  ```", 1)[0].splitlines()]
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        backend = scaleway_backend(sim, secret_key_env="SCW_SECRET_KEY")
        server = ServerProcess(
            server_config([backend]), env={"SCW_SECRET_KEY": "00000000-0000-0000-0000-000000000000"}, workdir=tmp_path
        )
        try:
            done = cli("status", "--address", server.address)
        finally:
            server.stop()
    assert done.returncode == 3
    assert done.stdout.splitlines() == shown


# ---------------------------------------------------------------------------- reference/in-tree-differences.md
def test_migration_problem_example_is_what_from_in_tree_prints(tmp_path: Path) -> None:
    shown = plain_block(MIGRATION, "environment with `BIZFLYCLOUD_AUTH_METHOD=password`")
    (tmp_path / "credentials.env").write_text(
        "BIZFLYCLOUD_AUTH_METHOD=password\nBIZFLYCLOUD_API_URL=http://api.example.com\n"
    )
    done = cli(
        "config", "from-in-tree", "--cloud-provider", "bizflycloud", "--env-file", "credentials.env", cwd=tmp_path
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == shown
