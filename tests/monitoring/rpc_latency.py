"""How long the server takes to answer each RPC, measured with fine buckets, and what a bucket set resolves.

``grpc_server_handling_seconds`` is only as useful as its buckets: with bounds that start above the
answers the server gives, every answer lands in the first bucket and a dashboard's p99 reads the first
bound, whatever the server does. This measures the real distribution and judges a bucket set against it:

1. the benchmark's simulated cluster (tests/bench/cluster.py) at each size;
2. our server in this process on each serving engine, with ``Metrics(grpc_buckets=FINE)``: 10 bounds per
   decade from 1 us to 20 s, both engines counting into them (the native engine counts its own answers);
3. the Go load client (tests/bench/loadclient, grpc-go) replaying the CA's loop for ``--loops`` loops,
   then a few size changes and deletions (``--changes``), which go to the cloud;
4. per method: calls, the 50th, 90th and 99th percentiles and the largest answer read from the fine
   histogram, and the 50th and 99th as Prometheus' ``histogram_quantile`` estimates them from the
   server's bounds (``GRPC_BUCKETS``) and, with ``--compare``, from other bounds.

    python -m tests.monitoring.rpc_latency                      # 1,000 and 5,000 nodes, both engines
    python -m tests.monitoring.rpc_latency --sizes 1000:100 --engines native --loops 10
    python -m tests.monitoring.rpc_latency --compare 0.0005,0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10

Needs ``make build`` (the load client). The server runs in this process (so the fine buckets need no
switch in the shipped server); the simulator too, idle between its syncs. docs/evidence/alerts.md has
a run and the choice it led to.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from devstack.clouds import scaleway_backend
from devstack.harness import open_channel, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from server import app
from server.config import parse
from server.metrics import GRPC_BUCKETS, Metrics
from tests.bench.cluster import node_list, start_cluster
from tests.support.gobuild import binary_path

CLOUD_PROVIDER = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
#: 10 bounds per decade, 1 us .. 20 s
FINE = tuple(float(f"{10 ** (k / 10 - 6):.3g}") for k in range(0, 74))
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class MethodLatency:
    method: str
    calls: int
    counts: tuple[float, ...]  # cumulative, per bound of FINE then +Inf

    def quantile(self, q: float, bounds: Sequence[float] = FINE) -> float:
        """``histogram_quantile(q)`` over ``bounds``, from the fine counts (re-bucketed when bounds differ)."""
        cumulative = [self.at_most(b) for b in bounds] + [float(self.calls)]
        return histogram_quantile(q, (*bounds, math.inf), cumulative)

    def at_most(self, bound: float) -> float:
        """Answers at or under ``bound`` (exact at a fine bound; a candidate bound between two fine ones
        counts the answers under the fine bound just below it)."""
        below = [i for i, b in enumerate(FINE) if b <= bound * (1 + 1e-9)]
        return self.counts[below[-1]] if below else 0.0

    def largest(self) -> float:
        """The upper bound of the highest non-empty fine bucket."""
        for bound, count in zip(FINE, self.counts, strict=False):
            if count >= self.calls:
                return bound
        return math.inf


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """Prometheus' estimate: linear interpolation inside the bucket the rank falls in."""
    total = cumulative[-1]
    if total == 0:
        return math.nan
    rank = q * total
    for i, (bound, count) in enumerate(zip(bounds, cumulative, strict=True)):
        if count >= rank:
            if math.isinf(bound):
                return bounds[i - 1] if i else math.nan
            lower = bounds[i - 1] if i else 0.0
            below = cumulative[i - 1] if i else 0.0
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
    return math.nan


def read_latencies(exposition: str) -> list[MethodLatency]:
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != "grpc_server_handling_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.labels["grpc_service"] == CLOUD_PROVIDER:
                buckets.setdefault(sample.labels["grpc_method"], {})[float(sample.labels["le"])] = sample.value
    found = []
    for method, by_bound in sorted(buckets.items()):
        calls = int(by_bound[math.inf])
        if calls:
            found.append(MethodLatency(method, calls, tuple(by_bound[b] for b in (*FINE, math.inf))))
    return found


