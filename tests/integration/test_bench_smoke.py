"""`make bench` in miniature, so the benchmark cannot rot: a tiny cluster, two loops.

It runs the real pieces end to end (Scaleway simulator, ``ca-externalgrpc serve`` and the grpc-go
stand-in ``goref`` as child processes, the Go load client over loopback gRPC) and checks what the run
measured, never how fast it was. The upstream example is left out: its first build takes minutes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from google.protobuf import descriptor_pb2

from protos import externalgrpc_pb2
from tests.bench import golang, run

NODES, POOLS, LOOPS = 120, 10, 2


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--nodes", str(NODES), "--pools", str(POOLS), "--loops", str(LOOPS), "--warmup", "1"]
    status = run.main([*argv, "--servers", "ours", "goref", "--out", str(out), "--log-level", "warning"])
    results = json.loads((out / "bench-results.json").read_text())
    return {"status": status, "results": results, "ours": results[f"nodes_{NODES}"].get("servers", {}).get("ours")}


def test_smoke_run_succeeds_and_writes_results_keyed_by_node_count(smoke: dict) -> None:
    assert smoke["status"] == 0, smoke["results"]
    assert smoke["results"][f"nodes_{NODES}"]["nodes"] == NODES
    assert smoke["ours"] is not None


def test_one_loop_replays_the_ca_call_pattern(smoke: dict) -> None:
    size = smoke["results"][f"nodes_{NODES}"]
    groups, at_zero = size["groups"], size["groups_at_zero"]
    assert groups == POOLS and at_zero == 1  # every tenth pool starts empty
    # Refresh + NodeGroups + NodeGroupForNode per node + 3 GetOptions per node
    # + 3 TargetSize and 1 Nodes per group + TemplateNodeInfo per group at zero.
    assert smoke["ours"]["calls_per_loop"] == 2 + NODES + 3 * NODES + 4 * groups + at_zero


def test_every_measured_call_is_counted_per_rpc(smoke: dict) -> None:
    rpc = smoke["ours"]["rpc"]
    assert rpc["NodeGroupForNode"]["count"] == NODES * LOOPS
    assert rpc["NodeGroupGetOptions"]["count"] == 3 * NODES * LOOPS
    assert rpc["NodeGroupTargetSize"]["count"] == 3 * POOLS * LOOPS
    assert rpc["NodeGroupTemplateNodeInfo"]["count"] == LOOPS
    assert len([v for v in (rpc["NodeGroupForNode"]["p50_us"], rpc["NodeGroupForNode"]["p99_us"]) if v > 0]) == 2


def test_process_figures_come_from_the_server_process(smoke: dict) -> None:
    ours = smoke["ours"]
    assert ours["peak_rss_mib"] >= ours["rss_at_end_mib"] > 0
    assert 0 < ours["startup_serving_s"] <= ours["startup_node_groups_s"]
    assert ours["startup_signal"] == "grpc.health.v1 SERVING"
    assert ours["loops"] == LOOPS


def test_cloud_requests_are_attributed_to_each_server_by_user_agent(smoke: dict) -> None:
    size = smoke["results"][f"nodes_{NODES}"]
    assert size["unattributed_cloud_requests"] == 0
    for server in size["servers"].values():
        assert server["cloud_requests"] == sum(server["cloud_requests_by_route"].values())


def test_ours_is_compared_with_the_go_baseline(smoke: dict) -> None:
    size = smoke["results"][f"nodes_{NODES}"]
    goref = size["servers"]["goref"]
    assert size["baseline"] == "goref"
    assert size["loop_ratio"] == pytest.approx(smoke["ours"]["loop_median_ms"] / goref["loop_median_ms"])
    assert goref["calls_per_loop"] == smoke["ours"]["calls_per_loop"]
    # The stand-in answers GetOptions UNIMPLEMENTED like the upstream Scaleway provider; that counts as an answer.
    assert goref["rpc"]["NodeGroupGetOptions"]["unimplemented"] == goref["rpc"]["NodeGroupGetOptions"]["count"]


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
