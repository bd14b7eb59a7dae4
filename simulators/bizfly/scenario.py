"""Scenarios: the account, catalog and clusters a Bizfly simulator starts with.

A scenario is a plain dict (or a YAML file with the same shape)::

    account:                       # who may log in (defaults in auth.py)
      users: {user@example.com: s3cret-password}
      app_credentials: {app-cred-id: app-cred-secret}
      project_id: ...              # the default project: tokens are scoped to it unless a login names another
      project_name: ...
      projects: {<id>: <name>}     # further projects of the account (ids are 32 hexadecimal characters)
    catalog: {region: HN, other_regions: [HCM]}
    token_ttl: 3600                # seconds of simulated time
    status_vocabulary: senlin      # senlin (INIT/CREATING/ACTIVE/DELETING/ERROR...), provisioning
                                   # (PROVISIONING/ACTIVE/...: the former default) or upstream (lowercase)
    timings: {provision_seconds: 120, delete_seconds: 30, force_delete_seconds: 0, init_seconds: 2,
              pool_provision_seconds: 60}
    api:
      delete_accepts_physical_id: false
      rate_limit: {per_second: 20, burst: 40}
      timestamps: naive            # naive (as the API writes created_at) or utc (with a Z: the former shape)
      stats_key: stats             # stats (null totals, as the API) or stat (the former shape)
      node_names: mixed            # mixed (Senlin's node names) or lower (the former lower-case names)
    seed: 1                        # generated ids are reproducible
    clusters:
      - uid: ke1m4ea3j8w6kkvp      # optional; generated when absent
        name: demo
        kubernetes_version: 1.30.4
        project_id: ...            # optional; the account's default project
        region: HCM                # optional; one of catalog.other_regions, served at /<region>/api/...
        pools:
          - id: 5f959e0ac0b18944d0a4f13a   # optional
            name: general
            flavor: nix.2c_4g
            min_size: 1
            max_size: 5
            desired_size: 2
            enable_autoscaling: true
            labels: {tier: web}
            taints: [{key: dedicated, value: web, effect: NoSchedule}]
            nodes: 2               # a count of running nodes, or a list of {id, physical_id, name, status}
            pending: false         # true: PENDING_PROVISION (null autoscaling group) for a while, no nodes

``nodes`` defaults to ``desired_size`` running nodes; when it differs, the pool converges on
``desired_size`` as soon as the simulator reads its state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulators.bizfly.state import (
    DEFAULT_PROJECT_ID,
    VOCABULARIES,
    ApiShapes,
    BizflyState,
    StatusVocabulary,
    Timings,
)

DEMO_CLUSTER_UID = "ke1m4ea3j8w6kkvp"


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names the offending key."""


@dataclass(frozen=True)
class ScenarioSettings:
    """The scalar settings of a scenario, after defaults and validation."""

    users: Mapping[str, str] | None
    app_credentials: Mapping[str, str] | None
    project_id: str
    project_name: str
    projects: Mapping[str, str]
    catalog_region: str | None
    other_regions: tuple[str, ...]
    token_ttl: float | None
    vocabulary: StatusVocabulary
    timings: Timings
    delete_accepts_physical_id: bool
    rate_limit: tuple[float, int] | None
    seed: int
    shapes: ApiShapes


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario must be a mapping at the top level")
    return data


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


def _string_map(value: Any, key: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{key}: expected a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


def parse_settings(scenario: Mapping[str, Any]) -> ScenarioSettings:
    if not isinstance(scenario, Mapping):
        raise ScenarioError("a scenario must be a mapping")
    vocabulary_name = scenario.get("status_vocabulary", "senlin")
    if vocabulary_name not in VOCABULARIES:
        raise ScenarioError(f"status_vocabulary: expected one of {sorted(VOCABULARIES)}, got {vocabulary_name!r}")
    try:
        return _parse_settings(scenario, VOCABULARIES[vocabulary_name])
    except ScenarioError:
        raise
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"scenario settings: {exc}") from exc


def _parse_settings(scenario: Mapping[str, Any], vocabulary: StatusVocabulary) -> ScenarioSettings:
    account = _mapping(scenario, "account")
    catalog = _mapping(scenario, "catalog")
    api = _mapping(scenario, "api")
    other_regions = catalog.get("other_regions", ["HCM"])
    if not isinstance(other_regions, list):
        raise ScenarioError("catalog.other_regions: expected a list of region strings")
    timings = Timings(**{k: float(v) for k, v in _mapping(scenario, "timings").items()})
    rate = _mapping(api, "rate_limit")
    ttl = scenario.get("token_ttl")
    shapes = ApiShapes(**{k: str(api[k]) for k in ("timestamps", "stats_key", "node_names") if k in api})
    project_id = str(account.get("project_id", DEFAULT_PROJECT_ID))
    project_name = str(account.get("project_name", "demo-project"))
    projects = {project_id: project_name, **(_string_map(account.get("projects"), "account.projects") or {})}
    return ScenarioSettings(
        users=_string_map(account.get("users"), "account.users"),
        app_credentials=_string_map(account.get("app_credentials"), "account.app_credentials"),
        project_id=project_id,
        project_name=project_name,
        projects=projects,
        catalog_region=None if catalog.get("region") is None else str(catalog["region"]),
        other_regions=tuple(str(r) for r in other_regions),
        token_ttl=None if ttl is None else float(ttl),
        vocabulary=vocabulary,
        timings=timings,
        delete_accepts_physical_id=bool(api.get("delete_accepts_physical_id", False)),
        rate_limit=(float(rate["per_second"]), int(rate.get("burst", 1))) if rate else None,
        seed=int(scenario.get("seed", 1)),
        shapes=shapes,
    )


