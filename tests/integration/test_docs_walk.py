"""The README's and the docs' commands that run offline, run as printed, and the outputs they promise.

Each test takes the command or the output block from the document itself (tests/support/docpages.py), so
an edit of the docs that the code does not follow (or the reverse) fails here. What needs a cluster or a
registry is walked elsewhere: every command of the tutorials on a real node in
tests/e2e/test_node_tutorials.py (``make node-e2e``), the image's podman lines in
tests/install/test_image.py, the Helm and kustomize trees in tests/deploy, the in-cluster migration in
tests/e2e/test_migration.py. Here, the tutorials' steps that need no cluster: what their Helm and
kustomize commands would apply, rendered, and the lengths the README and the tutorials are held to.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devstack.clouds import BIZFLY_REGION, bizfly_cluster_uid, scaleway_backend
from devstack.harness import REPO_ROOT, SCW_SECRET, ChildProcess, ServerProcess, child_env, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from simulators.bizfly import DEFAULT_APP_CREDENTIALS, BizflySimulator
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_public_cluster, demo_scenario
from tests.deploy.chart import CA_1_36_1, chart_dir, chart_version
from tests.deploy.rendering import find_kustomize
from tests.support.docpages import Tutorial, blocks, checked, commands, plain_block, words
from tests.support.gobuild import BinaryNotBuilt, binary_path

README = REPO_ROOT / "README.md"
CONFIGURE = REPO_ROOT / "docs" / "how-to" / "configure.md"
TROUBLESHOOTING = REPO_ROOT / "docs" / "how-to" / "troubleshooting.md"
MIGRATION = REPO_ROOT / "docs" / "reference" / "in-tree-differences.md"
DEMO_ADDRESS = "127.0.0.1:8086"  # what the docs write; the tests serve on a free port instead


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
    process, address = demo
    text = " ".join(README.read_text().split())
    assert "nine node groups from three backends" in text
    zero = "three at size 0 (Scaleway `batch` and `gpu`, Bizfly `batch`)"
    assert f"seven autoscaling pools: four with running nodes and {zero}" in text
    assert "`web` (1 to 4, one node) and `jobs` (0 to 3, at size 0, with the label `team=data` and a taint" in text
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        groups = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        targets = {
            g.id: stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=g.id), timeout=5).targetSize for g in groups
        }
    assert len(groups) == 9
    backend = {g.id: g.debug.split()[0].removeprefix("backend=") for g in groups}
    by_backend = {
        b: sorted((g.minSize, g.maxSize, targets[g.id]) for g in groups if backend[g.id] == b)
        for b in set(backend.values())
    }
    assert {b: len(v) for b, v in by_backend.items()} == {
        "scaleway-demo": 4,
        "bizfly-demo": 3,
        "scaleway-public-demo": 2,
    }
    assert by_backend["scaleway-public-demo"] == [(0, 3, 0), (1, 4, 1)]
    (jobs,) = [p for p in demo_public_cluster()["pools"] if p["name"] == "jobs"]
    assert "noprefix=team=data" in jobs["tags"] and any(t.startswith("taint=") for t in jobs["tags"]), jobs
    empty = sorted(backend[g.id] for g in groups if targets[g.id] == 0)
    assert empty == ["bizfly-demo", "scaleway-demo", "scaleway-demo", "scaleway-public-demo"]
    # and by name, in the scenarios the demo serves
    scw = [p["name"] for p in demo_scenario()["clusters"][0]["pools"] if p.get("autoscaling", True) and not p["size"]]
    bz = [p["name"] for p in bizfly_demo()["clusters"][0]["pools"] if p["enable_autoscaling"] and not p["desired_size"]]
    assert (scw, bz) == (["batch", "gpu"], ["batch"])
    assert all(targets[g.id] < g.maxSize for g in groups)
    # the banner's validate --online command, run as printed: the demo's config passes against its clouds
    (line,) = [x.strip() for x in process.output.splitlines() if "validate --online --config " in x]
    done = subprocess.run(line.split(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.count("online: OK") == 3, done.stdout + done.stderr


def test_readme_status_command_against_the_demo(demo: tuple[ChildProcess, str]) -> None:
    _, address = demo
    (command,) = [
        line for line in blocks(README, "## Try it in a minute (no cloud account)")[1].splitlines() if "status" in line
    ]
    assert command == f".venv/bin/ca-externalgrpc status --address {DEMO_ADDRESS}"
    done = subprocess.run(
        command.replace(DEMO_ADDRESS, address).split(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backend scaleway-demo (scaleway): healthy, serving, 4 group(s)" in done.stdout
    assert "backend bizfly-demo (bizfly): healthy, serving, 3 group(s)" in done.stdout
    assert "backend scaleway-public-demo (scaleway): healthy, serving, 2 group(s)" in done.stdout


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


# ---------------------------------------------------------------------------------------------- tutorials
TUTORIALS = REPO_ROOT / "docs" / "tutorials"
KAPSULE = Tutorial(TUTORIALS / "kapsule.md")
BIZFLY = Tutorial(TUTORIALS / "bizfly.md")
MIGRATE = Tutorial(TUTORIALS / "migrate-from-in-tree.md")
#: the Kapsule tutorial's two modes: the section of each one's choice (the block the check block then uses)
KAPSULE_MODES = {"public": "### Self-managed", "private": "### Private endpoints"}
KAPSULE_CHECK = "### Check it against Scaleway"
#: where a reader of the README leaves it for a tutorial (its "Start here" list), and where a tutorial
#: has shown them the CA scaling a pool
README_START_HERE = "## Why not the in-tree providers"
SCALED = "**the CA has scaled the pool"
#: the limits the docs are held to (issue 38): words as `wc -w` counts them, code included
README_WORDS, TUTORIAL_WORDS, TO_A_SCALED_POOL, EXPLANATION_WORDS = 1500, 2500, 2000, 4000
REGISTRY = "registry.example.com/team"
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def reading_path(tutorial: Tutorial) -> int:
    """Words from the README's first line to its link to ``tutorial``, then to the tutorial's scaled pool."""
    readme = README.read_text()
    assert f"(docs/tutorials/{tutorial.path.name})" in readme.split(README_START_HERE, 1)[0]
    return words(readme.split(README_START_HERE, 1)[0]) + words(tutorial.path.read_text().split(SCALED, 1)[0])


def test_the_readme_and_the_tutorials_are_as_short_as_promised() -> None:
    counts = {"README.md": words(README.read_text())}
    counts.update({t.path.name: words(t.path.read_text()) for t in (KAPSULE, BIZFLY, MIGRATE)})
    assert counts["README.md"] <= README_WORDS, counts
    assert all(n <= TUTORIAL_WORDS for n in counts.values()), counts
    paths = {t.path.name: reading_path(t) for t in (KAPSULE, BIZFLY)}
    assert all(n < TO_A_SCALED_POOL for n in paths.values()), paths
    explanations = {p.name: words(p.read_text()) for p in (REPO_ROOT / "docs" / "explanation").glob("*.md")}
    assert explanations and all(n <= EXPLANATION_WORDS for n in explanations.values()), explanations
    # The tutorials name this release's image and archive, nothing older.
    for tutorial in (KAPSULE, BIZFLY, MIGRATE):
        named = set(re.findall(r"ca-externalgrpc-server[:-](\d+\.\d+\.\d+)", tutorial.path.read_text()))
        assert named == {VERSION}, (tutorial.path.name, named)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder where a tutorial's commands run as from the repository's root: deploy/ and a values file
    there are copies, so what the commands write stays out of the checkout."""
    shutil.copytree(REPO_ROOT / "deploy", tmp_path / "deploy")
    return tmp_path


