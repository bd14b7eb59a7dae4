"""What a hostile client costs a server process, and how fast the server still answers.

Shared by the suites of every port (tests/hostile/test_http_port.py, test_grpc_port.py): functions of a
pid, read from /proc so they work on any server process the tests start, and a latency probe that takes
the median of several calls, so one slow scheduling slice on a loaded 2-core machine does not decide a
test while a server that really stalls still fails it.
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
    """One sample of a process: threads, resident memory (MiB) and open file descriptors."""

    threads: int
    rss_mib: float
    fds: int

    def __str__(self) -> str:
        return f"{self.threads} threads, {self.rss_mib:.1f} MiB RSS, {self.fds} fds"


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0  # the kernel counts kB
    raise ValueError(f"/proc/{pid}/status has no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def usage(pid: int) -> Usage:
    return Usage(thread_count(pid), rss_mib(pid), open_fds(pid))


def settled_usage(pid: int, seconds: float = 1.0, interval: float = 0.1) -> Usage:
    """The largest figures seen over ``seconds``: what the process holds, not a lucky instant."""
    samples = [usage(pid)]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval)
        samples.append(usage(pid))
    return Usage(max(s.threads for s in samples), max(s.rss_mib for s in samples), max(s.fds for s in samples))


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
