"""Where a server's memory goes: its Python heap by package and by line, from tracemalloc snapshots.

``make bench-kube --tracemalloc N`` starts every server with ``tracemalloc`` tracing ``N`` frames per
allocation; after the measured window the runner sends each one ``SIGUSR1`` and the server writes a
snapshot of its heap. Two servers' snapshots compared (all four features against none) name what the
features hold: each allocation is put to the innermost frame that is not the import machinery, then
grouped by package (a distribution under site-packages, a module of the standard library, a file of this
repository). tracemalloc sees what Python allocates (objects, code, the buffers of its C extensions that
use Python's allocator), not what C libraries allocate with ``malloc`` (OpenSSL, grpc core, the native
front) nor the allocator's own free lists: RSS stays the figure, the heap says where it went. Tracing
costs memory and time of its own, so the figures of a traced run are not the plain run's.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import time
import tracemalloc
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The path a traced server writes its snapshot to when it gets SIGUSR1.
SNAPSHOT_ENV = "BENCH_TRACEMALLOC_SNAPSHOT"
SNAPSHOT_TIMEOUT = 120.0
MIB = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]
_STDLIB = sysconfig.get_paths()["stdlib"]

# Run first in a traced server: start tracing, and on SIGUSR1 write a snapshot (whole, then renamed).
_TRACE_BOOT = """
import os, signal, tracemalloc
tracemalloc.start({frames})
def _snapshot(*_):
    path = os.environ[{env!r}]
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path)
signal.signal(signal.SIGUSR1, _snapshot)
"""


def server_command(code: Path | None, frames: int = 0) -> list[str] | None:
    """``ca-externalgrpc`` from this checkout (None: the harness's own command) or from the server code
    under ``code``; with ``frames``, traced by tracemalloc and writing a snapshot on SIGUSR1."""
    if code is None and not frames:
        return None
    boot = "import sys\n"
    if code is not None:
        boot += f"sys.path.insert(0, {str(code)!r})\n"
    if frames:
        boot += _TRACE_BOOT.format(frames=frames, env=SNAPSHOT_ENV)
    boot += "from server.cli import main\nsys.exit(main())\n"
    return [sys.executable, "-c", boot]


def take_snapshot(pid: int, path: Path, timeout: float = SNAPSHOT_TIMEOUT) -> Path:
    """Ask a traced server (started with ``SNAPSHOT_ENV`` = ``path``) for its snapshot; the file."""
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no tracemalloc snapshot from pid {pid} in {path} within {timeout:.0f}s")
        time.sleep(0.1)
    return path


def where(filename: str) -> str:
    """The package a source file belongs to: a distribution's top-level name, ``stdlib:<module>``, or
    a file of this repository."""
    if "site-packages" in filename:
        top = filename.split("site-packages/", 1)[1].split("/", 1)[0]
        return top.removesuffix(".py").split(".", 1)[0] if top.endswith(".py") else top
    if filename.startswith(str(REPO_ROOT)):
        return os.path.relpath(filename, REPO_ROOT)
    if filename.startswith(_STDLIB):
        return "stdlib:" + os.path.relpath(filename, _STDLIB).split("/", 1)[0].removesuffix(".py")
    return filename


def _owner(trace: tracemalloc.Trace) -> str:
    """Who allocated: the package of the innermost frame; when that is the import machinery (a module's
    code and constants being loaded), ``imports from <package>`` of the frame that imported it."""
    frames = list(reversed(trace.traceback))  # innermost first
    if not frames[0].filename.startswith("<frozen "):
        return where(frames[0].filename)
    for frame in frames:
        if not frame.filename.startswith("<frozen "):
            return "imports from " + where(frame.filename)
    return "imports"


@dataclass(frozen=True)
class Heap:
    """A snapshot summed by package: bytes and blocks, and the total traced."""

    by_package: Counter[str]
    blocks: Counter[str]
    total: int

    @classmethod
    def load(cls, path: Path) -> Heap:
        snapshot = tracemalloc.Snapshot.load(str(path))
        snapshot = snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        size: Counter[str] = Counter()
        blocks: Counter[str] = Counter()
        for trace in snapshot.traces:
            owner = _owner(trace)
            size[owner] += trace.size
            blocks[owner] += 1
        return cls(size, blocks, sum(size.values()))


def compare(heaps: Mapping[str, Heap], base: str, limit: int = 15) -> dict[str, list[tuple[str, int, int]]]:
    """For every heap but ``base``: the packages holding the most more than in ``base``, as (package,
    bytes more, blocks more), largest first."""
    reference = heaps[base]
    result = {}
    for name, heap in heaps.items():
        if name == base:
            continue
        grown = [
            (
                package,
                heap.by_package[package] - reference.by_package.get(package, 0),
                heap.blocks[package] - reference.blocks.get(package, 0),
            )
            for package in heap.by_package
        ]
        result[name] = sorted((g for g in grown if g[1] > 0), key=lambda g: -g[1])[:limit]
    return result


def summary(snapshots: Mapping[str, Path], base: str = "none", limit: int = 15) -> dict[str, Any]:
    """Traced MiB per server and, when ``base`` ran, what each other holds more by package (KiB, blocks)."""
    heaps = {name: Heap.load(path) for name, path in snapshots.items()}
    result: dict[str, Any] = {"traced_mib": {name: round(h.total / MIB, 2) for name, h in heaps.items()}}
    if base in heaps:
        result[f"over_{base}"] = {
            name: [[package, round(size / 1024, 1), blocks] for package, size, blocks in rows]
            for name, rows in compare(heaps, base, limit).items()
        }
    return result


def markdown(heap: Mapping[str, Any], name: str, base: str = "none") -> list[str]:
    """The table of what ``name`` holds more than ``base`` in one run's heap summary (none if absent)."""
    rows = heap.get(f"over_{base}", {}).get(name)
    if not rows:
        return []
    traced = heap["traced_mib"]
    out = [
        f"\nPython heap of {name} over {base} (tracemalloc: {traced[name]:.1f} MiB against {traced[base]:.1f}), "
        "largest first:\n",
        "| allocated by | KiB more | blocks more |",
        "|---|---|---|",
    ]
    out += [f"| {package} | {kib:,.1f} | {blocks:,} |" for package, kib, blocks in rows]
    return out
