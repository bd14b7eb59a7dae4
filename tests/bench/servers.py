"""Start the servers under test as child processes (through ``devstack.harness``) and time their start.

All run as real processes (not threads of the runner) so that peak RSS comes from the kernel's own
high-water mark (``VmHWM`` in ``/proc/PID/status``) and start-up time covers the whole process start:
interpreter or Go runtime, imports, first cloud sync, listening socket.

Start-up is timed differently, because the upstream example has no health service:
- ours: from ``Popen`` to the first ``grpc.health.v1`` ``Check("")`` answering SERVING; we also time the
  first ``NodeGroups`` answering every group, which is the comparable moment;
- upstream: from ``Popen`` to the first successful ``NodeGroups`` with every group (it runs the first
  cloud refresh before it listens, so that is when it can serve).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.clouds import scaleway_backend, scaleway_in_tree_env
from devstack.harness import ChildProcess, ServerProcess, ServerStartError, child_env, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from tests.bench import floor_server
from tests.bench.cluster import BenchCluster

REPO = Path(__file__).resolve().parents[2]
# Our server as benchmarked: the name in the results -> keys added to its config: "backend" keys to
# the Scaleway backend's entry, any other key at the top level.
OURS_VARIANTS: dict[str, dict[str, Any]] = {
    "ours": {},
    # Syncs on a timer every interval instead of at the CA's Refresh (sync.follow_refresh: false).
    "ours-timer": {"backend": {"sync": {"follow_refresh": False}}},
    "ours-grpcio": {"serving": {"engine": "grpcio"}},
    "ours-native": {"serving": {"engine": "native"}},
}


def checkout_option(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` of ``--ours-from``: another checkout of this repository, benchmarked as NAME."""
    name, _, path = text.partition("=")
    if not name or not path or name in (*OURS_VARIANTS, "upstream"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=PATH, a new name and a checkout whose make install has run, e.g. main=../main"
        )
    return name, Path(path).resolve()


def add_ours_options(parser: argparse.ArgumentParser) -> None:
    """The options both runners take for our server: another checkout to run beside it, its log level."""
    parser.add_argument(
        "--ours-from",
        type=checkout_option,
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also run the server of another checkout (its make install done) as NAME, e.g. main=../main",
    )
    parser.add_argument("--log-level", default="info", help="our server's log level (deployments run info)")


def describe_checkout(checkout: Path) -> str:
    """What ``--ours-from`` ran, for the results: the checkout and its commit."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
    )
    return f"ca-externalgrpc serve of the checkout {checkout} ({done.stdout.strip() or 'not a git checkout'})"


# The grpcio floor of the serving spike (floor_server.py): the name in the results -> its engine.
FLOOR_VARIANTS: dict[str, list[str]] = {
    "floor-threads": ["--engine", "threads"],
    "floor-threads-1": ["--engine", "threads", "--workers", "1"],
    "floor-threads-raw": ["--engine", "threads", "--raw"],
    "floor-aio": ["--engine", "aio"],
    "floor-aio-uvloop": ["--engine", "aio-uvloop"],
}
OURS_COMMAND = REPO / ".venv" / "bin" / "ca-externalgrpc"
START_TIMEOUT = 120.0  # a cold Python start plus a 5,000-node first sync stays far below this
POLL_INTERVAL = 0.005


@dataclass(frozen=True)
class Startup:
    serving_s: float  # ours: health SERVING; upstream: first complete NodeGroups (no health service)
    node_groups_s: float  # first NodeGroups answering every group, for both
    serving_signal: str


@dataclass
class BenchedServer:
    """A server under test: its process, the address it listens on and how long it took to be ready."""

    name: str
    process: ChildProcess
    address: str
    startup: Startup

    def stop(self) -> None:
        self.process.stop()


def start_ours(
    cluster: BenchCluster,
    workdir: Path,
    log_level: str = "info",
    name: str = "ours",
    settings: Mapping[str, Any] | None = None,
    checkout: Path | None = None,
) -> BenchedServer:
    """``ca-externalgrpc serve`` (the installed console script) on loopback port 0.

    ``settings`` are config keys added to the config file (a variant of ``OURS_VARIANTS``). ``checkout``
    runs another checkout of this repository instead (its ``.venv``, set up by its ``make install``),
    to compare two versions in one run.
    """
    top = dict(settings or {})
    backend = scaleway_backend(cluster.simulator, "scw-bench", **top.pop("backend", {}))
    config = server_config([backend], log={"format": "json", "level": log_level}, **top)
    command = OURS_COMMAND if checkout is None else checkout / ".venv" / "bin" / "ca-externalgrpc"
    if not command.is_file():
        raise ServerStartError(f"{command} does not exist: run make install in {checkout}")
    process = ServerProcess(
        config,
        env=None if checkout is None else {"PYTHONPATH": str(checkout)},
        workdir=workdir,
        log_level=log_level,
        command=[str(command)],
        log_path=workdir / f"{name}.log",
        name=name,
        start_timeout=START_TIMEOUT,
    )
    return _ready(process, process.address, expected_groups=cluster.pools, health=True)


def start_upstream(cluster: BenchCluster, binary: Path, workdir: Path) -> BenchedServer:
    """The upstream example server with the in-tree Scaleway provider, in front of the benchmark cluster."""
    env = scaleway_in_tree_env(cluster.simulator)
    return start_upstream_example(binary, "scaleway", env, workdir, expected_groups=cluster.pools)


def start_upstream_example(
    binary: Path,
    cloud_provider: str,
    env: Mapping[str, str],
    workdir: Path,
    expected_groups: int,
    name: str = "upstream",
) -> BenchedServer:
    """The upstream example server ``binary`` wrapping the in-tree provider ``cloud_provider`` (``scaleway``,
    ``bizflycloud``), configured the upstream way: by the variables ``env`` (this process's own cloud
    variables are left out). Ready once NodeGroups answers ``expected_groups`` groups.

    It listens on port 0; the port it got is read from /proc (it cannot report it).
    """
    process = ChildProcess(
        [str(binary), "--cloud-provider", cloud_provider, "--v", "0", "--address", "127.0.0.1:0"],
        env=child_env(env),
        cwd=workdir,
        log_path=workdir / f"{name}.log",
        name=name,
    )
    address = process.wait_listening(START_TIMEOUT)
    return _ready(process, address, expected_groups=expected_groups, health=False)


def _floor_state(cluster: BenchCluster) -> dict[str, Any]:
    state = cluster.simulator.state
    with state.lock:
        autoscaled = {pid: pool for pid, pool in state.pools.items() if pool.autoscaling}
        groups = [{"id": p.id, "min": p.min_size, "max": p.max_size, "size": p.size} for p in autoscaled.values()]
        nodes = {n.provider_id: n.pool_id for n in state.nodes.values() if n.pool_id in autoscaled}
    return floor_server.state_of(groups, nodes)


def start_floor(cluster: BenchCluster, workdir: Path, name: str) -> BenchedServer:
    """The do-nothing grpcio server of the spike, answering from the cluster's state as it is now."""
    state_file = workdir / f"{name}.state.json"
    state_file.write_text(json.dumps(_floor_state(cluster)))
    argv = [sys.executable, "-m", "tests.bench.floor_server", *FLOOR_VARIANTS[name], "--state", str(state_file)]
    process = ChildProcess([*argv, "--address", "127.0.0.1:0"], cwd=REPO, log_path=workdir / f"{name}.log", name=name)
    address = process.wait_listening(START_TIMEOUT)
    return _ready(process, address, expected_groups=cluster.pools, health=False)


