"""Scenarios: the declarative description of a simulated Kapsule account (dict or YAML).

```yaml
region: fr-par            # default region of clusters that do not name one
seed: 7                   # ids generated from this seed are reproducible
timings: {creating: 30, starting: 30, registering: 20, not_ready: 0, deleting: 30, deleted_kept: 0,
          scale_down_settle: 1}
behaviour: {enforce_size_bounds: true, repeated_delete: idempotent}  # every knob: state.Behaviour
# the defaults follow the real API's public evidence; a scenario names an earlier model explicitly, e.g.
# {cache_max_age: 30, error_shapes: typed, provider_id_at_creation: true, node_type_spelling: as_given}
clusters:
  - id: 6f1c...           # optional, generated when absent
    name: demo
    pools:
      - {name: general, node_type: DEV1-M, size: 2, min_size: 1, max_size: 5, autoscaling: true,
         taints: {dedicated: "infra:NoSchedule"}, labels: {team: a},
         default_labels: false,  # true: the well-known node labels under `labels` (recorded pools: `labels` alone)
         nodes: 2}         # a count of ready nodes, a list of {status, id, provider_id, name}, or absent (= size)
```
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import yaml

from simulators.scaleway.catalog import NODE_TYPES
from simulators.scaleway.state import ScalewayState, ScenarioError, behaviour_from, timings_from

TOP_LEVEL_KEYS = {"region", "seed", "secret_key", "timings", "behaviour", "clusters"}
CLUSTER_KEYS = {"id", "name", "region", "pools"}
POOL_KEYS = {
    "id",
    "name",
    "node_type",
    "size",
    "min_size",
    "max_size",
    "autoscaling",
    "status",
    "version",
    "zone",
    "node_price_per_hour",
    "capacity",
    "allocatable",
    "labels",
    "taints",
    "nodes",
    "default_labels",
    "tags",
    "root_volume_size",
    "kubelet_args",
}


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {path} must be a mapping at the top level")
    return data


def _check_keys(data: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where} must be a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return data


def apply_scenario(state: ScalewayState, scenario: dict[str, Any]) -> None:
    """Load clusters, pools and nodes into an empty state. Timings and behaviour are read by the caller."""
    _check_keys(scenario, TOP_LEVEL_KEYS, "scenario")
    clusters = scenario.get("clusters") or []
    if not isinstance(clusters, list):
        raise ScenarioError("scenario.clusters must be a list")
    for index, cluster_data in enumerate(clusters):
        where = f"clusters[{index}]"
        _check_keys(cluster_data, CLUSTER_KEYS, where)
        cluster = state.add_cluster(
            cluster_data.get("id"), cluster_data.get("name", f"cluster-{index}"), cluster_data.get("region")
        )
        pools = cluster_data.get("pools") or []
        if not isinstance(pools, list):
            raise ScenarioError(f"{where}.pools must be a list")
        for pool_index, pool_data in enumerate(pools):
            pool_where = f"{where}.pools[{pool_index}]"
            options = dict(_check_keys(pool_data, POOL_KEYS, pool_where))
            if "name" not in options:
                raise ScenarioError(f"{pool_where}: a pool needs a name")
            options["pool_id"] = options.pop("id", None)
            try:
                state.add_pool(cluster.id, **options)
            except TypeError as exc:
                raise ScenarioError(f"{pool_where}: {exc}") from exc


def build_state(clock: Any, scenario: dict[str, Any] | None, default_region: str) -> ScalewayState:
    scenario = scenario if scenario is not None else default_scenario()
    _check_keys(scenario, TOP_LEVEL_KEYS, "scenario")
    state = ScalewayState(
        clock,
        default_region=scenario.get("region", default_region),
        seed=int(scenario.get("seed", 0)),
        timings=timings_from(scenario.get("timings")),
        behaviour=behaviour_from(scenario.get("behaviour")),
    )
    apply_scenario(state, scenario)
    return state


def _stable_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def default_scenario() -> dict[str, Any]:
    """One empty cluster: enough for tests that add their own pools."""
    return {"clusters": [{"name": "sim-cluster"}]}


def demo_scenario() -> dict[str, Any]:
    """One cluster with four autoscaling pools below their max (one GPU pool at size 0) and one fixed pool."""
    rng = random.Random(20_260_101)
    return {
        "seed": 1,
        "timings": {"creating": 20, "starting": 20, "registering": 15, "deleting": 20},
        "clusters": [
            {
                "id": _stable_id(rng),
                "name": "demo",
                "pools": [
                    {"id": _stable_id(rng), "name": "general", "node_type": "DEV1-M", "size": 2, "min_size": 1,
                     "max_size": 6},
                    {"id": _stable_id(rng), "name": "compute", "node_type": "PRO2-S", "size": 1, "min_size": 0,
                     "max_size": 4, "labels": {"workload": "compute"}},
                    {"id": _stable_id(rng), "name": "batch", "node_type": "POP2-4C-16G", "size": 0, "min_size": 0,
                     "max_size": 5, "taints": {"batch": "true:PreferNoSchedule"}},
                    {"id": _stable_id(rng), "name": "gpu", "node_type": "L4-1-24G", "size": 0, "min_size": 0,
                     "max_size": 2, "taints": {"nvidia.com/gpu": "true:NoSchedule"}},
                    {"id": _stable_id(rng), "name": "system", "node_type": "GP1-XS", "size": 1, "min_size": 1,
                     "max_size": 1, "autoscaling": False},
                ],
            }
        ],
    }  # fmt: skip


def demo_public_cluster() -> dict[str, Any]:
    """A cluster for the public (self-managed) mode: two pools with Kapsule autoscaling off, in two zones, for
    our CA (``web`` with a node, ``jobs`` at size 0 with a label and a taint from its tags), and one with it on,
    which Kapsule's managed autoscaler owns and the public mode leaves alone."""
    rng = random.Random(20_260_102)
    return {
        "id": _stable_id(rng),
        "name": "demo-self-managed",
        "pools": [
            {"id": _stable_id(rng), "name": "web", "node_type": "PRO2-XS", "size": 1, "autoscaling": False,
             "zone": "fr-par-1", "tags": ["workload=web"]},
            {"id": _stable_id(rng), "name": "jobs", "node_type": "DEV1-L", "size": 0, "autoscaling": False,
             "zone": "fr-par-2", "tags": ["noprefix=team=data", "taint=dedicated=jobs:NoSchedule"]},
            {"id": _stable_id(rng), "name": "managed", "node_type": "DEV1-M", "size": 1, "min_size": 1,
             "max_size": 3},
        ],
    }  # fmt: skip


def generated_cluster(pools: int, nodes: int, seed: int = 0) -> dict[str, Any]:
    """A large cluster for benchmarks: ``pools`` autoscaling pools sharing ``nodes`` ready nodes."""
    if pools < 1 or nodes < 0:
        raise ValueError("generated_cluster needs pools >= 1 and nodes >= 0")
    rng = random.Random(seed)
    type_names = sorted(NODE_TYPES)
    base, extra = divmod(nodes, pools)
    pool_list = []
    for index in range(pools):
        count = base + (1 if index < extra else 0)
        pool_list.append(
            {
                "id": _stable_id(rng),
                "name": f"pool-{index:04d}",
                "node_type": rng.choice(type_names),
                "size": count,
                "min_size": 0,
                "max_size": max(count * 2, count + 10),
                "nodes": count,
            }
        )
    return {"seed": seed, "clusters": [{"id": _stable_id(rng), "name": "bench", "pools": pool_list}]}
