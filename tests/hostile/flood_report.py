"""The flood table of docs/evidence/hostile-clients.md, "Probes through a flood of new connections": new
connections to the probe/metrics port at rising rates, each held a second (sending nothing, or ``--payload``),
while kubelet-like probes (a fresh connection, ``GET /healthz``, one second for the whole exchange) run every
100 ms; per rate, the share of probes that succeeded, their latency, and the server process's RSS and
threads during the flood. The flood and the probes are ``httpflood`` (tests/hostile/flood, built by ``make build``).

    .venv/bin/python -m tests.hostile.flood_report
    .venv/bin/python -m tests.hostile.flood_report --rates 1000,5000 --server-from ../main   # another checkout
    CA_EXTERNALGRPC_TEST_ENGINE=grpcio .venv/bin/python -m tests.hostile.flood_report
    .venv/bin/python -m tests.hostile.flood_report --floor <hyper_probe_floor>/target/release/hyper-probe-floor

``--floor`` floods a program that prints its ``host:port`` on its first line of output instead of our
server: hyper's HTTP/1.1 server answering ``/healthz`` alone (``tests/hostile/hyper_probe_floor``, built
with ``cargo build --release`` there), what the port would be on the native front.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from devstack.clouds import scaleway_backend
from devstack.harness import ENGINE_ENV, ServerProcess, server_config
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario
from tests.hostile.measure import Usage, usage
from tests.support.gobuild import binary_path

DEFAULT_RATES = "0,1000,2000,5000,10000,20000"


def run_flood(port: int, rate: int, seconds: float, payload: str = "") -> dict[str, Any]:
    """One run of ``httpflood`` against ``127.0.0.1:port``; its JSON result."""
    argv = [str(binary_path("httpflood")), "-addr", f"127.0.0.1:{port}", "-rate", str(rate)]
    argv += ["-duration", f"{seconds}s", "-payload", payload]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 180, check=True)
    return dict(json.loads(done.stdout))


def flood_with_usage(pid: int, port: int, rate: int, seconds: float, payload: str = "") -> tuple[dict[str, Any], Usage]:
    """``run_flood`` while the server's largest threads, RSS and fds are sampled."""
    peak = usage(pid)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.1):
            now = usage(pid)
            peak = Usage(max(peak.threads, now.threads), max(peak.rss_mib, now.rss_mib), max(peak.fds, now.fds))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_flood(port, rate, seconds, payload)
    finally:
        stop.set()
        sampler.join()
    return result, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default=DEFAULT_RATES, help="new connections per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each rate is held")
    parser.add_argument("--payload", default="", help="what each flood connection sends (default nothing)")
    parser.add_argument("--server-from", type=Path, help="run the server of this checkout (its make install done)")
    parser.add_argument("--floor", type=Path, help="flood this program (it prints host:port) instead of our server")
    args = parser.parse_args()
    if args.floor is not None:
        floor = subprocess.Popen([str(args.floor.resolve())], stdout=subprocess.PIPE, text=True)
        try:
            assert floor.stdout is not None
            port = int(floor.stdout.readline().strip().rsplit(":", 1)[1])
            print(f"floor: {args.floor}; flood payload {args.payload!r}")
            _table(floor.pid, port, args)
        finally:
            floor.kill()
            floor.wait()
        return
    command = (
        None if args.server_from is None else [str(args.server_from.resolve() / ".venv" / "bin" / "ca-externalgrpc")]
    )
    engine = os.environ.get(ENGINE_ENV) or "native"
    print(f"server: {args.server_from or 'this checkout'}, engine {engine}; flood payload {args.payload!r}")
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        workdir = Path(tempfile.mkdtemp(prefix="ca-flood-"))
        server = ServerProcess(
            server_config([scaleway_backend(sim)]),
            workdir=workdir,
            command=command,
            from_checkout=command is None,
        )
        try:
            _table(server.pid, server.http_port, args)
        finally:
            server.stop()


def _table(pid: int, port: int, args: argparse.Namespace) -> None:
    print(f"load average (1, 5, 15 min) before: {_load()}")
    print(
        "| new connections/s | made/s | probes OK | probe p50 / p99 / max ms | failures | most failed in a row "
        "| peak RSS MiB | peak threads |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for rate in (int(r) for r in args.rates.split(",")):
        result, peak = flood_with_usage(pid, port, rate, args.seconds, args.payload)
        failures = ", ".join(f"{n} {why}" for why, n in sorted(result["probe_failures"].items())) or "-"
        made = result["connected"] / result["seconds"]
        print(
            f"| {rate:,} | {made:,.0f} | {result['probe_ok']}/{result['probes']} | "
            f"{result['probe_p50_ms']:.1f} / {result['probe_p99_ms']:.1f} / {result['probe_max_ms']:.1f} | "
            f"{failures} | {result['probe_failed_in_a_row']} | {peak.rss_mib:.1f} | {peak.threads} |",
            flush=True,
        )
    print(f"load average (1, 5, 15 min) after: {_load()}")


def _load() -> str:
    """The machine's load average: the flood shares the cores with whatever else runs."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
