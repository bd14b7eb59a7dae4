"""The one harness: simulated clouds and our server, started for tests, benchmarks and the demo.

Our server is started two ways, both on port 0 with the bound ports read back, never guessed:

- ``InProcessServer``: ``server.app.start`` in this process (the path ``ca-externalgrpc serve`` takes),
  for tests that reach into the server (force a sync, read a backend) or restart it at will;
- ``ServerProcess``: ``ca-externalgrpc serve`` as a child process, for what only a process shows
  (its own memory, its log, a real SIGTERM). It learns the bound addresses from the file
  ``serve --ready-file`` writes once both ports are bound.

``ChildProcess`` is the part of ``ServerProcess`` that fits any server binary (the Go servers of the
benchmark); for those, which cannot report their port, ``listening_addresses`` reads it from /proc.

``start_stack`` / ``running_stack`` give the common case: simulators from scenarios on one clock the
test controls, the server in-process in front of them, and a gRPC stub. Backend entries come from
``devstack.clouds``; nothing here is mocked.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import grpc
import yaml

from devstack.certs import Pki, make_pki
from devstack.clouds import bizfly_backend, scaleway_backend
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.backend import Backend
from providers.deadline import Deadline
from server import app
from server.app import RunningServer
from server.config import ServerConfig, parse
from simulators.bizfly import BizflySimulator
from simulators.common import Clock, ManualClock
from simulators.scaleway import ScalewaySimulator

REPO_ROOT = Path(__file__).resolve().parents[1]
ANY_LOOPBACK_PORT = "127.0.0.1:0"
SCW_SECRET = "3f0c2b4e-5d6a-4b7c-8d9e-0a1b2c3d4e5f"
# The upstream providers' variables override the config file; a child server must not inherit them.
CLOUD_ENV_PREFIXES = ("SCW_", "BIZFLYCLOUD_", "CLUSTER_")
START_TIMEOUT_SECONDS = 60.0
# Which serving engine the servers started here use when their config does not say (grpcio or
# native): `make test` runs the gRPC tests once per engine by setting it.
ENGINE_ENV = "CA_EXTERNALGRPC_TEST_ENGINE"


def with_test_engine(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with ``serving.engine`` from $CA_EXTERNALGRPC_TEST_ENGINE, unless it names one itself."""
    config = dict(raw)
    engine = os.environ.get(ENGINE_ENV)
    if engine and "serving" not in config:
        config["serving"] = {"engine": engine}
    return config


class ServerStartError(RuntimeError):
    """A server process exited or did not report its addresses in time; the message carries its output."""


