"""Soak: the CA's call pattern at 5,000 nodes / 100 groups, with faults, for a bounded time.

The server runs as a child process (``ca-externalgrpc serve``) so its resident memory can be read
from /proc; the Scaleway simulator runs in the test process on a manual clock that moves 10 s per
CA loop. Each loop replays what the CA does every ``--scan-interval``: Refresh, NodeGroups,
TargetSize for every group, Nodes for every group (concurrently, like the CA's per-group
goroutines), NodeGroupForNode for many nodes, GetOptions and TemplateNodeInfo, and a few scale-ups
and deletions. Every few loops a fault hits the cloud: 5xx bursts on the sync's reads, 429 with
Retry-After on writes, a write that answers after the caller's deadline, a dropped connection.

Checks: no DEADLINE_EXCEEDED, no UNKNOWN/INTERNAL; reads never fail (they are served from memory,
faults or not); mutation errors are only the retryable/refusal codes; pools stay within bounds; the
server's RSS does not keep growing. The short run is part of ``make test``; ``make soak`` runs the
long one (``-m soak --soak-seconds=600``).
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from devstack.harness import ServerProcess
from protos import externalgrpc_pb2 as pb
from simulators.common.faults import Fault
from simulators.scaleway.scenarios import generated_cluster
from simulators.scaleway.simulator import ScalewaySimulator
from tests.reliability.clouds import ScalewayKit
from tests.reliability.harness import server_raw_config
from tests.reliability.report import publish

POOLS = 100
NODES = 5_000
SHORT_SECONDS = 20.0
SECRET = "soak-secret-0f3e2d1c-b4a5-4c6d-8e7f-9a0b1c2d3e4f"
READS = frozenset(
    {"Refresh", "NodeGroups", "NodeGroupTargetSize", "NodeGroupNodes", "NodeGroupForNode", "NodeGroupGetOptions"}
)
MUTATIONS = frozenset({"NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "NodeGroupDecreaseTargetSize"})
# Memory may grow while caches fill (prebuilt messages per group, observed labels); after the warm-up
# loops it must level off. Both bounds are generous for CPython's allocator, tight for a real leak.
WARMUP_LOOPS = 3
MAX_GROWTH_KIB_SHORT = 48 * 1024
MAX_GROWTH_FRACTION_LONG = 0.25


@dataclass
class SoakFigures:
    loops: int = 0
    rpcs: int = 0
    codes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    faults_injected: collections.Counter[str] = field(default_factory=collections.Counter)
    rss_kib: list[int] = field(default_factory=list)
    worst_seconds: float = 0.0

    def errors(self, methods: frozenset[str] | None = None) -> int:
        return sum(n for (m, c), n in self.codes.items() if c != "OK" and (methods is None or m in methods))


class CaLoop:
    """One CA: a stub, a thread pool for the per-group fan-out, and the figures of what it saw."""

    def __init__(self, stub: object, figures: SoakFigures) -> None:
        self.stub = stub
        self.figures = figures
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ca-nodes")

    def call(self, method: str, request: object, timeout: float = 5.0) -> grpc.StatusCode:
        started = time.monotonic()
        try:
            getattr(self.stub, method)(request, timeout=timeout)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
        self.figures.worst_seconds = max(self.figures.worst_seconds, time.monotonic() - started)
        self.figures.rpcs += 1
        self.figures.codes[(method, code.name)] += 1
        return code

    def fan_out(self, method: str, requests: list[object]) -> None:
        list(self.pool.map(lambda r: self.call(method, r), requests))


def _inject_fault(sim: ScalewaySimulator, loop: int, figures: SoakFigures) -> Callable[[CaLoop, str], None] | None:
    """Every 3rd loop one fault; returns an extra action for faults that need a mutation to bite."""
    kind = (loop // 3) % 5
    if loop % 3:
        return None
    if kind == 0:
        for route in ("list_pools", "list_nodes"):
            sim.faults.add(Fault(route=route, status=503, times=6))
        figures.faults_injected["503 burst on the sync's reads"] += 1
        return None
    if kind == 1:
        sim.faults.add(Fault(route="update_pool", status=429, retry_after=0.0, times=2))
        figures.faults_injected["429 + Retry-After on writes"] += 1
        return None
    if kind == 2:
        sim.faults.add(Fault(route="update_pool", delay=1.2, times=1))
        figures.faults_injected["write answered after the deadline"] += 1

        def late(ca: CaLoop, gid: str) -> None:
            ca.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=gid, delta=1), timeout=1.0)
            ca.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=gid, delta=1))  # the retry

        return late
    if kind == 3:
        sim.faults.add(Fault(route="delete_node", drop=True, times=1))
        figures.faults_injected["dropped connection on delete"] += 1
        return None
    sim.faults.add(Fault(route="*", status=500, times=4))
    figures.faults_injected["500 on every route"] += 1
    return None


def run_soak(seconds: float, workdir: Path) -> SoakFigures:
    kit = ScalewayKit()
    scenario = generated_cluster(POOLS, NODES, seed=11)
    scenario["timings"] = {"creating": 20, "starting": 20, "registering": 20, "deleting": 30}
    sim = ScalewaySimulator(scenario=scenario, secret_key=SECRET).start()
    entry = {**kit.backend_entry(sim, SECRET), "sync": {"interval": "2s", "min_interval": "1s", "max_staleness": "10m"}}
    server = ServerProcess(server_raw_config([entry]), kit.env(SECRET), workdir)
    figures = SoakFigures()
    rng = random.Random(5)
    ca = CaLoop(server.stub, figures)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end or figures.loops <= WARMUP_LOOPS:
            pools = kit.pools(sim)
            groups = sorted(pools)
            extra = _inject_fault(sim, figures.loops, figures)
            ca.call("Refresh", pb.RefreshRequest())
            ca.call("NodeGroups", pb.NodeGroupsRequest())
            for gid in groups:
                ca.call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=gid))
            ca.fan_out("NodeGroupNodes", [pb.NodeGroupNodesRequest(id=gid) for gid in groups])
            nodes = [n for p in pools.values() for n in p.live()]
            for node in rng.sample(nodes, min(1_000, len(nodes))):
                labels = {"k8s.scaleway.com/pool-name": "x", "kubernetes.io/hostname": node.name}
                request = pb.NodeGroupForNodeRequest(
                    node=pb.ExternalGrpcNode(providerID=node.provider_id, name=node.name, labels=labels)
                )
                ca.call("NodeGroupForNode", request)
            for gid in rng.sample(groups, 30):
                ca.call("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest(id=gid))
                ca.call("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id=gid))
            for gid in rng.sample(groups, 3):
                ca.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=gid, delta=rng.randint(1, 2)))
            for gid in rng.sample(groups, 3):
                running = pools[gid].live("running")
                if running:
                    node = rng.choice(running)
                    request = pb.NodeGroupDeleteNodesRequest(
                        id=gid, nodes=[pb.ExternalGrpcNode(providerID=node.provider_id, name=node.name)]
                    )
                    ca.call("NodeGroupDeleteNodes", request)
            ca.call("NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=groups[0], delta=-1))
            if extra is not None:
                extra(ca, rng.choice(groups))
            sim.faults.clear()
            sim.advance(10.0)
            figures.loops += 1
            figures.rss_kib.append(server.rss_kib())
        for gid, pool in kit.pools(sim).items():
            assert pool.min_size <= pool.target <= pool.max_size, (gid, pool.target)
    finally:
        ca.pool.shutdown(wait=True)
        code = server.stop()
        sim.stop()
    assert code == 0, f"server exited with {code} after SIGTERM:\n{server.output[-3000:]}"
    return figures


def _check_and_publish(figures: SoakFigures, label: str, seconds: float) -> int:
    warm, last = figures.rss_kib[WARMUP_LOOPS - 1], figures.rss_kib[-1]
    codes: collections.Counter[str] = collections.Counter()
    for (_method, code), n in figures.codes.items():
        codes[code] += n
    publish(
        f"soak ({label}, {seconds:.0f}s, {POOLS} groups / {NODES} nodes): {figures.loops} CA loops, "
        f"{figures.rpcs} RPCs served, faults injected "
        + ", ".join(f"{k}={v}" for k, v in sorted(figures.faults_injected.items()))
        + f"; errors returned {figures.errors()} ("
        + ", ".join(f"{k}={v}" for k, v in sorted(codes.items()) if k != "OK")
        + f"), read errors {figures.errors(READS)}; slowest answer {figures.worst_seconds:.2f}s; "
        f"server RSS start (after {WARMUP_LOOPS} warm-up loops) {warm / 1024:.1f} MiB, "
        f"end {last / 1024:.1f} MiB, peak {max(figures.rss_kib) / 1024:.1f} MiB"
    )
    assert figures.codes, "the soak made no calls"
    bad = {k: n for k, n in figures.codes.items() if k[1] in ("DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL")}
    assert not bad, bad
    read_errors = {k: n for k, n in figures.codes.items() if k[0] in READS and k[1] != "OK"}
    assert not read_errors, f"reads are served from memory and must not fail: {read_errors}"
    mutation_codes = {k[1] for k in figures.codes if k[0] in MUTATIONS}
    assert mutation_codes <= {"OK", "UNAVAILABLE", "FAILED_PRECONDITION"}, mutation_codes
    assert figures.faults_injected, "no fault was injected"
    return last - warm


def test_soak_short(tmp_path: Path) -> None:
    figures = run_soak(SHORT_SECONDS, tmp_path)
    growth = _check_and_publish(figures, "short", SHORT_SECONDS)
    assert growth < MAX_GROWTH_KIB_SHORT, f"server RSS grew {growth / 1024:.1f} MiB in {SHORT_SECONDS:.0f}s"


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak_long(tmp_path: Path, soak_seconds: float) -> None:
    figures = run_soak(soak_seconds, tmp_path)
    growth = _check_and_publish(figures, "long", soak_seconds)
    # Compare the second half with the first: a leak keeps climbing, a cache levels off.
    half = len(figures.rss_kib) // 2
    first, second = figures.rss_kib[WARMUP_LOOPS - 1], figures.rss_kib[half]
    assert growth <= max(MAX_GROWTH_KIB_SHORT, MAX_GROWTH_FRACTION_LONG * first), growth
    assert figures.rss_kib[-1] - second <= max(second - first, 16 * 1024), figures.rss_kib[::10]