def measure(engine: str, nodes: int, groups: int, loops: int, changes: int, workdir: Path) -> list[MethodLatency]:
    cluster = start_cluster(groups, nodes)
    try:
        raw = server_config([scaleway_backend(cluster.simulator, "scw-latency")], serving={"engine": engine})
        raw["log"] = {"format": "json", "level": "warning"}
        metrics = Metrics(grpc_buckets=FINE)
        running = app.start(parse(raw, env={}, base=workdir), metrics=metrics)
        try:
            address = f"127.0.0.1:{running.port}"
            nodes_file = workdir / f"nodes-{nodes}.json"
            nodes_file.write_text(json.dumps(node_list(cluster)))
            out = workdir / f"loadclient-{engine}-{nodes}.json"
            argv = [str(binary_path("loadclient")), "-nodes", str(nodes_file), "-loops", str(loops)]
            argv += ["-warmup", "1", "-target", f"ours={address}", "-out", str(out)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise SystemExit(f"load client failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
            _change_sizes(address, changes)
            return read_latencies(metrics.exposition().decode())
        finally:
            running.stop(grace=0.0)
    finally:
        cluster.stop()


def _change_sizes(address: str, changes: int) -> None:
    """Size changes and deletions, which the server sends to the cloud before it answers."""
    channel = open_channel(address)
    stub = pb_grpc.CloudProviderStub(channel)
    try:
        groups = [g for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=10).nodeGroups if g.maxSize > 1]
        for i in range(changes):
            group = groups[i % len(groups)]
            target = stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group.id), timeout=10).targetSize
            if target < group.maxSize:
                stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group.id, delta=1), timeout=10)
            instances = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group.id), timeout=10).instances
            if len(instances) > group.minSize:
                node = pb.ExternalGrpcNode(providerID=instances[-1].id)
                stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=group.id, nodes=[node]), timeout=10)
            time.sleep(0.2)
    finally:
        channel.close()


def _us(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "> 20 s"
    return f"{seconds * 1e6:,.0f} us" if seconds < 0.01 else f"{seconds * 1e3:,.1f} ms"


def table(results: list[MethodLatency], compare: Sequence[float] | None) -> list[str]:
    head = "| method | calls | p50 | p90 | p99 | largest | p50 / p99 from the server's bounds |"
    rule = "|---|---:|---:|---:|---:|---:|---|"
    if compare:
        head, rule = head + " p50 / p99 from the compared bounds |", rule + "---|"
    lines = [head, rule]
    for r in results:
        measured = " | ".join(_us(r.quantile(q)) for q in QUANTILES)
        estimates = [(r.quantile(0.5, b), r.quantile(0.99, b)) for b in (GRPC_BUCKETS, compare) if b]
        lines.append(
            f"| {r.method} | {r.calls:,} | {measured} | {_us(r.largest())} | "
            + " | ".join(f"{_us(p50)} / {_us(p99)}" for p50, p99 in estimates)
            + " |"
        )
    return lines


def _sizes(text: str) -> tuple[int, int]:
    nodes, _, groups = text.partition(":")
    return int(nodes), int(groups or 100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=_sizes, default=[(1000, 100), (5000, 100)])
    parser.add_argument("--engines", nargs="+", choices=("native", "grpcio"), default=["native", "grpcio"])
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--changes", type=int, default=20, help="size changes and deletions after the loops")
    parser.add_argument(
        "--compare",
        type=lambda text: tuple(float(b) for b in text.split(",")),
        default=None,
        help="comma-separated bucket bounds to judge beside the server's",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rpc-latency-"))
    print(f"the server's bounds: {', '.join(f'{b:g}' for b in GRPC_BUCKETS)}")
    if args.compare:
        print(f"compared bounds: {', '.join(f'{b:g}' for b in args.compare)}")
    for nodes, groups in args.sizes:
        for engine in args.engines:
            results = measure(engine, nodes, groups, args.loops, args.changes, workdir)
            print(f"\n{engine} engine, {nodes:,} nodes / {groups} groups, {args.loops} loops:\n")
            print("\n".join(table(results, args.compare)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
