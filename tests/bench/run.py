"""``make bench``: replay the CA's loop against our server and the upstream example server.

For each cluster size: start one Scaleway simulator per server, all holding the same cluster, start
the servers against them (child processes, timed to readiness), run the Go load client once with
every target so the measured loops alternate A, B, A, B (drift on a noisy machine hits all alike),
then read each simulator's request log (every request in it comes from its one server) and each
server's peak RSS from /proc.

    python -m tests.bench.run                      # 1,000/100, 5,000/100, 10,000/500, 20,000/1,000 (nodes/groups)
    python -m tests.bench.run --nodes 120 --pools 10 --loops 2   # what the smoke test runs
    python -m tests.bench.run --sizes 1000:100 20000:100 20000:1000 --loops 3   # points of the cost curves
    python -m tests.bench.run --servers ours floor-threads floor-aio native-floor upstream   # the serving spike

Prints a Markdown table, the cost curves (against nodes and against groups, when the sizes make them)
and the path of the JSON results (keyed ``nodes_<N>_groups_<G>``). Exit status 1 when a server
answered wrongly (errors, unknown nodes, missing groups): such timings are not reported as valid.
"""

from __future__ import annotations

import argparse
import json
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
from tests.bench.cluster import BenchCluster, node_list, start_cluster
from tests.bench.servers import (
    FLOOR_VARIANTS,
    OURS_VARIANTS,
    BenchedServer,
    ServerStartError,
    add_ours_options,
    describe_checkout,
    start_floor,
    start_native_floor,
    start_ours,
    start_upstream,
)

DEFAULT_OUT = Path(tempfile.gettempdir()) / "ca-externalgrpc-bench"
LOAD_CLIENT_TIMEOUT = 3600.0
# (nodes, node groups) measured by default: the sizes of the first comparison, then large clusters.
DEFAULT_SIZES = ((1000, 100), (5000, 100), (10000, 500), (20000, 1000))
# Measured loops per server when --loops is not given: fewer for the largest clusters, whose loop is
# tens of thousands of calls (the median of 10 such loops is as steady as of 20 small ones).
DEFAULT_LOOPS = 20
LARGE_CLUSTER = 5000
DEFAULT_LOOPS_LARGE = 10


def size_key(nodes: int, groups: int) -> str:
    return f"nodes_{nodes}_groups_{groups}"


def _size(text: str) -> tuple[int, int]:
    nodes, _, groups = text.partition(":")
    try:
        return int(nodes), int(groups)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size as NODES:GROUPS, e.g. 20000:1000") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=_size,
        nargs="+",
        default=None,
        help="cluster sizes as NODES:GROUPS (default: 1000:100 5000:100 10000:500 20000:1000)",
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=None, help="cluster sizes, each with --pools groups")
    parser.add_argument("--pools", type=int, default=100, help="node groups (Kapsule pools) for --nodes")
    parser.add_argument(
        "--loops",
        type=int,
        default=None,
        help=f"measured loops per server and size (default {DEFAULT_LOOPS}, {DEFAULT_LOOPS_LARGE} above "
        f"{LARGE_CLUSTER:,} nodes)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured loops per server before measuring")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=(*OURS_VARIANTS, *FLOOR_VARIANTS, "native-floor", "upstream"),
        default=["ours", "upstream"],
        help="servers to run: our server with its default settings, its serving variants, the upstream example",
    )
    add_ours_options(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for results and server logs")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run our server under py-spy (must be on PATH) and write a speedscope profile per size",
    )
    args = parser.parse_args(argv)
    args.checkouts = dict(args.ours_from)
    if args.sizes is not None and args.nodes is not None:
        parser.error("give --sizes or --nodes (with --pools), not both")
    if args.nodes is not None:
        args.sizes = [(n, args.pools) for n in args.nodes]
    elif args.sizes is None:
        args.sizes = list(DEFAULT_SIZES)
    return args


