"""Pure-logic checks of the benchmark's bookkeeping: the cluster it builds and how it counts."""

from __future__ import annotations

import math

import pytest

from simulators.common.request_log import RecordedRequest
from tests.bench import report
from tests.bench.cluster import bench_scenario


def _request(agent: str, path: str = "/k8s/v1/regions/fr-par/autoscaler/clusters/c/nodes") -> RecordedRequest:
    return RecordedRequest(at=0.0, method="GET", path=path, route="list_nodes", headers={"user-agent": agent})


def _target(**overrides: object) -> dict:
    stats = {"ok": 10, "unimplemented": 0, "errors": 0, "first_error": ""}
    target = {"rpc": {"NodeGroupForNode": dict(stats)}, "unknown_nodes": 0, "groups": 10, "groups_at_zero": 1}
    target.update(overrides)
    return target


def test_scenario_keeps_the_node_count_and_empties_every_tenth_pool() -> None:
    pools = bench_scenario(pools=100, nodes=5000)["clusters"][0]["pools"]
    assert len(pools) == 100
    assert sum(p["nodes"] for p in pools) == 5000
    assert [i for i, p in enumerate(pools) if p["size"] == 0] == list(range(9, 100, 10))
    assert all(p["size"] == p["nodes"] and p["min_size"] <= p["size"] <= p["max_size"] for p in pools)


def test_scenario_with_one_pool_keeps_it_filled() -> None:
    pools = bench_scenario(pools=1, nodes=7)["clusters"][0]["pools"]
    assert [p["size"] for p in pools] == [7]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert report.percentile(values, 95) == 19.0
    assert report.percentile(values, 50) == 10.0
    assert report.percentile(values, 100) == 20.0
    assert math.isnan(report.percentile([], 50))


def test_requests_are_attributed_by_user_agent_and_control_calls_ignored() -> None:
    counts = report.attribute_requests(
        [
            _request("ca-externalgrpc-server/0.1.0 cluster-id/c"),
            _request("cluster-autoscaler/1.36.1 cluster-id/c"),
            _request("cluster-autoscaler/1.36.1 cluster-id/c"),
            _request("curl/8"),
            _request("ca-externalgrpc-server/0.1.0", path="/_sim/requests"),
        ]
    )
    assert sum(counts["ours"].values()) == 1
    assert sum(counts["upstream"].values()) == 2
    assert sum(counts["other"].values()) == 1


def test_a_run_with_errors_or_unknown_nodes_is_invalid() -> None:
    expected = report.Expectation(nodes=10, groups=10, groups_at_zero=1)
    report.check_target("ours", _target(), expected)  # a clean run passes
    failing = _target()
    failing["rpc"]["NodeGroupForNode"].update(errors=2, first_error="rpc error: code = Unavailable")
    with pytest.raises(report.InvalidRun, match="Unavailable"):
        report.check_target("ours", failing, expected)
    with pytest.raises(report.InvalidRun, match="no node group"):
        report.check_target("ours", _target(unknown_nodes=3), expected)
    with pytest.raises(report.InvalidRun, match="groups"):
        report.check_target("ours", _target(groups=9), expected)


def test_ratios_need_both_servers() -> None:
    ours = {"loop_median_ms": 30.0, "loop_p95_ms": 40.0, "cloud_requests": 5, "peak_rss_mib": 60.0}
    upstream = {"loop_median_ms": 20.0, "loop_p95_ms": 20.0, "cloud_requests": 10, "peak_rss_mib": 30.0}
    assert report.compare({"ours": ours}) == {}
    ratios = report.compare({"ours": ours, "upstream": upstream})
    assert ratios["loop_ratio"] == pytest.approx(1.5)
    assert ratios["loop_p95_ratio"] == pytest.approx(2.0)
    assert ratios["cloud_requests_ratio"] == pytest.approx(0.5)
