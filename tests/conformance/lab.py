"""The conformance lab: both cloud simulators, our server in front of them, and what a CA must see.

A lab is started fresh for every client run (CA version x transport), so the mutating checks of
one run never leak into the expectations of the next. Expectations are read from the simulators'
own state once the server has synced, never written down by hand: the scenario below only decides
which situations exist (running, creating, deleting and failed machines, a pool at size 0, a GPU
pool, a pool the server cannot describe, per-group options and a template override).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack.certs import Pki
from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.harness import InProcessServer, ServerProcess, server_config
from providers.scaleway.adapter import SYNTHETIC_ID_PREFIX as SCW_SYNTHETIC_ID_PREFIX
from simulators.bizfly import BizflySimulator
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.catalog import GPU_LABEL as SCALEWAY_GPU_LABEL
from simulators.scaleway.catalog import commercial_type as scaleway_commercial_type
from simulators.scaleway.catalog import lookup as scaleway_node_type

# ---------------------------------------------------------------------------------------------
# The situations the lab sets up. Names are for humans; ids come from the simulators.

SCALEWAY_SCENARIO: dict[str, Any] = {
    "region": "fr-par",
    "seed": 11,
    "clusters": [
        {
            "name": "conformance",
            "pools": [
                # Mutations run here; it also carries per-group options and a template override.
                {
                    "name": "general",
                    "node_type": "DEV1-M",
                    "size": 3,
                    "min_size": 1,
                    "max_size": 6,
                    "autoscaling": True,
                    "labels": {"team": "web"},
                    "taints": {"dedicated": "web:NoSchedule"},
                    "nodes": [{"status": "ready"}, {"status": "ready"}, {"status": "creating"}],
                },
                # Scale from zero with a GPU node type: template only, GPU label and types.
                {
                    "name": "gpu",
                    "node_type": "L4-1-24G",
                    "size": 0,
                    "min_size": 0,
                    "max_size": 3,
                    "autoscaling": True,
                    "labels": {"accelerator": "l4"},
                    "taints": {"nvidia.com/gpu": "present:NoSchedule"},
                    "nodes": 0,
                },
                # One machine of this pool is switched to creation_error after the simulator starts.
                {
                    "name": "flaky",
                    "node_type": "DEV1-L",
                    "size": 2,
                    "min_size": 0,
                    "max_size": 4,
                    "autoscaling": True,
                    "nodes": [{"status": "ready"}, {"status": "creating"}],
                },
            ],
        }
    ],
}

BIZFLY_SCENARIO: dict[str, Any] = {
    "catalog": {"region": "HN"},
    "seed": 5,
    "clusters": [
        {
            "name": "conformance-bizfly",
            "pools": [
                # Mutations run here too; one machine is switched to DELETING after start.
                {
                    "name": "web",
                    "flavor": "nix.4c_8g",
                    "min_size": 1,
                    "max_size": 5,
                    "desired_size": 4,
                    "labels": {"tier": "web"},
                    "nodes": [
                        {"status": "ACTIVE"},
                        {"status": "ACTIVE"},
                        {"status": "ACTIVE"},
                        {"status": "PROVISIONING"},
                    ],
                },
                # One machine is switched to ERROR with a quota reason after start.
                {
                    "name": "jobs",
                    "flavor": "nix.2c_4g",
                    "min_size": 0,
                    "max_size": 4,
                    "desired_size": 2,
                    "nodes": [{"status": "ACTIVE"}, {"status": "ACTIVE"}],
                },
                # A flavor name that says nothing about the machine and no node to learn from:
                # the server has no template, so the CA must get ErrNotImplemented.
                {
                    "name": "custom",
                    "flavor": "custom-highmem",
                    "min_size": 0,
                    "max_size": 2,
                    "desired_size": 0,
                    "nodes": 0,
                },
            ],
        }
    ],
}

# Per-group server configuration, keyed by pool NAME (the lab maps names to the simulator's ids).
SCALEWAY_GROUP_CONFIG: dict[str, dict[str, Any]] = {
    "general": {
        "options": {
            "scale_down_utilization_threshold": 0.65,
            "scale_down_unneeded_time": "7m",
            "max_node_provision_time": "25m",
            "zero_or_max_node_scaling": True,
        },
        "template": {
            "labels": {"conformance.example/override": "yes"},
            "taints": [
                {"key": "dedicated", "value": "web", "effect": "NoSchedule"},
                {"key": "conformance.example/slow-disk", "value": "true", "effect": "PreferNoSchedule"},
            ],
            "allocatable": {"pods": "58"},
        },
    }
}

FLAKY_MESSAGE = "quota exceeded for instance type DEV1-L"
BIZFLY_FAILURE_REASON = "Creation failed: quota exceeded"
READY_TIMEOUT_SECONDS = 20.0

# Kubernetes labels a Kapsule kubelet registers with (docs/reference/scaleway.md, "Templates"): the pool id
# label is what NodePrice resolves a node's pool from.
SCW_POOL_ID_LABEL = "k8s.scaleway.com/pool"
SCW_POOL_NAME_LABEL = "k8s.scaleway.com/pool-name"

SCW_STATES = {
    "ready": "running",
    "creating": "creating",
    "starting": "creating",
    "registering": "creating",
    "not_ready": "creating",
    "upgrading": "creating",
    "rebooting": "creating",
    "deleting": "deleting",
}
BIZFLY_STATES = {"ACTIVE": "running", "PROVISIONING": "creating", "DELETING": "deleting"}


def _scaleway_gpus(pool: Any) -> int:
    entry = scaleway_node_type(pool.node_type)
    return entry.gpus if entry is not None else 0


def _scaleway_gpu_type(pool: Any) -> str:
    return str(pool.labels.get(SCALEWAY_GPU_LABEL) or scaleway_commercial_type(pool.node_type).lower())


class LabError(RuntimeError):
    """The lab could not be brought up (simulator, server or first sync)."""


@dataclass(frozen=True)
class Endpoint:
    """How a client reaches the server of one lab."""

    address: str
    tls: bool
    pki: Pki | None


def _taint_map_to_list(taints: Mapping[str, str]) -> list[dict[str, str]]:
    """Kapsule's ``{key: "value:Effect" | "Effect"}`` -> taints (docs/reference/scaleway.md, "Templates")."""
    out = []
    for key, raw in taints.items():
        parts = raw.split(":")
        value = parts[0] if len(parts) == 2 else ""
        out.append({"key": key, "value": value, "effect": parts[-1]})
    return out


