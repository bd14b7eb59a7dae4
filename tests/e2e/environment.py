"""One end-to-end environment: simulated clouds, our server, a real control plane, the node agent, the CA.

Start order: the Scaleway and Bizfly simulators (on the wall clock, with short boot and deletion
times), etcd + kube-apiserver + kube-scheduler, our server as a ``ca-externalgrpc serve`` child
process in front of both clouds (or what a scenario's ``serve`` starts, e.g. two replicas behind a
proxy), the node agent (which registers the machines that already run), and last the
cluster-autoscaler binary pointed at our server. ``stop`` ends them in reverse order.
Everything a run writes (configs, certificates, logs) stays in its work folder for a post-mortem.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import yaml
from kubernetes import client as k8s

from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.container import ContainerServer
from devstack.harness import SCW_SECRET, ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from simulators.bizfly import BizflySimulator
from simulators.common import WallClock
from simulators.common.request_log import RecordedRequest
from simulators.scaleway import ScalewaySimulator
from tests.e2e.autoscaler import Autoscaler, write_cloud_config
from tests.e2e.control_plane import ControlPlane, ControlPlanePrograms
from tests.e2e.node_agent import NodeAgent, bizfly_source, scaleway_source
from tests.support.gobuild import binary_path

T = TypeVar("T")

# Machines boot in seconds, not minutes: scenarios measure the autoscaling path, not cloud boot time.
SCALEWAY_TIMINGS = {"creating": 2, "starting": 2, "registering": 1, "deleting": 2}
BIZFLY_TIMINGS = {"provision_seconds": 5, "delete_seconds": 2}
# The server re-reads each cloud every 2 s (and at most every second when a call asks it to).
BACKEND_SYNC = {"interval": "2s", "min_interval": "1s"}
# Cloud routes that change a pool's size (the "cloud call" a scale-up makes).
# The simulators' route names of a resize and of a machine deletion (Scaleway: either mode's endpoint).
RESIZE_ROUTES = {"scaleway": ("update_pool", "public_update_pool"), "bizfly": ("update_pool",)}
DELETE_ROUTES = {"scaleway": ("delete_node", "public_delete_node"), "bizfly": ("delete_node",)}


@dataclass(frozen=True)
class CaRelease:
    """A cluster-autoscaler release and the control plane it runs against, by the names their build.toml
    gives the binaries: ``cluster-autoscaler-<name>``, ``kube-apiserver-<kubernetes>``,
    ``kube-scheduler-<kubernetes>``, ``etcd-<etcd>``."""

    name: str  # "1.36.1", "head"
    kubernetes: str  # the kube-apiserver and kube-scheduler release
    etcd: str

    @property
    def cluster_autoscaler(self) -> str:
        return f"cluster-autoscaler-{self.name}"

    @property
    def program_names(self) -> tuple[str, str, str, str]:
        k8s = self.kubernetes
        return (self.cluster_autoscaler, f"kube-apiserver-{k8s}", f"kube-scheduler-{k8s}", f"etcd-{self.etcd}")


# What tests/e2e/gomod/build.toml declares: the CA every scenario runs, unless a scenario asks for
# another release (the compatibility matrix, test_ca_matrix.py).
CA_1_36_1 = CaRelease("1.36.1", kubernetes="1.36.2", etcd="3.6.8")


@dataclass(frozen=True)
class AutoscalerPrograms:
    control_plane: ControlPlanePrograms
    cluster_autoscaler: Path
    release: CaRelease = CA_1_36_1


def find_programs(release: CaRelease = CA_1_36_1) -> AutoscalerPrograms:
    """The binaries ``make build`` produced; GoBuildError, naming what is missing and how to build it."""
    ca, apiserver, scheduler, etcd = (binary_path(name) for name in release.program_names)
    return AutoscalerPrograms(
        ControlPlanePrograms(etcd=etcd, kube_apiserver=apiserver, kube_scheduler=scheduler),
        cluster_autoscaler=ca,
        release=release,
    )


def scaleway_pool(name: str, node_type: str, size: int, min_size: int, max_size: int, **extra: Any) -> dict[str, Any]:
    """A pool of the Scaleway simulator's scenario format, with ``size`` ready nodes."""
    return {"name": name, "node_type": node_type, "size": size, "min_size": min_size, "max_size": max_size, **extra}


def bizfly_pool(name: str, flavor: str, size: int, min_size: int, max_size: int, **extra: Any) -> dict[str, Any]:
    """A worker pool of the Bizfly simulator's scenario format, autoscaled, with ``size`` running nodes."""
    return {
        "name": name,
        "flavor": flavor,
        "desired_size": size,
        "min_size": min_size,
        "max_size": max_size,
        "enable_autoscaling": True,
        **extra,
    }


