"""The node agent: plays, for every simulated machine, the parts of a cluster the autoscaler relies on.

A real cluster has a kubelet on each machine (it registers the Node, reports capacity and readiness,
runs the pods bound to it), a node-lifecycle controller (it lifts the ``not-ready`` taint once a node
is Ready) and a cloud controller / pod garbage collector (they remove the Node and its pods once the
machine is gone). Here one thread does all of that from the simulators' state:

- a machine that has joined the cluster gets a Node with ``spec.providerID`` as the cloud reports it,
  the labels a real node of its cloud carries (its pool's, the kubelet's and the cloud controller's:
  a Kapsule node's instance type is its commercial type, ``PRO2-XXS``), the taints its pool gives its
  nodes, and capacity/allocatable of its machine type;
- the Node turns Ready when the machine runs, and then loses the ``not-ready`` taint the API server
  put on it at registration;
- a Node whose machine has disappeared is deleted, with the pods bound to it;
- a pod bound to one of its Nodes is reported Running; a pod being deleted there is confirmed gone.

The machines are read from each simulator's control route ``GET /_sim/state``, which faults and rate
limits never touch: a cloud API outage injected by a scenario does not blind the "kubelets".
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from simulators.scaleway.catalog import kubernetes_labels as scaleway_kubernetes_labels
from simulators.scaleway.catalog import tag_node_taints

log = logging.getLogger(__name__)
T = TypeVar("T")

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
KUBELET_VERSION = "v1.36.2"
MAX_PODS = 110
# Scaleway node statuses in which the kubelet has registered the Node (it is still there while draining).
SCALEWAY_REGISTERED = frozenset({"not_ready", "ready", "rebooting", "upgrading", "locked", "deleting"})
SCALEWAY_RUNNING = frozenset({"ready", "upgrading", "locked"})
# What the Bizfly cloud-controller-manager writes into the region labels with its default settings.
BIZFLY_REGION = "HN"


@dataclass(frozen=True)
class Machine:
    """What a kubelet on one machine would register."""

    cloud: str
    name: str
    provider_id: str
    pool: str
    running: bool
    labels: dict[str, str]
    taints: list[dict[str, str]]
    capacity: dict[str, str]
    allocatable: dict[str, str]


def fetch_state(base_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base_url}/_sim/state", timeout=10) as answer:
        return dict(json.loads(answer.read()))


def scaleway_taints(taints: dict[str, str]) -> list[dict[str, str]]:
    """Kapsule's map form ``key -> "value:Effect"`` (or ``"Effect"``) as Node taints."""
    out = []
    for key, spec in sorted(taints.items()):
        value, _, effect = spec.rpartition(":")
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        out.append(taint)
    return out


def scaleway_machines(state: dict[str, Any]) -> list[Machine]:
    pools = {pool["id"]: pool for pool in state.get("pools", [])}
    regions = {cluster["id"]: cluster["region"] for cluster in state.get("clusters", [])}
    machines = []
    for node in state.get("nodes", []):
        pool = pools.get(node["pool_id"])
        if pool is None or node["status"] not in SCALEWAY_REGISTERED or not node.get("provider_id"):
            continue
        # What the kubelet and Scaleway's cloud-controller-manager put on a real Kapsule node.
        labels = scaleway_kubernetes_labels(
            node_type=pool["node_type"],
            node_name=node["name"],
            node_id=node["id"],
            pool_id=pool["id"],
            pool_name=pool["name"],
            cluster_id=pool["cluster_id"],
            region=regions.get(pool["cluster_id"], ""),
            zone=pool["zone"],
            pool_labels=pool["labels"],
            pool_tags=pool.get("tags") or [],
        )
        machines.append(
            Machine(
                cloud="scaleway",
                name=node["name"],
                provider_id=node["provider_id"],
                pool=pool["name"],
                running=node["status"] in SCALEWAY_RUNNING,
                labels=labels,
                taints=scaleway_taints({**tag_node_taints(pool.get("tags") or []), **(pool.get("taints") or {})}),
                capacity={k: str(v) for k, v in pool["capacity"].items()},
                allocatable={k: str(v) for k, v in pool["allocatable"].items()},
            )
        )
    return machines


