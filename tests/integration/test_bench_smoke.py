"""`make bench` in miniature, so the benchmark cannot rot: a tiny cluster, two loops.

It runs the real pieces end to end (a Scaleway simulator per server, ``ca-externalgrpc serve`` and the
upstream example server of CA 1.36.1 and the spike's grpcio floor server as child processes, the Go
load client over loopback gRPC) and
checks what the run measured, never how fast it was. ``make build`` compiles both Go programs first.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from google.protobuf import descriptor_pb2

from protos import externalgrpc_pb2
from tests.bench import golang, report, run
from tests.bench.cluster import unmanaged_count

NODES, POOLS, LOOPS = 120, 10, 2
UNMANAGED = unmanaged_count(NODES)
AUTOSCALED = NODES - UNMANAGED
KEY = run.size_key(NODES, POOLS)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--nodes", str(NODES), "--pools", str(POOLS), "--loops", str(LOOPS), "--warmup", "1"]
    servers = ["--servers", "ours", "upstream", "floor-threads"]
    status = run.main([*argv, *servers, "--out", str(out), "--log-level", "warning"])
    results = json.loads((out / "bench-results.json").read_text())
    return {"status": status, "results": results, "ours": results[KEY].get("servers", {}).get("ours")}


def test_smoke_run_succeeds_and_writes_results_keyed_by_node_count(smoke: dict) -> None:
    assert smoke["status"] == 0, smoke["results"]
    assert smoke["results"][KEY]["nodes"] == NODES
    assert smoke["ours"] is not None


def test_one_loop_replays_the_ca_call_pattern(smoke: dict) -> None:
    size = smoke["results"][KEY]
    groups, at_zero = size["groups"], size["groups_at_zero"]
    assert groups == POOLS and at_zero == 1  # every tenth pool starts empty
    assert size["unmanaged_nodes"] == UNMANAGED > 0
    # Refresh + NodeGroups; NodeGroupForNode once per node of a group (then cached) and four times per
    # node of none; GetOptions twice per node of a group (readiness) and twice more for every second
    # one (scale-down candidates); TargetSize three times and Nodes once per group; a template per
    # group at size 0.
    for server in size["servers"].values():
        assert server["calls_per_loop"] == (
            2 + AUTOSCALED + 4 * UNMANAGED + 2 * AUTOSCALED + 2 * ((AUTOSCALED + 1) // 2) + 4 * groups + at_zero
        )


def test_every_measured_call_is_counted_per_rpc(smoke: dict) -> None:
    for server in smoke["results"][KEY]["servers"].values():
        rpc = server["rpc"]
        assert rpc["NodeGroupForNode"]["count"] == (AUTOSCALED + 4 * UNMANAGED) * LOOPS
        assert rpc["NodeGroupGetOptions"]["count"] == (2 * AUTOSCALED + 2 * ((AUTOSCALED + 1) // 2)) * LOOPS
        assert rpc["NodeGroupTargetSize"]["count"] == 3 * POOLS * LOOPS
        assert rpc["NodeGroupTemplateNodeInfo"]["count"] == LOOPS
        assert all(rpc["NodeGroupForNode"][p] > 0 for p in ("p50_us", "p99_us"))


def test_process_figures_come_from_the_server_process(smoke: dict) -> None:
    ours = smoke["ours"]
    assert ours["peak_rss_mib"] >= ours["rss_at_end_mib"] > 0
    assert ours["cpu_per_loop_s"] > 0
    assert 0 < ours["startup_serving_s"] <= ours["startup_node_groups_s"]
    assert ours["startup_signal"] == "grpc.health.v1 SERVING"
    assert ours["loops"] == LOOPS


def test_every_cloud_request_comes_from_the_server_it_is_counted_for(smoke: dict) -> None:
    for server in smoke["results"][KEY]["servers"].values():
        assert server["foreign_cloud_requests"] == 0
        assert server["cloud_requests"] == sum(server["cloud_requests_by_route"].values())


def test_ours_is_compared_with_the_upstream_example_at_its_release(smoke: dict) -> None:
    size = smoke["results"][KEY]
    upstream = size["servers"]["upstream"]
    assert size["baseline"] == "upstream"
    assert "CA 1.36.1" in smoke["results"]["environment"]["servers"]["upstream"]
    ratio = size["ratios"]["ours"]["loop_ratio"]
    assert ratio == pytest.approx(smoke["ours"]["loop_median_ms"] / upstream["loop_median_ms"])
    # The upstream Scaleway provider answers GetOptions UNIMPLEMENTED; that counts as an answer.
    assert upstream["rpc"]["NodeGroupGetOptions"]["unimplemented"] == upstream["rpc"]["NodeGroupGetOptions"]["count"]


def test_cloud_requests_are_reported_against_the_upstreams_with_what_one_listing_costs(smoke: dict) -> None:
    size = smoke["results"][KEY]
    ours, upstream = smoke["ours"], size["servers"]["upstream"]
    ratios = size["ratios"]["ours"]
    # Two loops of 120 nodes last well under the simulator's 30 s max-age: a window may hold no listing.
    if upstream["cloud_requests"]:
        assert ratios["cloud_requests_ratio"] == pytest.approx(ours["cloud_requests"] / upstream["cloud_requests"])
    listings = ours["freshness"]["listings"], upstream["freshness"]["listings"]
    if all(listings):  # a listing fell in both windows: what one costs is compared too
        per_listing = [s["cloud_requests"] / n for s, n in zip((ours, upstream), listings, strict=True)]
        assert ratios["cloud_requests_per_listing_ratio"] == pytest.approx(per_listing[0] / per_listing[1])
    table = report.cloud_table({KEY: size})
    assert f"| {NODES:,} | {POOLS:,} | ours | " in table and f"| {NODES:,} | {POOLS:,} | upstream | " in table
    few = min(listings) < report.MIN_LISTINGS
    assert (f"At {NODES} nodes a window held fewer than {report.MIN_LISTINGS} listings" in table) is few


def _shape(file: descriptor_pb2.FileDescriptorProto) -> tuple:
    messages = {
        m.name: sorted((f.name, f.number, f.type, f.label, f.type_name) for f in m.field) for m in file.message_type
    }
    services = {s.name: sorted((m.name, m.input_type, m.output_type) for m in s.method) for s in file.service}
    return file.package, messages, services


def test_load_client_speaks_the_current_proto() -> None:
    """loadclient/pb is generated code: it must still match protos/externalgrpc.proto field for field."""
    dumped = subprocess.run(
        [str(golang.load_client()), "-dump-descriptor"], capture_output=True, check=True, timeout=60
    ).stdout
    go_file = descriptor_pb2.FileDescriptorProto.FromString(dumped)
    python_file = descriptor_pb2.FileDescriptorProto()
    externalgrpc_pb2.DESCRIPTOR.CopyToProto(python_file)
    assert _shape(go_file) == _shape(python_file)
