"""What an operator sees after a real workload: /metrics, the JSON log lines, the status command, and
the PromQL of deploy/monitoring checked against that real scrape."""

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
from prometheus_client.parser import text_string_to_metric_families

from devstack.harness import SCW_SECRET, running_stack
from protos import externalgrpc_pb2 as pb
from providers.errors import DomainError
from server.logs import configure_logging
from simulators.common import Fault
from tests.deploy import promql
from tests.integration.test_server_rpcs import GENERAL, SCENARIO, SMALL

ROOT = Path(__file__).resolve().parents[2]
#: fields every JSON line has, as the Kubernetes component-base JSON logger (the CA's) writes them
KUBERNETES_FIELDS = ("ts", "caller", "msg")


@pytest.fixture(scope="module")
def worked(tmp_path_factory):
    """A server that served reads, an increase, a deletion, a refused call, retried cloud calls
    (a 429 and a 503), one failed sync and a size write the cloud refused with 503; its /metrics, its
    log (at debug), `status`, and the statuses the simulated cloud answered."""
    stream = io.StringIO()
    root = logging.getLogger()
    level, urllib3_level = root.level, logging.getLogger("urllib3").level
    handler = configure_logging("json", "debug", stream=stream)
    try:
        with running_stack(tmp_path_factory.mktemp("ops"), scaleway=SCENARIO) as stack:
            stack.groups()
            stack.target(GENERAL)
            stack.instances(GENERAL)
            stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=5)
            pid = sorted(n.provider_id for n in stack.scaleway.nodes_of(GENERAL) if n.provider_id)[0]
            stack.stub.NodeGroupDeleteNodes(
                pb.NodeGroupDeleteNodesRequest(id=GENERAL, nodes=[pb.ExternalGrpcNode(providerID=pid)]), timeout=5
            )
            with pytest.raises(grpc.RpcError):
                stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=SMALL, delta=50), timeout=5)
            stack.scaleway.faults.add(Fault(route="*", status=429, retry_after=0, times=1))
            stack.scaleway.faults.add(Fault(route="*", status=503, times=1))
            stack.sync()  # retried past the 429 and the 503
            stack.scaleway.faults.add(Fault(route="*", status=503))
            with pytest.raises(DomainError):
                stack.sync()  # every attempt fails: a failed sync
            with pytest.raises(grpc.RpcError) as refused:  # the size write meets the 503 too
                stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=1), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            stack.scaleway.faults.clear()
            statuses = [r.status for r in stack.scaleway.requests.all()]
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
            yield metrics, stream.getvalue(), status, statuses
    finally:
        # Root left at debug would make every later in-process native server hand all calls to Python.
        root.removeHandler(handler)
        root.setLevel(level)
        logging.getLogger("urllib3").setLevel(urllib3_level)


def samples(metrics: str, family: str) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith(family)]