def helm_template(command: str) -> str:
    """``helm install`` or ``upgrade`` of the official chart as the tutorials write it, as ``helm template``
    of the chart we render (tests/deploy/chart.py): what the command would apply, without a cluster."""
    pinned = f"autoscaler/cluster-autoscaler --version {chart_version(CA_1_36_1)}"
    verb = re.match(rf"helm (?:-n kube-system )?(?:install|upgrade) (\S+) {re.escape(pinned)} ", command)
    assert verb, f"not an install or upgrade of chart {pinned}: {command}"
    return f"{binary_path('helm')} template {verb.group(1)} {chart_dir(CA_1_36_1)} {command[verb.end() :]}"


def sidecar_and_ca(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod.get("initContainers", []) if c["name"] == "ca-externalgrpc"]
    ca = pod["containers"][0]  # named after the cloud provider unless the values set nameOverride
    return pod, sidecar, ca


@pytest.mark.parametrize("mode", ["public", "private"])
def test_the_kapsule_tutorials_install_applies_the_pushed_image_the_pull_secret_and_the_ca_release(
    checkout: Path, mode: str
) -> None:
    values = {**KAPSULE.values(), "REGISTRY": REGISTRY, "CA_VERSION": "v1.35.2", "SCW_SECRET_KEY": SCW_SECRET}
    (choice,) = KAPSULE.blocks(KAPSULE_MODES[mode])
    (check,) = KAPSULE.blocks(KAPSULE_CHECK)
    # The check asks the cloud: here the Scaleway simulator, with the page's cluster and pool (Kapsule
    # autoscaling off in the public mode, on with its bounds in the private one), at the URL the page's
    # shell gets from SCW_API_URL (the walk's one addition).
    pool = {"id": "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e0a", "name": values["POOL"], "node_type": "DEV1-M", "size": 0}
    pool |= {"autoscaling": False} if mode == "public" else {"min_size": 0, "max_size": 3}
    cluster = {"id": values["CLUSTER_ID"], "name": "tutorial", "region": values["SCW_REGION"], "pools": [pool]}
    (checkout / ".venv").symlink_to(REPO_ROOT / ".venv")
    with ScalewaySimulator(scenario={"clusters": [cluster]}, clock=ManualClock(), secret_key=SCW_SECRET) as sim:
        done = KAPSULE.run(f"{choice}\n{check}", values, cwd=checkout, env={"SCW_API_URL": sim.url})
    shown = checked(done, "the mode's choice and the check")
    assert "online: OK" in shown and "online: OK" in KAPSULE.path.read_text()
    (group,) = [line for line in shown.splitlines() if line.startswith(f"  group {pool['id']} ")]
    assert f"({values['POOL']}): min 0, max 3, target 0" in group, shown
    install = commands(KAPSULE.block("## 6."))
    assert install[0] == "helm repo add autoscaler https://kubernetes.github.io/autoscaler"
    (helm,) = [c for c in install if c.startswith("helm install")]
    upgrade = commands(KAPSULE.block("## Upgrade", "helm -n kube-system upgrade"))[0]
    for command in (helm, upgrade):
        done = KAPSULE.run(helm_template(command), values, cwd=checkout)
        docs = list(yaml.safe_load_all(checked(done, command)))
        pod, sidecar, ca = sidecar_and_ca(docs)
        assert sidecar["image"] == f"{REGISTRY}/ca-externalgrpc-server:{VERSION}"
        assert pod["imagePullSecrets"] == [{"name": "ca-externalgrpc-pull"}]
        assert ca["image"] == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2"
        assert "--cloud-provider=externalgrpc" in ca["command"]
        (config,) = [
            d
            for d in docs
            if d
            and d["kind"] == "ConfigMap"
            and d["metadata"]["name"].endswith("-config")
            and "config.yaml" in d["data"]
        ]
        (backend,) = yaml.safe_load(config["data"]["config.yaml"])["backends"]
        expected = {"mode": "public", "pools": {values["POOL"]: {"min_size": 0, "max_size": 3}}}
        assert backend["scaleway"] == (expected if mode == "public" else {}), backend


