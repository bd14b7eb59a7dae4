"""Learned templates and their ConfigMaps against the real API server: what a follower asks of the API
server (counted in the API server's audit log), and records that together pass the 1 MiB limit of a
ConfigMap (150 node groups whose nodes carry node-feature-discovery's labels)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from devstack.clouds import bizfly_backend, bizfly_cluster_uid, scaleway_backend
from devstack.harness import ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from providers.model import LearnedTemplate, NodeTemplate
from server.kube.templates import encode_learned
from simulators.bizfly import BizflySimulator, demo_scenario
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.scenarios import generated_cluster
from tests.bench.kubelet_nodes import nfd_labels
from tests.e2e.control_plane import ControlPlane
from tests.kube.polling import wait_for

COMPUTE = "5f959e0ac0b18944d0a4f13b"  # the Bizfly demo pool "compute": one running machine
CONFIGMAP_LIMIT = 1024 * 1024  # the API server refuses a ConfigMap whose data is larger
POOLS, POOLS_AT_ZERO = 150, 10


def create_node(
    core: client.CoreV1Api,
    created: list[str],
    name: str,
    provider_id: str,
    labels: dict[str, str],
    capacity: dict[str, str],
) -> None:
    """A Ready Node as a kubelet registers it (the API server keeps the status a Node is created with)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}
    body = {
        "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name}},
        "spec": {"providerID": provider_id},
        "status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]},
    }
    core.create_node(body)
    created.append(name)


def configmap_data(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    try:
        return dict(core.read_namespaced_config_map(name, namespace).data or {})
    except ApiException as err:
        if err.status == 404:
            return {}
        raise


def test_a_follower_reads_the_templates_configmap_once_and_then_leaves_it_alone(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str, nodes: list[str], tmp_path: Path
) -> None:
    # Issue 26, item 9: a follower whose records differed from the ConfigMap's (here: there is none yet)
    # read it again every 2 s for as long as it followed.
    sim = BizflySimulator(scenario=demo_scenario(), clock=ManualClock()).start()
    user = f"follower-{uuid.uuid4().hex[:8]}"
    configmap = "ca-externalgrpc-templates-bizfly"
    coordination = client.CoordinationV1Api(admin)
    now = datetime.now(UTC)
    lease = {
        "metadata": {"name": "ca-externalgrpc"},
        "spec": {
            "holderIdentity": "replica-elsewhere",
            "leaseDurationSeconds": 3600,
            "renewTime": now,
            "acquireTime": now,
        },
    }
    coordination.create_namespaced_lease(namespace, lease)
    raw = server_config(
        [bizfly_backend(sim)],
        kubernetes={
            "kubeconfig": str(control_plane.user_kubeconfig(user, group="system:masters")),
            "namespace": namespace,
            "identity": "replica-here",
            "leader_election": {
                "enabled": True,
                "lease_duration": "60s",
                "renew_deadline": "40s",
                "retry_period": "500ms",
            },
            "learned_templates": {"enabled": True, "min_write_interval": "200ms"},
        },
    )
    ref = next(r for r in sim.node_refs(bizfly_cluster_uid(sim)) if r["pool_id"] == COMPUTE)
    server = ServerProcess(raw, workdir=tmp_path)
    try:
        create_node(
            client.CoreV1Api(admin),
            nodes,
            ref["name"],
            ref["provider_id"],
            ref["labels"],
            {"cpu": "4", "memory": "8Gi"},
        )
        time.sleep(8.0)  # four rounds of the old 2 s re-read

        def reads() -> list[dict[str, Any]]:
            return [
                e
                for e in control_plane.audit_events(user)
                if e["verb"] == "get" and e.get("objectRef", {}).get("name") == configmap
            ]

        assert len(reads()) == 1, [e["requestReceivedTimestamp"] for e in reads()]  # the read at start
        # Once it leads it writes what it learns, as any leader.
        coordination.patch_namespaced_lease("ca-externalgrpc", namespace, {"spec": {"holderIdentity": None}})
        core = client.CoreV1Api(admin)
        record = wait_for("the new leader stores the compute pool", lambda: configmap_data(core, namespace, configmap))
        assert json.loads(record[COMPUTE])["node"] == ref["name"]
    finally:
        server.stop()
        sim.stop()


def test_records_that_pass_the_configmap_limit_together_keep_the_groups_at_zero_and_as_many_others_as_fit(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str, nodes: list[str], tmp_path: Path
) -> None:
    # Issue 26, item 9: 150 groups with node-feature-discovery's labels make records of about 1.3 MiB; the
    # API server refused every write and nothing learned was stored any more.
    scenario = generated_cluster(pools=POOLS, nodes=POOLS - POOLS_AT_ZERO, seed=26)
    sim = ScalewaySimulator(scenario).start()
    core = client.CoreV1Api(admin)
    configmap = "ca-externalgrpc-templates-scw"
    hardware = nfd_labels(150)
    with sim.state.lock:
        pools = list(sim.state.pools.values())
        machines = [(n.name, n.provider_id, n.pool_id) for n in sim.state.nodes.values()]
    at_zero = [p.id for p in pools if p.size == 0]
    assert len(at_zero) == POOLS_AT_ZERO
    # Groups at zero learned before, with the same hardware labels (as an earlier run stored them).
    earlier = {
        p.id: encode_learned(
            LearnedTemplate(
                NodeTemplate(hardware, (), {"cpu": "4", "memory": "16Gi"}, {"cpu": "3900m", "memory": "15Gi"}),
                f"gone-{p.id[:8]}",
                "2026-01-01T00:00:00Z",
            )
        )
        for p in pools
        if p.id in at_zero
    }
    core.create_namespaced_config_map(namespace, {"metadata": {"name": configmap}, "data": earlier})
    raw = server_config(
        [scaleway_backend(sim)],
        kubernetes={
            "kubeconfig": str(control_plane.kubeconfig),
            "namespace": namespace,
            "learned_templates": {"enabled": True, "min_write_interval": "200ms"},
        },
    )
    server = ServerProcess(raw, workdir=tmp_path)
    try:
        for name, provider_id, pool_id in machines:
            pool = sim.state.pools[pool_id]
            capacity = {k: str(v) for k, v in pool.capacity.items()}
            create_node(core, nodes, name, provider_id, {**pool.labels, **hardware}, capacity)

        def learned_everywhere() -> bool:
            groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
            return sum("template=learned" in g.debug for g in groups) == POOLS

        wait_for("every group with a learned template", learned_everywhere, timeout=60)
        wait_for(
            "the groups at zero and a hundred others stored",
            lambda: len(data := configmap_data(core, namespace, configmap)) >= 100 and set(at_zero) <= set(data),
            timeout=30,
        )
        time.sleep(1.0)  # five write intervals: any write of all 150 records would have been tried
        data = configmap_data(core, namespace, configmap)
        assert sum(len(k) + len(v) for k, v in data.items()) <= CONFIGMAP_LIMIT
        assert set(at_zero) <= set(data)  # a group at zero has no other description of its nodes
        assert len(data) >= 100, len(data)  # the others as many as fit: each record is about 9 KiB
        writes = [
            e
            for e in control_plane.audit_events()
            if e["verb"] in ("create", "update")
            and e.get("objectRef", {}).get("namespace") == namespace
            and e.get("objectRef", {}).get("name") == configmap
        ]
        refused = [e["responseStatus"] for e in writes if e["responseStatus"]["code"] >= 400]
        assert not refused, refused  # 422: "Too long: must have at most 1048576 bytes"
    finally:
        server.stop()
        sim.stop()