def log_lines(logs: str) -> list[dict]:
    return [json.loads(line) for line in logs.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# /metrics


def test_metrics_carry_grpc_cloud_group_and_action_families(worked):
    metrics, _, _, _ = worked
    assert any(
        'grpc_method="NodeGroupIncreaseSize"' in s and 'grpc_code="OK"' in s
        for s in samples(metrics, "grpc_server_handled_total")
    )
    assert any('grpc_code="FailedPrecondition"' in s for s in samples(metrics, "grpc_server_handled_total"))
    assert samples(metrics, "grpc_server_started_total{")
    assert samples(metrics, "grpc_server_handling_seconds_bucket{")
    cloud = samples(metrics, "ca_externalgrpc_cloud_api_requests_total{")
    assert any('api="scaleway"' in s and 'status="200"' in s for s in cloud)
    assert any('status="503"' in s for s in cloud) and any('status="429"' in s for s in cloud)
    assert samples(metrics, "ca_externalgrpc_cloud_api_retries_total{")
    assert any(f'node_group="{GENERAL}"' in s for s in samples(metrics, "ca_externalgrpc_node_group_target_size{"))
    assert any('state="running"' in s for s in samples(metrics, "ca_externalgrpc_node_group_instances{"))
    assert samples(metrics, 'ca_externalgrpc_snapshot_age_seconds{backend="scw"}')
    assert samples(metrics, 'ca_externalgrpc_snapshot_stale{backend="scw"} 0.0')
    actions = samples(metrics, "ca_externalgrpc_scale_actions_total{")
    assert any('action="increase"' in s and 'result="ok"' in s for s in actions)
    assert any('action="delete"' in s for s in actions)
    assert any('action="increase"' in s and 'result="error"' in s for s in actions)
    assert samples(metrics, 'ca_externalgrpc_sync_errors_total{backend="scw"} 1.0')
    assert SCW_SECRET not in metrics


def test_every_cloud_series_carries_the_backend_and_endpoints_are_names_not_urls(worked):
    metrics, _, _, _ = worked
    cloud = [line for line in metrics.splitlines() if line.startswith("ca_externalgrpc_cloud_api_")]
    assert cloud and all('backend="scw"' in line for line in cloud)
    assert not re.search(r'endpoint="[^"]*[0-9a-f]{8}-[0-9a-f]{4}', metrics)  # templates, never ids


def test_breaker_state_is_one_series_per_state(worked):
    metrics, _, _, _ = worked
    breaker = samples(metrics, "ca_externalgrpc_cloud_api_circuit_breaker_state{")
    assert sorted(re.search(r'state="([^"]+)"', s).group(1) for s in breaker) == ["closed", "half-open", "open"]
    assert [s for s in breaker if s.endswith(" 1.0")] == [s for s in breaker if 'state="closed"' in s], (
        "the breaker is closed after the cloud recovered"
    )


def test_process_metrics_build_info_and_no_created_series(worked):
    metrics, _, _, _ = worked
    rss = samples(metrics, "process_resident_memory_bytes ")
    assert rss and float(rss[0].split()[1]) > 10_000_000
    assert samples(metrics, "process_cpu_seconds_total ")
    assert samples(metrics, "process_open_fds ")
    (info,) = samples(metrics, "ca_externalgrpc_build_info{")
    assert re.search(r'version="[^"]+"', info) and 'python="3.' in info and 'grpcio="1.' in info
    assert "_created" not in metrics


# ---------------------------------------------------------------------------------------------------
# The PromQL of deploy/monitoring against this scrape


@pytest.mark.parametrize("query", promql.all_queries(), ids=lambda q: q.where)
def test_monitoring_promql_matches_what_the_server_exports(worked, query):
    metrics, _, _, _ = worked
    assert promql.problems(query, promql.Scrape.parse(metrics)) == []


# ---------------------------------------------------------------------------------------------------
# Logs


def test_every_log_line_has_the_kubernetes_json_fields_and_no_secret(worked):
    _, logs, _, _ = worked
    lines = log_lines(logs)
    assert lines
    for line in lines:
        assert set(KUBERNETES_FIELDS) <= set(line), line
        assert isinstance(line["ts"], float)
        assert re.fullmatch(r"[\w.-]+/[\w.-]+\.py:\d+", line["caller"]), line["caller"]
        assert line.get("v", 0) in (0, 4)  # klog verbosity: info 0, debug 4; error lines have none
        assert "level" not in line and "grpc_method" not in line  # camelCase keys, no level field
    assert SCW_SECRET not in logs


def test_rpc_lines_name_the_call_its_code_and_its_group(worked):
    _, logs, _, _ = worked
    lines = log_lines(logs)
    mutations = [line for line in lines if line.get("grpcMethod") == "NodeGroupIncreaseSize"]
    assert {m["result"] for m in mutations} == {"ok", "error"}
    for m in mutations:
        assert m["logger"] == "server.rpc" and m["v"] == 0
        assert {"nodeGroup", "delta", "durationMs", "grpcCode"} <= set(m)
    assert any(line.get("grpcMethod") == "NodeGroupDeleteNodes" and line["v"] == 0 for line in lines)
    reads = [line for line in lines if line.get("grpcMethod") == "NodeGroupTargetSize"]
    assert reads and all(r["v"] == 4 for r in reads)  # reads log at debug


def test_each_cloud_attempt_is_one_line_and_a_retry_is_not_logged_twice(worked):
    _, logs, _, statuses = worked
    lines = log_lines(logs)
    attempts = [line for line in lines if line.get("logger") == "providers.http"]
    assert not any(line["msg"].startswith("retrying") for line in attempts)
    for code in (429, 503):
        logged = [a for a in attempts if a["status"] == str(code)]
        assert len(logged) == statuses.count(code), f"{code}: one line per attempt the cloud answered"
    retried = [a for a in attempts if "retryInSeconds" in a]
    assert retried and all("; retrying in " in a["msg"] and a["backend"] == "scw" for a in retried)
    assert any("giving up after" in a["msg"] for a in attempts)
    ok = [a for a in attempts if a["status"] == "200"]
    assert ok and all(a["v"] == 4 and {"api", "endpoint", "method", "attempt", "durationMs"} <= set(a) for a in ok)


def test_a_failed_sync_is_one_warning_with_the_clouds_error(worked):
    _, logs, _, _ = worked
    (failed,) = [line for line in log_lines(logs) if line["msg"].startswith("cloud sync failed")]
    assert failed["backend"] == "scw" and failed["v"] == 0 and "503" in failed["err"]


# ---------------------------------------------------------------------------------------------------
# status


def test_status_command_prints_groups_sizes_and_backend_health(worked):
    _, _, status, _ = worked
    assert status.returncode == 0, status.stderr
    header, *rows = status.stdout.splitlines()
    assert header.split()[:7] == ["ID", "NAME", "BACKEND", "MIN", "MAX", "TARGET", "INSTANCES"]
    general = next(r for r in rows if r.startswith(GENERAL)).split()
    assert general[1] == "general"  # the pool's name in the console, next to the UUID the CA uses
    assert general[2:6] == ["scw", "1", "4", "2"]  # 2 + 1 increased - 1 deleted
    assert general[-3].endswith("s")  # snapshot age
    assert general[-2] == "cloud"  # the template's source: no override, nothing learned
    assert "backend scw (scaleway): healthy, serving, 3 group(s), snapshot age " in status.stdout


def test_the_metrics_reference_documents_exactly_the_families_the_server_exports(worked):
    """docs/reference/metrics.md is generated from a fresh registry (make reference); a real scrape after a
    workload, the native engine's calls included, shows no family it lacks and lacks none it lists (but
    those of the Kubernetes features, which this server does not switch on)."""
    metrics, _, _, _ = worked
    rows = [line for line in (ROOT / "docs" / "reference" / "metrics.md").read_text().splitlines()]
    # Counters are documented with their _total suffix; the parser names the family without it.
    # The families of the optional Kubernetes features (a last column naming the feature's key) are
    # registered only when it is on; this server runs with none.
    documented = {
        m.group(1).removesuffix("_total")
        for row in rows
        if (m := re.match(r"\| `([a-z_]+)` \|", row)) and not re.search(r"\| `kubernetes\.[a-z_]+` \|$", row)
    }
    exported = {family.name for family in text_string_to_metric_families(metrics)}
    assert not exported - documented, f"exported but not in docs/reference/metrics.md: {sorted(exported - documented)}"
    assert not documented - exported, f"documented but not exported: {sorted(documented - exported)}"
