"""A cluster with a real node, where our manifests and the official chart are deployed as an operator
deploys them: the e2e environment (simulated clouds, control plane, node agent) plus
kube-controller-manager, one real node (tests/e2e/node.py) and the operator's tools, kubectl and helm.

What runs where:

- on this machine's loopback, as in every e2e scenario: the Scaleway and Bizfly simulators, etcd,
  kube-apiserver (RBAC, audit log, ServiceAccount tokens on), kube-scheduler, kube-controller-manager
  (every default controller but the node lifecycle one, see below), the node agent;
- on the real node: whatever the scenario deploys, our server and the cluster-autoscaler among it, from
  images copied out of podman (ours from ``make image``, the CA 1.36.1 and the pause image from
  ``make node-images``);
- the simulated machines of the clouds stay the node agent's Nodes, which carry the taint
  ``SIMULATED_TAINT`` (a pool setting of the simulators): only pods that tolerate it, the scenarios'
  workloads, are placed there, so everything deployed lands on the real node, where it really runs.

**The clouds from inside a pod.** The credentials Secret, which an operator writes and the layouts never
ship, carries besides the cloud's keys the way to the simulator that plays the cloud (``cloud_way``):

- Scaleway: the API's URL, the documented ``SCW_API_URL``, naming a port of the interception proxy
  (tests/support/https_intercept.py) relayed into the node that speaks TLS as ``api.scaleway.com`` with a
  certificate that also names the node's address. The CA's in-tree Scaleway client takes no proxy, so
  this is the one way that serves it and our server alike;
- Bizfly: ``HTTPS_PROXY``, naming the interception proxy relayed into the node, which answers for
  ``manage.bizflycloud.vn``: Bizfly's service catalog names that host whatever URL the client logged in
  at, so the API's URL alone would not do;
- both: ``SSL_CERT_FILE``, naming the ``ca.crt`` of the pod's ServiceAccount token volume:
  kube-controller-manager publishes the cluster CA together with the proxy's throwaway CA as every
  namespace's ``kube-root-ca.crt``.

The proxy answers for those two hosts alone and relays to the simulators on loopback; nothing leaves
the machine.

**The API server to the node.** ``kubectl logs`` and ``exec`` go from the API server to the kubelet, and
the node's address lives in its own network namespace: the API server reaches it through its egress
selector, an HTTP CONNECT proxy on a Unix socket of this machine whose connections start inside the
node (``NodeNamespaces.connect_proxy``), as konnectivity does for a control plane that cannot route to
its nodes.

**The operator's shell.** ``operator_env`` is the environment a tutorial's commands run in
(tests/e2e/test_node_tutorials.py): ``kubectl``, ``helm`` and ``kustomize`` on the PATH under those names,
the admin's kubeconfig, a home folder of the run's own.

**Controllers.** The node lifecycle controller is off: it would mark the agent's Nodes (which renew no
Lease) unreachable and evict their pods. The agent lifts the not-ready taint of its Nodes, the node
harness that of the real one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devstack.clouds import BIZFLY_REGION, bizfly_in_tree_env
from devstack.container import default_image, image_problem
from devstack.harness import SCW_SECRET
from server.from_in_tree import SIDECAR_IMAGE
from simulators.bizfly import BizflySimulator
from simulators.scaleway import ScalewaySimulator
from tests.e2e.autoscaler import AutoscalerLog, LogEntry
from tests.e2e.control_plane import ControlPlane, NodeAccess, write_kubeconfig
from tests.e2e.environment import AutoscalerPrograms, E2EEnvironment, Layout, find_programs
from tests.e2e.node import Node, NodeNetwork, NodePrograms, Relay, find_node_programs, why_no_node
from tests.e2e.node_agent import NodeAgent, bizfly_source, scaleway_source
from tests.e2e.processes import ManagedProcess
from tests.support.gobuild import GoBuildError, binary_path
from tests.support.https_intercept import BIZFLY_PRODUCTION_HOST, InterceptingProxy
from tests.support.nodeimages import CLUSTER_AUTOSCALER, PAUSE, crds_problem
from tests.support.nodeimages import image_problem as node_image_problem

#: the taint every simulated machine's Node carries: only the scenarios' workloads tolerate it
SIMULATED_TAINT = {"key": "ca-externalgrpc.e2e/simulated", "value": "true", "effect": "NoSchedule"}
SCALEWAY_PRODUCTION_HOST = "api.scaleway.com"
#: the names the shipped layouts give the two images (the chart's default CA image; deploy/helm and
#: deploy/kubernetes name ours as from-in-tree does, with the release's version, which make release
#: checks in every one of those places)
CA_IMAGE_NAME = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.1"
SERVER_IMAGE_NAME = SIDECAR_IMAGE
NAMESPACE = "kube-system"
#: where a pod finds the cluster CA bundle (with the interception CA in it, see the module docstring)
POD_CA_BUNDLE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
KUBECTL = "kubectl-1.36.2"
HELM = "helm"
KUSTOMIZE = "kustomize"
KUBE_CONTROLLER_MANAGER = "kube-controller-manager-1.36.2"


@dataclass(frozen=True)
class NodeClusterPrograms:
    node: NodePrograms
    kube_controller_manager: Path
    kubectl: Path
    helm: Path
    kustomize: Path


def find_node_cluster_programs() -> NodeClusterPrograms:
    """The binaries ``make build`` produced; GoBuildError naming what is missing and how to build it."""
    return NodeClusterPrograms(
        node=find_node_programs(),
        kube_controller_manager=binary_path(KUBE_CONTROLLER_MANAGER),
        kubectl=binary_path(KUBECTL),
        helm=binary_path(HELM),
        kustomize=binary_path(KUSTOMIZE),
    )


def image_problems() -> list[str]:
    """Why the images the node runs are not ready (``make image``, ``make node-images``), if they are not."""
    found = [image_problem(default_image())]
    found += [node_image_problem(image) for image in (CLUSTER_AUTOSCALER, PAUSE)]
    found.append(crds_problem())
    return [problem for problem in found if problem]


def simulated_pool(pool: Mapping[str, Any], cloud: str) -> dict[str, Any]:
    """A pool of the simulators' scenario format whose machines carry ``SIMULATED_TAINT``."""
    key, value, effect = SIMULATED_TAINT["key"], SIMULATED_TAINT["value"], SIMULATED_TAINT["effect"]
    if cloud == "scaleway":
        return {**pool, "taints": {**dict(pool.get("taints") or {}), key: f"{value}:{effect}"}}
    return {**pool, "taints": [*pool.get("taints", []), dict(SIMULATED_TAINT)]}


