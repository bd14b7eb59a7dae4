"""What ``make bench-ca`` reads while the real cluster-autoscaler runs: its loops and everyone's CPU.

A thread samples, every ``period`` seconds:

- the CA's own metrics (``/metrics``): ``cluster_autoscaler_function_duration_seconds`` ``_sum`` and
  ``_count`` per function. When the ``main`` count goes up by one, its sum went up by exactly that
  loop's duration (the histogram's buckets are too coarse for a median; the sum is exact). The other
  functions' sums since the previous loop give that loop's ``cloudProviderRefresh``,
  ``updateClusterState``, ``findUnneeded`` ...;
- the CA's log, read from where the last sample stopped, for the wall-clock time each loop started
  (``Starting main loop``, millisecond timestamps), so each loop is a window [start, start + duration];
- ``utime + stime`` of every watched process from ``/proc/<pid>/stat``, and the load average.

Everything is wall-clock time (``time.time()``), as are the CA's log, the simulator's request log and
the packet capture, so the windows line up.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devstack.harness import process_cpu_seconds

_SERIES = re.compile(
    rb"^cluster_autoscaler_(function_duration_seconds_sum|function_duration_seconds_count|errors_total)"
    rb"\{([^}]*)\} (\S+)$",
    re.MULTILINE,
)
_LABEL = re.compile(rb'(\w+)="([^"]*)"')
LOOP_START = b'"Starting main loop"'
# Functions recorded outside a loop's window: the wait before it, and the loop as a whole.
NOT_IN_LOOP = frozenset({"main", "loopWait"})


@dataclass(frozen=True)
class CaScrape:
    sums: dict[str, float]  # function -> seconds
    counts: dict[str, int]
    errors: float  # cluster_autoscaler_errors_total, all types


def parse_ca_metrics(text: bytes) -> CaScrape:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    errors = 0.0
    for match in _SERIES.finditer(text):
        kind, labels, value = match.groups()
        names = dict(_LABEL.findall(labels))
        if kind == b"errors_total":
            errors += float(value)
            continue
        function = names.get(b"function", b"").decode()
        if kind.endswith(b"_sum"):
            sums[function] = float(value)
        else:
            counts[function] = int(float(value))
    return CaScrape(sums, counts, errors)


@dataclass
class Loop:
    index: int  # the CA's count of main loops (1 = its first)
    duration_s: float
    ended_seen_at: float  # when a sample first saw it finished
    functions: dict[str, float]  # seconds per function recorded since the previous loop
    start: float | None = None  # from the CA's log

    @property
    def end(self) -> float | None:
        return None if self.start is None else self.start + self.duration_s


@dataclass
class Sample:
    at: float
    cpu: dict[str, float]  # process name -> CPU seconds so far


@dataclass
class Sampling:
    """Everything sampled; filled by ``CaSampler`` while it runs."""

    loops: list[Loop] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    load: list[tuple[float, float]] = field(default_factory=list)  # (time, 1-minute load average)
    errors_at: list[tuple[float, float]] = field(default_factory=list)  # (time, errors_total)
    scrape_failures: int = 0

    def cpu_at(self, name: str, at: float, after: bool) -> tuple[float, float] | None:
        """The first sample at or after ``at`` (``after``), else the last one at or before it."""
        chosen: Sample | None = None
        for sample in self.samples:
            if after and sample.at >= at:
                chosen = sample
                break
            if not after and sample.at <= at:
                chosen = sample
        if chosen is None or name not in chosen.cpu:
            return None
        return chosen.at, chosen.cpu[name]

    def cpu_between(self, name: str, start: float, end: float) -> tuple[float, float] | None:
        """(CPU seconds, seconds) of ``name`` between the samples nearest inside [start, end]."""
        first, last = self.cpu_at(name, start, after=True), self.cpu_at(name, end, after=False)
        if first is None or last is None or last[0] <= first[0]:
            return None
        return last[1] - first[1], last[0] - first[0]


class CaSampler:
    """Samples the CA and the watched processes in a thread until ``stop``."""

    def __init__(self, metrics_url: str, ca_log: Path, processes: Mapping[str, int], period: float = 0.25) -> None:
        self.metrics_url = metrics_url
        self.ca_log = ca_log
        self.processes = dict(processes)
        self.period = period
        self.sampling = Sampling()
        self._starts: list[float] = []
        self._log_offset = 0
        self._partial = b""
        self._last: CaScrape | None = None
        self._since_loop: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ca-sampler", daemon=True)

    def start(self) -> CaSampler:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> Sampling:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        return self.sampling

    def loops_done(self) -> int:
        """Loops seen finished since the sampler started."""
        with self._lock:
            return len(self.sampling.loops)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        now = time.time()
        cpu: dict[str, float] = {}
        for name, pid in self.processes.items():
            with contextlib.suppress(OSError, ValueError, IndexError):  # exited: its last sample stands
                cpu[name] = process_cpu_seconds(pid)
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
                scrape = parse_ca_metrics(answer.read())
        except OSError:
            with self._lock:
                self.sampling.scrape_failures += 1
                self.sampling.samples.append(Sample(now, cpu))
            return
        self._read_log()
        with self._lock:
            self.sampling.samples.append(Sample(now, cpu))
            self.sampling.load.append((now, os.getloadavg()[0]))
            self.sampling.errors_at.append((now, scrape.errors))
            self._account(scrape, now)

    def _account(self, scrape: CaScrape, now: float) -> None:
        last, self._last = self._last, scrape
        if last is None:
            return
        for function, total in scrape.sums.items():
            if function not in NOT_IN_LOOP:
                grown = total - last.sums.get(function, 0.0)
                if grown > 0:
                    self._since_loop[function] = self._since_loop.get(function, 0.0) + grown
        finished = scrape.counts.get("main", 0) - last.counts.get("main", 0)
        if finished <= 0:
            return
        # Normally one loop between two samples; several would share their sum evenly.
        each = (scrape.sums.get("main", 0.0) - last.sums.get("main", 0.0)) / finished
        functions = {k: v / finished for k, v in self._since_loop.items()}
        self._since_loop = {}
        first = last.counts.get("main", 0) + 1
        for index in range(first, first + finished):
            start = self._starts[index - 1] if index - 1 < len(self._starts) else None
            self.sampling.loops.append(Loop(index, each, now, dict(functions), start))

    def _read_log(self) -> None:
        try:
            with self.ca_log.open("rb") as log:
                log.seek(self._log_offset)
                chunk = log.read()
        except OSError:
            return
        self._log_offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if LOOP_START in line and line.startswith(b"{"):
                try:
                    self._starts.append(float(json.loads(line)["ts"]) / 1000.0)
                except (ValueError, KeyError):
                    continue
        # Loops seen finished before their start line was read get it now.
        with self._lock:
            for loop in self.sampling.loops:
                if loop.start is None and loop.index - 1 < len(self._starts):
                    loop.start = self._starts[loop.index - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