def _apply_override(
    labels: dict[str, str], taints: list[dict[str, str]], allocatable: dict[str, str], override: Mapping[str, Any]
) -> tuple[dict[str, str], list[dict[str, str]], dict[str, str]]:
    """The documented override rule: labels and quantities merged, taints replaced when given."""
    labels = {**labels, **override.get("labels", {})}
    if "taints" in override:
        taints = [dict(t) for t in override["taints"]]
    allocatable = {**allocatable, **override.get("allocatable", {})}
    return labels, taints, allocatable


@dataclass(frozen=True)
class InstalledServer:
    """An installation's ``ca-externalgrpc`` (a virtualenv's console script) and the environment to run
    it in, to serve a lab as a child process instead of this checkout in-process (tests/install)."""

    command: tuple[str, ...]
    env: Mapping[str, str]


class Lab:
    """Simulators + server for one client run. Use as a context manager."""

    def __init__(self, workdir: Path, pki: Pki | None, installed: InstalledServer | None = None) -> None:
        self.workdir = workdir
        self.pki = pki
        self.installed = installed
        self.scaleway = ScalewaySimulator(scenario=SCALEWAY_SCENARIO, clock=ManualClock())
        self.bizfly = BizflySimulator(scenario=BIZFLY_SCENARIO, clock=ManualClock())
        self.server: InProcessServer | ServerProcess | None = None

    # ----- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        try:
            self.scaleway.start()
            self.bizfly.start()
            self._shape_states()
            if self.installed is None:
                # The config is generated: environment variables must not redirect it to a real cloud.
                self.server = InProcessServer(self._server_config(), env={}, base=self.workdir)
            else:
                # The child's environment is the one given, less the cloud variables (child_env).
                self.server = ServerProcess(
                    self._server_config(),
                    env=self.installed.env,
                    workdir=self.workdir,
                    command=self.installed.command,
                    from_checkout=False,
                )
            self._wait_until_synced()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if isinstance(self.server, InProcessServer):
            self.server.stop(grace=1.0)
        elif self.server is not None:
            self.server.stop()
        self.server = None
        self.scaleway.stop()
        self.bizfly.stop()

    @property
    def endpoint(self) -> Endpoint:
        assert self.server is not None
        return Endpoint(self.server.address, self.pki is not None, self.pki)

    # ----- setup ----------------------------------------------------------------------------------
    def _scw_pools(self) -> dict[str, Any]:
        with self.scaleway.state.lock:
            cluster = self.scaleway.state.clusters[self.scaleway.cluster_id]
            return {pool.name: pool for pool in cluster.pool_list()}

    def _bizfly_cluster(self) -> dict[str, Any]:
        return self.bizfly.snapshot()["clusters"][0]

    def _bizfly_pools(self) -> dict[str, dict[str, Any]]:
        return {pool["name"]: pool for pool in self._bizfly_cluster()["worker_pools"]}

    def _shape_states(self) -> None:
        """Put the machines the scenario format cannot describe into their state, before any sync."""
        flaky = self._scw_pools()["flaky"]
        creating = [n for n in self.scaleway.nodes_of(flaky.id) if n.status == "creating"]
        self.scaleway.set_node_status(creating[0].id, "creation_error", FLAKY_MESSAGE)
        pools = self._bizfly_pools()
        self.bizfly.set_node_status(pools["jobs"]["nodes"][-1]["id"], "ERROR", BIZFLY_FAILURE_REASON)
        active = [n for n in pools["web"]["nodes"] if n["status"] == "ACTIVE"]
        self.bizfly.set_node_status(active[-1]["id"], "DELETING")

    def _server_config(self) -> dict[str, Any]:
        scw_pools = self._scw_pools()
        scw_groups = {scw_pools[name].id: cfg for name, cfg in SCALEWAY_GROUP_CONFIG.items()}
        backends = [
            # Scaleway first: its GPU label is the one GPULabel reports (the first backend's).
            scaleway_backend(self.scaleway, "scw", node_groups=scw_groups),
            bizfly_backend(self.bizfly, "bizfly"),
        ]
        return server_config(
            backends,
            http=False,
            pki=self.pki,
            mtls=self.pki is not None,
            shutdown_grace="1s",
            log={"format": "text", "level": "error"},
        )

    def _wait_until_synced(self) -> None:
        assert self.server is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            if isinstance(self.server, InProcessServer):
                ready, why = self.server.running.ready()
            else:
                status, why = self.server.http_get("/readyz")
                ready = status == 200
            if ready:
                return
            if time.monotonic() > deadline:
                raise LabError(f"the server did not finish its first sync: {why}")
            time.sleep(0.05)

    # ----- expectations ---------------------------------------------------------------------------
    def expectations(self, mutate: bool) -> dict[str, Any]:
        return {
            "backends": [self._scaleway_expectations(mutate), self._bizfly_expectations(mutate)],
            "unmanaged_provider_id": f"scaleway://instance/fr-par-1/{uuid.uuid4()}",
            "gpu_label": SCALEWAY_GPU_LABEL,
            "gpu_types": sorted(
                {_scaleway_gpu_type(p) for p in self._scw_pools().values() if p.autoscaling and _scaleway_gpus(p)}
            ),
            "mutate": mutate,
        }

    def _scaleway_expectations(self, mutate: bool) -> dict[str, Any]:
        groups = []
        for name, pool in self._scw_pools().items():
            if not pool.autoscaling:
                continue
            nodes = self.scaleway.nodes_of(pool.id)
            instances = []
            for node in nodes:
                # A machine Kapsule is still creating has no providerID yet (as recorded): ours lists it by
                # its Kapsule node id (docs/reference/scaleway.md, "Instances").
                instance_id = node.provider_id or SCW_SYNTHETIC_ID_PREFIX + node.id
                if node.status == "creation_error":
                    instances.append({"id": instance_id, "state": "creating", "error_code": "*"})
                elif node.status in SCW_STATES:
                    instances.append({"id": instance_id, "state": SCW_STATES[node.status]})
            ready = [n for n in nodes if n.status == "ready"]
            managed = (
                {
                    "provider_id": ready[0].provider_id,
                    "name": ready[0].name,
                    "labels": {SCW_POOL_ID_LABEL: pool.id, SCW_POOL_NAME_LABEL: pool.name, **pool.labels},
                }
                if ready
                else None
            )
            # The pool's labels, and the instance type as real nodes carry it (the pools API says "dev1_m",
            # a node "DEV1-M"); on GPU pools the GPU label: the pool's, else the node type in lower case.
            labels = dict(pool.labels)
            labels["node.kubernetes.io/instance-type"] = scaleway_commercial_type(pool.node_type)
            if _scaleway_gpus(pool):
                labels[SCALEWAY_GPU_LABEL] = _scaleway_gpu_type(pool)
            taints = _taint_map_to_list(pool.taints)
            allocatable = {k: str(v) for k, v in pool.allocatable.items()}
            cfg = SCALEWAY_GROUP_CONFIG.get(name, {})
            if "template" in cfg:
                labels, taints, allocatable = _apply_override(labels, taints, allocatable, cfg["template"])
            group: dict[str, Any] = {
                "id": pool.id,
                "name": name,
                "min": pool.min_size,
                "max": pool.max_size,
                "target_size": pool.size,
                "managed_node": managed,
                "instances": instances,
                "template": {"labels": labels, "taints": taints, "allocatable": allocatable},
                "node_price": pool.node_price_per_hour if managed else None,
            }
            group.update(self._options(cfg))
            if mutate and name == "general" and len(ready) >= 2:
                group.update({"increase_by": 1, "decrease_by": 1, "delete_node": managed})
            groups.append(group)
        return {"name": "scaleway", "groups": groups}

    def _bizfly_expectations(self, mutate: bool) -> dict[str, Any]:
        groups = []
        for name, pool in self._bizfly_pools().items():
            if not pool.get("enable_autoscaling", True):
                continue
            instances = []
            ready: list[dict[str, Any]] = []
            for node in pool["nodes"]:
                provider_id = node["k8s"]["provider_id"]
                status = node["status"]
                if status == "ERROR":
                    instances.append({"id": provider_id, "state": "creating", "error_code": "*"})
                elif status in BIZFLY_STATES:
                    instances.append({"id": provider_id, "state": BIZFLY_STATES[status]})
                if status == "ACTIVE":
                    ready.append(node)
            managed = (
                {
                    "provider_id": ready[0]["k8s"]["provider_id"],
                    "name": ready[0]["k8s"]["name"],
                    "labels": dict(ready[0]["k8s"]["labels"]),
                }
                if ready
                else None
            )
            describable = "vcpus" in (pool.get("flavor_detail") or {})
            group: dict[str, Any] = {
                "id": pool["id"],
                "name": name,
                "min": pool["min_size"],
                "max": pool["max_size"],
                "target_size": pool["desired_size"],
                "managed_node": managed,
                "instances": instances,
                # Bizfly has no price list: the server must say UNIMPLEMENTED, which the CA maps.
                "node_price_unimplemented": managed is not None,
                "options_empty": True,
            }
            if describable:
                group["template"] = {
                    "labels": dict(pool.get("labels") or {}),
                    "taints": [
                        {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
                        for t in pool.get("taints") or []
                    ],
                    "allocatable": {},
                }
            elif not ready:
                group["template_unimplemented"] = True
            if mutate and name == "web" and len(ready) >= 2:
                group.update({"increase_by": 1, "decrease_by": 1, "delete_node": managed})
            groups.append(group)
        return {"name": "bizfly", "groups": groups}

    @staticmethod
    def _options(cfg: Mapping[str, Any]) -> dict[str, Any]:
        if "options" not in cfg:
            return {"options_empty": True}
        return {"options": dict(cfg["options"])}

    # ----- client configuration ---------------------------------------------------------------------
    def write_cloud_config(self, path: Path) -> Path:
        """The CA's ``--cloud-config`` for the externalgrpc provider (docs/reference/protocol.md, "Cloud-config and
        TLS")."""
        endpoint = self.endpoint
        body: dict[str, Any] = {"address": endpoint.address, "grpc_timeout": "5s"}
        if endpoint.pki is not None:
            body.update(
                {
                    "cert": str(endpoint.pki.client_cert),
                    "key": str(endpoint.pki.client_key),
                    "cacert": str(endpoint.pki.ca_cert),
                }
            )
        path.write_text(yaml.safe_dump(body))
        return path
