"""What a hostile client costs a server process, and how fast it still answers.

Functions of a pid (read from /proc, so they work on any server binary the tests start) and a latency
probe that takes the median of several calls, so one slow scheduling slice on a loaded 2-core machine
does not decide a test while a server that really stalls still fails it.
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


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == name:
            return int(rest.split()[0])
    raise KeyError(f"/proc/{pid}/status has no {name}")


def thread_count(pid: int) -> int:
    return _status_field(pid, "Threads")


def rss_mib(pid: int) -> float:
    return _status_field(pid, "VmRSS") / 1024.0  # the kernel reports kB


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


def median_latency(call: Callable[[], object], probes: int = 7, pause: float = 0.02) -> float:
    """Median wall time of ``probes`` calls of ``call`` in seconds; a call that raises fails the probe."""
    times = []
    for _ in range(probes):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
        time.sleep(pause)
    return statistics.median(times)