# ---------------------------------------------------------------------------------------------- config
def server_config(
    backends: Sequence[Mapping[str, Any]],
    *,
    http: bool = True,
    pki: Pki | None = None,
    mtls: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A server config serving ``backends`` on loopback port 0 (gRPC, and HTTP probes when ``http``)."""
    raw: dict[str, Any] = {
        "listen": ANY_LOOPBACK_PORT,
        "http_listen": ANY_LOOPBACK_PORT if http else None,
        "shutdown_grace": "2s",
        "backends": [dict(b) for b in backends],
    }
    if pki is not None:
        raw["tls"] = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
        if mtls:
            raw["tls"]["client_ca"] = str(pki.ca_cert)
    raw.update(extra)
    return raw


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


def client_credentials(pki: Pki, with_cert: bool = True, other: bool = False) -> grpc.ChannelCredentials:
    """Trust the test CA; present its client certificate (or, ``other``, one from an unrelated CA)."""
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())
    cert, key = (pki.other_client_cert, pki.other_client_key) if other else (pki.client_cert, pki.client_key)
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=key.read_bytes(),
        certificate_chain=cert.read_bytes(),
    )


def open_channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)


# ---------------------------------------------------------------------------------------------- in-process
class InProcessServer:
    """Our server in this process, started through ``server.app.start``; restartable."""

    def __init__(
        self,
        raw: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        base: Path | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.raw = with_test_engine(raw)
        self.config: ServerConfig = parse(self.raw, env=dict(env or {}), base=base or Path.cwd())
        self.credentials = credentials
        self.restarts = 0
        self.running: RunningServer = app.start(self.config)
        self.channel = open_channel(self.address, credentials)
        self.stub = pb_grpc.CloudProviderStub(self.channel)

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    @property
    def http_port(self) -> int:
        if self.running.http is None:
            raise AssertionError("this server has no HTTP endpoint (http_listen is not set)")
        return int(self.running.http.port)  # type: ignore[attr-defined]

    def restart(self) -> None:
        """Stop at once (no grace) and start afresh: all in-memory state is lost, as in a new process."""
        self.stop(grace=0.0)
        self.restarts += 1
        self.running = app.start(self.config)
        self.channel = open_channel(self.address, self.credentials)
        self.stub = pb_grpc.CloudProviderStub(self.channel)

    def stop(self, grace: float = 1.0) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
        self.running.stop(grace=grace)


# ---------------------------------------------------------------------------------------------- processes
def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on, from /proc (for servers that cannot report them)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                host_hex, port_hex = local.split(":")
                found.append((_proc_net_host(host_hex), int(port_hex, 16)))
    return found


def _proc_net_host(hex_host: str) -> str:
    # /proc/net/tcp* print each 32-bit word of the address in host (little-endian) byte order.
    words = [bytes.fromhex(hex_host[i : i + 8])[::-1] for i in range(0, len(hex_host), 8)]
    return str(ipaddress.ip_address(b"".join(words)))


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) from ``/proc/<pid>/stat``, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces; it ends at ")"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ChildProcess:
    """A server as a child process: output kept (in memory, or in ``log_path`` for long runs), memory
    from /proc, a real signal to stop it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        log_path: Path | None = None,
        name: str = "server",
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env if env is not None else os.environ)
        self.cwd = cwd
        self.log_path = log_path
        self.name = name
        self._spawn()

    def _spawn(self) -> None:
        self.lines: list[str] = []
        self._log_file: IO[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.started_at = time.monotonic()
        if self.log_path is not None:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self.process: subprocess.Popen[Any] = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=self._log_file, stderr=subprocess.STDOUT
            )
        else:
            self.process = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        if self.log_path is not None:
            try:
                return self.log_path.read_text(errors="replace")
            except OSError:
                return ""
        return "".join(self.lines)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def memory(self) -> dict[str, float]:
        """Peak (``VmHWM``) and current (``VmRSS``) resident set size in MiB, as the kernel counts them."""
        values: dict[str, float] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) / 1024.0  # the kernel reports kB
        return {"peak_rss_mib": values.get("VmHWM", 0.0), "rss_mib": values.get("VmRSS", 0.0)}

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the process has used so far."""
        return process_cpu_seconds(self.pid)

    def rss_kib(self) -> int:
        return round(self.memory()["rss_mib"] * 1024)

    def wait_listening(self, timeout: float = START_TIMEOUT_SECONDS) -> str:
        """Block until the process listens on a TCP port; its ``host:port``."""
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_exited()
            with contextlib.suppress(OSError):
                addresses = listening_addresses(self.pid)
                if addresses:
                    host, port = addresses[0]
                    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"{self.name} not listening after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.01)

    def _raise_if_exited(self) -> None:
        if self.process.poll() is not None:
            self._join_output()
            raise ServerStartError(
                f"{self.name} exited with {self.process.returncode} before it was ready:\n{self.log_tail()}"
            )

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the process (SIGTERM drains; SIGKILL does not) and wait; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._join_output()
        return int(self.process.returncode)

    def _join_output(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def serve_command() -> list[str]:
    """``ca-externalgrpc`` of this checkout, run by the interpreter running the harness."""
    return [sys.executable, "-m", "server.cli"]


def child_env(extra: Mapping[str, str] | None = None, *, from_checkout: bool = True) -> dict[str, str]:
    """This environment without the cloud variables that would override a config file, plus ``extra``;
    with this checkout on PYTHONPATH, or (``from_checkout=False``) without any PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_ENV_PREFIXES)}
    env.update(extra or {})
    if from_checkout:
        # This checkout's code, unless ``extra`` names another (a benchmark comparing two checkouts).
        env["PYTHONPATH"] = (extra or {}).get("PYTHONPATH", str(REPO_ROOT))
    else:
        env.pop("PYTHONPATH", None)
    return env


