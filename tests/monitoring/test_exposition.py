"""The gRPC server series are the same on both serving engines: names, labels, ``grpc_code`` values as
go-grpc-prometheus writes them, and the buckets of ``grpc_server_handling_seconds``.

The native engine counts the calls it answers itself into the bounds Python hands it
(``Metrics.grpc_buckets``) and reports them as OK; Python adds them to its own series
(server/metrics.py). The same calls go to a server on each engine, and the two scrapes are compared.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.harness import running_stack
from protos import externalgrpc_pb2 as pb
from server.metrics import GRPC_BUCKETS
from tests.integration.test_server_rpcs import GENERAL, SCENARIO

SERVER_FAMILIES = ("grpc_server_started", "grpc_server_handled", "grpc_server_handling_seconds")


def served(tmp_path: Path, engine: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """The label sets of every gRPC server sample after the same calls, on ``engine``."""
    with running_stack(tmp_path / engine, scaleway=SCENARIO, server_extra={"serving": {"engine": engine}}) as stack:
        for _ in range(3):
            stack.groups()
            stack.target(GENERAL)
            stack.instances(GENERAL)
        with pytest.raises(grpc.RpcError):
            stack.target("no-such-group")  # NotFound
        with pytest.raises(grpc.RpcError):
            stack.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GENERAL, delta=100), timeout=5)
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.in_process.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    samples: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in SERVER_FAMILIES:
            for sample in family.samples:
                if sample.labels.get("grpc_service", "").startswith("clusterautoscaler."):
                    samples.setdefault(sample.name, set()).add(tuple(sorted(sample.labels.items())))
    return samples


def test_both_engines_write_the_same_series_codes_and_buckets(tmp_path: Path) -> None:
    native, grpcio = served(tmp_path, "native"), served(tmp_path, "grpcio")
    assert native == grpcio
    codes = {dict(labels)["grpc_code"] for labels in native["grpc_server_handled_total"]}
    assert codes == {"OK", "NotFound", "FailedPrecondition"}  # grpc-go's spelling, not NOT_FOUND
    bounds = {dict(labels)["le"] for labels in native["grpc_server_handling_seconds_bucket"]}
    assert sorted(float(b) for b in bounds) == [*GRPC_BUCKETS, float("inf")]
    assert min(GRPC_BUCKETS) <= 0.000005  # the native engine's reads: 2-10 us (docs/evidence/alerts.md)
