"""Start the two servers under test as child processes and measure what only the OS can tell.

Both run as real processes (not threads of the runner) so that peak RSS comes from the kernel's own
high-water mark (``VmHWM`` in ``/proc/PID/status``) and start-up time covers the whole process start:
interpreter or Go runtime, imports, first cloud sync, listening socket.

Start-up is timed differently, because the upstream example (and its Go stand-in) has no health service:
- ours: from ``Popen`` to the first ``grpc.health.v1`` ``Check("")`` answering SERVING; we also time the
  first ``NodeGroups`` answering every group, which is the comparable moment;
- upstream and goref: from ``Popen`` to the first successful ``NodeGroups`` with every group (both run
  the first cloud refresh before they listen, so that is when they can serve).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from tests.bench.cluster import BENCH_REGION, BENCH_SECRET_KEY, BenchCluster

REPO = Path(__file__).resolve().parents[2]
OURS_COMMAND = REPO / ".venv" / "bin" / "ca-externalgrpc"
START_TIMEOUT = 120.0  # a cold Python start plus a 5,000-node first sync stays far below this
POLL_INTERVAL = 0.005
# Upstream variables that would silently override our config file (CONTRIBUTING-CONTRACTS.md).
SCALEWAY_ENV = ("CLUSTER_ID", "SCW_SECRET_KEY", "SCW_REGION", "SCW_API_URL")


class ServerStartError(RuntimeError):
    """A server process exited or never became ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Startup:
    serving_s: float  # ours: health SERVING; upstream: first complete NodeGroups (no health service)
    node_groups_s: float  # first NodeGroups answering every group, for both
    serving_signal: str


@dataclass
class ServerProcess:
    name: str
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    startup: Startup | None = None
    _log_file: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def memory(self) -> dict[str, float]:
        """Peak and current resident set size of the server process, MiB, from /proc."""
        values: dict[str, float] = {}
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    values[key] = int(rest.split()[0]) / 1024.0  # the kernel reports kB
        return {"peak_rss_mib": values.get("VmHWM", 0.0), "rss_mib": values.get("VmRSS", 0.0)}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None


def _spawn(name: str, address: str, argv: list[str], env: dict[str, str], workdir: Path) -> ServerProcess:
    log_path = workdir / f"{name}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by ServerProcess.stop
    started_at = time.monotonic()
    process = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir)
    return ServerProcess(name, address, process, log_path, started_at, _log_file=log_file)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SCALEWAY_ENV}


def ours_config(cluster: BenchCluster, port: int, http_port: int, log_level: str) -> str:
    return (
        f"listen: 127.0.0.1:{port}\n"
        f"http_listen: 127.0.0.1:{http_port}\n"
        f"log: {{format: json, level: {log_level}}}\n"
        "backends:\n"
        "  - name: scw-bench\n"
        "    type: scaleway\n"
        "    scaleway:\n"
        f"      cluster_id: {cluster.cluster_id}\n"
        f"      region: {BENCH_REGION}\n"
        f"      api_url: {cluster.url}\n"
        f"      secret_key: {BENCH_SECRET_KEY}\n"
    )


def start_ours(cluster: BenchCluster, workdir: Path, log_level: str = "info") -> ServerProcess:
    """``ca-externalgrpc serve`` on a free loopback port."""
    port, http_port = free_port(), free_port()
    config = workdir / "ours.yaml"
    config.write_text(ours_config(cluster, port, http_port, log_level))
    argv = [str(OURS_COMMAND), "serve", "--config", str(config)]
    server = _spawn("ours", f"127.0.0.1:{port}", argv, _clean_env(), workdir)
    server.startup = _wait_ready(server, expected_groups=cluster.pools, health=True)
    return server


def _scaleway_env(cluster: BenchCluster) -> dict[str, str]:
    env = _clean_env()
    env.update(
        CLUSTER_ID=cluster.cluster_id, SCW_SECRET_KEY=BENCH_SECRET_KEY, SCW_REGION=BENCH_REGION, SCW_API_URL=cluster.url
    )
    return env


def start_upstream(cluster: BenchCluster, binary: Path, workdir: Path) -> ServerProcess:
    """The upstream example server with the in-tree Scaleway provider, configured the upstream way (env)."""
    port = free_port()
    argv = [str(binary), "--address", f"127.0.0.1:{port}", "--cloud-provider", "scaleway", "--v", "0"]
    server = _spawn("upstream", f"127.0.0.1:{port}", argv, _scaleway_env(cluster), workdir)
    server.startup = _wait_ready(server, expected_groups=cluster.pools, health=False)
    return server


def start_go_reference(cluster: BenchCluster, binary: Path, workdir: Path) -> ServerProcess:
    """The Go stand-in (tests/bench/loadclient/goreference), configured like the upstream (env)."""
    port = free_port()
    argv = [str(binary), "--address", f"127.0.0.1:{port}"]
    server = _spawn("goref", f"127.0.0.1:{port}", argv, _scaleway_env(cluster), workdir)
    server.startup = _wait_ready(server, expected_groups=cluster.pools, health=False)
    return server


def _wait_ready(server: ServerProcess, expected_groups: int, health: bool) -> Startup:
    deadline = server.started_at + START_TIMEOUT
    serving_at: float | None = None
    with grpc.insecure_channel(server.address) as channel:
        health_stub = health_pb2_grpc.HealthStub(channel)
        provider = pb_grpc.CloudProviderStub(channel)
        while True:
            if server.process.poll() is not None:
                raise ServerStartError(
                    f"{server.name} exited with {server.process.returncode} before it was ready:\n{server.log_tail()}"
                )
            now = time.monotonic()
            if now > deadline:
                server.stop()
                raise ServerStartError(f"{server.name} not ready after {START_TIMEOUT:.0f}s:\n{server.log_tail()}")
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
                            serving_s=first - server.started_at,
                            node_groups_s=ready_at - server.started_at,
                            serving_signal="grpc.health.v1 SERVING" if health else "first complete NodeGroups",
                        )
                except grpc.RpcError:
                    pass
            time.sleep(POLL_INTERVAL)