NATIVE_FLOOR = REPO / "tests" / "bench" / "native_floor" / "target" / "release" / "native-floor"


def start_native_floor(cluster: BenchCluster, workdir: Path) -> BenchedServer:
    """The spike's Rust/tonic floor, serving the answers Python serialized from the cluster's state."""
    if not NATIVE_FLOOR.is_file():
        raise ServerStartError(
            f"{NATIVE_FLOOR} is not built: run `cargo build --release` in tests/bench/native_floor (needs Rust)"
        )
    answers = workdir / "native-floor.answers.json"
    answers.write_text(json.dumps(floor_server.native_answers(_floor_state(cluster))))
    process = ChildProcess(
        [str(NATIVE_FLOOR), "--answers", str(answers), "--address", "127.0.0.1:0"],
        cwd=REPO,
        log_path=workdir / "native-floor.log",
        name="native-floor",
    )
    address = process.wait_listening(START_TIMEOUT)
    return _ready(process, address, expected_groups=cluster.pools, health=False)


def _ready(process: ChildProcess, address: str, expected_groups: int, health: bool) -> BenchedServer:
    """Poll until the server answers every group; the times are from process start (``Popen``)."""
    try:
        startup = _wait_ready(process, address, expected_groups, health)
    except BaseException:
        process.stop()
        raise
    return BenchedServer(process.name, process, address, startup)


def _wait_ready(process: ChildProcess, address: str, expected_groups: int, health: bool) -> Startup:
    deadline = process.started_at + START_TIMEOUT
    serving_at: float | None = None
    with grpc.insecure_channel(address) as channel:
        health_stub = health_pb2_grpc.HealthStub(channel)
        provider = pb_grpc.CloudProviderStub(channel)
        while True:
            if process.process.poll() is not None:
                raise ServerStartError(
                    f"{process.name} exited with {process.process.returncode} before it was ready:\n"
                    + process.log_tail()
                )
            now = time.monotonic()
            if now > deadline:
                raise ServerStartError(f"{process.name} not ready after {START_TIMEOUT:.0f}s:\n{process.log_tail()}")
            if health and serving_at is None:
                try:
                    answer = health_stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        serving_at = time.monotonic()
                except grpc.RpcError:
                    pass
            if not health or serving_at is not None:
                try:
                    groups = provider.NodeGroups(pb.NodeGroupsRequest(), timeout=1.0).nodeGroups
                    if len(groups) >= expected_groups:
                        ready_at = time.monotonic()
                        first = serving_at if serving_at is not None else ready_at
                        return Startup(
                            serving_s=first - process.started_at,
                            node_groups_s=ready_at - process.started_at,
                            serving_signal="grpc.health.v1 SERVING" if health else "first complete NodeGroups",
                        )
                except grpc.RpcError:
                    pass
            time.sleep(POLL_INTERVAL)