def bizfly_resources(pool: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Capacity from the flavor; allocatable after a kubelet's usual reservations (CPU, memory, eviction)."""
    detail = pool.get("flavor_detail") or {}
    cpus = int(detail.get("vcpus", 1))
    memory_mib = int(detail.get("ram", 1024))
    disk_gib = int(pool.get("volume_size") or 40)
    capacity = {
        "cpu": str(cpus),
        "memory": f"{memory_mib}Mi",
        "ephemeral-storage": f"{disk_gib}Gi",
        "pods": str(MAX_PODS),
    }
    allocatable = {
        "cpu": f"{cpus * 1000 - 100}m",
        "memory": f"{int(memory_mib * 0.9) - 100}Mi",
        "ephemeral-storage": f"{int(disk_gib * 0.9)}Gi",
        "pods": str(MAX_PODS),
    }
    return capacity, allocatable


def bizfly_machines(state: dict[str, Any]) -> list[Machine]:
    machines = []
    for cluster in state.get("clusters", []):
        for pool in cluster.get("worker_pools", []):
            capacity, allocatable = bizfly_resources(pool)
            for node in pool.get("nodes", []):
                identity = node.get("k8s") or {}
                # A Bizfly machine joins the cluster once provisioned; one whose creation failed never does.
                # One that failed its health check later stays a Node, NotReady.
                if node["phase"] not in ("running", "deleting", "unhealthy") or not identity.get("provider_id"):
                    continue
                zone = str(pool.get("availability_zone") or "")
                # The cloud node controller writes each cloud label under its GA and its beta key.
                labels = {
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": str(pool["flavor"]),
                    "beta.kubernetes.io/instance-type": str(pool["flavor"]),
                    "topology.kubernetes.io/region": BIZFLY_REGION,
                    "failure-domain.beta.kubernetes.io/region": BIZFLY_REGION,
                    "topology.kubernetes.io/zone": zone,
                    "failure-domain.beta.kubernetes.io/zone": zone,
                    **identity.get("labels", {}),
                    "kubernetes.io/hostname": identity["name"],
                }
                machines.append(
                    Machine(
                        cloud="bizfly",
                        name=identity["name"],
                        provider_id=identity["provider_id"],
                        pool=pool["name"],
                        running=node["phase"] == "running",
                        labels={k: v for k, v in labels.items() if v != ""},
                        taints=[dict(t) for t in pool.get("taints", [])],
                        capacity=capacity,
                        allocatable=allocatable,
                    )
                )
    return machines


@dataclass
class CloudSource:
    """Where the agent reads one cloud's machines: the simulator's base URL and its state reader."""

    name: str
    url: str
    machines_of: Callable[[dict[str, Any]], list[Machine]]

    def machines(self) -> list[Machine]:
        return self.machines_of(fetch_state(self.url))


def scaleway_source(url: str) -> CloudSource:
    return CloudSource("scaleway", url, scaleway_machines)


def bizfly_source(url: str) -> CloudSource:
    return CloudSource("bizfly", url, bizfly_machines)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class AgentRecord:
    """What the agent did and when (wall-clock seconds), for scenario timings and assertions."""

    nodes_created: dict[str, float] = field(default_factory=dict)
    nodes_ready: dict[str, float] = field(default_factory=dict)
    nodes_deleted: dict[str, float] = field(default_factory=dict)
    pods_running: dict[str, float] = field(default_factory=dict)  # "namespace/name" -> when set Running
    errors: list[str] = field(default_factory=list)


class NodeAgent:
    """Reconciles Nodes and pod phases with the simulated machines, every ``interval`` seconds.

    It scales to thousands of nodes (``make bench-ca`` keeps 5,000): lists are read as raw JSON (the
    client's model objects cost about a millisecond per Node to build), a Node is created with its
    status in one request, and the writes of one pass go out on ``workers`` threads. A pass with nothing
    to change costs two lists; ``interval`` sets how often that happens and ``wake`` asks for a pass now.
    ``cpu_seconds`` is the CPU time the agent's own threads have spent, so a benchmark can say what
    playing kubelet cost it.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        sources: Sequence[CloudSource],
        interval: float = 0.5,
        workers: int = 8,
        real_nodes: Collection[str] = (),
    ) -> None:
        self.core = k8s.CoreV1Api(api)
        # Nodes a real kubelet runs (tests/e2e/node.py): never removed, their pods never touched.
        self.real_nodes = frozenset(real_nodes)
        self.sources = list(sources)
        self.interval = interval
        self.record = AgentRecord()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-agent", daemon=True)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(workers, 1), thread_name_prefix="node-agent-write")
        self.passes = 0
        self.cpu_seconds = 0.0

    def start(self) -> NodeAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def wake(self) -> None:
        """Start the next pass now instead of after the interval."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._counting():
                    self.reconcile()
            except Exception as exc:  # keep playing kubelet; the error is kept for the scenario's report
                message = f"{type(exc).__name__}: {exc}"
                log.warning("node agent pass failed: %s", message)
                with self._lock:
                    self.record.errors.append(message)
            self._wake.wait(self.interval)
            self._wake.clear()

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        """Adds the CPU time the current thread spends inside the block to ``cpu_seconds``."""
        started = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self.cpu_seconds += spent

    def _each(self, items: Sequence[T], write: Callable[[T], None]) -> None:
        """``write`` every item, on the pool when there are several; the first failure is raised."""
        if len(items) <= 1:
            for item in items:
                write(item)
            return

        def counted(item: T) -> None:
            with self._counting():
                write(item)

        for future in [self._pool.submit(counted, item) for item in items]:
            future.result()

    # ------------------------------------------------------------------------------------------ one pass
    def reconcile(self) -> None:
        machines: dict[str, Machine] = {}
        for source in self.sources:
            for machine in source.machines():
                machines[machine.name] = machine
        nodes = {node["metadata"]["name"]: node for node in self._list(self.core.list_node)}
        missing: list[Machine] = []
        changed: list[tuple[Machine, dict[str, Any]]] = []
        for name, machine in machines.items():
            node = nodes.get(name)
            if node is None:
                missing.append(machine)
            elif _is_ready(node) != machine.running or (machine.running and _not_ready_taint(node)):
                changed.append((machine, node))
            elif machine.running:
                self.record.nodes_ready.setdefault(name, time.time())
        self._each(missing, self._register)
        self._each(changed, self._update)
        self._each([name for name in nodes if name not in machines and name not in self.real_nodes], self._remove)
        self._run_pods(set(machines))
        self.passes += 1

    @staticmethod
    def _list(method: Callable[..., Any], **query: Any) -> list[dict[str, Any]]:
        answer = method(_preload_content=False, **query)
        return list(json.loads(answer.data)["items"])

    def _register(self, machine: Machine) -> None:
        # A Node may be created with its status (the API server keeps it), so one request registers it.
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": machine.name, "labels": machine.labels},
            "spec": {"providerID": machine.provider_id, "taints": machine.taints},
            "status": _node_status(machine),
        }
        try:
            answer: Any = self.core.create_node(body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return  # registered meanwhile; the next pass looks at it
        self.record.nodes_created.setdefault(machine.name, time.time())
        if machine.running:
            self._ready(machine, json.loads(answer.data))

    def _report_status(self, machine: Machine) -> None:
        self.core.patch_node_status(machine.name, {"status": _node_status(machine)}, _preload_content=False)

    def _update(self, pair: tuple[Machine, dict[str, Any]]) -> None:
        machine, node = pair
        ready = _is_ready(node)
        if ready != machine.running:
            self._report_status(machine)
            ready = machine.running
        if ready:
            self._ready(machine, node)

    def _ready(self, machine: Machine, node: dict[str, Any]) -> None:
        self.record.nodes_ready.setdefault(machine.name, time.time())
        if _not_ready_taint(node):
            # The node-lifecycle controller's part: lift the taint registration added, keep every
            # other taint (the autoscaler's own among them); the resourceVersion refuses a stale write.
            kept = [t for t in node["spec"]["taints"] if t["key"] != NOT_READY_TAINT]
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": kept or None},
            }
            try:
                self.core.patch_node(machine.name, patch, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def _remove(self, name: str) -> None:
        try:
            self.core.delete_node(name, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.record.nodes_deleted.setdefault(name, time.time())

    def _run_pods(self, node_names: set[str]) -> None:
        pods = self._list(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName!=")
        gone, starting = [], []
        for pod in pods:
            if pod["spec"]["nodeName"] in self.real_nodes:
                continue
            if pod["metadata"].get("deletionTimestamp") or pod["spec"]["nodeName"] not in node_names:
                gone.append(pod)
            elif pod.get("status", {}).get("phase") == "Pending":
                starting.append(pod)
        self._each(gone, self._confirm_gone)
        self._each(starting, self._start_pod)

    def _confirm_gone(self, pod: dict[str, Any]) -> None:
        # The kubelet confirms a pod's termination; the pod GC removes pods of vanished nodes.
        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], _running(pod), _preload_content=False)
        self.record.pods_running.setdefault(f"{meta['namespace']}/{meta['name']}", time.time())


def _node_status(machine: Machine) -> dict[str, Any]:
    """What the kubelet of ``machine`` reports: resources, the Ready condition, its identity."""
    now = _now()
    ready = {
        "type": "Ready",
        "status": "True" if machine.running else "False",
        "reason": "KubeletReady" if machine.running else "KubeletNotReady",
        "message": "kubelet is posting ready status" if machine.running else "machine is starting",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    return {
        "capacity": machine.capacity,
        "allocatable": machine.allocatable,
        "conditions": [ready],
        "addresses": [{"type": "Hostname", "address": machine.name}],
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",  # deprecated, empty since 1.31; the client requires the key
            "containerRuntimeVersion": "containerd://2.1.0",
            "kernelVersion": "6.1.0",
            "osImage": "e2e node agent",
            "machineID": machine.name,
            "systemUUID": machine.name,
            "bootID": machine.name,
        },
    }


def _not_ready_taint(node: dict[str, Any]) -> bool:
    return any(t["key"] == NOT_READY_TAINT for t in node.get("spec", {}).get("taints") or [])


def _is_ready(node: dict[str, Any]) -> bool:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition["type"] == "Ready":
            return bool(condition["status"] == "True")
    return False


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    now = _now()
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    containers = [
        {
            "name": container["name"],
            "image": container["image"],
            "imageID": container["image"],
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for container in pod["spec"]["containers"]
    ]
    return {
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": conditions,
            "containerStatuses": containers,
            "hostIP": "10.0.0.1",
            "podIP": "10.244.0.1",
        }
    }