class ServerProcess(ChildProcess):
    """``ca-externalgrpc serve`` as a child process on loopback port 0 (gRPC and HTTP); restartable.

    The constructor returns once the server has written its ready file: both ports are bound and
    the first sync is done (or has failed and been logged).
    """

    def __init__(
        self,
        raw_config: Mapping[str, Any],
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        *,
        log_level: str = "info",
        command: Sequence[str] | None = None,
        log_path: Path | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        name: str = "ours",
        start_timeout: float = START_TIMEOUT_SECONDS,
        listen: str = ANY_LOOPBACK_PORT,
        http_listen: str = ANY_LOOPBACK_PORT,
        from_checkout: bool = True,
    ) -> None:
        # The config and the ready file live in workdir (a fresh temporary directory by default).
        # ``listen`` and ``http_listen`` stay port 0; only tests of the listening rules pick another host.
        # ``from_checkout=False``: an installed ``command`` (a virtualenv's console script) runs with
        # nothing of this checkout on its path, in workdir.
        workdir = workdir or Path(tempfile.mkdtemp(prefix="ca-externalgrpc-"))
        config = {**with_test_engine(raw_config), "listen": listen, "http_listen": http_listen}
        self.config_path = write_config(workdir / f"{name}.yaml", config)
        self.ready_path = workdir / f"{name}.ready.json"
        self.credentials = credentials
        self.start_timeout = start_timeout
        self.restarts = 0
        self.command = list(command or serve_command())
        argv = [*self.command, "serve", "--config", str(self.config_path), "--log-level", log_level]
        argv += ["--ready-file", str(self.ready_path)]
        self.ready_path.unlink(missing_ok=True)
        super().__init__(
            argv,
            env=child_env(env, from_checkout=from_checkout),
            cwd=REPO_ROOT if from_checkout else workdir,
            log_path=log_path,
            name=name,
        )
        self._await_ready()

    def _await_ready(self) -> None:
        deadline = self.started_at + self.start_timeout
        while not self.ready_path.exists():
            self._raise_if_exited()
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise ServerStartError(f"{self.name} not ready after {self.start_timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.01)
        ready = json.loads(self.ready_path.read_text())
        self.address: str = ready["grpc"]
        self.http_address: str | None = ready["http"]
        self.channel = open_channel(self.address, self.credentials)
        self.stub = pb_grpc.CloudProviderStub(self.channel)

    @property
    def grpc_port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def http_port(self) -> int:
        assert self.http_address is not None
        return int(self.http_address.rsplit(":", 1)[1])

    def http_get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.http_address}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def cli(self, *args: str) -> str:
        """Run another ``ca-externalgrpc`` sub-command with the same environment; stdout + stderr."""
        done = subprocess.run(
            [*self.command, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=60
        )
        return done.stdout + done.stderr

    def restart(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop the process (killed by default: no drain) and start a new one on new ports."""
        self.stop(sig)
        self.respawn()

    def respawn(self, same_addresses: bool = False) -> None:
        """Start a new process once this one has stopped; on new ports, or with ``same_addresses`` on
        the ones it had, as a restarted pod behind a Service: a client whose configuration names the
        address (the CA's cloud-config) reconnects without being told."""
        if self.process.poll() is None:
            raise RuntimeError(f"{self.name} is still running: stop it before respawning")
        if same_addresses:
            config = yaml.safe_load(self.config_path.read_text())
            config["listen"], config["http_listen"] = self.address, self.http_address
            write_config(self.config_path, config)
        self.restarts += 1
        self.ready_path.unlink(missing_ok=True)
        self._spawn()
        self._await_ready()

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int:
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        return super().stop(sig, timeout)


# ---------------------------------------------------------------------------------------------- stack
class Stack:
    """Simulators on one clock, our server in-process in front of them, a stub; stop() ends all."""

    def __init__(
        self,
        server: InProcessServer,
        clock: Clock,
        *,
        scaleway: ScalewaySimulator | None = None,
        bizfly: BizflySimulator | None = None,
        pki: Pki | None = None,
    ) -> None:
        self.in_process = server
        self.clock = clock
        self.scaleway = scaleway
        self.bizfly = bizfly
        self.pki = pki

    @property
    def server(self) -> RunningServer:
        return self.in_process.running

    @property
    def channel(self) -> grpc.Channel:
        return self.in_process.channel

    @property
    def stub(self) -> pb_grpc.CloudProviderStub:
        return self.in_process.stub

    @property
    def config(self) -> dict[str, Any]:
        """The server config as written (before parsing)."""
        return self.in_process.raw

    @property
    def address(self) -> str:
        return self.in_process.address

    def backend(self, name: str) -> Backend:
        for backend in self.server.registry.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)

    def advance(self, seconds: float, sync: bool = True) -> None:
        """Move simulated cloud time on (a ManualClock), then let every backend re-read the cloud."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs the stack on a ManualClock; a WallClock moves by itself")
        self.clock.advance(seconds)
        if sync:
            self.sync()

    def sync(self) -> None:
        """What the background sync does on its timer, done now (tests do not wait for timers)."""
        for backend in self.server.registry.backends:
            backend.sync(Deadline.after(10))

    def groups(self) -> dict[str, pb.NodeGroup]:
        return {g.id: g for g in self.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups}

    def target(self, group_id: str) -> int:
        return self.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group_id), timeout=5).targetSize

    def instances(self, group_id: str) -> list[pb.Instance]:
        return list(self.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group_id), timeout=5).instances)

    def restart(self) -> None:
        self.in_process.restart()

    def stop(self) -> None:
        self.in_process.stop(grace=1.0)
        for sim in (self.scaleway, self.bizfly):
            if sim is not None:
                sim.stop()


def start_stack(
    tmp: Path,
    *,
    scaleway: dict[str, Any] | None = None,
    bizfly: dict[str, Any] | None = None,
    tls: str | None = None,
    bizfly_auth: str = "password",
    backend_extra: Mapping[str, Mapping[str, Any]] | None = None,
    server_extra: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
) -> Stack:
    """Start the simulators given a scenario (``{}`` = the simulator's default), then the server.

    ``tls`` is None (plaintext), "tls" or "mtls". ``backend_extra`` adds keys (``node_groups``,
    ``sync``) to the backend named "scw" or "bizfly". ``clock`` defaults to a ManualClock the test
    moves with ``Stack.advance``.
    """
    clock = clock if clock is not None else ManualClock()
    extra = backend_extra or {}
    backends: list[dict[str, Any]] = []
    started: list[ScalewaySimulator | BizflySimulator] = []
    scw_sim = bz_sim = None
    pki = None
    try:
        if scaleway is not None:
            scw_sim = ScalewaySimulator(scenario=scaleway or None, clock=clock, secret_key=SCW_SECRET).start()
            started.append(scw_sim)
            backends.append(scaleway_backend(scw_sim, **extra.get("scw", {})))
        if bizfly is not None:
            bz_sim = BizflySimulator(scenario=bizfly or None, clock=clock).start()
            started.append(bz_sim)
            backends.append(bizfly_backend(bz_sim, auth=bizfly_auth, **extra.get("bizfly", {})))
        if tls is not None:
            pki = make_pki(tmp / "pki")
        raw = server_config(backends, pki=pki, mtls=tls == "mtls", **(server_extra or {}))
        credentials = client_credentials(pki, with_cert=tls == "mtls") if pki is not None else None
        # The config is generated: environment variables must not redirect it to a real cloud.
        server = InProcessServer(raw, env={}, base=tmp, credentials=credentials)
    except BaseException:
        for sim in started:
            sim.stop()
        raise
    return Stack(server, clock, scaleway=scw_sim, bizfly=bz_sim, pki=pki)


@contextlib.contextmanager
def running_stack(tmp: Path, **kwargs: Any) -> Iterator[Stack]:
    stack = start_stack(tmp, **kwargs)
    try:
        yield stack
    finally:
        stack.stop()