def populate(state: BizflyState, scenario: Mapping[str, Any]) -> None:
    """Create the scenario's clusters, pools and nodes in ``state``."""
    clusters = scenario.get("clusters") or []
    if not isinstance(clusters, list):
        raise ScenarioError("clusters: expected a list")
    for index, cluster_spec in enumerate(clusters):
        where = f"clusters[{index}]"
        if not isinstance(cluster_spec, Mapping) or not cluster_spec.get("name"):
            raise ScenarioError(f"{where}: a cluster needs at least a name")
        try:
            cluster = state.add_cluster(
                str(cluster_spec["name"]),
                uid=cluster_spec.get("uid"),
                kubernetes_version=str(cluster_spec.get("kubernetes_version", "1.30.4")),
                project_id=None if cluster_spec.get("project_id") is None else str(cluster_spec["project_id"]),
                region=str(cluster_spec.get("region") or ""),
            )
            for pool_index, pool_spec in enumerate(cluster_spec.get("pools") or []):
                _add_pool(state, cluster.uid, pool_spec, f"{where}.pools[{pool_index}]")
        except (TypeError, ValueError, KeyError) as exc:
            if isinstance(exc, ScenarioError):
                raise
            raise ScenarioError(f"{where}: {exc}") from exc


def _add_pool(state: BizflyState, cluster_uid: str, spec: Any, where: str) -> None:
    if not isinstance(spec, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    for key in ("name", "flavor", "min_size", "max_size"):
        if key not in spec:
            raise ScenarioError(f"{where}: missing {key}")
    desired = int(spec.get("desired_size", spec["min_size"]))
    nodes_spec = spec.get("nodes")
    nodes: list[dict[str, Any]] | None
    if nodes_spec is None:
        nodes = None
    elif isinstance(nodes_spec, int) and not isinstance(nodes_spec, bool):
        nodes = [{} for _ in range(nodes_spec)]
    elif isinstance(nodes_spec, list) and all(isinstance(n, Mapping) for n in nodes_spec):
        nodes = [dict(n) for n in nodes_spec]
    else:
        raise ScenarioError(f"{where}.nodes: expected a count or a list of mappings")
    state.add_pool(
        cluster_uid,
        str(spec["name"]),
        pool_id=spec.get("id"),
        flavor=str(spec["flavor"]),
        min_size=int(spec["min_size"]),
        max_size=int(spec["max_size"]),
        desired_size=desired,
        enable_autoscaling=bool(spec.get("enable_autoscaling", True)),
        labels=_string_map(spec.get("labels"), f"{where}.labels"),
        taints=[dict(t) for t in spec.get("taints") or []],
        availability_zone=str(spec.get("availability_zone", "HN1")),
        nodes=nodes,
        pending=bool(spec.get("pending", False)),
    )


def demo_scenario() -> dict[str, Any]:
    """One cluster with three autoscaling pools below their maximum (one of them empty) and one fixed pool."""
    return {
        "catalog": {"region": "HN", "other_regions": ["HCM"]},
        "clusters": [
            {
                "uid": DEMO_CLUSTER_UID,
                "name": "demo-cluster",
                "kubernetes_version": "1.30.4",
                "pools": [
                    {
                        "id": "5f959e0ac0b18944d0a4f13a",
                        "name": "general",
                        "flavor": "nix.2c_4g",
                        "min_size": 1,
                        "max_size": 5,
                        "desired_size": 2,
                        "enable_autoscaling": True,
                        "labels": {"workload": "general"},
                    },
                    {
                        "id": "5f959e0ac0b18944d0a4f13b",
                        "name": "compute",
                        "flavor": "nix.4c_8g",
                        "min_size": 0,
                        "max_size": 4,
                        "desired_size": 1,
                        "enable_autoscaling": True,
                        "labels": {"workload": "compute"},
                        "taints": [{"key": "dedicated", "value": "compute", "effect": "NoSchedule"}],
                    },
                    {
                        "id": "5f959e0ac0b18944d0a4f13c",
                        "name": "batch",
                        "flavor": "nix.8c_16g",
                        "min_size": 0,
                        "max_size": 3,
                        "desired_size": 0,
                        "enable_autoscaling": True,
                        "labels": {"workload": "batch"},
                    },
                    {
                        "id": "5f959e0ac0b18944d0a4f13d",
                        "name": "system",
                        "flavor": "nix.2c_4g",
                        "min_size": 1,
                        "max_size": 1,
                        "desired_size": 1,
                        "enable_autoscaling": False,
                    },
                ],
            }
        ],
    }
