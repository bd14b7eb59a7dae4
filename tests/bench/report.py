"""Turn raw measurements (load-client JSON, simulator request log, /proc figures) into the results.

The JSON written by the runner is keyed by size (``"nodes_5000_groups_100": {...}``); every figure is
named with its unit. The tables are what docs/evidence/performance.md quotes.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulators.common.request_log import RecordedRequest

# Every server has a simulator of its own, so its log holds only its requests; the User-Agent each
# really sends is checked as well (ours: providers/scaleway/client.py; the upstream example: its
# hard-coded UserAgent option "user-agent", then "/<CA version> cluster-id/<id>").
OURS_USER_AGENT = "ca-externalgrpc-server/"
UPSTREAM_USER_AGENT = "user-agent/"
# The server every other is compared with.
BASELINE = "upstream"
HOT_RPCS = ("NodeGroupForNode", "NodeGroupGetOptions")
# The request that starts a full listing of the cluster: the first page of its pools.
LISTING_START_ROUTE = "list_pools"
# Fewer listings than this in a window and its cloud requests per minute move by a third with where it falls.
MIN_LISTINGS = 3


class InvalidRun(AssertionError):
    """A server answered wrongly or not at all; its timings would be meaningless."""


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100): a value that was observed, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def user_agent_prefix(server: str) -> str:
    return UPSTREAM_USER_AGENT if server == BASELINE else OURS_USER_AGENT  # the floor servers send none


@dataclass(frozen=True)
class CloudRequests:
    """The requests one server sent to its own simulator in the measured window."""

    by_route: Counter[str]
    foreign: int  # requests without the server's User-Agent (must be 0: nothing else talks to it)
    listing_starts: list[float]  # simulator time of each full listing's first request
    listing_ends: list[float]  # time of each listing's last request

    @property
    def total(self) -> int:
        return sum(self.by_route.values())


def cloud_requests(server: str, requests: Iterable[RecordedRequest]) -> CloudRequests:
    """Count a server's cloud requests by route and find its full listings; control-API calls are skipped.

    A listing starts with the first page of the pool list and runs until the next one starts.
    """
    prefix = user_agent_prefix(server)
    by_route: Counter[str] = Counter()
    foreign = 0
    starts: list[float] = []
    ends: list[float] = []
    for request in sorted(requests, key=lambda r: r.at):
        if request.path.startswith("/_sim/"):
            continue
        if not request.headers.get("user-agent", "").startswith(prefix):
            foreign += 1
            continue
        by_route[f"{request.method} {request.route}"] += 1
        if request.route == LISTING_START_ROUTE and request.query.get("page", "1") == "1":
            starts.append(request.at)
            ends.append(request.at)
        elif ends:
            ends[-1] = request.at
    return CloudRequests(by_route, foreign, starts, ends)


def freshness(cloud: CloudRequests) -> dict[str, float]:
    """How old the cloud state behind an answer can be, from the listings a server made.

    Until listing k+1 has finished, a server answers from listing k (or older), whose data dates from
    when listing k started: the largest ``end[k+1] - start[k]`` bounds the age of any answer in the
    window. NaN when the window holds fewer than two listings.
    """
    starts, ends = cloud.listing_starts, cloud.listing_ends
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    ages = [ends[k + 1] - starts[k] for k in range(len(starts) - 1)]
    # A listing ends with its last request before the next one starts (the last may still run).
    durations = [ends[k] - starts[k] for k in range(len(starts) - 1)]
    per_listing = cloud.total / len(starts) if starts else math.nan
    mean_gap = statistics.fmean(gaps) if gaps else math.nan
    return {
        "listings": float(len(starts)),
        "requests_per_listing": per_listing,
        # The steady rate: what a listing costs, as often as listings came. A window holds only a few
        # listings, so its plain count moves by a whole listing with where the window falls.
        "requests_per_minute_steady": per_listing * 60.0 / mean_gap if gaps else math.nan,
        "listing_interval_mean_s": mean_gap,
        "listing_interval_max_s": max(gaps) if gaps else math.nan,
        "max_answer_age_s": max(ages) if ages else math.nan,
        "listing_duration_median_s": statistics.median(durations) if durations else math.nan,
    }


@dataclass(frozen=True)
class Expectation:
    nodes: int
    groups: int
    groups_at_zero: int
    unmanaged_nodes: int


def check_target(name: str, target: Mapping[str, Any], expected: Expectation) -> None:
    """Raise InvalidRun unless every call succeeded and the answers describe the simulated cluster."""
    problems = []
    for rpc, stats in target["rpc"].items():
        if stats["errors"]:
            problems.append(f"{rpc}: {stats['errors']} errors, first: {stats['first_error']}")
    if target["unknown_nodes"] != expected.unmanaged_nodes:
        problems.append(
            f"{target['unknown_nodes']} of {expected.nodes} nodes answered with no node group, "
            f"{expected.unmanaged_nodes} belong to none"
        )
    if target["groups"] != expected.groups:
        problems.append(f"NodeGroups listed {target['groups']} groups, the cluster has {expected.groups}")
    if target["groups_at_zero"] != expected.groups_at_zero:
        problems.append(f"{target['groups_at_zero']} groups at size 0, the cluster has {expected.groups_at_zero}")
    if problems:
        raise InvalidRun(f"{name}: " + "; ".join(problems))


def summarize_target(
    target: Mapping[str, Any],
    cloud: CloudRequests,
    loops: int,
    window_s: float,
    memory: Mapping[str, float],
    startup: Mapping[str, Any],
    cpu_per_loop_s: float = math.nan,
) -> dict[str, Any]:
    loops_ms = list(target["loops_ms"])
    total_requests = cloud.total
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
        "cloud_requests_by_route": dict(sorted(cloud.by_route.items())),
        "foreign_cloud_requests": cloud.foreign,
        "freshness": freshness(cloud),
        "peak_rss_mib": memory["peak_rss_mib"],
        "rss_at_end_mib": memory["rss_mib"],
        "cpu_per_loop_s": cpu_per_loop_s,
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
    """Ratios server/baseline for the figures the targets are stated in, for every server but the baseline.

    ``{}`` when the baseline did not run.
    """
    if BASELINE not in servers:
        return {}
    base = servers[BASELINE]

    def ratio(a: float, b: float) -> float:
        return a / b if b else math.inf

    def steady(s: Mapping[str, Any]) -> float:
        return float(s["freshness"]["requests_per_minute_steady"])

    def per_listing(s: Mapping[str, Any]) -> float:
        return float(s["freshness"]["requests_per_listing"])

    return {
        name: {
            "loop_ratio": ratio(s["loop_median_ms"], base["loop_median_ms"]),
            "loop_p95_ratio": ratio(s["loop_p95_ms"], base["loop_p95_ms"]),
            "cloud_requests_ratio": ratio(s["cloud_requests"], base["cloud_requests"]),
            "cloud_requests_steady_ratio": ratio(steady(s), steady(base)),
            "cloud_requests_per_listing_ratio": ratio(per_listing(s), per_listing(base)),
            "peak_rss_ratio": ratio(s["peak_rss_mib"], base["peak_rss_mib"]),
            "cpu_per_loop_ratio": ratio(s["cpu_per_loop_s"], base["cpu_per_loop_s"]),
        }
        for name, s in servers.items()
        if name != BASELINE
    }


def fmt(value: float | None, digits: int = 1) -> str:
    """A figure for a table: thousands separated, ``-`` for one that does not exist."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _servers(
    results: Mapping[str, Mapping[str, Any]],
) -> Iterator[tuple[Mapping[str, Any], str, Mapping[str, Any], Mapping[str, float] | None]]:
    """Every server of every size of a run: (size, name, its summary, its ratios to the upstream or None)."""
    for key, size in results.items():
        if key.startswith("nodes_"):
            for name, summary in size["servers"].items():
                yield size, name, summary, size.get("ratios", {}).get(name)


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table, one row per (size, server)."""
    header = (
        "| nodes | groups | server | loop median ms | loop p95 ms | ÷ upstream | NodeGroupForNode p50/p99 µs "
        "| GetOptions p50/p99 µs | CPU s / loop | ÷ upstream | cloud req/min (window / steady) "
        "| max answer age s | peak RSS MiB | start → serving s |"
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for size, name, s, ratio in _servers(results):
        ngfn, opts = s["rpc"]["NodeGroupForNode"], s["rpc"]["NodeGroupGetOptions"]
        start = fmt(s["startup_serving_s"], 2) + (" (a)" if name == BASELINE else "")
        rows.append(
            f"| {size['nodes']:,} | {size['groups']:,} | {name} | {fmt(s['loop_median_ms'])} "
            f"| {fmt(s['loop_p95_ms'])} "
            f"| {fmt(ratio['loop_ratio'], 2) if ratio else 'baseline'} "
            f"| {fmt(ngfn['p50_us'], 0)} / {fmt(ngfn['p99_us'], 0)} "
            f"| {fmt(opts['p50_us'], 0)} / {fmt(opts['p99_us'], 0)} "
            f"| {fmt(s.get('cpu_per_loop_s', math.nan), 3)} "
            f"| {fmt(ratio['cpu_per_loop_ratio'], 2) if ratio else 'baseline'} "
            f"| {fmt(s['cloud_requests_per_minute'], 1)} / "
            f"{fmt(s['freshness']['requests_per_minute_steady'], 1)} "
            f"| {fmt(s['freshness']['max_answer_age_s'], 1)} "
            f"| {fmt(s['peak_rss_mib'])} | {start} |"
        )
    rows.append("")
    rows.append(
        "(a) no grpc.health.v1 service in the upstream example: time to the first NodeGroups answering every group."
    )
    rows.append(
        "CPU s / loop: the server's user + system time over the whole load-client run (warm-up loops included) "
        "divided by its loops."
    )
    rows.append(
        "cloud req/min: window = requests in the measured window per minute; steady = requests per full "
        "listing times listings per minute (mean interval between listings), which a window of a few "
        "listings does not move by a whole listing."
    )
    rows.append(
        "max answer age: the oldest cloud state a server could answer from in the window (end of a listing "
        "minus the start of the one before it)."
    )
    return "\n".join(rows)


def cloud_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Cloud requests per minute of each server against the upstream's, and what makes them: requests per
    full listing (what one listing of the cluster costs) and listings (how often the server re-read it)."""
    header = (
        "| nodes | groups | server | cloud req/min (window / steady) | ÷ upstream (window / steady) "
        "| requests per listing | ÷ upstream | listings in the window | mean interval between listings s |"
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for size, name, s, ratio in _servers(results):
        fresh = s["freshness"]
        against = (
            f"{fmt(ratio['cloud_requests_ratio'], 3)} / {fmt(ratio['cloud_requests_steady_ratio'], 3)} "
            f"| {fmt(fresh['requests_per_listing'], 1)} | {fmt(ratio['cloud_requests_per_listing_ratio'], 3)}"
            if ratio
            else f"baseline | {fmt(fresh['requests_per_listing'], 1)} | baseline"
        )
        rows.append(
            f"| {size['nodes']:,} | {size['groups']:,} | {name} | {fmt(s['cloud_requests_per_minute'], 1)} / "
            f"{fmt(fresh['requests_per_minute_steady'], 1)} | {against} | {fmt(fresh['listings'], 0)} "
            f"| {fmt(fresh['listing_interval_mean_s'], 1)} |"
        )
    rows.append("")
    few = [
        f"{size['nodes']:,}"
        for key, size in results.items()
        if key.startswith("nodes_") and any(s["freshness"]["listings"] < MIN_LISTINGS for s in size["servers"].values())
    ]
    if few:
        rows.append(
            f"At {', '.join(few)} nodes a window held fewer than {MIN_LISTINGS} listings of a server: its cloud "
            "figures there say little; --loops sets a window long enough to compare them.\n"
        )
    rows.append(
        "Both servers list by the same rule (at the first Refresh once their last listing is older than the "
        "cloud's max-age), so what a listing costs decides; in one run a listing more in the window, or "
        "intervals one loop longer or shorter among the few the steady rate is taken from, move a ratio by "
        'several per cent (docs/evidence/performance.md, "Cloud requests and freshness").'
    )
    return "\n".join(rows)


def curves(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The cost of each server against nodes (groups fixed) and against groups (nodes fixed), as tables.

    A curve needs at least two sizes that differ only in that one dimension; none is printed otherwise.
    """
    sizes = [size for key, size in results.items() if key.startswith("nodes_") and "servers" in size]
    out: list[str] = []
    for axis, fixed in (("nodes", "groups"), ("groups", "nodes")):
        by_fixed: dict[int, list[Mapping[str, Any]]] = {}
        for size in sizes:
            by_fixed.setdefault(size[fixed], []).append(size)
        for value, points in sorted(by_fixed.items()):
            if len({p[axis] for p in points}) < 2:
                continue
            out.append(f"Cost against {axis}, {value:,} {fixed}:")
            out.append("")
            header = (
                f"| {axis} | server | loop median ms | loop ms per 1,000 calls | CPU s / loop | peak RSS MiB "
                "| start → serving s | one full listing s |"
            )
            out += [header, "|" + "---|" * (header.count("|") - 1)]
            for point in sorted(points, key=lambda p: p[axis]):
                for name, s in point["servers"].items():
                    per_call = s["loop_median_ms"] / s["calls_per_loop"] * 1000 if s["calls_per_loop"] else math.nan
                    out.append(
                        f"| {point[axis]:,} | {name} | {fmt(s['loop_median_ms'])} | {fmt(per_call, 0)} "
                        f"| {fmt(s.get('cpu_per_loop_s', math.nan), 3)} | {fmt(s['peak_rss_mib'])} "
                        f"| {fmt(s['startup_serving_s'], 2)} "
                        f"| {fmt(s['freshness'].get('listing_duration_median_s', math.nan), 2)} |"
                    )
            out.append("")
    return "\n".join(out).rstrip()


def finite(value: Any) -> Any:
    """Strict JSON has no NaN or Infinity: a figure that does not exist (no upstream run) becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