@dataclass
class Layout:
    """The pools each simulated cloud starts with (scenario dicts in each simulator's own format)."""

    scaleway_pools: list[dict[str, Any]] = field(default_factory=list)
    bizfly_pools: list[dict[str, Any]] = field(default_factory=list)
    # Keys added to our server's ``scaleway:`` mapping, e.g. ``{"mode": "public", "pools": {...}}``.
    scaleway_settings: dict[str, Any] = field(default_factory=dict)

    def scaleway_scenario(self) -> dict[str, Any]:
        return {"timings": SCALEWAY_TIMINGS, "clusters": [{"name": "e2e", "pools": self.scaleway_pools}]}

    def bizfly_scenario(self) -> dict[str, Any]:
        return {"timings": BIZFLY_TIMINGS, "clusters": [{"name": "e2e", "pools": self.bizfly_pools}]}


#: where our server keeps its Kubernetes objects when a scenario switches its features on
SERVER_NAMESPACE = "kube-system"


class OurServer:
    """``ca-externalgrpc serve`` as a child process (the harness's ``ServerProcess``), or with ``image`` the
    container image run by podman on host networking (``ContainerServer``), with the reads the scenarios
    check and a restart that keeps the address the CA's cloud-config names."""

    def __init__(
        self,
        config: Mapping[str, Any],
        workdir: Path,
        name: str = "server",
        env: Mapping[str, str] | None = None,
        image: str | None = None,
    ) -> None:
        self.name = name
        self.log_path = workdir / "logs" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        config = {**config, "log": {"format": "json"}}
        self.process: ServerProcess
        if image is not None:
            self.process = ContainerServer(image, config, dict(env or {}), workdir, name=name, log_path=self.log_path)
        else:
            self.process = ServerProcess(config, env=env, workdir=workdir, log_path=self.log_path, name=name)

    @property
    def address(self) -> str:
        return self.process.address

    def kill(self) -> None:
        """SIGKILL: a crash, nothing drained."""
        self.process.stop(signal.SIGKILL)

    def start_again(self) -> None:
        self.process.respawn(same_addresses=True)

    def check_running(self) -> None:
        if self.process.process.poll() is not None:
            raise AssertionError(f"our server exited; last lines of {self.log_path}:\n{self.process.log_tail()}")

    def stop(self) -> None:
        self.process.stop()

    def rpc_log(self, method: str) -> list[dict[str, Any]]:
        """The server's JSON log records of the mutating RPC ``method`` (reads are not logged one by one)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("grpcMethod") == method:
                    records.append(record)
        return records

    def node_groups(self) -> list[pb.NodeGroup]:
        return list(self.process.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups)

    def group_ids(self) -> list[str]:
        return [g.id for g in self.node_groups()]

    def target(self, group_id: str) -> int:
        request = pb.NodeGroupTargetSizeRequest(id=group_id)
        return int(self.process.stub.NodeGroupTargetSize(request, timeout=5).targetSize)

    def instances(self, group_id: str) -> list[pb.Instance]:
        return list(self.process.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group_id), timeout=5).instances)


# The CA's status ConfigMap (--write-status-configmap, on by default), in kube-system.
STATUS_CONFIGMAP = "cluster-autoscaler-status"


@dataclass(frozen=True)
class GroupStatus:
    """One node group as the CA's status ConfigMap shows it."""

    min_size: int
    max_size: int
    target: int
    registered: int
    ready: int
    scale_up: str
    health: str = ""

    def sizes(self) -> tuple[int, int, int]:
        return (self.min_size, self.max_size, self.target)


def status_groups(document: Mapping[str, Any]) -> tuple[str, dict[str, GroupStatus]]:
    """A parsed ``status`` of the CA's status ConfigMap: when the CA wrote it (its own ``time``) and its node
    groups by id (``cloudProviderTarget``: the target size the CA last read from the provider)."""
    found = {}
    for group in document.get("nodeGroups") or []:
        health = group.get("health") or {}
        registered = (health.get("nodeCounts") or {}).get("registered") or {}
        found[str(group["name"])] = GroupStatus(
            min_size=int(health.get("minSize", 0)),
            max_size=int(health.get("maxSize", 0)),
            target=int(health.get("cloudProviderTarget", 0)),
            registered=int(registered.get("total", 0)),
            ready=int(registered.get("ready", 0)),
            scale_up=str((group.get("scaleUp") or {}).get("status", "")),
            health=str(health.get("status", "")),
        )
    return str(document.get("time", "")), found


