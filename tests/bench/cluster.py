"""The simulated cluster a benchmark runs against, and the node list the load client replays.

Every server under test gets a ``ScalewaySimulator`` of its own, built from the same seeded scenario,
so all of them see the same pools and nodes (same ids) and every request in a simulator's log was
sent by that simulator's server: the counts need no guess about who sent what.

``generated_cluster`` fills every pool; a tenth of the pools are emptied here (their nodes moved to
the others, so the node count stays as asked) because the CA asks ``TemplateNodeInfo`` only for groups
without usable nodes, and a loop that never asks for a template would leave that path unmeasured.
One more pool has autoscaling turned off and holds ``UNMANAGED_SHARE`` of the nodes: the nodes of no
node group, which the CA asks about again and again in every loop because an empty answer is never
cached by its client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulators.common.clock import WallClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.scenarios import generated_cluster

BENCH_SECRET_KEY = "bench-secret-key"
BENCH_REGION = "fr-par"
EMPTY_POOL_EVERY = 10  # every 10th pool starts at size 0 (scale-from-zero candidates)
UNMANAGED_SHARE = 0.05  # nodes in a pool with autoscaling off (a fixed "system" pool)
UNMANAGED_POOL = "system-fixed"
# The real Kapsule API sends no Cache-Control on its lists (docs/reference/scaleway.md, "Evidence"), and the simulator
# follows it by default. Without one, the upstream provider re-lists every 60 s and ours every 30 s (its
# default sync interval), so the two would not read the cloud on the same cadence. The benchmark names the
# earlier simulator's 30 s max-age, which both servers follow, so each re-lists at the same loop and their
# figures stay comparable with each other and with earlier runs (docs/explanation/performance.md, "Cloud
# requests and freshness").
BENCH_MAX_AGE_SECONDS = 30

# Annotations a kubelet-registered node typically carries; the CA sends all of them in every
# NodeGroupForNode request, so they are part of the request size both servers must decode.
NODE_ANNOTATIONS = {
    "node.alpha.kubernetes.io/ttl": "0",
    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    "csi.volume.kubernetes.io/nodeid": '{"csi.scaleway.com":"fr-par-1/00000000-0000-0000-0000-000000000000"}',
}


def unmanaged_count(nodes: int) -> int:
    """How many of ``nodes`` belong to no node group (none in clusters too small to spare them)."""
    return int(nodes * UNMANAGED_SHARE)


def bench_scenario(pools: int, nodes: int, seed: int = 0) -> dict[str, Any]:
    """``generated_cluster`` with every ``EMPTY_POOL_EVERY``-th pool emptied and a fixed pool added.

    ``pools`` counts the autoscaled pools (the node groups); ``nodes`` counts every node, those of the
    fixed pool included.
    """
    unmanaged = unmanaged_count(nodes)
    scenario = generated_cluster(pools=pools, nodes=nodes - unmanaged, seed=seed)
    pool_list = scenario["clusters"][0]["pools"]
    empty = [p for i, p in enumerate(pool_list) if i % EMPTY_POOL_EVERY == EMPTY_POOL_EVERY - 1]
    filled = [p for p in pool_list if p not in empty]
    if not filled:  # a single pool cannot be both empty and hold the nodes
        empty = []
        filled = pool_list
    moved = sum(p["nodes"] for p in empty)
    for pool in empty:
        pool["size"] = pool["nodes"] = 0
        pool["max_size"] = max(pool["max_size"], 10)
    base, extra = divmod(moved, len(filled))
    for index, pool in enumerate(filled):
        pool["nodes"] += base + (1 if index < extra else 0)
        pool["size"] = pool["nodes"]
        pool["max_size"] = max(pool["max_size"], pool["size"] * 2, pool["size"] + 10)
    if unmanaged:
        pool_list.append(
            {
                "name": UNMANAGED_POOL,
                "node_type": "DEV1-M",
                "size": unmanaged,
                "min_size": unmanaged,
                "max_size": unmanaged,
                "autoscaling": False,
                "nodes": unmanaged,
            }
        )
    scenario["secret_key"] = BENCH_SECRET_KEY
    scenario["behaviour"] = {"cache_max_age": BENCH_MAX_AGE_SECONDS}
    return scenario


@dataclass(frozen=True)
class BenchCluster:
    """One simulator holding the benchmark cluster, serving one server under test."""

    simulator: ScalewaySimulator
    cluster_id: str
    pools: int  # node groups (autoscaled pools)
    nodes: int  # every node, the unmanaged ones included
    empty_pools: int
    unmanaged_nodes: int

    @property
    def url(self) -> str:
        return self.simulator.url

    def stop(self) -> None:
        self.simulator.stop()


def start_cluster(pools: int, nodes: int, seed: int = 0) -> BenchCluster:
    """Start a wall-clock simulator on 127.0.0.1 holding the benchmark cluster."""
    scenario = bench_scenario(pools, nodes, seed)
    simulator = ScalewaySimulator(scenario, clock=WallClock(), secret_key=BENCH_SECRET_KEY, region=BENCH_REGION).start()
    autoscaled = [p for p in scenario["clusters"][0]["pools"] if p.get("autoscaling", True)]
    empty = sum(1 for p in autoscaled if p["size"] == 0)
    return BenchCluster(simulator, simulator.cluster_id, pools, nodes, empty, unmanaged_count(nodes))


def node_list(cluster: BenchCluster) -> list[dict[str, Any]]:
    """The Kubernetes nodes as the CA would present them: providerID, name, labels, annotations."""
    state = cluster.simulator.state
    with state.lock:
        result = []
        for node in state.nodes.values():
            labels = state.kubernetes_labels(node)
            result.append(
                {"providerID": node.provider_id, "name": node.name, "labels": labels, "annotations": NODE_ANNOTATIONS}
            )
    return result
