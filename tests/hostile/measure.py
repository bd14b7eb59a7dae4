"""What a hostile-client test measures of a server process, by pid, from /proc; and how fast it answers.

Shared by the suites of every port: each attack asserts that the server's threads, resident memory and
open file descriptors stay under a stated bound while a normal request keeps answering in time.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Usage:
    """One sample of a process's resources."""

    threads: int
    rss_mib: float
    fds: int

    def __str__(self) -> str:
        return f"{self.threads} threads, {self.rss_mib:.1f} MiB RSS, {self.fds} fds"


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0  # the kernel counts kB
    raise ValueError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def usage(pid: int) -> Usage:
    return Usage(threads(pid), rss_mib(pid), open_fds(pid))


def latencies(probe: Callable[[], object], count: int = 7, pause: float = 0.02) -> list[float]:
    """Seconds each of ``count`` calls of ``probe`` took (a raise propagates: a probe must succeed)."""
    taken = []
    for _ in range(count):
        started = time.perf_counter()
        probe()
        taken.append(time.perf_counter() - started)
        time.sleep(pause)
    return taken


def median_latency(probe: Callable[[], object], count: int = 7, pause: float = 0.02) -> float:
    """The median of ``latencies``: one slow probe on a loaded machine does not decide, most of them do."""
    return statistics.median(latencies(probe, count, pause))