def test_the_bizfly_tutorials_check_passes_on_the_pages_cluster_and_lists_its_pool(checkout: Path) -> None:
    # The Bizfly simulator's demo cluster, its first pool named as the page's, the simulator's credential;
    # BIZFLYCLOUD_API_URL is the shell's way to the simulator (the walk's one addition).
    scenario = bizfly_demo()
    values = {**BIZFLY.values(), "REGISTRY": REGISTRY}
    scenario["clusters"][0]["pools"][0]["name"] = values["POOL"]
    ((credential_id, credential_secret),) = DEFAULT_APP_CREDENTIALS.items()
    (checkout / ".venv").symlink_to(REPO_ROOT / ".venv")
    with BizflySimulator(scenario, clock=ManualClock()) as sim:
        values |= {
            "CLUSTER_NAME": bizfly_cluster_uid(sim),
            "BIZFLYCLOUD_REGION": BIZFLY_REGION,
            "BIZFLYCLOUD_APP_CREDENTIAL_ID": credential_id,
            "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": credential_secret,
        }
        done = BIZFLY.run(
            BIZFLY.block("## 4.", "validate --online"), values, cwd=checkout, env={"BIZFLYCLOUD_API_URL": sim.url}
        )
    shown = checked(done, "the check")
    assert "bizfly (bizfly): online: OK" in shown and "online: OK" in BIZFLY.path.read_text()
    assert [line for line in shown.splitlines() if f"({values['POOL']}): min 1, max 5" in line], shown


