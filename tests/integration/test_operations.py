"""What an operator sees after a real workload: /metrics, JSON logs, the status command."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from devstack.harness import SCW_SECRET, running_stack
from protos import externalgrpc_pb2 as pb
from server.logs import configure_logging
from simulators.common import Fault
from tests.integration.test_server_rpcs import GENERAL, SCENARIO, SMALL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def worked(tmp_path):
    """A server that served reads, an increase, a deletion, a refused call and a cloud fault."""
    stream = io.StringIO()
    handler = configure_logging("json", "info", stream=stream)
    try:
        with running_stack(tmp_path, scaleway=SCENARIO) as stack:
            stack.groups()
            stack.target(GENERAL)
            stack.instances(GENERAL)
            stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=5)
            pid = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL))[0]
            stack.stub.NodeGroupDeleteNodes(
                pb.NodeGroupDeleteNodesRequest(id=GENERAL, nodes=[pb.ExternalGrpcNode(providerID=pid)]), timeout=5
            )
            with pytest.raises(grpc.RpcError):
                stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=SMALL, delta=50), timeout=5)
            stack.scaleway.faults.add(Fault(route="*", status=503, times=2))
            stack.sync()  # retried past the two 503s
            http_port = stack.server.http.port  # type: ignore[union-attr]
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as answer:
                metrics = answer.read().decode()
            status = subprocess.run(
                [sys.executable, "-m", "server.cli", "status", "--address", stack.address],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=30,
            )
            yield metrics, stream.getvalue(), status
    finally:
        logging.getLogger().removeHandler(handler)


def samples(metrics: str, family: str) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith(family)]


def test_metrics_carry_grpc_cloud_group_and_action_families(worked):
    metrics, _, _ = worked
    assert any(
        'grpc_method="NodeGroupIncreaseSize"' in s and 'grpc_code="OK"' in s
        for s in samples(metrics, "grpc_server_handled_total")
    )
    assert any('grpc_code="FAILED_PRECONDITION"' in s for s in samples(metrics, "grpc_server_handled_total"))
    assert samples(metrics, "grpc_server_started_total{")
    assert samples(metrics, "grpc_server_handling_seconds_bucket{")
    cloud = samples(metrics, "ca_externalgrpc_cloud_api_requests_total{")
    assert any('provider="scaleway"' in s and 'status="200"' in s for s in cloud)
    assert any('status="503"' in s for s in cloud)
    assert samples(metrics, "ca_externalgrpc_cloud_api_retries_total{")
    assert samples(metrics, "ca_externalgrpc_cloud_api_circuit_breaker_state{")
    assert any(f'node_group="{GENERAL}"' in s for s in samples(metrics, "ca_externalgrpc_node_group_target_size{"))
    assert any('state="running"' in s for s in samples(metrics, "ca_externalgrpc_node_group_instances{"))
    assert samples(metrics, 'ca_externalgrpc_snapshot_age_seconds{backend="scw"}')
    actions = samples(metrics, "ca_externalgrpc_scale_actions_total{")
    assert any('action="increase"' in s and 'result="ok"' in s for s in actions)
    assert any('action="delete"' in s for s in actions)
    assert any('action="increase"' in s and 'result="error"' in s for s in actions)
    # endpoint labels are route templates, never concrete URLs with ids
    assert not re.search(r'endpoint="[^"]*[0-9a-f]{8}-[0-9a-f]{4}', metrics)
    assert SCW_SECRET not in metrics


def test_logs_are_json_lines_with_the_promised_fields_and_no_secret(worked):
    _, logs, _ = worked
    lines = [json.loads(line) for line in logs.splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    mutations = [line for line in lines if line.get("grpc_method") == "NodeGroupIncreaseSize"]
    assert {m["result"] for m in mutations} == {"ok", "error"}
    for m in mutations:
        assert {"node_group", "delta", "duration_ms", "grpc_code"} <= set(m)
    assert any(line.get("grpc_method") == "NodeGroupDeleteNodes" for line in lines)
    assert not any(line.get("grpc_method") == "NodeGroupTargetSize" for line in lines)  # reads log at debug
    assert SCW_SECRET not in logs


def test_status_command_prints_groups_sizes_and_backend_health(worked):
    _, _, status = worked
    assert status.returncode == 0, status.stderr
    header, *rows = status.stdout.splitlines()
    assert header.split()[:6] == ["ID", "BACKEND", "MIN", "MAX", "TARGET", "INSTANCES"]
    general = next(r for r in rows if r.startswith(GENERAL)).split()
    assert general[1:5] == ["scw", "1", "4", "2"]  # 2 + 1 increased - 1 deleted
    assert general[-2].endswith("s")  # snapshot age
    assert "backend scw: SERVING (snapshot age" in status.stdout
