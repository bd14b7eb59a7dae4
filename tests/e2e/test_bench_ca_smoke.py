"""`make bench-ca` in miniature, so it cannot rot: 40 nodes, one round, two measured CA loops per server.

The real pieces run (the control plane, the node agent, the pods, our server and the upstream example
server, the cluster-autoscaler binary, tcpdump when it is installed) and the test checks what was
measured, never how fast. ``make build`` compiles the Go programs first.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.bench import ca_run

NODES, POOLS, LOOPS = 40, 4, 2
WIRE = shutil.which("tcpdump") is not None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out: Path = tmp_path_factory.mktemp("bench-ca")
    argv = ["--nodes", str(NODES), "--pools", str(POOLS), "--loops", str(LOOPS), "--warmup", "1", "--rounds", "1"]
    argv += ["--scan-interval", "2s", "--agent-interval", "5", "--settle", "0"]  # a smoke: no template delay
    argv += ["--out", str(out), "--log-level", "warning"]
    status = ca_run.main([*argv, *([] if WIRE else ["--no-wire"])])
    results = json.loads((out / "bench-ca-results.json").read_text())
    return {"status": status, "size": results[f"nodes_{NODES}"]}


@pytest.mark.timeout(300)
def test_both_servers_ran_under_the_real_ca_and_every_figure_was_measured(smoke: dict) -> None:
    assert smoke["status"] == 0, smoke["size"]
    size = smoke["size"]
    assert set(size["servers"]) == {"ours", "upstream"}
    assert [p["server"] for p in size["phases"]] == ["ours", "upstream"]  # alternating, ours first
    pods = size["pods"]
    assert pods["busy"] + pods["light"] > 0 and pods["empty_nodes"] > 0
    for name, server in size["servers"].items():
        assert server["loops"] == LOOPS, name
        assert server["main_median_s"] > 0 and server["main_p90_s"] >= server["main_median_s"]
        # CPU is read in the kernel's 10 ms ticks: our server's two loops at 40 nodes can take less than
        # one tick (a fresh machine measured 0.000 s for ours, 0.030 s for the upstream's), so its figure
        # must be measured (finite), not above zero; the CA's own CPU shows the sampler reads ticks.
        cpus = [server[f"{p}_cpu_per_loop_s"] for p in ("server", "ca", "apiserver")]
        assert all(math.isfinite(c) and c >= 0 for c in cpus), (name, cpus)
        assert server["ca_cpu_per_loop_s"] > 0, name
        assert server["idle_millicores"] >= 0
        assert server["peak_rss_mib"] > 0
        assert "updateClusterState" in server["functions_median_s"]
    ratios = size["ratios"]["ours"]
    assert ratios["main_median_s"] == pytest.approx(
        size["servers"]["ours"]["main_median_s"] / size["servers"]["upstream"]["main_median_s"]
    )


@pytest.mark.timeout(300)
def test_every_cloud_request_in_a_window_comes_from_the_server_under_test(smoke: dict) -> None:
    for phase in smoke["size"]["phases"]:
        assert phase["foreign_cloud_requests"] == 0
        assert phase["cloud_requests"] == sum(phase["cloud_requests_by_route"].values())


@pytest.mark.skipif(not WIRE, reason="tcpdump is not installed: the provider calls were not captured")
@pytest.mark.timeout(300)
def test_the_provider_calls_of_each_loop_are_timed_on_the_wire(smoke: dict) -> None:
    for phase in smoke["size"]["phases"]:
        for loop in phase["loops"]:
            # At least one NodeGroupForNode per node in every loop; waits within the loop.
            assert loop["provider_calls"] >= NODES
            assert 0 < loop["provider_wait_s"] < loop["main_s"]
