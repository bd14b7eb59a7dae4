"""What the simulated clouds hold in the scenarios, and how a scenario reads a pool's machines."""

from __future__ import annotations

from typing import Any

from tests.e2e.environment import E2EEnvironment, Layout, bizfly_pool, scaleway_pool

POOL_LABEL = {"scaleway": "k8s.scaleway.com/pool-name", "bizfly": "bke.bizflycloud.vn/pool-name"}


def machines(env: E2EEnvironment, cloud: str, pool: str) -> list[dict[str, str]]:
    """``{id, name, provider_id}`` of every machine of a pool, whatever the cloud's own format."""
    if cloud == "scaleway":
        return [{"id": n["id"], "name": n["name"], "provider_id": n["provider_id"]} for n in env.scaleway_nodes(pool)]
    return [
        {"id": n["id"], "name": n["k8s"]["name"], "provider_id": n["k8s"]["provider_id"]}
        for n in env.bizfly_nodes(pool)
    ]


def pool_size(env: E2EEnvironment, cloud: str, pool: str) -> int:
    if cloud == "scaleway":
        return int(env.scaleway_pool(pool)["size"])
    return int(env.bizfly_pool(pool)["desired_size"])


def all_running(env: E2EEnvironment, cloud: str, pool: str) -> bool:
    if cloud == "scaleway":
        return all(n["status"] == "ready" for n in env.scaleway_nodes(pool))
    return all(n["phase"] == "running" for n in env.bizfly_nodes(pool))


def two_clouds(scaleway: list[dict[str, Any]], bizfly: list[dict[str, Any]]) -> Layout:
    return Layout(scaleway_pools=scaleway, bizfly_pools=bizfly)


# One busy machine per cloud: a pinned pod takes most of its CPU, so the next pod needs a new machine.
SCALE_UP = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 4)],  # 3 CPUs allocatable
    [bizfly_pool("general", "nix.2c_4g", 1, 1, 4)],  # 1.9 CPUs allocatable
)
FILLER_CPU = {"scaleway": "2", "bizfly": "1500m"}
APP_CPU = {"scaleway": "2", "bizfly": "1"}
