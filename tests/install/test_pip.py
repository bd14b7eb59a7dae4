"""``pip install`` of the wheels ``make wheels`` built, in a fresh virtualenv on a PATH without cargo or
rustc, as a Python user installs the server (docs/how-to/install.md runs the same commands).

The server's wheel alone serves the README's minimal config (pointed at the Scaleway simulator) on
the grpcio engine and says so in one log line; ``serving.engine: native`` asked for explicitly fails
at start with the fix. With the ``[native]`` extra the same config serves on the native engine. Each
installation then serves a conformance smoke: the CA 1.36.1 client's checks (``make build``) against
the conformance lab with the installed ``ca-externalgrpc`` in front of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.harness import ENGINE_ENV, ServerProcess, write_config
from protos import externalgrpc_pb2 as pb
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.conformance.lab import InstalledServer
from tests.conformance.run import CA_MODULES, run_ca
from tests.install.conftest import DIST, REPO, SCALEWAY_SCENARIO
from tests.support import gobuild

RUST_TOOLS = ("cargo", "rustc", "rustup", "maturin")
SERVER_WHEEL = "ca_externalgrpc_server-*.whl"
NATIVE_WHEEL = "ca_externalgrpc_native-*.whl"
GRPCIO_LINE = "serving on the grpcio engine (serving.engine: auto)"
PIP_TIMEOUT_SECONDS = 400


#: what a wheel is built from (byte-code the tests write into the source folders is not)
SOURCE_SUFFIXES = {".py", ".pyi", ".rs", ".toml", ".lock"}


def newest_source(*paths: str) -> float:
    files = [f for path in paths for f in [REPO / path, *(REPO / path).rglob("*")] if f.is_file()]
    return max(f.stat().st_mtime for f in files if f.suffix in SOURCE_SUFFIXES and "__pycache__" not in f.parts)


def built_wheel(pattern: str, *sources: str) -> Path:
    """The wheel of dist/ matching ``pattern``, newer than its sources, or the test fails: run make wheels."""
    found = sorted(DIST.glob(pattern))
    problem = ""
    if len(found) != 1:
        problem = f"expected one {pattern} in {DIST}, found {[p.name for p in found]}: run make wheels"
    elif found[0].stat().st_mtime < newest_source(*sources):
        problem = f"{found[0].name} is older than its sources: run make wheels"
    if problem:
        pytest.fail(problem, pytrace=False)
    return found[0]


def path_without_rust() -> str:
    """$PATH without the folders that hold a Rust tool (rustup's ~/.cargo/bin among them)."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    kept = [f for f in folders if f and not any(os.access(Path(f) / tool, os.X_OK) for tool in RUST_TOOLS)]
    path = os.pathsep.join(kept)
    assert all(shutil.which(tool, path=path) is None for tool in RUST_TOOLS)
    return path


@dataclass
class Virtualenv:
    root: Path
    env: dict[str, str]  # the environment every command of the installation runs in: no Rust on PATH

    @property
    def ca_externalgrpc(self) -> str:
        return str(self.root / "bin" / "ca-externalgrpc")

    def run(self, *argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            env={**self.env, **env},
            cwd=self.root.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pip_install(self, *requirements: str) -> None:
        done = self.run(str(self.root / "bin" / "pip"), "install", *requirements, timeout=PIP_TIMEOUT_SECONDS)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def has_native_engine(self) -> bool:
        return self.run(str(self.root / "bin" / "python"), "-c", "import ca_externalgrpc_native").returncode == 0


def fresh_virtualenv(root: Path) -> Virtualenv:
    """``python3 -m venv`` of the interpreter running the tests (not its virtualenv), no Rust on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CARGO_HOME", "RUSTUP_HOME")}
    env["PATH"] = path_without_rust()
    venv = Virtualenv(root, env)
    done = venv.run(sys.executable, "-m", "venv", str(root))
    assert done.returncode == 0, done.stderr
    return venv


@pytest.fixture(scope="module")
def wheels() -> tuple[Path, Path]:
    server = built_wheel(SERVER_WHEEL, "server", "providers", "protos", "pyproject.toml", "setup.py")
    native = built_wheel(NATIVE_WHEEL, "native/src", "native/Cargo.toml", "native/Cargo.lock")
    return server, native


@pytest.fixture(scope="module")
def plain(wheels: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Virtualenv:
    """The server's wheel alone: its dependencies from the index, no native engine."""
    venv = fresh_virtualenv(tmp_path_factory.mktemp("plain") / "venv")
    venv.pip_install(str(wheels[0]))
    return venv


@pytest.fixture(scope="module")
def with_native(wheels: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Virtualenv:
    """The server with its [native] extra, the native wheel found in dist/, its dependencies the locked
    ones: the exact files of requirements/runtime.txt, hashes checked, then both wheels without
    dependencies, and pip check that nothing the server needs is missing (docs/how-to/install.md)."""
    venv = fresh_virtualenv(tmp_path_factory.mktemp("native") / "venv")
    venv.pip_install("--require-hashes", "--no-deps", "-r", str(REPO / "requirements" / "runtime.txt"))
    venv.pip_install("--no-deps", str(wheels[0]), str(wheels[1]))  # --no-deps: the extra names, the file installs
    checked = venv.run(str(venv.root / "bin" / "pip"), "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return venv


@pytest.fixture
def scaleway(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScalewaySimulator]:
    monkeypatch.delenv(ENGINE_ENV, raising=False)  # the README's config, with the default engine
    with ScalewaySimulator(scenario=SCALEWAY_SCENARIO, clock=ManualClock()) as sim:
        yield sim


def readme_minimal_config() -> dict[str, Any]:
    """The YAML block under "A minimal sidecar config" in README.md."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"A minimal sidecar config:\s*```yaml\n(.*?)```", readme, re.DOTALL)
    assert block, "README.md has no minimal sidecar config block"
    return dict(yaml.safe_load(block.group(1)))


def pointed_at(sim: ScalewaySimulator, pool_id: str) -> dict[str, Any]:
    """The README's minimal config with the simulator's cluster, region and API URL, and the example
    node-group override on a real pool; the ports are loopback port 0, never the README's 8086 and 8087,
    which a developer's `make run` may hold (the harness reads the bound ports back)."""
    config = {**readme_minimal_config(), "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0"}
    (backend,) = config["backends"]
    assert backend["scaleway"]["secret_key_env"] == "SCW_SECRET_KEY"
    backend["scaleway"].update(cluster_id=sim.cluster_id, region=sim.region, api_url=sim.url)
    backend["node_groups"] = {pool_id: backend["node_groups"].pop("<pool-id>")}
    return config


def serve_readme_config(venv: Virtualenv, sim: ScalewaySimulator, workdir: Path) -> tuple[str, list[dict[str, Any]]]:
    """Serve the README's config with the installation, check what it serves; its engine and log records."""
    pools = {p["name"]: p["id"] for p in sim.state.snapshot()["pools"]}
    env = {"PATH": venv.env["PATH"], "SCW_SECRET_KEY": sim.secret_key}
    server = ServerProcess(
        pointed_at(sim, pools["general"]), env=env, workdir=workdir, command=[venv.ca_externalgrpc], from_checkout=False
    )
    try:
        groups = {g.id for g in server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups}
        assert groups == set(pools.values())
        # The README's override of the example group (5m), the CA's default (10m) given as a CA 1.36 sends it.
        defaults = pb.NodeGroupAutoscalingOptions(scaleDownUnneededDuration={"seconds": 600})
        request = pb.NodeGroupAutoscalingOptionsRequest(id=pools["general"], defaults=defaults)
        answer = server.stub.NodeGroupGetOptions(request, timeout=5)
        assert answer.nodeGroupAutoscalingOptions.scaleDownUnneededDuration.seconds == 300
        status = venv.run(venv.ca_externalgrpc, "status", "--address", server.address)
        assert status.returncode == 0 and pools["general"] in status.stdout, status.stdout + status.stderr
    finally:
        assert server.stop() == 0, server.log_tail()
    records = [json.loads(line) for line in server.output.splitlines() if line.startswith("{")]
    (serving,) = [r for r in records if r["msg"] == "serving"]
    return serving["engine"], records


def conformance_smoke(venv: Virtualenv, workdir: Path) -> None:
    """The CA 1.36.1 client's checks, plaintext, against the lab served by the installed server."""
    (module,) = [m for m in CA_MODULES if m.key == "1.36.1"]
    try:
        binary = gobuild.binary_path(module.binary_name)
        missing = ""
    except gobuild.GoBuildError as err:
        missing = str(err)
    if missing:
        pytest.fail(missing, pytrace=False)
    installed = InstalledServer((venv.ca_externalgrpc,), {"PATH": venv.env["PATH"]})
    result = run_ca(binary, module, "plaintext", None, workdir, installed)
    assert result.ok, result.error or f"{result.failed} failed: {', '.join(result.failures)}"
    assert result.passed > 0


@pytest.mark.timeout(PIP_TIMEOUT_SECONDS + 200)
def test_the_servers_wheel_alone_serves_the_readme_config_on_grpcio_and_says_so_once(
    plain: Virtualenv, scaleway: ScalewaySimulator, tmp_path: Path
) -> None:
    assert not plain.has_native_engine()
    engine, records = serve_readme_config(plain, scaleway, tmp_path)
    assert engine == "grpcio"
    said = [r for r in records if GRPCIO_LINE in r["msg"]]
    assert len(said) == 1, [r["msg"] for r in records]
    assert "native serving engine is not installed" in said[0]["msg"]
    assert "pip install 'ca-externalgrpc-server[native]'" in said[0]["msg"]
    conformance_smoke(plain, tmp_path)


@pytest.mark.timeout(PIP_TIMEOUT_SECONDS + 200)
def test_version_names_the_commit_the_wheel_was_built_from_and_the_engine(
    plain: Virtualenv, with_native: Virtualenv
) -> None:
    """No git in a virtualenv: the commit is the one make wheels recorded in the wheel."""
    for venv, engine in ((plain, "grpcio"), (with_native, "native")):
        done = venv.run(venv.ca_externalgrpc, "--version")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        assert re.fullmatch(r"commit: [0-9a-f]{40}(-dirty)? \(recorded at build\)", lines[1]), lines
        assert lines[2].startswith(f"engine: {engine} (serving.engine: auto"), lines
        assert re.fullmatch(
            r"libraries: grpcio \S+, protobuf \S+ \(\w+\), ca-externalgrpc-native (\S+|not installed)", lines[3]
        ), lines
    locked = (REPO / "requirements" / "runtime.txt").read_text()
    pinned = {name: re.search(rf"^{name}==(\S+)", locked, re.MULTILINE) for name in ("grpcio", "protobuf")}
    done = with_native.run(with_native.ca_externalgrpc, "--version")
    for name, pin in pinned.items():
        assert pin and f"{name} {pin.group(1)}" in done.stdout, (name, done.stdout)


@pytest.mark.timeout(PIP_TIMEOUT_SECONDS + 200)
def test_asking_for_the_native_engine_without_it_fails_at_start_with_the_fix(
    plain: Virtualenv, scaleway: ScalewaySimulator, tmp_path: Path
) -> None:
    config = {**pointed_at(scaleway, "any-pool"), "serving": {"engine": "native"}}
    path = write_config(tmp_path / "config.yaml", config)
    done = plain.run(plain.ca_externalgrpc, "serve", "--config", str(path), SCW_SECRET_KEY=scaleway.secret_key)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: serving.engine: the native serving engine is not installed"), line
    assert "Fix: install the server with its native extra, pip install 'ca-externalgrpc-server[native]'" in line


@pytest.mark.timeout(PIP_TIMEOUT_SECONDS + 200)
def test_the_native_extra_installs_the_native_engine_without_rust_and_the_server_serves_with_it(
    with_native: Virtualenv, scaleway: ScalewaySimulator, tmp_path: Path
) -> None:
    assert with_native.has_native_engine()
    engine, records = serve_readme_config(with_native, scaleway, tmp_path)
    assert engine == "native"
    assert not [r for r in records if GRPCIO_LINE in r["msg"]]
    conformance_smoke(with_native, tmp_path)
