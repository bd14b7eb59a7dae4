"""The pods ``make bench-ca`` puts on the cluster's nodes, so that the CA has scale-down work to do.

Every node of a node group gets one of three loads, in turn: a pod asking for 70 % of its CPU (above
the CA's default utilisation threshold of 0.5: not a candidate), a pod asking for 20 % (a candidate
whose pod the CA must find room for elsewhere, its scheduling simulation), or nothing (an empty
candidate). Nodes of no group (the fixed pool) get a busy pod, as a system pool would. The pods are
bound to their node directly (``spec.nodeName``, as the scheduler would) and owned by a ReplicaSet
that exists, so the CA treats them as movable; no controller-manager runs, so the ReplicaSet never
makes pods of its own. With a long ``--scale-down-unneeded-time`` the candidates are never removed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

NAMESPACE = "default"
OWNER = "bench-load"
BUSY_SHARE = 0.7
LIGHT_SHARE = 0.2
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class NodeSlot:
    name: str
    cpu_cores: int
    in_group: bool


@dataclass(frozen=True)
class Placement:
    busy: int
    light: int
    empty: int

    @property
    def pods(self) -> int:
        return self.busy + self.light


def plan(nodes: Iterable[NodeSlot]) -> list[tuple[str, int]]:
    """(node, CPU millicores) of each pod to create, in the order of ``nodes``."""
    pods: list[tuple[str, int]] = []
    turn = 0
    for node in nodes:
        millis = node.cpu_cores * 1000
        if not node.in_group:
            pods.append((node.name, int(millis * BUSY_SHARE)))
            continue
        share = (BUSY_SHARE, LIGHT_SHARE, 0.0)[turn % 3]
        turn += 1
        if share:
            pods.append((node.name, int(millis * share)))
    return pods


def place(api: k8s.ApiClient, nodes: list[NodeSlot], workers: int = 8) -> Placement:
    """Create the ReplicaSet and the pods of ``plan(nodes)``; how many of each load there are."""
    pods = plan(nodes)
    apps = k8s.AppsV1Api(api)
    core = k8s.CoreV1Api(api)
    labels = {"app": OWNER}
    replica_set: Any = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": OWNER, "namespace": NAMESPACE},
        "spec": {
            "replicas": len(pods),
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [_container(100)]}},
        },
    }
    answer: Any = apps.create_namespaced_replica_set(NAMESPACE, replica_set, _preload_content=False)
    created = json.loads(answer.data)
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": OWNER,
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }

    def create(index_and_pod: tuple[int, tuple[str, int]]) -> None:
        index, (node, millis) = index_and_pod
        body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{OWNER}-{index:05d}", "labels": labels, "ownerReferences": [owner]},
            "spec": {"nodeName": node, "containers": [_container(millis)], "terminationGracePeriodSeconds": 0},
        }
        core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, enumerate(pods)))
    in_group = sum(1 for n in nodes if n.in_group)
    fixed = len(nodes) - in_group
    light = sum(1 for i in range(in_group) if i % 3 == 1)
    return Placement(busy=len(pods) - light, light=light, empty=in_group - (len(pods) - fixed))


def _container(millis: int) -> dict[str, Any]:
    return {"name": "app", "image": PAUSE_IMAGE, "resources": {"requests": {"cpu": f"{millis}m", "memory": "64Mi"}}}