def test_the_bizfly_tutorials_overlay_applies_the_pushed_image_the_pull_secret_and_the_ca_release(
    checkout: Path,
) -> None:
    values = {
        **BIZFLY.values(),
        "REGISTRY": REGISTRY,
        "CA_VERSION": "v1.35.2",
        "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": "s",
    }
    deploy = commands(BIZFLY.block("## 6."))
    assert deploy[-2:] == [
        "kubectl apply -k my-bizfly",
        "kubectl -n kube-system rollout status deployment/cluster-autoscaler --timeout=5m",
    ]
    checked(BIZFLY.run("\n".join(deploy[:-2]), values, cwd=checkout), "the overlay's commands")
    docs = find_kustomize().render(checkout / "my-bizfly")
    pod, sidecar, ca = sidecar_and_ca(docs)
    assert sidecar["image"] == f"{REGISTRY}/ca-externalgrpc-server:{VERSION}"
    assert pod["imagePullSecrets"] == [{"name": "ca-externalgrpc-pull"}]
    assert ca["image"] == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2"
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("ca-externalgrpc-config")
    ]
    assert [b["type"] for b in yaml.safe_load(config["data"]["config.yaml"])["backends"]] == ["bizfly"]


def test_the_migration_tutorials_conversion_makes_the_values_of_the_switch(checkout: Path) -> None:
    # The reader's state: an in-tree release's values, and the keys of the Secret its envFromSecret names
    # (what the page's kubectl line writes to credentials.env).
    values = {**MIGRATE.values(), "REGISTRY": REGISTRY}
    in_tree = {"cloudProvider": "scaleway", "autoDiscovery": {"clusterName": "c"}, "envFromSecret": values["SECRET"]}
    (checkout / "my-values.yaml").write_text(yaml.safe_dump(in_tree))
    convert = commands(MIGRATE.block("## 3.", "from-in-tree"))
    assert convert[0].startswith('kubectl -n kube-system get secret "$SECRET"') and convert[0].endswith(
        "> credentials.env"
    )
    (checkout / "credentials.env").write_text(
        f"CLUSTER_ID=11111111-2222-3333-4444-555555555555\nSCW_REGION=fr-par\nSCW_SECRET_KEY={SCW_SECRET}\n"
    )
    (checkout / ".venv").symlink_to(REPO_ROOT / ".venv")
    checked(MIGRATE.run("\n".join(convert[1:]), values, cwd=checkout), "the conversion")
    assert not (checkout / "credentials.env").exists()
    checked(MIGRATE.run(MIGRATE.block("## 3.", "patch "), values, cwd=checkout), "the values' patch")
    (switch,) = [c for c in commands(MIGRATE.block("## 4.")) if c.startswith("helm")]
    done = MIGRATE.run(helm_template(switch), values, cwd=checkout)
    pod, sidecar, ca = sidecar_and_ca(list(yaml.safe_load_all(checked(done, switch))))
    assert sidecar["image"] == f"{REGISTRY}/ca-externalgrpc-server:{VERSION}"
    assert sidecar["envFrom"] == [{"secretRef": {"name": values["SECRET"]}}]
    assert pod["imagePullSecrets"] == [{"name": "ca-externalgrpc-pull"}]
    assert "--cloud-provider=externalgrpc" in ca["command"] and not ca.get("envFrom")
