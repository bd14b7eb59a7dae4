"""The two simulated clouds as ``CloudKit``s: simulator set-up, backend config, ground-truth reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from devstack.clouds import bizfly_backend, scaleway_backend
from tests.reliability.harness import NodeView, PoolSpec, PoolView

BIZFLY_CLUSTER = "kerel1abilitytest"
BIZFLY_EMAIL = "ops@example.com"
BIZFLY_PASSWORD_ENV = "RELIABILITY_BIZFLY_PASSWORD"
SCALEWAY_CLUSTER = "7a1f3c2e-4b5d-4e6f-8a9b-0c1d2e3f4a5b"
SCALEWAY_SECRET_ENV = "RELIABILITY_SCW_SECRET"

_BIZFLY_PHASES = {"running": "running", "creating": "creating", "deleting": "deleting", "failed": "failed"}


class BizflyKit:
    name = "bizfly"
    update_route = "update_pool"
    delete_route = "delete_node"
    read_routes = ("get_cluster", "get_pool", "list_clusters", "service_catalog")
    auth_routes = ("token",)

    def make_sim(self, pools: Sequence[PoolSpec], secret: str, **scenario_extra: Any) -> Any:
        from simulators.bizfly.simulator import BizflySimulator

        scenario = {
            "account": {"users": {BIZFLY_EMAIL: secret}},
            "timings": {"provision_seconds": 60, "delete_seconds": 30},
            "clusters": [
                {
                    "uid": BIZFLY_CLUSTER,
                    "name": "reliability",
                    "pools": [
                        {
                            "name": p.name,
                            "flavor": "nix.2c_4g",
                            "min_size": p.min_size,
                            "max_size": p.max_size,
                            "desired_size": p.size,
                            "nodes": p.size,
                        }
                        for p in pools
                    ],
                }
            ],
            **scenario_extra,
        }
        return BizflySimulator(scenario=scenario)

    def backend_entry(self, sim: Any, secret: str, name: str = "") -> dict[str, Any]:
        return bizfly_backend(sim, name or "bizfly", email=BIZFLY_EMAIL, password_env=BIZFLY_PASSWORD_ENV)

    def env(self, secret: str) -> dict[str, str]:
        return {BIZFLY_PASSWORD_ENV: secret}

    def pools(self, sim: Any) -> dict[str, PoolView]:
        out: dict[str, PoolView] = {}
        for cluster in sim.snapshot()["clusters"]:
            for pool in cluster["worker_pools"]:
                nodes = tuple(
                    NodeView(
                        provider_id=node["k8s"]["provider_id"],
                        name=node["k8s"]["name"],
                        phase=_BIZFLY_PHASES.get(node["phase"], "other"),
                    )
                    for node in pool["nodes"]
                )
                out[pool["id"]] = PoolView(pool["id"], pool["min_size"], pool["max_size"], pool["desired_size"], nodes)
        return out


_SCALEWAY_PHASES = {
    "ready": "running",
    "creating": "creating",
    "starting": "creating",
    "registering": "creating",
    "not_ready": "creating",
    "upgrading": "creating",
    "rebooting": "creating",
    "deleting": "deleting",
    "deleted": "deleting",
    "creation_error": "failed",
}


class ScalewayKit:
    name = "scaleway"
    update_route = "update_pool"
    delete_route = "delete_node"
    read_routes = ("list_pools", "list_nodes")
    auth_routes: tuple[str, ...] = ()

    def make_sim(self, pools: Sequence[PoolSpec], secret: str, **scenario_extra: Any) -> Any:
        from simulators.scaleway.simulator import ScalewaySimulator

        scenario = {
            "seed": 7,
            "timings": {"creating": 20, "starting": 20, "registering": 20, "deleting": 30},
            "clusters": [
                {
                    "id": SCALEWAY_CLUSTER,
                    "name": "reliability",
                    "pools": [
                        {
                            "name": p.name,
                            "node_type": "DEV1-M",
                            "size": p.size,
                            "min_size": p.min_size,
                            "max_size": p.max_size,
                            "nodes": p.size,
                        }
                        for p in pools
                    ],
                }
            ],
            **scenario_extra,
        }
        return ScalewaySimulator(scenario=scenario, secret_key=secret)

    def backend_entry(self, sim: Any, secret: str, name: str = "") -> dict[str, Any]:
        return scaleway_backend(sim, name or "scw", secret_key_env=SCALEWAY_SECRET_ENV)

    def env(self, secret: str) -> dict[str, str]:
        return {SCALEWAY_SECRET_ENV: secret}

    def pools(self, sim: Any) -> dict[str, PoolView]:
        snapshot = sim.state.snapshot()
        nodes: dict[str, list[NodeView]] = {}
        for node in snapshot["nodes"]:
            view = NodeView(node["provider_id"], node["name"], _SCALEWAY_PHASES.get(node["status"], "other"))
            nodes.setdefault(node["pool_id"], []).append(view)
        return {
            pool["id"]: PoolView(
                pool["id"], pool["min_size"], pool["max_size"], pool["size"], tuple(nodes.get(pool["id"], ()))
            )
            for pool in snapshot["pools"]
            if pool["autoscaling"]
        }
