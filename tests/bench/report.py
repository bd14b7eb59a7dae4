"""Turn raw measurements (load-client JSON, simulator request log, /proc figures) into the results.

The JSON written by the runner is keyed by node count (``"nodes_5000": {...}``); every figure is
named with its unit. The table is what the README quotes.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulators.common.request_log import RecordedRequest

# How a cloud request is attributed to a server: the User-Agent each one sends (ours:
# providers/scaleway/client.py; upstream: "<user-agent flag>/<CA version> cluster-id/<id>").
USER_AGENT_PREFIXES: Mapping[str, str] = {
    "ours": "ca-externalgrpc-server/",
    "upstream": "cluster-autoscaler/",
    "goref": "ca-bench-goreference/",
}
# The server ours is compared with: the upstream example when it ran, else the Go stand-in.
BASELINES = ("upstream", "goref")
HOT_RPCS = ("NodeGroupForNode", "NodeGroupGetOptions")


class InvalidRun(AssertionError):
    """A server answered wrongly or not at all; its timings would be meaningless."""


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100): a value that was observed, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def attribute_requests(requests: Iterable[RecordedRequest]) -> dict[str, Counter[str]]:
    """Count simulator requests per server and route, by User-Agent; control-API calls are skipped."""
    counts: dict[str, Counter[str]] = {name: Counter() for name in [*USER_AGENT_PREFIXES, "other"]}
    for request in requests:
        if request.path.startswith("/_sim/"):
            continue
        agent = request.headers.get("user-agent", "")
        owner = next((name for name, prefix in USER_AGENT_PREFIXES.items() if agent.startswith(prefix)), "other")
        counts[owner][f"{request.method} {request.route}"] += 1
    return counts


@dataclass(frozen=True)
class Expectation:
    nodes: int
    groups: int
    groups_at_zero: int


def check_target(name: str, target: Mapping[str, Any], expected: Expectation) -> None:
    """Raise InvalidRun unless every call succeeded and the answers describe the simulated cluster."""
    problems = []
    for rpc, stats in target["rpc"].items():
        if stats["errors"]:
            problems.append(f"{rpc}: {stats['errors']} errors, first: {stats['first_error']}")
    if target["unknown_nodes"]:
        problems.append(f"{target['unknown_nodes']} of {expected.nodes} nodes answered with no node group")
    if target["groups"] != expected.groups:
        problems.append(f"NodeGroups listed {target['groups']} groups, the cluster has {expected.groups}")
    if target["groups_at_zero"] != expected.groups_at_zero:
        problems.append(f"{target['groups_at_zero']} groups at size 0, the cluster has {expected.groups_at_zero}")
    if problems:
        raise InvalidRun(f"{name}: " + "; ".join(problems))


def summarize_target(
    target: Mapping[str, Any],
    cloud: Counter[str],
    loops: int,
    window_s: float,
    memory: Mapping[str, float],
    startup: Mapping[str, Any],
) -> dict[str, Any]:
    loops_ms = list(target["loops_ms"])
    total_requests = sum(cloud.values())
    summary: dict[str, Any] = {
        "loops": len(loops_ms),
        "loop_median_ms": statistics.median(loops_ms),
        "loop_p95_ms": percentile(loops_ms, 95),
        "loop_min_ms": min(loops_ms),
        "loop_max_ms": max(loops_ms),
        "calls_per_loop": target["calls_per_loop"][0] if target["calls_per_loop"] else 0,
        "cloud_requests": total_requests,
        "cloud_requests_per_loop": total_requests / loops if loops else math.nan,
        "cloud_requests_per_minute": total_requests / window_s * 60.0 if window_s > 0 else math.nan,
        "cloud_requests_by_route": dict(sorted(cloud.items())),
        "peak_rss_mib": memory["peak_rss_mib"],
        "rss_at_end_mib": memory["rss_mib"],
        "startup_serving_s": startup["serving_s"],
        "startup_node_groups_s": startup["node_groups_s"],
        "startup_signal": startup["serving_signal"],
        "rpc": {},
    }
    for rpc, stats in target["rpc"].items():
        summary["rpc"][rpc] = {
            "count": stats["ok"],
            "unimplemented": stats["unimplemented"],
            "p50_us": stats["p50_us"],
            "p99_us": stats["p99_us"],
            "mean_us": stats["mean_us"],
            "total_ms": stats["total_ms"],
        }
    return summary


def compare(servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Ratios ours/baseline for the figures the targets are stated in (empty without ours and a baseline)."""
    baseline = next((name for name in BASELINES if name in servers), None)
    if "ours" not in servers or baseline is None:
        return {}
    ours, upstream = servers["ours"], servers[baseline]

    def ratio(a: float, b: float) -> float:
        return a / b if b else math.inf

    return {
        "baseline": baseline,
        "loop_ratio": ratio(ours["loop_median_ms"], upstream["loop_median_ms"]),
        "loop_p95_ratio": ratio(ours["loop_p95_ms"], upstream["loop_p95_ms"]),
        "cloud_requests_ratio": ratio(ours["cloud_requests"], upstream["cloud_requests"]),
        "peak_rss_ratio": ratio(ours["peak_rss_mib"], upstream["peak_rss_mib"]),
    }


def _fmt(value: float, digits: int = 1) -> str:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-"
    return f"{value:,.{digits}f}"


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table, one row per (size, server)."""
    header = (
        "| nodes | server | loop median ms | loop p95 ms | ours/baseline | NodeGroupForNode p50/p99 µs "
        "| GetOptions p50/p99 µs | cloud req/loop | cloud req/min | peak RSS MiB | start → serving s |"
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for key, size in results.items():
        if not key.startswith("nodes_"):
            continue
        for name, s in size["servers"].items():
            ratio = size.get("loop_ratio") if name == "ours" else None
            ngfn, opts = s["rpc"]["NodeGroupForNode"], s["rpc"]["NodeGroupGetOptions"]
            start = _fmt(s["startup_serving_s"], 2) + ("" if name == "ours" else " (a)")
            if name == size.get("baseline"):
                name = f"{name} (baseline)"
            rows.append(
                f"| {size['nodes']:,} | {name} | {_fmt(s['loop_median_ms'])} | {_fmt(s['loop_p95_ms'])} "
                f"| {_fmt(ratio, 2) if ratio is not None else ''} "
                f"| {_fmt(ngfn['p50_us'], 0)} / {_fmt(ngfn['p99_us'], 0)} "
                f"| {_fmt(opts['p50_us'], 0)} / {_fmt(opts['p99_us'], 0)} "
                f"| {_fmt(s['cloud_requests_per_loop'], 2)} | {_fmt(s['cloud_requests_per_minute'], 1)} "
                f"| {_fmt(s['peak_rss_mib'])} | {start} |"
            )
    rows.append("")
    rows.append(
        "(a) no grpc.health.v1 service in the upstream example (nor in goref): time to the first NodeGroups "
        "answering every group."
    )
    rows.append(
        "goref: a grpc-go stand-in doing the upstream example's lookups (tests/bench/loadclient/goreference), "
        "used as the baseline when the upstream module at the pinned release cannot be built."
    )
    return "\n".join(rows)