def loops_for(args: argparse.Namespace, nodes: int) -> int:
    if args.loops is not None:
        return int(args.loops)
    return DEFAULT_LOOPS if nodes <= LARGE_CLUSTER else DEFAULT_LOOPS_LARGE


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
    client: Path,
    servers: dict[str, BenchedServer],
    clusters: dict[str, BenchCluster],
    nodes_file: Path,
    args: argparse.Namespace,
    loops: int,
) -> dict[str, Any]:
    result_file = nodes_file.with_name(f"loadclient-{nodes_file.stem}.json")
    argv = [str(client), "-nodes", str(nodes_file), "-loops", str(loops), "-warmup", str(args.warmup)]
    argv += ["-out", str(result_file)]
    for name, server in servers.items():
        argv += ["-target", f"{name}={server.address}"]
        # Cleared after everyone's warm-up: the steady-state window starts for all at once.
        argv += ["-clear", f"{name}={clusters[name].url}/_sim/requests"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LOAD_CLIENT_TIMEOUT)
    if done.returncode != 0:
        raise report.InvalidRun(f"load client failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(result_file.read_text())


def _start_clusters(names: Sequence[str], groups: int, nodes: int) -> dict[str, BenchCluster]:
    """One simulator per server, from the same seeded scenario; checked to hold the very same nodes."""
    clusters: dict[str, BenchCluster] = {}
    try:
        for name in names:
            clusters[name] = start_cluster(groups, nodes)
        lists = [node_list(c) for c in clusters.values()]
        if any(other != lists[0] for other in lists[1:]):
            raise report.InvalidRun("the simulators of the servers do not hold the same nodes")
    except BaseException:
        for cluster in clusters.values():
            cluster.stop()
        raise
    return clusters


def run_size(
    nodes: int, groups: int, args: argparse.Namespace, client: Path, upstream: Path | None, out: Path
) -> dict[str, Any]:
    workdir = out / size_key(nodes, groups)
    workdir.mkdir(parents=True, exist_ok=True)
    loops = loops_for(args, nodes)
    # A fixed order within each round (ours first); the alternation spreads drift over all servers.
    known = (*OURS_VARIANTS, *args.checkouts, *FLOOR_VARIANTS, "native-floor", "upstream")
    names = [n for n in known if (n in args.servers or n in args.checkouts) and (n != "upstream" or upstream)]
    clusters = _start_clusters(names, groups, nodes)
    servers: dict[str, BenchedServer] = {}
    profiler: subprocess.Popen[bytes] | None = None
    try:
        first = clusters[names[0]]
        nodes_file = workdir / "nodes.json"
        nodes_file.write_text(json.dumps(node_list(first)))
        # Started one after the other, so no start-up competes with another for the CPU.
        for name in names:
            if name == "upstream":
                assert upstream is not None
                servers[name] = start_upstream(clusters[name], upstream, workdir)
            elif name in FLOOR_VARIANTS:
                servers[name] = start_floor(clusters[name], workdir, name)
            elif name == "native-floor":
                servers[name] = start_native_floor(clusters[name], workdir)
            elif name in args.checkouts:
                servers[name] = start_ours(clusters[name], workdir, args.log_level, name, checkout=args.checkouts[name])
            else:
                servers[name] = start_ours(clusters[name], workdir, args.log_level, name, OURS_VARIANTS[name])
        if args.profile and "ours" in servers:
            profiler = _start_profiler(servers["ours"], out, nodes)
        cpu_before = {name: server.process.cpu_seconds() for name, server in servers.items()}
        raw = _run_load_client(client, servers, clusters, nodes_file, args, loops)
        cpu = {name: server.process.cpu_seconds() - cpu_before[name] for name, server in servers.items()}
        _stop_profiler(profiler)
        profiler = None
        expected = report.Expectation(
            nodes=first.nodes,
            groups=first.pools,
            groups_at_zero=first.empty_pools,
            unmanaged_nodes=first.unmanaged_nodes,
        )
        summaries: dict[str, Any] = {}
        for name, server in servers.items():
            target = raw["targets"][name]
            report.check_target(name, target, expected)
            cloud = report.cloud_requests(name, clusters[name].simulator.requests.all())
            if cloud.foreign:
                raise report.InvalidRun(f"{name}'s simulator answered {cloud.foreign} requests of another client")
            startup = server.startup
            summaries[name] = report.summarize_target(
                target,
                cloud,
                loops,
                raw["measure_seconds"],
                server.process.memory(),
                {
                    "serving_s": startup.serving_s,
                    "node_groups_s": startup.node_groups_s,
                    "serving_signal": startup.serving_signal,
                },
                # Over the whole load-client run: the warm-up loops too, and the time the other servers
                # ran their loops (an idle server spends nothing then).
                cpu[name] / (loops + args.warmup),
            )
        return {
            "baseline": report.BASELINE if report.BASELINE in summaries else None,
            "ratios": report.compare(summaries),
            "nodes": first.nodes,
            "unmanaged_nodes": first.unmanaged_nodes,
            "groups": first.pools,
            "groups_at_zero": first.empty_pools,
            "loops": loops,
            "warmup_loops": args.warmup,
            "measure_window_s": raw["measure_seconds"],
            "load_average": os.getloadavg(),
            "servers": summaries,
        }
    finally:
        _stop_profiler(profiler)
        for server in servers.values():
            server.stop()
        for cluster in clusters.values():
            cluster.stop()


def _environment(notes: dict[str, str]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_at_start": os.getloadavg(),
        "servers": notes,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _notes(
    wanted: Sequence[str], pin: golang.UpstreamPin | None, checkouts: dict[str, Path] | None = None
) -> dict[str, str]:
    """What each server is, for the results."""
    notes: dict[str, str] = {}
    for name, path in (checkouts or {}).items():
        notes[name] = describe_checkout(path)
    for name in wanted:
        if name == "upstream":
            assert pin is not None
            notes[name] = f"upstream example server: {pin.describe()}"
        elif name in FLOOR_VARIANTS:
            notes[name] = "tests/bench/floor_server.py " + " ".join(FLOOR_VARIANTS[name])
        elif name == "native-floor":
            notes[name] = "tests/bench/native_floor (Rust, tonic 0.14) serving answers Python serialized"
        else:
            settings = OURS_VARIANTS[name]
            notes[name] = "ca-externalgrpc serve (this checkout)" + (f", {json.dumps(settings)}" if settings else "")
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        client = golang.load_client()
        upstream = golang.upstream_example() if "upstream" in args.servers else None
        pin = golang.upstream_pin() if upstream else None
    except golang.GoBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"environment": _environment(_notes(args.servers, pin, args.checkouts))}
    failed = False
    for nodes, groups in args.sizes:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        loops = loops_for(args, nodes)
        print(
            f"running {nodes:,} nodes / {groups:,} groups, {loops} loops per server (load {load}) ...",
            flush=True,
        )
        began = time.monotonic()
        key = size_key(nodes, groups)
        try:
            results[key] = run_size(nodes, groups, args, client, upstream, out)
            results[key]["wall_s"] = time.monotonic() - began
        except (report.InvalidRun, ServerStartError) as exc:
            failed = True
            results[key] = {"nodes": nodes, "groups": groups, "error": str(exc)}
            print(f"INVALID at {nodes} nodes / {groups} groups: {exc}", file=sys.stderr, flush=True)
    result_file = out / "bench-results.json"
    result_file.write_text(json.dumps(report.finite(results), indent=2, allow_nan=False) + "\n")
    measured = {k: v for k, v in results.items() if "servers" in v}
    print()
    print(report.table(measured))
    if any(size.get("baseline") for size in measured.values()):
        print()
        print("Cloud requests, ours against the upstream example:")
        print()
        print(report.cloud_table(measured))
    curves = report.curves(measured)
    if curves:
        print()
        print(curves)
    print()
    print(f"results: {result_file}")
    print(f"server logs and load-client output: {out}/nodes_<N>_groups_<G>/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
