"""``make bench-ca``: the real cluster-autoscaler 1.36.1 against our server and the upstream example.

For each cluster size: one simulated Scaleway cluster, the e2e suite's control plane (etcd,
kube-apiserver, kube-scheduler) with the node agent keeping a Ready Node per machine, pods that make
part of the nodes scale-down candidates (``workload.py``), then, round after round, each server in
turn: start it against the cluster, start the CA pointed at it, let it run its warm-up and measured
loops, stop both. Servers alternate (ours, upstream, ours, upstream ...) so drift on a shared machine
hits both.

    python -m tests.bench.ca_run                                  # 1,000 and 5,000 nodes, 2 rounds
    python -m tests.bench.ca_run --nodes 1000 --rounds 3 --loops 10
    python -m tests.bench.ca_run --nodes 40 --pools 4 --loops 2 --warmup 1 --rounds 1 --scan-interval 2s --settle 0

Prints a Markdown table and the path of the JSON results (keyed ``nodes_<N>``). Exit status 1 when a
run is invalid (the CA reported errors, a server failed): such timings are not reported as valid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from server.service import SERVICE_NAME
from tests.bench import golang, report
from tests.bench.ca_sampler import CaSampler, Loop, Sampling
from tests.bench.cluster import BenchCluster, start_cluster
from tests.bench.report import fmt
from tests.bench.servers import (
    OURS_VARIANTS,
    BenchedServer,
    ServerStartError,
    add_ours_options,
    describe_checkout,
    start_ours,
    start_upstream,
)
from tests.bench.wire import CaptureUnavailable, Exchange, WireCapture, wait_in
from tests.bench.workload import NodeSlot, Placement, place
from tests.e2e.autoscaler import Autoscaler, write_cloud_config
from tests.e2e.control_plane import ControlPlane
from tests.e2e.environment import AutoscalerPrograms, find_programs
from tests.e2e.node_agent import NodeAgent, scaleway_source
from tests.support.gobuild import GoBuildError

DEFAULT_OUT = Path(tempfile.gettempdir()) / "ca-externalgrpc-bench-ca"
# What differs from the e2e suite's flags (tests/e2e/autoscaler.py): the CA's default loop interval; a
# candidate is never unneeded long enough to go; no soft taints, which the CA would add to ten
# candidates per loop and leave on the Nodes, so a later phase would start from another cluster.
CA_FLAGS = {
    "scale-down-unneeded-time": "24h",
    "max-bulk-soft-taint-count": "0",
    "max-node-provision-time": "15m",
}
# The CA's stabilizationDelay (a node Ready for a minute is a template) and some margin.
SETTLE_SECONDS = 65.0
# Between two loops, this much after one ends and before the next starts is left out of "idle".
IDLE_MARGIN = 0.5
SERVER_NAMES = (*OURS_VARIANTS, "upstream")


class InvalidBench(RuntimeError):
    """The CA or a server misbehaved; the timings of the run are not valid."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ca_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000], help="cluster sizes to run")
    parser.add_argument("--pools", type=int, default=100, help="node groups (Kapsule pools)")
    parser.add_argument("--rounds", type=int, default=2, help="times each server runs, alternating")
    parser.add_argument("--loops", type=int, default=8, help="measured CA loops per server and round")
    parser.add_argument("--warmup", type=int, default=2, help="CA loops left out at the start of each run")
    parser.add_argument("--scan-interval", default="10s", help="the CA's --scan-interval (its default: 10s)")
    parser.add_argument("--agent-interval", type=float, default=30.0, help="seconds between node-agent passes")
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_SECONDS,
        help="seconds every Node is Ready before the first CA starts (the CA's template delay is 60 s)",
    )
    parser.add_argument("--servers", nargs="+", choices=SERVER_NAMES, default=["ours", "upstream"])
    add_ours_options(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for results and logs")
    parser.add_argument("--no-wire", action="store_true", help="do not capture the provider calls with tcpdump")
    args = parser.parse_args(argv)
    args.checkouts = dict(args.ours_from)
    return args


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


class Size:
    """Everything one cluster size shares across its runs: the cloud, the control plane, the Nodes."""

    def __init__(self, nodes: int, args: argparse.Namespace, programs: AutoscalerPrograms, workdir: Path) -> None:
        self.args = args
        self.programs = programs
        self.workdir = workdir
        self.cluster: BenchCluster | None = None
        self.control_plane: ControlPlane | None = None
        self.agent: NodeAgent | None = None
        self.nodes = nodes
        self.placement: Placement | None = None
        self.setup_s: dict[str, float] = {}

    def start(self) -> Size:
        began = time.monotonic()
        self.cluster = start_cluster(self.args.pools, self.nodes)
        self.control_plane = ControlPlane(self.programs.control_plane, self.workdir).start()
        self.setup_s["control_plane"] = time.monotonic() - began
        api = kubernetes.config.new_client_from_config(str(self.control_plane.kubeconfig))
        self.agent = NodeAgent(api, [scaleway_source(self.cluster.url)], interval=0.5).start()
        machines = self._wait(lambda: len(self.agent.record.nodes_ready), self.nodes, "Ready Nodes")  # type: ignore[union-attr]
        self.setup_s["nodes_ready"] = time.monotonic() - began
        self.placement = place(api, self._slots())
        self.agent.wake()
        self._wait(lambda: len(self.agent.record.pods_running), self.placement.pods, "Running pods")  # type: ignore[union-attr]
        self.setup_s["pods_running"] = time.monotonic() - began
        self.agent.interval = self.args.agent_interval
        # The CA takes a node as its group's template only once it has been Ready for a minute
        # (isNodeGoodTemplateCandidate); before that it asks TemplateNodeInfo of every group in every loop,
        # which would weigh on whichever server runs first.
        settled = max(self.agent.record.nodes_ready.values()) + self.args.settle
        time.sleep(max(0.0, settled - time.time()))
        self.setup_s["settled"] = time.monotonic() - began
        assert machines == self.nodes
        return self

    def _wait(self, count: Any, expected: int, what: str) -> int:
        deadline = time.monotonic() + 120 + expected * 0.05
        while True:
            seen = int(count())
            if seen >= expected:
                return seen
            assert self.agent is not None
            if self.agent.record.errors:
                raise InvalidBench(f"the node agent failed: {self.agent.record.errors[-1]}")
            if time.monotonic() > deadline:
                raise InvalidBench(f"only {seen} of {expected} {what} after {time.monotonic() - deadline:.0f}s")
            time.sleep(0.5)

    def _slots(self) -> list[NodeSlot]:
        assert self.cluster is not None
        state = self.cluster.simulator.state
        with state.lock:
            pools = state.pools
            return [
                NodeSlot(node.name, int(pools[node.pool_id].allocatable["cpu"]), pools[node.pool_id].autoscaling)
                for node in state.nodes.values()
            ]

    def stop(self) -> None:
        for part in (self.agent, self.control_plane, self.cluster):
            if part is not None:
                part.stop()


def _start_server(name: str, size: Size, upstream: Path | None, workdir: Path) -> BenchedServer:
    assert size.cluster is not None
    if name == "upstream":
        assert upstream is not None
        return start_upstream(size.cluster, upstream, workdir)
    if name in size.args.checkouts:
        return start_ours(size.cluster, workdir, size.args.log_level, name, checkout=size.args.checkouts[name])
    return start_ours(size.cluster, workdir, size.args.log_level, name, OURS_VARIANTS[name])


def run_phase(size: Size, name: str, round_index: int, upstream: Path | None) -> dict[str, Any]:
    """One server with a fresh CA for warm-up + measured loops; its figures."""
    args = size.args
    assert size.cluster is not None and size.control_plane is not None and size.agent is not None
    workdir = size.workdir / f"round{round_index}-{name}"
    workdir.mkdir(parents=True, exist_ok=True)
    server = _start_server(name, size, upstream, workdir)
    capture: WireCapture | None = None
    autoscaler: Autoscaler | None = None
    sampler: CaSampler | None = None
    try:
        if not args.no_wire:
            capture = WireCapture(int(server.address.rsplit(":", 1)[1]), workdir / "provider-calls.pcap").start()
        cloud_config = write_cloud_config(workdir / "cloud-config.yaml", server.address)
        flags = {**CA_FLAGS, "scan-interval": args.scan_interval}
        autoscaler = Autoscaler(
            size.programs.cluster_autoscaler, size.control_plane.kubeconfig, cloud_config, workdir, flags
        )
        autoscaler.start(ready_timeout=180 + size.nodes * 0.02)
        assert autoscaler.process.child is not None
        processes = {"server": server.process.pid, "ca": autoscaler.process.child.pid, "bench": os.getpid()}
        for part, process in (("kube-apiserver", size.control_plane.apiserver), ("etcd", size.control_plane.etcd)):
            if process is not None and process.child is not None:
                processes[part] = process.child.pid
        agent_cpu_before = size.agent.cpu_seconds
        sampler = CaSampler(f"http://{autoscaler.metrics_address}/metrics", autoscaler.log_path, processes).start()
        wanted = args.warmup + args.loops + 1  # one more: its start closes the last measured loop's gap
        per_loop = _seconds(args.scan_interval) + 120 + size.nodes * 0.05
        deadline = time.monotonic() + wanted * per_loop
        while sampler.loops_done() < wanted:
            autoscaler.check_running()
            if server.process.process.poll() is not None:
                raise InvalidBench(f"{name} exited during the run:\n{server.process.log_tail()}")
            if time.monotonic() > deadline:
                raise InvalidBench(f"only {sampler.loops_done()} CA loops in {wanted * per_loop:.0f}s")
            time.sleep(0.5)
        sampling = sampler.stop()
        sampler = None
        agent_cpu = size.agent.cpu_seconds - agent_cpu_before
        memory = server.process.memory()
        calls = _calls_per_loop(server, sampling)
    finally:
        if sampler is not None:
            sampler.stop()
        if autoscaler is not None:
            autoscaler.stop()
        if capture is not None:
            capture.stop()
        server.stop()
    exchanges = capture.exchanges() if capture is not None else None
    requests = size.cluster.simulator.requests.all()
    phase = summarize_phase(name, round_index, sampling, args, exchanges, requests, memory, agent_cpu)
    if calls is not None:
        phase["calls_per_loop_by_method"] = calls
    return phase


def _calls_per_loop(server: BenchedServer, sampling: Sampling) -> dict[str, float] | None:
    """Our server's calls by method over the CA's whole run, per loop the CA ran (its start-up calls
    included, a few per group), from our own metrics; None for the upstream example, which has none."""
    http = getattr(server.process, "http_address", None)
    if not http or not sampling.loops:
        return None
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "grpc_server_handled_total" and sample.labels.get("grpc_service") == SERVICE_NAME:
                method = sample.labels["grpc_method"]
                counts[method] = counts.get(method, 0.0) + sample.value
    loops = sampling.loops[-1].index
    return {method: round(count / loops, 1) for method, count in sorted(counts.items())}


def summarize_phase(
    name: str,
    round_index: int,
    sampling: Sampling,
    args: argparse.Namespace,
    exchanges: list[Exchange] | None,
    requests: list[Any],
    memory: dict[str, float],
    agent_cpu: float,
) -> dict[str, Any]:
    loops = [loop for loop in sampling.loops if loop.start is not None]
    if len(loops) < args.warmup + args.loops + 1:
        raise InvalidBench(f"{name}: {len(loops)} CA loops with a known start, {args.warmup + args.loops + 1} needed")
    measured = loops[args.warmup : args.warmup + args.loops]
    before = loops[args.warmup - 1] if args.warmup else None
    after = loops[args.warmup + args.loops]
    window_start = before.end if before is not None else measured[0].start
    window_end = measured[-1].end
    assert window_start is not None and window_end is not None and after.start is not None
    errors = [e for at, e in sampling.errors_at if window_start <= at <= window_end + 1.0]
    if errors and errors[-1] > errors[0]:
        raise InvalidBench(f"{name}: the CA counted {errors[-1] - errors[0]:.0f} errors in the measured loops")
    window = window_end - window_start
    cpu = {
        process: sampling.cpu_between(process, window_start, window_end)
        for process in ("server", "ca", "kube-apiserver", "etcd", "bench")
    }
    idle_cpu = idle_time = 0.0
    previous: Loop | None = before
    for loop in [*measured, after]:
        if previous is not None and previous.end is not None and loop.start is not None:
            spent = sampling.cpu_between("server", previous.end + IDLE_MARGIN, loop.start - IDLE_MARGIN)
            if spent is not None:
                idle_cpu += spent[0]
                idle_time += spent[1]
        previous = loop
    per_loop: list[dict[str, Any]] = []
    for loop in measured:
        assert loop.start is not None and loop.end is not None
        entry: dict[str, Any] = {"index": loop.index, "main_s": loop.duration_s, "functions_s": loop.functions}
        if exchanges is not None:
            waited, calls = wait_in(exchanges, loop.start, loop.end)
            entry.update(provider_wait_s=waited, provider_calls=calls)
        per_loop.append(entry)
    cloud = report.cloud_requests(name, [r for r in requests if window_start <= r.at <= window_end])
    load = [value for at, value in sampling.load if window_start <= at <= window_end]
    return {
        "server": name,
        "round": round_index,
        "loops": per_loop,
        "window_s": window,
        "window": [window_start, window_end],
        "cpu_s": {process: (value[0] if value else None) for process, value in cpu.items()},
        "cpu_measured_s": {process: (value[1] if value else None) for process, value in cpu.items()},
        "idle_cpu_s": idle_cpu,
        "idle_time_s": idle_time,
        "peak_rss_mib": memory["peak_rss_mib"],
        "cloud_requests": cloud.total,
        "cloud_requests_by_route": dict(sorted(cloud.by_route.items())),
        "foreign_cloud_requests": cloud.foreign,
        "node_agent_cpu_s": agent_cpu,
        "load_average_1m": {"mean": statistics.fmean(load) if load else math.nan, "max": max(load, default=math.nan)},
        "ca_scrape_failures": sampling.scrape_failures,
    }


def _quantile(values: list[float], q: float) -> float:
    return report.percentile(values, q * 100) if values else math.nan


def summarize_server(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's phases of one size, pooled: every measured loop counts once."""
    loops = [loop for phase in phases for loop in phase["loops"]]
    mains = [loop["main_s"] for loop in loops]
    refresh = [loop["functions_s"].get("cloudProviderRefresh", 0.0) for loop in loops]
    count = len(loops)
    window = sum(p["window_s"] for p in phases)
    idle_time = sum(p["idle_time_s"] for p in phases)

    def cpu_per_loop(process: str) -> float:
        values = [p["cpu_s"][process] for p in phases]
        return sum(values) / count if count and all(v is not None for v in values) else math.nan

    functions: dict[str, float] = {}
    for name in sorted({f for loop in loops for f in loop["functions_s"]}):
        functions[name] = statistics.median(loop["functions_s"].get(name, 0.0) for loop in loops)
    summary: dict[str, Any] = {
        "rounds": len(phases),
        "loops": count,
        "main_median_s": statistics.median(mains),
        "main_p90_s": _quantile(mains, 0.9),
        "refresh_median_s": statistics.median(refresh),
        "refresh_p90_s": _quantile(refresh, 0.9),
        "functions_median_s": functions,
        "server_cpu_per_loop_s": cpu_per_loop("server"),
        "ca_cpu_per_loop_s": cpu_per_loop("ca"),
        "apiserver_cpu_per_loop_s": cpu_per_loop("kube-apiserver"),
        "idle_millicores": 1000 * sum(p["idle_cpu_s"] for p in phases) / max(idle_time, 1e-9),
        "peak_rss_mib": max(p["peak_rss_mib"] for p in phases),
        "cloud_requests_per_minute": 60 * sum(p["cloud_requests"] for p in phases) / window if window else math.nan,
        "node_agent_cpu_per_minute_s": 60 * sum(p["node_agent_cpu_s"] for p in phases) / window if window else math.nan,
        "load_average_1m_mean": statistics.fmean(p["load_average_1m"]["mean"] for p in phases),
        "load_average_1m_max": max(p["load_average_1m"]["max"] for p in phases),
    }
    if all("provider_wait_s" in loop for loop in loops):
        shares = [loop["provider_wait_s"] / loop["main_s"] for loop in loops if loop["main_s"] > 0]
        summary["provider_wait_share_median"] = statistics.median(shares) if shares else math.nan
        summary["provider_wait_median_s"] = statistics.median(loop["provider_wait_s"] for loop in loops)
        summary["provider_calls_per_loop_median"] = statistics.median(loop["provider_calls"] for loop in loops)
    return summary


def compare(servers: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    if report.BASELINE not in servers:
        return {}
    base = servers[report.BASELINE]
    figures = ("main_median_s", "main_p90_s", "server_cpu_per_loop_s", "idle_millicores", "peak_rss_mib")

    def ratio(a: float, b: float) -> float:
        return a / b if b else math.inf

    return {
        name: {figure: ratio(s[figure], base[figure]) for figure in figures}
        for name, s in servers.items()
        if name != report.BASELINE
    }


def run_size(
    nodes: int, args: argparse.Namespace, programs: AutoscalerPrograms, upstream: Path | None
) -> dict[str, Any]:
    workdir = args.out / f"nodes_{nodes}"
    shutil.rmtree(workdir, ignore_errors=True)  # etcd's data of an earlier run would be reused
    workdir.mkdir(parents=True)
    names = [n for n in (*OURS_VARIANTS, *args.checkouts, "upstream") if n in args.servers or n in args.checkouts]
    size = Size(nodes, args, programs, workdir)
    try:
        size.start()
        assert size.cluster is not None and size.placement is not None
        phases = []
        for round_index in range(args.rounds):
            for name in names:
                load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
                print(f"  round {round_index + 1}/{args.rounds}: {name} (load {load}) ...", flush=True)
                phases.append(run_phase(size, name, round_index, upstream))
        servers = {name: summarize_server([p for p in phases if p["server"] == name]) for name in names}
        return {
            "nodes": nodes,
            "groups": size.cluster.pools,
            "groups_at_zero": size.cluster.empty_pools,
            "unmanaged_nodes": size.cluster.unmanaged_nodes,
            "pods": {"busy": size.placement.busy, "light": size.placement.light, "empty_nodes": size.placement.empty},
            "setup_s": size.setup_s,
            "scan_interval": args.scan_interval,
            "servers": servers,
            "ratios": compare(servers),
            "phases": phases,
        }
    finally:
        size.stop()


def table(results: dict[str, Any]) -> str:
    header = (
        "| nodes | server | main loop median / p90 s | ÷ upstream | cloudProviderRefresh median / p90 s "
        "| waiting on the provider (share of loop) | provider calls / loop | server CPU s / loop | ÷ upstream "
        "| idle mCPU | peak RSS MiB | cloud req / min | CA CPU s / loop | load 1 min (mean / max) |"
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for key, size in results.items():
        if not key.startswith("nodes_") or "servers" not in size:
            continue
        for name, s in size["servers"].items():
            ratio = size["ratios"].get(name)
            share = 100 * s.get("provider_wait_share_median", math.nan)
            rows.append(
                f"| {size['nodes']:,} | {name} | {fmt(s['main_median_s'], 2)} / {fmt(s['main_p90_s'], 2)} "
                f"| {fmt(ratio['main_median_s'], 2) if ratio else 'baseline'} "
                f"| {fmt(s['refresh_median_s'], 3)} / {fmt(s['refresh_p90_s'], 3)} "
                f"| {fmt(s.get('provider_wait_median_s'), 2)} s ({fmt(share, 0)} %) "
                f"| {fmt(s.get('provider_calls_per_loop_median'), 0)} "
                f"| {fmt(s['server_cpu_per_loop_s'], 3)} "
                f"| {fmt(ratio['server_cpu_per_loop_s'], 2) if ratio else 'baseline'} "
                f"| {fmt(s['idle_millicores'], 1)} | {fmt(s['peak_rss_mib'], 1)} "
                f"| {fmt(s['cloud_requests_per_minute'], 1)} | {fmt(s['ca_cpu_per_loop_s'], 2)} "
                f"| {fmt(s['load_average_1m_mean'], 1)} / {fmt(s['load_average_1m_max'], 1)} |"
            )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        programs = find_programs()
        upstream = golang.upstream_example() if "upstream" in args.servers else None
        pin = golang.upstream_pin() if upstream else None
        if not args.no_wire:
            WireCapture.program()
    except (GoBuildError, CaptureUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "environment": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_at_start": os.getloadavg(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "upstream": pin.describe() if pin else None,
            "checkouts": {name: describe_checkout(path) for name, path in args.checkouts.items()},
            "ca_flags": CA_FLAGS,
        }
    }
    failed = False
    for nodes in args.nodes:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"bench-ca: {nodes:,} nodes / {args.pools} groups, {args.rounds} rounds (load {load}) ...", flush=True)
        began = time.monotonic()
        try:
            results[f"nodes_{nodes}"] = run_size(nodes, args, programs, upstream)
            results[f"nodes_{nodes}"]["wall_s"] = time.monotonic() - began
        except (InvalidBench, ServerStartError, report.InvalidRun, CaptureUnavailable) as exc:
            failed = True
            results[f"nodes_{nodes}"] = {"nodes": nodes, "error": str(exc)}
            print(f"INVALID at {nodes} nodes: {exc}", file=sys.stderr, flush=True)
    result_file = args.out / "bench-ca-results.json"
    result_file.write_text(json.dumps(report.finite(results), indent=2, allow_nan=False) + "\n")
    print()
    print(table(results))
    print()
    print(f"results: {result_file}")
    print(f"logs (CA, servers, control plane) and captures: {args.out}/nodes_<N>/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
