"""What a newcomer meets first, run as they would run it: the CLI and the demo as child processes.

A busy port is one line naming the port and what changes it; ``--version``; unreadable certificate
files are one line; ``serve --ready-file`` reports the ports a port-0 config was given; the demo's
banner commands work when pasted.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.clouds import scaleway_backend
from devstack.harness import (
    REPO_ROOT,
    ChildProcess,
    ServerProcess,
    child_env,
    listening_addresses,
    serve_command,
    server_config,
    write_config,
)
from protos import externalgrpc_pb2 as pb
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario

CLI_TIMEOUT = 60


@pytest.fixture
def simulator() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        yield sim


@contextlib.contextmanager
def port_taken() -> Iterator[int]:
    """A loopback port another process (here: this one) listens on for the whole block."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run(*serve_command(), *args)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    return lines[0]


# ---------------------------------------------------------------------------------------------- ready file
def test_ready_file_reports_the_ports_bound_for_port_zero(tmp_path: Path, simulator: ScalewaySimulator) -> None:
    server = ServerProcess(server_config([scaleway_backend(simulator)]), workdir=tmp_path)
    try:
        ready = json.loads(server.ready_path.read_text())
        assert ready["pid"] == server.pid
        grpc_port, http_port = (int(ready[key].rsplit(":", 1)[1]) for key in ("grpc", "http"))
        assert grpc_port != 0 and http_port != 0 and grpc_port != http_port
        # The kernel agrees: those are the ports the process listens on.
        assert {grpc_port, http_port} <= {port for _, port in listening_addresses(server.pid)}
        health = health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert server.http_get("/healthz") == (200, "ok\n")
    finally:
        assert server.stop() == 0


def test_restart_comes_back_on_new_ports_with_fresh_state(tmp_path: Path, simulator: ScalewaySimulator) -> None:
    server = ServerProcess(server_config([scaleway_backend(simulator)]), workdir=tmp_path)
    try:
        first_pid = server.pid
        server.restart()
        assert server.pid != first_pid and server.restarts == 1
        groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        assert len(groups) == len([p for p in simulator.state.snapshot()["pools"] if p["autoscaling"]])
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- busy ports
@pytest.mark.parametrize("setting", ["listen", "http_listen"])
def test_serve_on_a_busy_port_says_which_port_and_which_key_in_one_line(
    tmp_path: Path, simulator: ScalewaySimulator, setting: str
) -> None:
    with port_taken() as port:
        config = server_config([scaleway_backend(simulator)], **{setting: f"127.0.0.1:{port}"})
        path = write_config(tmp_path / "config.yaml", config)
        done = cli("serve", "--config", str(path))
    assert done.returncode != 0
    line = one_line(done.stderr)
    assert f"127.0.0.1:{port}" in line and "already in use" in line
    assert f"`{setting}` in {path}" in line


@pytest.mark.parametrize(
    ("flag", "make_variable", "purpose"),
    [("--listen", "LISTEN=", "gRPC"), ("--http-listen", "HTTP_LISTEN=", "HTTP")],
)
def test_demo_on_a_busy_port_names_the_flag_and_the_make_variable(flag: str, make_variable: str, purpose: str) -> None:
    other = "--http-listen" if flag == "--listen" else "--listen"
    with port_taken() as port:
        done = run(sys.executable, "-m", "devstack", flag, f"127.0.0.1:{port}", other, "127.0.0.1:0")
    assert done.returncode != 0
    line = one_line(done.stderr)
    assert f"127.0.0.1:{port}" in line and purpose in line
    assert f"{flag} HOST:PORT" in line and f"make run {make_variable}HOST:PORT" in line


# ---------------------------------------------------------------------------------------------- CLI basics
def test_version_prints_the_distribution_version_then_the_commit_engine_and_libraries() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    done = cli("--version")
    assert done.returncode == 0
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f"ca-externalgrpc {project['version']}"
    assert [line.split(":")[0] for line in lines[1:]] == ["commit", "engine", "libraries"]


@pytest.mark.parametrize("path", ["/no/such/ca.crt", "."])  # missing, and a directory
def test_status_with_an_unreadable_cacert_is_one_line(path: str) -> None:
    done = cli("status", "--address", "127.0.0.1:1", "--cacert", path)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"error: cannot read --cacert {path}: ")
    assert done.stdout == ""


# ---------------------------------------------------------------------------------------------- demo banner
def test_demo_banner_commands_work_when_pasted_from_the_repository_root() -> None:
    demo = ChildProcess(
        [sys.executable, "-m", "devstack", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
        env=child_env(),
    )
    try:
        demo.wait_listening()
        banner = _banner(demo)
        commands = [line.strip() for line in banner.splitlines() if re.match(r"\s+(\.venv/bin/|grpcurl |curl )", line)]
        assert any(c.startswith(".venv/bin/ca-externalgrpc status") for c in commands), banner
        for command in commands:
            done = subprocess.run(
                shlex.split(command), cwd=REPO_ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            assert done.stdout.strip(), command
    finally:
        assert demo.stop() == 0


def _banner(demo: ChildProcess, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while "Stop with Ctrl-C." not in demo.output:
        if time.monotonic() > deadline:
            raise AssertionError(f"the demo printed no banner:\n{demo.output}")
        time.sleep(0.02)
    return demo.output