@dataclass
class ScenarioTiming:
    """Wall-clock seconds from what starts a scenario's work to the cloud call it causes and to its end.

    Scale-ups start at a pending pod, call the cloud to resize a pool and end with the pod running;
    scale-downs start when the nodes are empty, call the cloud to delete machines and end with the
    last Node gone.
    """

    scenario: str
    to_cloud_call: float | None = None
    to_done: float | None = None
    start: str = "pending pod"
    done: str = "pod running"

    def line(self) -> str:
        def show(value: float | None) -> str:
            return f"{value:6.1f}s" if value is not None else "     - "

        return (
            f"{self.scenario:56} {self.start}->cloud call {show(self.to_cloud_call)}"
            f"   ->{self.done} {show(self.to_done)}"
        )


class E2EEnvironment:
    def __init__(
        self,
        programs: AutoscalerPrograms,
        workdir: Path,
        layout: Layout,
        ca_flags: Mapping[str, str] | None = None,
        prepare: Callable[[E2EEnvironment], None] | None = None,
        serve: ServeBackends | None = None,
        audit: bool | Mapping[str, Any] = False,
    ) -> None:
        self.prepare = prepare
        self.audit = audit  # the control plane's audit log: off, the default policy, or a policy (ControlPlane)
        self.serve = serve
        self.programs = programs
        self.workdir = workdir
        self.layout = layout
        self.ca_flags = dict(ca_flags or {})
        self.clock = WallClock()
        self.scaleway: ScalewaySimulator | None = None
        self.bizfly: BizflySimulator | None = None
        self.server: Any = None  # OurServer, or what ``serve`` started
        self.control_plane: ControlPlane | None = None
        self.agent: NodeAgent | None = None
        self.autoscaler: Autoscaler | None = None
        self.api: k8s.ApiClient | None = None

    # ------------------------------------------------------------------------------------- lifecycle
    def start(self) -> E2EEnvironment:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scaleway = ScalewaySimulator(
            scenario=self.layout.scaleway_scenario(), clock=self.clock, secret_key=SCW_SECRET
        ).start()
        self.bizfly = BizflySimulator(scenario=self.layout.bizfly_scenario(), clock=self.clock).start()
        backends = [
            scaleway_backend(self.scaleway, settings=self.layout.scaleway_settings, sync=BACKEND_SYNC),
            bizfly_backend(self.bizfly, sync=BACKEND_SYNC),
        ]
        # The control plane first: a server with Kubernetes features (``serve``) needs the API server.
        self.control_plane = ControlPlane(self.programs.control_plane, self.workdir, audit=self.audit).start()
        self.api = kubernetes.config.new_client_from_config(str(self.control_plane.kubeconfig))
        if self.serve is not None:
            self.server = self.serve(self, backends)
        else:
            self.server = OurServer(server_config(backends), self.workdir)
        self.agent = NodeAgent(self.api, [scaleway_source(self.scaleway.url), bizfly_source(self.bizfly.url)]).start()
        self.wait_for(self._machines_registered, 30, "the running machines registered as Ready nodes")
        if self.prepare is not None:
            self.prepare(self)  # e.g. pods pinned to nodes, in place before the CA's first loop
        cloud_config = write_cloud_config(self.workdir / "cloud-config.yaml", self.server.address)
        self.autoscaler = Autoscaler(
            self.programs.cluster_autoscaler,
            self.control_plane.kubeconfig,
            cloud_config,
            self.workdir,
            self.ca_flags,
        ).start()

    def stop(self) -> None:
        for part in (self.autoscaler, self.agent, self.control_plane, self.server, self.scaleway, self.bizfly):
            if part is not None:
                part.stop()

    # ------------------------------------------------------------------------------------- accessors
    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def ca(self) -> Autoscaler:
        assert self.autoscaler is not None
        return self.autoscaler

    @property
    def ours(self) -> Any:  # OurServer, or what ``serve`` started
        assert self.server is not None
        return self.server

    def our_events(
        self, namespace: str = SERVER_NAMESPACE, object_name: str = "ca-externalgrpc-status", reporter: str = ""
    ) -> list[Any]:
        """The Events our server wrote (kubernetes.events) about its status object, oldest first; with
        ``reporter``, only those of that replica (its ``kubernetes.identity``, the Event's reportingInstance)."""
        found = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={object_name}").items
        mine = [e for e in found if not reporter or e.reporting_instance == reporter]
        return sorted(mine, key=lambda e: (e.last_timestamp, e.metadata.name))

    @property
    def scw(self) -> ScalewaySimulator:
        assert self.scaleway is not None
        return self.scaleway

    @property
    def bz(self) -> BizflySimulator:
        assert self.bizfly is not None
        return self.bizfly

    def check_running(self) -> None:
        """Every child still alive and the agent still playing kubelet; raises with the culprit's log."""
        assert self.control_plane is not None and self.agent is not None
        self.control_plane.check_running()
        self.ca.check_running()
        assert self.server is not None
        self.server.check_running()
        if not self.agent.alive():
            raise AssertionError("the node agent thread has stopped")

    # ------------------------------------------------------------------------------------- clouds
    def scaleway_pool(self, name: str) -> dict[str, Any]:
        for pool in self.scw.state.snapshot()["pools"]:
            if pool["name"] == name:
                return dict(pool)
        raise KeyError(f"no Scaleway pool named {name!r}")

    def scaleway_nodes(self, pool_name: str) -> list[dict[str, Any]]:
        pool_id = self.scaleway_pool(pool_name)["id"]
        return [n for n in self.scw.state.snapshot()["nodes"] if n["pool_id"] == pool_id]

    def bizfly_pool(self, name: str) -> dict[str, Any]:
        for pool in self.bz.snapshot()["clusters"][0]["worker_pools"]:
            if pool["name"] == name:
                return dict(pool)
        raise KeyError(f"no Bizfly pool named {name!r}")

    def bizfly_nodes(self, pool_name: str) -> list[dict[str, Any]]:
        return list(self.bizfly_pool(pool_name)["nodes"])

    def group_id(self, cloud: str, pool_name: str) -> str:
        """The node group id our server gives this pool (checked against its NodeGroups answer)."""
        pool = self.scaleway_pool(pool_name) if cloud == "scaleway" else self.bizfly_pool(pool_name)
        group = str(pool["id"])
        groups = self.ours.group_ids()
        assert group in groups, f"our server does not serve pool {pool_name!r} ({group}) as a node group: {groups}"
        return group

    def cloud_requests(self, cloud: str, route: str | tuple[str, ...], since: float = 0.0) -> list[RecordedRequest]:
        """The writes (not GETs) the cloud received on ``route`` (a name, or any of several) since ``since``."""
        sim = self.scw if cloud == "scaleway" else self.bz
        routes = (route,) if isinstance(route, str) else route
        return [r for r in sim.requests.filter() if r.route in routes and r.at >= since and r.method != "GET"]

    # ------------------------------------------------------------------------------------- kubernetes
    def create_pod(
        self,
        name: str,
        *,
        cpu: str = "100m",
        memory: str = "64Mi",
        node_selector: Mapping[str, str] | None = None,
        node_name: str | None = None,
        tolerations: Sequence[Mapping[str, str]] = (),
    ) -> float:
        """Create a bare pod in ``default``; returns the wall-clock time it was created."""
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        }
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        if node_name:
            spec["nodeName"] = node_name
        if tolerations:
            spec["tolerations"] = [dict(t) for t in tolerations]
        created = time.time()
        self.core.create_namespaced_pod(
            "default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        )
        return created

    def delete_pod_at(self, name: str) -> float:
        """Delete a pod at once; returns the wall-clock time of the deletion."""
        at = time.time()
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        return at

    def pod(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, "default")

    def wait_pod_running(self, name: str, timeout: float) -> Any:
        def running() -> Any:
            pod = self.pod(name)
            return pod if pod.status.phase == "Running" else None

        return self.wait_for(running, timeout, f"pod {name} Running")

    def nodes(self) -> dict[str, Any]:
        return {node.metadata.name: node for node in self.core.list_node().items}

    def node_by_provider_id(self) -> dict[str, Any]:
        return {node.spec.provider_id: node for node in self.core.list_node().items}

    def events(self, reason: str) -> list[Any]:
        return [e for e in self.core.list_event_for_all_namespaces().items if e.reason == reason]

    def status_document(self, since: float | None = None) -> dict[str, Any]:
        """The CA's status ConfigMap, parsed: empty until the running CA (or one started after ``since``)
        has written it. A CA deletes it when it stops, so an older one is a previous CA's."""
        try:
            config_map = self.core.read_namespaced_config_map(STATUS_CONFIGMAP, "kube-system")
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return {}
            raise
        if since is None:
            since = self.autoscaler.started_at if self.autoscaler is not None else 0.0
        created = config_map.metadata.creation_timestamp if config_map.metadata else None
        if created is None or created.timestamp() < since - 1:
            return {}
        document = yaml.safe_load((config_map.data or {}).get("status", "")) or {}
        return document if isinstance(document, dict) else {}

    def status_written(self, since: float | None = None) -> tuple[str, dict[str, GroupStatus]]:
        """When the running CA last wrote its status ConfigMap (its own ``time``), and the node groups there."""
        return status_groups(self.status_document(since))

    def status(self) -> dict[str, GroupStatus]:
        """The node groups of the CA's status ConfigMap; empty until the running CA has written it."""
        return self.status_written()[1]

    def settled_status(self, timeout: float = 60) -> dict[str, GroupStatus]:
        """The status once every group has as many ready nodes as its target (the cloud and the CA agree)."""

        def settled() -> dict[str, GroupStatus]:
            found = self.status()
            ok = found and all(g.ready == g.registered == g.target for g in found.values())
            return found if ok else {}

        return self.wait_for(settled, timeout, "the CA's status: every group's ready nodes equal to its target")

    def _machines_registered(self) -> bool:
        expected = sum(1 for m in _machines(self) if m)
        ready = [n for n in self.nodes().values() if _node_ready(n)]
        return len(ready) == expected

    # ------------------------------------------------------------------------------------- waiting
    def wait_for(self, probe: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
        """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the work folder."""
        deadline = time.monotonic() + timeout
        while True:
            result = probe()
            if result:
                return result
            if self.autoscaler is not None:
                self.check_running()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (logs in {self.workdir})")
            time.sleep(interval)


# Starts what the CA talks to, given the environment (its control plane is up) and the backends entries;
# the result offers OurServer's reads (tests/e2e/replicas.py serves two replicas behind a proxy).
ServeBackends = Callable[["E2EEnvironment", list[dict[str, Any]]], Any]


def with_kubernetes(features: Mapping[str, Any]) -> ServeBackends:
    """One server with the config's ``kubernetes:`` ``features``, talking to this cluster's API server."""

    def serve(env: E2EEnvironment, backends: list[dict[str, Any]]) -> OurServer:
        assert env.control_plane is not None
        connection = {
            "kubeconfig": str(env.control_plane.kubeconfig),
            "namespace": SERVER_NAMESPACE,
            "identity": "ca-externalgrpc-e2e",
        }
        return OurServer(server_config(backends, kubernetes={**connection, **features}), env.workdir)

    return serve


def in_container(image: str) -> ServeBackends:
    """One server as the container image ``make image`` built (tests/e2e/test_image.py)."""

    def serve(env: E2EEnvironment, backends: list[dict[str, Any]]) -> OurServer:
        return OurServer(server_config(backends), env.workdir, image=image)

    return serve


# What the ``start_environment`` fixture gives a scenario: ``start(layout, ca_flags=None, prepare=None)``.
StartEnvironment = Callable[..., E2EEnvironment]


def _machines(env: E2EEnvironment) -> Iterator[bool]:
    """One entry per machine that should be a Ready node at start: running Scaleway and Bizfly nodes."""
    for node in env.scw.state.snapshot()["nodes"]:
        yield node["status"] == "ready"
    for pool in env.bz.snapshot()["clusters"][0]["worker_pools"]:
        for node in pool["nodes"]:
            yield node["phase"] == "running"


def _node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def measure(env: E2EEnvironment, scenario: str, pod: str, created: float, cloud: str) -> ScenarioTiming:
    """The timing of one pending pod: to the first pool resize the cloud received, to the pod running."""
    calls = env.cloud_requests(cloud, RESIZE_ROUTES[cloud], since=created)
    assert env.agent is not None
    running = env.agent.record.pods_running.get(f"default/{pod}")
    return ScenarioTiming(
        scenario,
        to_cloud_call=calls[0].at - created if calls else None,
        to_done=running - created if running is not None else None,
    )


def measure_removal(env: E2EEnvironment, scenario: str, names: set[str], emptied: float) -> ScenarioTiming:
    """The timing of a scale-down: from the nodes being empty to the first machine deletion any cloud
    received, and to the last of their Nodes gone."""
    calls = [r.at for cloud in DELETE_ROUTES for r in env.cloud_requests(cloud, DELETE_ROUTES[cloud], since=emptied)]
    assert env.agent is not None
    gone = [env.agent.record.nodes_deleted[name] for name in names if name in env.agent.record.nodes_deleted]
    return ScenarioTiming(
        scenario,
        to_cloud_call=min(calls) - emptied if calls else None,
        to_done=max(gone) - emptied if len(gone) == len(names) else None,
        start="empty nodes",
        done="nodes gone",
    )
