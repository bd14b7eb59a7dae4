"""Pure-logic checks of the benchmark's bookkeeping: the cluster it builds and how it counts."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest

from simulators.common.request_log import RecordedRequest
from tests.bench import heap, report, run
from tests.bench.cluster import UNMANAGED_POOL, bench_scenario

OURS_AGENT = "ca-externalgrpc-server/0.2.0 cluster-id/c"
UPSTREAM_AGENT = "user-agent/1.36.1 cluster-id/c"


def _request(
    agent: str, at: float = 0.0, route: str = "list_nodes", page: str = "1", path: str = "/k8s/v1/x"
) -> RecordedRequest:
    return RecordedRequest(
        at=at, method="GET", path=path, route=route, query={"page": page}, headers={"user-agent": agent}
    )


def _target(**overrides: object) -> dict:
    stats = {"ok": 10, "unimplemented": 0, "errors": 0, "first_error": ""}
    target = {"rpc": {"NodeGroupForNode": dict(stats)}, "unknown_nodes": 2, "groups": 10, "groups_at_zero": 1}
    target.update(overrides)
    return target


def test_scenario_keeps_the_node_count_empties_every_tenth_pool_and_adds_a_fixed_pool() -> None:
    pools = bench_scenario(pools=100, nodes=5000)["clusters"][0]["pools"]
    autoscaled = [p for p in pools if p.get("autoscaling", True)]
    fixed = [p for p in pools if not p.get("autoscaling", True)]
    assert len(autoscaled) == 100
    assert [p["name"] for p in fixed] == [UNMANAGED_POOL] and fixed[0]["nodes"] == 250
    assert sum(p["nodes"] for p in pools) == 5000
    assert [i for i, p in enumerate(autoscaled) if p["size"] == 0] == list(range(9, 100, 10))
    assert all(p["size"] == p["nodes"] and p["min_size"] <= p["size"] <= p["max_size"] for p in pools)


def test_scenario_with_one_pool_keeps_it_filled() -> None:
    pools = bench_scenario(pools=1, nodes=7)["clusters"][0]["pools"]
    assert [p["size"] for p in pools] == [7]  # too small to spare a node for the fixed pool


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert report.percentile(values, 95) == 19.0
    assert report.percentile(values, 50) == 10.0
    assert report.percentile(values, 100) == 20.0
    assert math.isnan(report.percentile([], 50))


def test_a_servers_requests_are_counted_by_route_and_others_flagged() -> None:
    requests = [
        _request(UPSTREAM_AGENT, at=1.0, route="list_pools"),
        _request(UPSTREAM_AGENT, at=1.1, route="list_nodes"),
        _request(OURS_AGENT, at=1.2),
        _request(UPSTREAM_AGENT, at=1.3, path="/_sim/requests"),  # the control API is not the cloud's
    ]
    upstream = report.cloud_requests("upstream", requests)
    assert upstream.by_route == {"GET list_pools": 1, "GET list_nodes": 1}
    assert upstream.foreign == 1
    assert report.cloud_requests("ours", requests).total == 1


def test_freshness_bounds_the_age_of_answers_by_the_listings() -> None:
    requests = []
    for start in (0.0, 30.0, 65.0):  # three listings: pools pages 1 and 2, then two node pages
        requests += [
            _request(OURS_AGENT, at=start, route="list_pools", page="1"),
            _request(OURS_AGENT, at=start + 0.5, route="list_pools", page="2"),
            _request(OURS_AGENT, at=start + 1.0, route="list_nodes", page="1"),
            _request(OURS_AGENT, at=start + 2.0, route="list_nodes", page="2"),
        ]
    fresh = report.freshness(report.cloud_requests("ours", requests))
    assert fresh["listings"] == 3
    assert fresh["requests_per_listing"] == 4
    assert fresh["requests_per_minute_steady"] == pytest.approx(4 * 60 / 32.5)
    assert fresh["listing_interval_mean_s"] == pytest.approx(32.5)
    assert fresh["listing_interval_max_s"] == pytest.approx(35.0)
    assert fresh["max_answer_age_s"] == pytest.approx(37.0)  # listing 3 ends at 67, listing 2 began at 30
    assert fresh["listing_duration_median_s"] == pytest.approx(2.0)  # the last one may still run: left out
    assert math.isnan(report.freshness(report.cloud_requests("ours", requests[:4]))["max_answer_age_s"])


def test_a_run_with_errors_or_unknown_nodes_is_invalid() -> None:
    expected = report.Expectation(nodes=10, groups=10, groups_at_zero=1, unmanaged_nodes=2)
    report.check_target("ours", _target(), expected)  # a clean run passes
    failing = _target()
    failing["rpc"]["NodeGroupForNode"].update(errors=2, first_error="rpc error: code = Unavailable")
    with pytest.raises(report.InvalidRun, match="Unavailable"):
        report.check_target("ours", failing, expected)
    with pytest.raises(report.InvalidRun, match="no node group"):
        report.check_target("ours", _target(unknown_nodes=3), expected)
    with pytest.raises(report.InvalidRun, match="no node group"):
        report.check_target("ours", _target(unknown_nodes=0), expected)
    with pytest.raises(report.InvalidRun, match="groups"):
        report.check_target("ours", _target(groups=9), expected)


def test_ratios_are_against_the_upstream_example() -> None:
    ours = {"loop_median_ms": 30.0, "loop_p95_ms": 40.0, "cloud_requests": 5, "peak_rss_mib": 60.0}
    ours |= {"cpu_per_loop_s": 0.1}
    ours["freshness"] = {"requests_per_minute_steady": 90.0, "requests_per_listing": 52.0}
    upstream = {"loop_median_ms": 20.0, "loop_p95_ms": 20.0, "cloud_requests": 10, "peak_rss_mib": 30.0}
    upstream |= {"cpu_per_loop_s": 0.4}
    upstream["freshness"] = {"requests_per_minute_steady": 100.0, "requests_per_listing": 53.0}
    assert report.compare({"ours": ours}) == {}
    ratios = report.compare({"ours": ours, "floor-aio": ours, "upstream": upstream})
    assert set(ratios) == {"ours", "floor-aio"}
    assert ratios["ours"]["loop_ratio"] == pytest.approx(1.5)
    assert ratios["ours"]["loop_p95_ratio"] == pytest.approx(2.0)
    assert ratios["ours"]["cloud_requests_ratio"] == pytest.approx(0.5)
    assert ratios["ours"]["cloud_requests_steady_ratio"] == pytest.approx(0.9)
    assert ratios["ours"]["cloud_requests_per_listing_ratio"] == pytest.approx(52 / 53)
    assert ratios["ours"]["peak_rss_ratio"] == pytest.approx(2.0)
    assert ratios["ours"]["cpu_per_loop_ratio"] == pytest.approx(0.25)


def _size(nodes: int, groups: int, loop_ms: float) -> dict:
    server = {
        "loop_median_ms": loop_ms,
        "calls_per_loop": 4 * nodes,
        "cpu_per_loop_s": loop_ms / 5000,
        "peak_rss_mib": 40 + nodes / 1000,
        "startup_serving_s": 1.0,
        "freshness": {"listing_duration_median_s": nodes / 10000},
    }
    return {"nodes": nodes, "groups": groups, "servers": {"ours": server}}


def test_cost_curves_need_two_sizes_that_differ_in_one_dimension() -> None:
    results = {
        run.size_key(1000, 100): _size(1000, 100, 400.0),
        run.size_key(20000, 100): _size(20000, 100, 8000.0),
        run.size_key(20000, 1000): _size(20000, 1000, 9000.0),
    }
    text = report.curves(results)
    assert "Cost against nodes, 100 groups:" in text
    assert "Cost against groups, 20,000 nodes:" in text
    assert "| 20,000 | ours | 8,000.0 | 100 | 1.600 | 60.0 | 1.00 | 2.00 |" in text
    assert report.curves({run.size_key(1000, 100): _size(1000, 100, 400.0)}) == ""


def test_sizes_are_nodes_and_groups_and_large_clusters_run_fewer_loops() -> None:
    args = run.parse_args(["--sizes", "1000:100", "20000:1000"])
    assert args.sizes == [(1000, 100), (20000, 1000)]
    assert (run.loops_for(args, 1000), run.loops_for(args, 20000)) == (20, 10)
    assert run.parse_args(["--nodes", "120", "--pools", "10"]).sizes == [(120, 10)]
    assert run.parse_args([]).sizes == list(run.DEFAULT_SIZES)
    assert run.loops_for(run.parse_args(["--loops", "3"]), 20000) == 3
    with pytest.raises(SystemExit):
        run.parse_args(["--sizes", "1000"])


def test_another_checkout_is_named_and_must_not_shadow_a_server(tmp_path) -> None:
    args = run.parse_args(["--ours-from", f"main={tmp_path}"])
    assert args.checkouts == {"main": tmp_path.resolve()}
    for bad in ("main", f"ours={tmp_path}", f"upstream={tmp_path}", f"={tmp_path}"):
        with pytest.raises(SystemExit):
            run.parse_args(["--ours-from", bad])


def test_a_heap_is_summed_by_package_and_compared_with_the_servers_without_features(tmp_path: Path) -> None:
    """heap.py on two real snapshots of this process: the second holds a list built in this file more."""
    tracemalloc.start(5)
    try:
        base = tmp_path / "none.snapshot"
        tracemalloc.take_snapshot().dump(str(base))
        held = [str(i) * 20 for i in range(20_000)]
        more = tmp_path / "all four.snapshot"
        tracemalloc.take_snapshot().dump(str(more))
    finally:
        tracemalloc.stop()
    summary = heap.summary({"none": base, "all four": more})
    assert summary["traced_mib"]["all four"] > summary["traced_mib"]["none"]
    package, kib, blocks = summary["over_none"]["all four"][0]
    assert package == "tests/bench/test_bench_logic.py" and kib > len(held) * 20 / 1024 and blocks >= len(held)
    assert "| tests/bench/test_bench_logic.py |" in "\n".join(heap.markdown(summary, "all four"))
    assert heap.where(heap.__file__) == "tests/bench/heap.py"
    assert heap.where("/x/lib/python3.11/site-packages/lark/parsers/lalr.py") == "lark"
    assert heap.where("/x/lib/python3.11/site-packages/six.py") == "six"