class NodeEnvironment(E2EEnvironment):
    """The e2e environment with a real node and no server or CA of its own: a scenario deploys those."""

    def __init__(
        self,
        programs: AutoscalerPrograms,
        cluster_programs: NodeClusterPrograms,
        workdir: Path,
        layout: Layout,
        network: NodeNetwork | None = None,
        say: Callable[[str], None] = print,
        untainted: Sequence[str] = (),
    ) -> None:
        # ``untainted``: pools whose machines take any pod, for workloads that tolerate nothing (the
        # tutorials'); they must start empty, so that nothing deployed lands on a simulated machine.
        scaleway, bizfly = layout.scaleway_pools, layout.bizfly_pools
        assert all(not p["size"] for p in scaleway if p["name"] in untainted), "an untainted pool starts empty"
        assert all(not p["desired_size"] for p in bizfly if p["name"] in untainted), "an untainted pool starts empty"
        tainted = Layout(
            scaleway_pools=[p if p["name"] in untainted else simulated_pool(p, "scaleway") for p in scaleway],
            bizfly_pools=[p if p["name"] in untainted else simulated_pool(p, "bizfly") for p in bizfly],
        )
        super().__init__(programs, workdir, tainted)
        self.cluster_programs = cluster_programs
        self.network = network or NodeNetwork()
        self.say = say
        self.proxy: InterceptingProxy | None = None
        self.dialer: Any = None  # the API server's CONNECT proxy into the node
        self.dialer_dir: Path | None = None
        self.kcm: ManagedProcess | None = None
        self.node: Node | None = None
        self.timings: dict[str, float] = {}
        self.stopped = False

    # ---------------------------------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scaleway = ScalewaySimulator(
            scenario=self.layout.scaleway_scenario(), clock=self.clock, secret_key=SCW_SECRET
        ).start()
        self.bizfly = BizflySimulator(scenario=self.layout.bizfly_scenario(), clock=self.clock).start()
        # As the real one, its service catalog names the production host (which the proxy answers for).
        self.bizfly.catalog_base_url = f"https://{BIZFLY_PRODUCTION_HOST}"
        self.proxy = InterceptingProxy(
            {
                SCALEWAY_PRODUCTION_HOST: ("127.0.0.1", self.scaleway.port),
                BIZFLY_PRODUCTION_HOST: ("127.0.0.1", self.bizfly.port),
            },
            self.workdir / "intercept",
            names=(self.network.ipv4,),
        ).start()
        net = self.network
        self.node = Node(
            self.cluster_programs.node,
            self.workdir,
            api=None,  # type: ignore[arg-type]  # set below, once the API server runs
            api_port=0,
            kubeconfig_for=self._node_kubeconfig,
            pause_image=PAUSE.name,
            network=net,
            relays=[
                Relay("cloud-proxy", int(self.proxy.url.rsplit(":", 1)[1])),
                Relay("scaleway-api", self.proxy.direct(SCALEWAY_PRODUCTION_HOST)),
            ],
            say=self.say,
        )
        # A Unix socket: the API server speaks HTTP CONNECT in plaintext only over one (TCP wants TLS).
        self.dialer_dir = Path(tempfile.mkdtemp(prefix="node-dialer-"))
        dialer_path = self.dialer_dir / "connect.sock"
        dialer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dialer.bind(str(dialer_path))
        dialer.listen(64)
        self.dialer = self.node.namespaces.connect_proxy(dialer)
        access = NodeAccess(
            egress_proxy=str(dialer_path),
            advertise_address=net.ipv4,
            serving_hosts=(
                net.ipv4,
                net.kubernetes_service_ip,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self.control_plane = ControlPlane(self.programs.control_plane, self.workdir, audit=True, nodes=access).start()
        self.api = kubernetes.config.new_client_from_config(str(self.control_plane.kubeconfig))
        self._start_controller_manager()
        plane = self.control_plane
        self.node.api = self.api
        self.node.api_port = int(plane.server_url.rsplit(":", 1)[1])
        self.node.kubelet_client_ca = plane.pki.ca_cert
        self.node.start()
        self.timings["node ready"] = self.node.ready_at - self.node.started_at
        self.agent = NodeAgent(
            self.api,
            [scaleway_source(self.scaleway.url), bizfly_source(self.bizfly.url)],
            real_nodes={self.node.name},
        ).start()
        self.wait_for(self._machines_registered, 30, "the running machines registered as Ready nodes")
        loaded = time.monotonic()
        self.node.import_image(default_image(), SERVER_IMAGE_NAME)
        self.node.import_image(CLUSTER_AUTOSCALER.name, CA_IMAGE_NAME)
        self.timings["images"] = time.monotonic() - loaded
        self.timings["start"] = time.monotonic() - started
        self.say(
            f"cluster with a real node up in {self.timings['start']:.1f} s (node Ready "
            f"{self.timings['node ready']:.1f} s, images into the node {self.timings['images']:.1f} s)"
        )

    def _node_kubeconfig(self, server: str, path: Path) -> Path:
        assert self.control_plane is not None
        return write_kubeconfig(path, server, self.control_plane.pki)

    def _start_controller_manager(self) -> None:
        plane = self.control_plane
        assert plane is not None and self.proxy is not None
        # Every namespace's kube-root-ca.crt: the cluster CA, and the interception proxy's (module docstring).
        bundle = self.workdir / "pki" / "root-ca-bundle.crt"
        bundle.write_bytes(plane.pki.ca_cert.read_bytes() + self.proxy.ca_file.read_bytes())
        kubeconfig = str(plane.kubeconfig)
        self.kcm = ManagedProcess(
            "kube-controller-manager",
            [
                str(self.cluster_programs.kube_controller_manager),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--root-ca-file={bundle}",
                f"--service-account-private-key-file={plane.pki.service_account_key}",
                "--controllers=*,-node-lifecycle-controller",
                "--v=1",
            ],
            self.workdir / "logs" / "kube-controller-manager.log",
        ).start()
        # Running once it published the default ServiceAccount (pods need it for their token).
        self.kcm.wait_until(lambda: bool(self.core.read_namespaced_service_account("default", "default")), 60, "up")

    def stop(self) -> None:
        """Everything in reverse order; every part is stopped even when one fails (the first error is raised)."""
        if self.stopped:
            return
        self.stopped = True
        errors: list[Exception] = []
        for part in (
            self.agent,
            self.node,
            self.dialer,
            self.kcm,
            self.control_plane,
            self.proxy,
            self.scaleway,
            self.bizfly,
        ):
            if part is not None:
                try:
                    part.stop()
                except Exception as exc:
                    errors.append(exc)
        if self.dialer_dir is not None:
            shutil.rmtree(self.dialer_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def _machines_registered(self) -> bool:
        node = self.node.name if self.node else ""
        expected = sum(1 for _ in self._running_machines())
        ready = [n for name, n in self.nodes().items() if name != node and _ready(n)]
        return len(ready) == expected

    def _running_machines(self) -> Any:
        for node in self.scw.state.snapshot()["nodes"]:
            if node["status"] == "ready":
                yield node
        for pool in self.bz.snapshot()["clusters"][0]["worker_pools"]:
            for node in pool["nodes"]:
                if node["phase"] == "running":
                    yield node

    def check_running(self) -> None:
        assert self.control_plane is not None and self.node is not None and self.kcm is not None
        self.control_plane.check_running()
        self.kcm.check_running()
        self.node.check_running()
        if self.agent is not None and not self.agent.alive():
            raise AssertionError("the node agent thread has stopped")

    @property
    def real_node(self) -> Node:
        assert self.node is not None
        return self.node

    # ---------------------------------------------------------------------------------------- operator
    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        """kubectl as the cluster's admin; its output, AssertionError with its error."""
        return self._run([str(self.cluster_programs.kubectl), *args], stdin, timeout)

    def helm(self, *args: str, timeout: float = 300) -> str:
        return self._run([str(self.cluster_programs.helm), *args], None, timeout)

    def operator_env(self) -> dict[str, str]:
        """Where an operator's commands run: ``kubectl``, ``helm`` and ``kustomize`` on the PATH by those
        names, the admin's kubeconfig, a home of the run's own (helm's repositories, podman's logins)."""
        assert self.control_plane is not None
        tools = self.workdir / "operator-bin"
        tools.mkdir(parents=True, exist_ok=True)
        programs = self.cluster_programs
        named = {"kubectl": programs.kubectl, "helm": programs.helm, "kustomize": programs.kustomize}
        for name, program in named.items():
            if not (tools / name).exists():
                (tools / name).symlink_to(program)
        return {
            **os.environ,
            "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(self.control_plane.kubeconfig),
            "HOME": str(self.workdir / "home"),
        }

    def _run(self, argv: Sequence[str], stdin: str | None, timeout: float) -> str:
        env = self.operator_env()
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv[:4])} ... exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def cloud_way(self, cloud: str) -> dict[str, str]:
        """The variables that take a pod's calls to ``cloud`` to its simulator (module docstring): what the
        test adds to every Secret of cloud credentials an operator writes."""
        if cloud == "scaleway":
            return {"SCW_API_URL": f"https://{self.real_node.address('scaleway-api')}", "SSL_CERT_FILE": POD_CA_BUNDLE}
        return {
            "HTTPS_PROXY": f"http://{self.real_node.address('cloud-proxy')}",
            "NO_PROXY": f"{self.network.services},.svc,.cluster.local,127.0.0.1,localhost",
            "SSL_CERT_FILE": POD_CA_BUNDLE,
        }

    def cloud_credentials(self, cloud: str = "scaleway") -> dict[str, str]:
        """What an operator puts in the Secret ca-externalgrpc-credentials for the simulated ``cloud``,
        plus the way from a pod to it (module docstring)."""
        way = self.cloud_way(cloud)
        if cloud == "scaleway":
            return {
                "SCW_SECRET_KEY": self.scw.secret_key,
                "CLUSTER_ID": self.scw.cluster_id,
                "SCW_REGION": self.scw.region,
                **way,
            }
        if cloud == "bizfly":
            return {**bizfly_in_tree_env(self.bz), "BIZFLYCLOUD_REGION": BIZFLY_REGION, **way}
        raise ValueError(f"no credentials for {cloud!r}")

    def create_credentials_secret(self, cloud: str = "scaleway", namespace: str = NAMESPACE) -> None:
        """``kubectl create secret generic ca-externalgrpc-credentials --from-env-file=...``, as the layouts say."""
        env_file = self.workdir / f"credentials-{cloud}.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in self.cloud_credentials(cloud).items()))
        self.kubectl(
            "-n", namespace, "create", "secret", "generic", "ca-externalgrpc-credentials", f"--from-env-file={env_file}"
        )

    # ---------------------------------------------------------------------------------------- reading
    def pods(self, selector: str, namespace: str = NAMESPACE) -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def wait_pods_ready(self, selector: str, count: int, timeout: float, namespace: str = NAMESPACE) -> list[Any]:
        """``count`` pods of ``selector``, all Ready, none being deleted; returns them."""

        def ready() -> list[Any]:
            pods = [p for p in self.pods(selector, namespace) if p.metadata.deletion_timestamp is None]
            return pods if len(pods) == count and all(_pod_ready(p) for p in pods) else []

        return self.wait_for(ready, timeout, f"{count} Ready pod(s) of {selector} in {namespace}")

    def container_id(self, pod: Any, container: str) -> str:
        statuses = [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]
        (found,) = [s.container_id for s in statuses if s.name == container]
        return str(found)

    def forbidden(self, user: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        """The API server's audit events answered 403 (RBAC refused), of ``user`` when given."""
        assert self.control_plane is not None
        return [
            e
            for e in self.control_plane.audit_events(user)
            if e.get("responseStatus", {}).get("code") == 403 and _audit_time(e) >= since
        ]


class PodLog(AutoscalerLog):
    """The JSON lines of one container (its CRI log on the node): the CA's, read as ``AutoscalerLog`` reads
    the CA process's file; also our server's."""

    def __init__(self, env: NodeEnvironment, pod: Any, container: str, restart: int | None = None) -> None:
        super().__init__(env.workdir / "unused")
        self.env, self.pod, self.container, self.restart = env, pod, container, restart

    def entries(self, since: float = 0.0) -> list[LogEntry]:
        out = []
        for line in self.env.real_node.container_log(self.pod, self.container, self.restart):
            if not line.text.startswith("{"):
                continue
            try:
                data = json.loads(line.text)
            except json.JSONDecodeError:
                continue
            at = _entry_time(data, line.at)
            if at >= since:
                out.append(LogEntry(at, str(data.get("msg", "")), data))
        return out


def _entry_time(data: Mapping[str, Any], fallback: float) -> float:
    """klog's JSON ``ts`` (milliseconds since the epoch) or our server's ``time`` (ISO 8601), else when the
    runtime read the line."""
    if isinstance(data.get("ts"), int | float):
        return float(data["ts"]) / 1000.0
    return fallback


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _audit_time(event: Mapping[str, Any]) -> float:
    stamp = str(event.get("stageTimestamp") or event.get("requestReceivedTimestamp") or "")
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return 0.0


# ------------------------------------------------------------------------------------------------ fixtures
@contextlib.contextmanager
def node_environments(tmp_path: Path) -> Iterator[Callable[..., NodeEnvironment]]:
    """A factory of started ``NodeEnvironment``s (``start(layout, network=None, untainted=())``), all stopped
    at the end.

    A machine where a real node cannot run skips the test with one line saying why (not root, runc, podman
    or the CNI plugins missing); a missing program or image fails it with the command that builds it."""
    reason = why_no_node()
    if reason:
        pytest.skip(reason)
    missing = ""
    try:
        programs, cluster_programs = find_programs(), find_node_cluster_programs()
    except GoBuildError as err:
        missing = str(err)
    if missing:
        pytest.fail(missing, pytrace=False)
    problems = image_problems()
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    started: list[NodeEnvironment] = []

    def start(layout: Layout, network: NodeNetwork | None = None, untainted: Sequence[str] = ()) -> NodeEnvironment:
        env = NodeEnvironment(
            programs, cluster_programs, tmp_path / f"run{len(started)}", layout, network, untainted=untainted
        )
        started.append(env)
        return env.start()  # type: ignore[return-value]

    try:
        yield start
    finally:
        for env in started:
            env.stop()
