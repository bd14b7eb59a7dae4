"""Child processes of an end-to-end run: started with their output in a log file, stopped by their own pid.

Every program of the cluster (etcd, kube-apiserver, kube-scheduler, the cluster-autoscaler, our server)
runs as a child of the test process. Each writes stdout and stderr to one file in the run's work
folder, which stays there after a failure so the reason can be read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class ProcessFailed(RuntimeError):
    """A child exited or never became ready; the message carries the tail of its log."""


def free_port() -> int:
    """A loopback port free right now, for programs that cannot bind port 0 and report it back."""
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
    """One child program with its log file; ``stop`` ends exactly this process (its own process group)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_running(self) -> None:
        if self._popen is None:
            raise ProcessFailed(f"{self.name} was never started")
        code = self._popen.poll()
        if code is not None:
            raise ProcessFailed(
                f"{self.name} exited with status {code}; last lines of {self.log_path}:\n" + self.tail()
            )

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
                    f"{self.name} not {what} after {timeout:.0f}s; last lines of {self.log_path}:\n" + self.tail()
                )
            time.sleep(0.2)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM this process's group, SIGKILL it after ``grace`` seconds."""
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL at once: a crash, not a shutdown."""
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)
