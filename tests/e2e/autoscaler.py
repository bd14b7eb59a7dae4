"""The real cluster-autoscaler binary (``--cloud-provider=externalgrpc``) pointed at our server.

Intervals are shortened so that a scenario runs in seconds to a couple of minutes: a loop every
2 s, a node unneeded for 5 s can go, scale-down resumes 5 s after a scale-up. The CA logs JSON lines
(``--logging-format=json``) at verbosity 4, which includes every failed provider call (the
externalgrpc client logs those at level 1) and every scale-up and scale-down decision; scenarios read
them through ``AutoscalerLog``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devstack.harness import listening_addresses
from tests.e2e.processes import ManagedProcess

SCAN_INTERVAL = "2s"
# Flags every scenario shares; a scenario adds or overrides through ``extra_flags``.
BASE_FLAGS: dict[str, str] = {
    "cloud-provider": "externalgrpc",
    "scan-interval": SCAN_INTERVAL,
    "scale-down-unneeded-time": "5s",
    "scale-down-delay-after-add": "5s",
    "scale-down-delay-after-delete": "0s",
    "scale-down-delay-after-failure": "5s",
    "scale-down-unready-time": "30s",
    "max-node-provision-time": "2m",
    "new-pod-scale-up-delay": "0s",
    "expander": "least-waste",
    "leader-elect": "false",
    "logging-format": "json",
    "v": "4",
    "max-inactivity": "10m",
    "max-failing-time": "10m",
}


@cache
def known_flags(program: Path) -> frozenset[str]:
    """The flags a cluster-autoscaler binary accepts, as its own ``--help`` lists them.

    A CA stops at start on a flag it does not know (``unknown flag: --x``, exit status 2), and every
    minor adds flags (1.35: ``--max-node-startup-time``, ``--scale-from-unschedulable`` ...), so what
    the harness passes is checked against the binary it starts. (The listing is the same in every
    release; up to 1.34 the CA then exits with status 2, "pflag: help requested", from 1.35 on with 0.)"""
    proc = subprocess.run([str(program), "--help"], capture_output=True, text=True, timeout=60, check=False)
    found = frozenset(re.findall(r"^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)", proc.stdout + proc.stderr, re.MULTILINE))
    if not found:
        status = proc.returncode
        raise AssertionError(f"`{program} --help` listed no flags (exit status {status}): {proc.stderr[-500:]}")
    return found


def unknown_flags(program: Path, flags: Mapping[str, object]) -> list[str]:
    return sorted(set(flags) - known_flags(program))


def write_cloud_config(path: Path, address: str, grpc_timeout: str = "5s") -> Path:
    path.write_text(yaml.safe_dump({"address": address, "grpc_timeout": grpc_timeout}, sort_keys=False))
    return path


@dataclass(frozen=True)
class LogEntry:
    at: float  # wall-clock seconds
    message: str
    fields: Mapping[str, Any]

    def text(self) -> str:
        """The message with its structured fields, as one searchable line."""
        extra = " ".join(f"{k}={v}" for k, v in self.fields.items() if k not in ("ts", "msg", "caller", "v"))
        return f"{self.message} {extra}".strip()


class AutoscalerLog:
    """The CA's JSON log file, parsed on every read (it is small: minutes of loops)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self, since: float = 0.0) -> list[LogEntry]:
        out = []
        try:
            lines = self.path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        for line in lines:
            if not line.startswith("{"):
                continue  # Go runtime messages and flag parsing output are not JSON
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            at = float(data.get("ts", 0.0)) / 1000.0  # klog's JSON "ts" is milliseconds since the epoch
            if at >= since:
                out.append(LogEntry(at, str(data.get("msg", "")), data))
        return out

    def matching(self, pattern: str, since: float = 0.0) -> list[LogEntry]:
        regex = re.compile(pattern)
        return [entry for entry in self.entries(since) if regex.search(entry.text())]

    def provider_errors(self, since: float = 0.0) -> list[LogEntry]:
        """Failed calls of the externalgrpc client and loops the CA aborted for a provider error."""
        return self.matching(
            r"Error on gRPC call|Failed to refresh cloud provider|Failed to update cluster state|"
            r"Failed to get node infos|failed to get target size|Failed to fix node group sizes",
            since,
        )

    def loops(self, since: float = 0.0) -> list[LogEntry]:
        """One entry per started main loop."""
        return self.matching(r"^Starting main loop", since)


class Autoscaler:
    """The CA process; ``restart`` keeps the same flags and log file."""

    def __init__(
        self,
        program: Path,
        kubeconfig: Path,
        cloud_config: Path | None,
        workdir: Path,
        extra_flags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        flags = {**BASE_FLAGS, **(extra_flags or {})}
        flags["kubeconfig"] = str(kubeconfig)
        if cloud_config is not None:  # an in-tree provider may read none (tests/e2e/migration.py)
            flags["cloud-config"] = str(cloud_config)
        # Metrics on a port the CA binds itself; read back from /proc once it runs.
        flags["address"] = "127.0.0.1:0"
        if unknown := unknown_flags(program, flags):
            raise AssertionError(
                f"{program.name} has no flag {', '.join('--' + f for f in unknown)}: it would exit at start with "
                "'unknown flag'; pass that flag only to the releases that have it (docs/reference/compatibility.md)"
            )
        self.metrics_address = ""
        self.flags = flags
        self.argv = [str(program), *(f"--{k}={v}" for k, v in flags.items())]
        self.log_path = workdir / "logs" / "cluster-autoscaler.log"
        self.log = AutoscalerLog(self.log_path)
        self.process = ManagedProcess("cluster-autoscaler", self.argv, self.log_path, env)
        self.started_at = 0.0

    def start(self, ready_timeout: float = 60.0) -> Autoscaler:
        self.started_at = time.time()
        self.process.start()
        self.process.wait_until(
            lambda: bool(self.log.loops(since=self.started_at)), ready_timeout, "running its main loop"
        )
        assert self.process.child is not None
        host, port = listening_addresses(self.process.child.pid)[0]
        self.metrics_address = f"{host}:{port}"
        return self

    def check_running(self) -> None:
        self.process.check_running()

    def stop(self) -> None:
        self.process.stop()

    def restart(self, sig: signal.Signals = signal.SIGTERM, down: float = 0.0) -> None:
        """Stop the CA (SIGKILL: a crash; SIGTERM: a rollout), wait ``down`` seconds, start it again with the
        same flags; its log goes on in the same file. Returns once the new process runs its first loop."""
        if self.process.child is not None:
            self.process.child.stop(sig, timeout=10)
        time.sleep(down)
        self.start()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``cluster_autoscaler_<name>`` whose labels include ``labels``."""
        url = f"http://{self.metrics_address}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"cluster_autoscaler_{name}" and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def last_successful_loop(self) -> float:
        """Wall-clock time the last main loop finished without error (the CA's own metric)."""
        return self.metric("last_activity", activity="mainSuccessful")

    def wait_for_loops(self, count: int, since: float, timeout: float) -> list[LogEntry]:
        """Block until ``count`` loops started after ``since`` have finished (the next one began)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            loops = self.log.loops(since)
            if len(loops) > count:
                return loops
            if time.monotonic() > deadline:
                raise AssertionError(f"only {max(len(loops) - 1, 0)} CA loops completed in {timeout:.0f}s")
            time.sleep(0.5)
