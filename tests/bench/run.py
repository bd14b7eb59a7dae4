"""``make bench``: replay the CA's loop against our server and the upstream example server.

For each cluster size: start one Scaleway simulator holding the cluster, start both servers against
it (child processes, timed to readiness), run the Go load client once with both targets so the
measured loops alternate A, B, A, B (drift on a noisy machine hits both alike), then read the
simulator's request log (attributed by User-Agent) and each server's peak RSS from /proc.

    python -m tests.bench.run                      # 1,000 and 5,000 nodes, 100 groups, 20 loops
    python -m tests.bench.run --nodes 200 --loops 2 --servers ours   # what the smoke test runs

Prints a Markdown table and the path of the JSON results (keyed ``nodes_<N>``). Exit status 1 when a
server answered wrongly (errors, unknown nodes, missing groups): such timings are not reported as
valid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench import golang, report
from tests.bench.cluster import BenchCluster, start_cluster, write_node_list
from tests.bench.servers import BenchedServer, ServerStartError, start_go_reference, start_ours, start_upstream

DEFAULT_OUT = Path(tempfile.gettempdir()) / "ca-externalgrpc-bench"
LOAD_CLIENT_TIMEOUT = 1800.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000], help="cluster sizes to run")
    parser.add_argument("--pools", type=int, default=100, help="node groups (Kapsule pools)")
    parser.add_argument("--loops", type=int, default=20, help="measured loops per server and size")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured loops per server before measuring")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=("ours", "upstream", "goref"),
        default=["ours", "upstream", "goref"],
        help="servers to run (upstream is skipped, with a message, when its pinned release cannot be built)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for results and server logs")
    parser.add_argument("--log-level", default="info", help="our server's log level (deployments run info)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run our server under py-spy (must be on PATH) and write a speedscope profile per size",
    )
    return parser.parse_args(argv)


def _start_profiler(server: BenchedServer, out: Path, nodes: int) -> subprocess.Popen[bytes]:
    """Attach py-spy to the running server, so the measured process (and its RSS) stays the server."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    target = out / f"ours-{nodes}.speedscope.json"
    argv = [
        py_spy,
        "record",
        "--pid",
        str(server.process.pid),
        "--format",
        "speedscope",
        "--rate",
        "250",
        "-o",
        str(target),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profiler(profiler: subprocess.Popen[bytes] | None) -> None:
    if profiler is None:
        return
    profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
    try:
        profiler.wait(timeout=60)
    except subprocess.TimeoutExpired:
        profiler.kill()


def _run_load_client(
    client: Path, servers: dict[str, BenchedServer], nodes_file: Path, cluster: BenchCluster, args: argparse.Namespace
) -> dict[str, Any]:
    result_file = nodes_file.with_name(f"loadclient-{nodes_file.stem}.json")
    argv = [str(client), "-nodes", str(nodes_file), "-loops", str(args.loops), "-warmup", str(args.warmup)]
    argv += ["-out", str(result_file)]
    for name, server in servers.items():
        argv += ["-target", f"{name}={server.address}"]
    # The log is shared: clearing it once after everyone's warm-up starts the steady-state window.
    first = next(iter(servers))
    argv += ["-clear", f"{first}={cluster.url}/_sim/requests"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LOAD_CLIENT_TIMEOUT)
    if done.returncode != 0:
        raise report.InvalidRun(f"load client failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(result_file.read_text())


def run_size(
    nodes: int, args: argparse.Namespace, client: Path, binaries: dict[str, Path], out: Path
) -> dict[str, Any]:
    workdir = out / f"nodes_{nodes}"
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = start_cluster(args.pools, nodes)
    servers: dict[str, BenchedServer] = {}
    profiler: subprocess.Popen[bytes] | None = None
    try:
        nodes_file = workdir / "nodes.json"
        count = write_node_list(cluster, nodes_file)
        # Started one after the other, so neither start-up competes with the other for the CPU.
        if "upstream" in binaries:
            servers["upstream"] = start_upstream(cluster, binaries["upstream"], workdir)
        if "goref" in binaries:
            servers["goref"] = start_go_reference(cluster, binaries["goref"], workdir)
        if "ours" in args.servers:
            servers["ours"] = start_ours(cluster, workdir, args.log_level)
            if args.profile:
                profiler = _start_profiler(servers["ours"], out, nodes)
        # A fixed order within each round (ours first); the alternation spreads drift over all servers.
        ordered: dict[str, BenchedServer] = {n: servers[n] for n in ("ours", "upstream", "goref") if n in servers}
        raw = _run_load_client(client, ordered, nodes_file, cluster, args)
        _stop_profiler(profiler)
        profiler = None
        requests = report.attribute_requests(cluster.simulator.requests.all())
        expected = report.Expectation(nodes=count, groups=cluster.pools, groups_at_zero=cluster.empty_pools)
        summaries: dict[str, Any] = {}
        for name, server in ordered.items():
            target = raw["targets"][name]
            report.check_target(name, target, expected)
            startup = server.startup
            summaries[name] = report.summarize_target(
                target,
                requests[name],
                args.loops,
                raw["measure_seconds"],
                server.process.memory(),
                {
                    "serving_s": startup.serving_s,
                    "node_groups_s": startup.node_groups_s,
                    "serving_signal": startup.serving_signal,
                },
            )
        return {
            **report.compare(summaries),  # baseline, loop_ratio, loop_p95_ratio, ... at the top of the size
            "nodes": count,
            "groups": cluster.pools,
            "groups_at_zero": cluster.empty_pools,
            "loops": args.loops,
            "warmup_loops": args.warmup,
            "measure_window_s": raw["measure_seconds"],
            "unattributed_cloud_requests": sum(requests["other"].values()),
            "servers": summaries,
        }
    finally:
        _stop_profiler(profiler)
        for server in servers.values():
            server.stop()
        cluster.stop()


def _environment(notes: dict[str, str]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "servers": notes,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _build_servers(wanted: Sequence[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """Go binaries for the Go servers asked for, and a note per server saying what ran (or why not)."""
    binaries: dict[str, Path] = {}
    notes: dict[str, str] = {}
    if "ours" in wanted:
        notes["ours"] = "ca-externalgrpc serve (this checkout)"
    if "upstream" in wanted:
        pin = golang.upstream_pin()
        print(f"building the upstream example server (cluster-autoscaler {pin.version}) ...", flush=True)
        try:
            binaries["upstream"] = golang.build_upstream()
            notes["upstream"] = f"k8s.io/autoscaler/cluster-autoscaler {pin.version}, -tags {golang.UPSTREAM_TAGS}"
        except (golang.WrongUpstreamRelease, golang.GoBuildError) as exc:
            notes["upstream"] = f"not run: {exc}"
            print(f"UPSTREAM NOT RUN: {exc}", file=sys.stderr, flush=True)
    if "goref" in wanted:
        binaries["goref"] = golang.go_reference()
        notes["goref"] = "tests/bench/loadclient/goreference (grpc-go stand-in for the upstream example)"
    return binaries, notes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        client = golang.load_client()
        binaries, notes = _build_servers(args.servers)
    except golang.GoBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"environment": _environment(notes)}
    failed = False
    for nodes in args.nodes:
        print(f"running {nodes:,} nodes / {args.pools} groups, {args.loops} loops per server ...", flush=True)
        try:
            results[f"nodes_{nodes}"] = run_size(nodes, args, client, binaries, out)
        except (report.InvalidRun, ServerStartError) as exc:
            failed = True
            results[f"nodes_{nodes}"] = {"nodes": nodes, "error": str(exc)}
            print(f"INVALID at {nodes} nodes: {exc}", file=sys.stderr, flush=True)
    result_file = out / "bench-results.json"
    result_file.write_text(json.dumps(_finite(results), indent=2, allow_nan=False) + "\n")
    print()
    print(report.table({k: v for k, v in results.items() if "servers" in v}))
    print()
    print(f"results: {result_file}")
    print(f"server logs and load-client output: {out}/nodes_<N>/")
    return 1 if failed else 0


def _finite(value: Any) -> Any:
    """Strict JSON has no NaN or Infinity: a figure that does not exist (no upstream run) becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
