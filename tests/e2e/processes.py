"""The cluster's programs as child processes: etcd, kube-apiserver, kube-scheduler and the cluster-autoscaler.

Each writes stdout and stderr to one file in the run's work folder, which stays there after a failure
so the reason can be read. (Our server runs through the harness's ``ServerProcess``.)
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from devstack.harness import ChildProcess


class ProcessFailed(RuntimeError):
    """A child exited or never became ready; the message carries the tail of its log."""


def free_port() -> int:
    """A loopback port free right now, for etcd and kube-apiserver, which refuse port 0; another program
    can take it before they bind it, so their start-up retries with a new one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ManagedProcess:
    """One program of the cluster, run by the harness's ``ChildProcess`` with its output in ``log_path``;
    adds the checks the scenarios need (still alive? ready yet?) with the log's tail in every failure."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env  # the whole environment of the child; None: this process's
        self.child: ChildProcess | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.child = ChildProcess(self.argv, env=self.env, log_path=self.log_path, name=self.name)
        return self

    def check_running(self) -> None:
        if self.child is None:
            raise ProcessFailed(f"{self.name} was never started")
        code = self.child.process.poll()
        if code is not None:
            raise ProcessFailed(f"{self.name} exited with status {code}; last lines of {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 25) -> str:
        return log_tail(self.log_path, lines)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it is true; fail early if the process exits, with its log tail."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            with contextlib.suppress(Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ProcessFailed(
                    f"{self.name} not {what} after {timeout:.0f}s; last lines of {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.2)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.child is not None:
            self.child.stop(signal.SIGTERM, timeout=grace)
