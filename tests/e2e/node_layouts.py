"""Every layout we ship, deployed on a real node as an operator deploys it, and what the node scenarios
check of it (tests/e2e/test_node_*.py).

An operator's steps, done with the real tools against the run's cluster (tests/e2e/node_cluster.py):

1. ``kubectl create secret generic ca-externalgrpc-credentials --from-env-file=...``: the cloud's keys
   (here the simulator's, with the way to it, see node_cluster.py);
2. the Helm layouts: ``helm install cluster-autoscaler <chart> -n kube-system -f deploy/helm/<values>``
   with the official chart at the version we pin (tests/deploy/chart.py: CA 1.36.1, chart 9.58.0); the
   kustomize layouts: ``kubectl apply -k`` of an operator's overlay that takes ours as its base.

What the scenarios change from the shipped files, and only that: the CA's loop timings (a 2 s scan
interval, nodes unneeded after 5 s, as every e2e scenario runs the CA: ``CA_TIMING_FLAGS``), set with
``--set extraArgs...`` or an args patch; and for the Kubernetes-features layouts, the server config's
``kubernetes:`` block switched on as the shipped files' comments tell an operator to (the commented
block of values-sidecar.yaml uncommented; the same features added to the kustomize overlay's config).
The images are the ones the layouts name (node_cluster.py imports ours and the CA's under those names).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.chart import CA_1_36_1, SIDECAR_FEATURES_VALUES, SIDECAR_VALUES, VALUES_DIR, chart_dir, chart_version
from tests.deploy.rendering import KUBERNETES
from tests.e2e.autoscaler import BASE_FLAGS
from tests.e2e.environment import DELETE_ROUTES, RESIZE_ROUTES, ScenarioTiming, measure, measure_removal
from tests.e2e.node_certificates import certificate_names, install_crds, issue
from tests.e2e.node_cluster import NAMESPACE, SIMULATED_TAINT, NodeEnvironment, PodLog
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, machines, pool_size

#: the CA flags every e2e scenario shortens (tests/e2e/autoscaler.py), nothing else
CA_TIMING_FLAGS = {
    name: BASE_FLAGS[name]
    for name in (
        "scan-interval",
        "scale-down-unneeded-time",
        "scale-down-delay-after-add",
        "scale-down-delay-after-delete",
        "scale-down-delay-after-failure",
        "new-pod-scale-up-delay",
        "max-node-provision-time",
    )
}
TOLERATE_SIMULATED = {"key": SIMULATED_TAINT["key"], "operator": "Exists", "effect": SIMULATED_TAINT["effect"]}
#: the CA's pod in every layout (the chart's labels; the kustomize base's)
CA_SELECTOR = "app.kubernetes.io/name=cluster-autoscaler"
#: the server's own pods in the mTLS layouts
SERVER_SELECTOR = "app.kubernetes.io/name=ca-externalgrpc-server"
#: the features the sidecar layouts can switch on (leader election is for the separate server only)
MTLS_VALUES = VALUES_DIR / "values-mtls-service.yaml"
SIDECAR_FEATURES = {"learned_templates": {"enabled": True}, "journal": {"enabled": True}, "events": {"enabled": True}}


@dataclass
class Deployed:
    """One layout on the node: what to find it by and what its deployment measured."""

    layout: str
    ca_container: str = "cluster-autoscaler"
    server_container: str = "ca-externalgrpc"
    server_selector: str = CA_SELECTOR  # the sidecar layouts: the server is in the CA's pod
    server_replicas: int = 1
    server_account: str = "system:serviceaccount:kube-system:cluster-autoscaler"
    ca_account: str = "system:serviceaccount:kube-system:cluster-autoscaler"
    features: bool = False
    applied_at: float = 0.0
    ready_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def sidecar(self) -> bool:
        return self.server_selector == CA_SELECTOR


def timing_args() -> list[str]:
    return [f"--set=extraArgs.{name}={value}" for name, value in CA_TIMING_FLAGS.items()]


def with_features_uncommented(values: Path, target: Path) -> Path:
    """values-sidecar.yaml with its commented ``kubernetes:`` block switched on, line for line as its
    comment tells an operator (``# kubernetes:`` ... ``#     enabled: true`` without the ``# ``)."""
    lines = values.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# kubernetes:")
    indent = lines[start].index("#")
    out = list(lines)
    for i in range(start, len(lines)):
        line = lines[i]
        if not line.strip().startswith("#") or line.index("#") != indent:
            break
        out[i] = line[:indent] + line[indent + 2 :]
    target.write_text("\n".join(out) + "\n")
    config = _sidecar_server_config(yaml.safe_load(target.read_text()))
    assert config.get("kubernetes") == SIDECAR_FEATURES, f"uncommented block reads {config.get('kubernetes')}"
    return target


def _sidecar_server_config(values: dict[str, Any]) -> dict[str, Any]:
    (configmap,) = [o for o in values["extraObjects"] if o["metadata"]["name"] == "ca-externalgrpc-config"]
    return dict(yaml.safe_load(configmap["data"]["config.yaml"]))


def install_chart(env: NodeEnvironment, layout: str, values: Sequence[Path]) -> Deployed:
    """``helm install`` of the official chart with ``values``; waits for the CA's pod Ready."""
    chart = chart_dir(CA_1_36_1)
    deployed = Deployed(layout)
    argv = ["install", "cluster-autoscaler", str(chart), "--namespace", NAMESPACE]
    for path in values:
        argv += ["-f", str(path)]
    deployed.applied_at = time.time()
    env.helm(*argv, *timing_args())
    deployed.notes.append(f"chart cluster-autoscaler {chart_version(CA_1_36_1)}")
    env.wait_pods_ready(CA_SELECTOR, 1, 180)
    deployed.ready_seconds = time.time() - deployed.applied_at
    return deployed


def deploy_sidecar_chart(env: NodeEnvironment, features: bool = False) -> Deployed:
    env.create_credentials_secret()
    if not features:
        return install_chart(env, "helm: values-sidecar.yaml", [SIDECAR_VALUES])
    values = with_features_uncommented(SIDECAR_VALUES, env.workdir / "values-sidecar-features-on.yaml")
    deployed = install_chart(
        env, "helm: values-sidecar.yaml + values-sidecar-kubernetes-features.yaml", [values, SIDECAR_FEATURES_VALUES]
    )
    deployed.features = True
    return deployed


# ------------------------------------------------------------------------------------------ kustomize
def operator_overlay(env: NodeEnvironment, base: str, *, features: bool = False, name: str = "") -> Path:
    """An operator's own overlay on top of one of ours (``base``, relative to deploy/kubernetes): the CA's
    timing flags, and with ``features`` the server config's Kubernetes features and their RBAC."""
    directory = env.workdir / "overlays" / (name or base.replace("/", "-"))
    directory.mkdir(parents=True, exist_ok=True)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KUBERNETES / base, directory)],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": "cluster-autoscaler"},
                "patch": yaml.safe_dump(
                    [
                        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": f"--{k}={v}"}
                        for k, v in CA_TIMING_FLAGS.items()
                    ]
                ),
            }
        ],
    }
    if features:
        shipped = yaml.safe_load((KUBERNETES / base / "config.yaml").read_text())
        (directory / "config.yaml").write_text(yaml.safe_dump({**shipped, "kubernetes": SIDECAR_FEATURES}))
        kustomization["components"] = [os.path.relpath(KUBERNETES / "components" / "kubernetes-features", directory)]
        kustomization["configMapGenerator"] = [
            {"name": "ca-externalgrpc-config", "behavior": "replace", "files": ["config.yaml"]}
        ]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


def apply_overlay(env: NodeEnvironment, layout: str, overlay: Path, deployed: Deployed | None = None) -> Deployed:
    """``kubectl apply -k``; waits for the CA's pod Ready (and the server's pods, when apart)."""
    deployed = deployed or Deployed(layout)
    deployed.applied_at = time.time()
    env.kubectl("apply", "-k", str(overlay))
    if not deployed.sidecar:
        env.wait_pods_ready(deployed.server_selector, deployed.server_replicas, 180)
    env.wait_pods_ready(CA_SELECTOR, 1, 180)
    deployed.ready_seconds = time.time() - deployed.applied_at
    return deployed


def deploy_sidecar_overlay(env: NodeEnvironment, features: bool = False, cloud: str = "scaleway") -> Deployed:
    env.create_credentials_secret(cloud)
    overlay = operator_overlay(env, f"overlays/{cloud}", features=features)
    layout = f"kustomize: overlays/{cloud}" + (" + components/kubernetes-features" if features else "")
    deployed = apply_overlay(env, layout, overlay)
    deployed.features = features
    return deployed


# ------------------------------------------------------------------------------------------ checks
def ca_pod(env: NodeEnvironment) -> Any:
    (pod,) = [p for p in env.pods(CA_SELECTOR) if p.metadata.deletion_timestamp is None]
    return pod


def ca_log(env: NodeEnvironment) -> PodLog:
    return PodLog(env, ca_pod(env), "cluster-autoscaler")


def scale_up_and_down(
    env: NodeEnvironment, deployed: Deployed, cloud: str = "scaleway"
) -> tuple[ScenarioTiming, ScenarioTiming]:
    """A pending pod makes the CA grow the cloud's pool "general" by one machine through our server; once
    the pod is gone the CA removes that node again. The two timings, checked against the cloud and the
    CA's log."""
    log = ca_log(env)
    (first,) = machines(env, cloud, "general")
    env.create_pod("filler", cpu=FILLER_CPU[cloud], node_name=first["name"], tolerations=[TOLERATE_SIMULATED])
    env.wait_pod_running("filler", 30)
    created = env.create_pod(
        "app", cpu=APP_CPU[cloud], node_selector={POOL_LABEL[cloud]: "general"}, tolerations=[TOLERATE_SIMULATED]
    )
    pod = env.wait_pod_running("app", 120)
    up = measure(env, f"{deployed.layout}: scale-up", "app", created, cloud)
    assert len(env.cloud_requests(cloud, RESIZE_ROUTES[cloud], since=created)) == 1
    assert pool_size(env, cloud, "general") == 2
    (new,) = [m for m in machines(env, cloud, "general") if m["id"] != first["id"]]
    assert pod.spec.node_name == new["name"]
    group = env.scaleway_pool("general")["id"] if cloud == "scaleway" else env.bizfly_pool("general")["id"]
    assert log.matching(rf"^Scale-up: setting group {group} size to 2", since=created), "the CA did not decide it"

    emptied = env.delete_pod_at("app")
    env.wait_for(lambda: new["name"] not in env.nodes(), 180, f"node {new['name']} removed")
    down = measure_removal(env, f"{deployed.layout}: scale-down", {new["name"]}, emptied)
    assert len(env.cloud_requests(cloud, DELETE_ROUTES[cloud], since=emptied)) == 1
    assert [m["id"] for m in machines(env, cloud, "general")] == [first["id"]]
    assert log.matching(rf'^Scale-down: removing empty node "{new["name"]}"', since=emptied)
    errors = log.provider_errors(since=created)
    assert not errors, [e.message[:160] for e in errors[:5]]
    env.core.delete_namespaced_pod("filler", "default", grace_period_seconds=0)
    return up, down


def rbac_refusals(env: NodeEnvironment, deployed: Deployed) -> list[str]:
    """Every request of the layout's service accounts the API server refused (403) since it was applied."""
    users = {deployed.server_account, deployed.ca_account}
    return [
        f"{e['user']['username']} {e['verb']} {e.get('objectRef', {}).get('resource')}/"
        f"{e.get('objectRef', {}).get('name', '')}"
        for user in users
        for e in env.forbidden(user, since=deployed.applied_at)
    ]


@dataclass(frozen=True)
class StopOrder:
    """When the kubelet stopped each container of a pod being deleted, from containerd's own log."""

    stop_requested: dict[str, float]  # container name -> StopContainer
    exited: dict[str, float]  # container name -> exit

    def line(self) -> str:
        names = sorted(self.stop_requested, key=self.stop_requested.__getitem__)
        t0 = min(self.stop_requested.values())
        return ", ".join(
            f"{n}: SIGTERM +{self.stop_requested[n] - t0:.2f}s, exited +{self.exited.get(n, float('nan')) - t0:.2f}s"
            for n in names
        )


CONTAINERD_TIME = re.compile(r'^time="([^"]+)"')
STOP_LINE = re.compile(r'StopContainer for \\"([0-9a-f]{64})\\" with timeout')
# containerd logs the event in protobuf's text form, whose spacing Go's protobuf varies on purpose from one
# build of a program to another (one or two spaces between fields), and which leaves out a zero ``nanos``.
EXIT_LINE = re.compile(
    r'received container exit event container_id:\\"([0-9a-f]{64})\\"'
    r".*exited_at:\{seconds:(\d+)(?:\s+nanos:(\d+))?\s*\}"
)


def stop_order(env: NodeEnvironment, ids: dict[str, str]) -> StopOrder:
    """``ids``: container name -> containerd id. Read from the node's containerd log."""
    by_id = {cid.split("://")[-1]: name for name, cid in ids.items()}
    requested: dict[str, float] = {}
    exited: dict[str, float] = {}
    for line in (env.workdir / "logs" / "containerd.log").read_text(errors="replace").splitlines():
        if (stop := STOP_LINE.search(line)) and stop.group(1) in by_id:
            when = CONTAINERD_TIME.match(line)
            if when:
                requested.setdefault(by_id[stop.group(1)], _rfc3339(when.group(1)))
        elif (gone := EXIT_LINE.search(line)) and gone.group(1) in by_id:
            exited.setdefault(by_id[gone.group(1)], int(gone.group(2)) + int(gone.group(3) or 0) / 1e9)
    return StopOrder(requested, exited)


def _rfc3339(stamp: str) -> float:
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()


def delete_pod_and_watch(env: NodeEnvironment, pod: Any, timeout: float = 60) -> tuple[StopOrder, dict[str, list[str]]]:
    """``kubectl delete pod`` (graceful), then: the containers' stop order, and each container's last log
    lines, read while the pod terminates (the kubelet removes the logs with the pod)."""
    ids = {c: env.container_id(pod, c) for c in _container_names(pod)}
    env.kubectl("-n", pod.metadata.namespace, "delete", "pod", pod.metadata.name, "--wait=false")
    last: dict[str, list[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in ids:
            lines = env.real_node.container_log(pod, name)
            if lines:
                last[name] = [line.text for line in lines[-20:]]
        order = stop_order(env, ids)
        if len(order.exited) == len(ids):
            return order, last
        time.sleep(0.2)
    raise AssertionError(
        f"the containers of {pod.metadata.name} did not all stop in {timeout:.0f}s: {stop_order(env, ids)}"
    )


def _container_names(pod: Any) -> list[str]:
    return [c.name for c in [*(pod.spec.init_containers or []), *pod.spec.containers]]


# ------------------------------------------------------------------------------------------ mTLS
MTLS_SERVER_ACCOUNT = "system:serviceaccount:kube-system:ca-externalgrpc-server"


def wait_leader_ready(env: NodeEnvironment, timeout: float = 180) -> list[Any]:
    """The two server replicas running, exactly one Ready (the leader; a follower fails /readyz)."""

    def settled() -> list[Any]:
        pods = [p for p in env.pods(SERVER_SELECTOR) if p.metadata.deletion_timestamp is None]
        running = [p for p in pods if p.status.phase == "Running"]
        ready = [p for p in running if _ready(p)]
        return pods if len(running) == 2 and len(ready) == 1 else []

    return env.wait_for(settled, timeout, "two server replicas running, the leader Ready")


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def leader_pod(env: NodeEnvironment) -> Any:
    (pod,) = [p for p in env.pods(SERVER_SELECTOR) if p.metadata.deletion_timestamp is None and _ready(p)]
    return pod


def deploy_server_mtls(env: NodeEnvironment, deployed: Deployed, overlay: Path) -> Deployed:
    """cert-manager's CRDs, ``kubectl apply -k`` of ``overlay``, the Certificates issued, the leader Ready."""
    install_crds(env.kubectl)
    deployed.applied_at = time.time()
    env.kubectl("apply", "-k", str(overlay))
    assert env.api is not None
    issued = issue(env.api, NAMESPACE)
    assert sorted(issued) == sorted(certificate_names(KUBERNETES / "server-mtls" / "certificates.yaml")), issued
    wait_leader_ready(env)
    return deployed


def deploy_mtls_chart(env: NodeEnvironment) -> Deployed:
    """The server as values-mtls-service.yaml's comment says: server-mtls applied first, then the chart."""
    env.create_credentials_secret()
    deployed = Deployed(
        "helm: values-mtls-service.yaml + kustomize server-mtls",
        server_selector=SERVER_SELECTOR,
        server_replicas=2,
        server_account=MTLS_SERVER_ACCOUNT,
        features=True,
    )
    deploy_server_mtls(env, deployed, KUBERNETES / "server-mtls")
    env.helm(
        "install",
        "cluster-autoscaler",
        str(chart_dir(CA_1_36_1)),
        "--namespace",
        NAMESPACE,
        "-f",
        str(MTLS_VALUES),
        *timing_args(),
    )
    env.wait_pods_ready(CA_SELECTOR, 1, 180)
    deployed.ready_seconds = time.time() - deployed.applied_at
    return deployed


def deploy_mtls_overlay(env: NodeEnvironment) -> Deployed:
    env.create_credentials_secret()
    deployed = Deployed(
        "kustomize: overlays/mtls-service",
        server_selector=SERVER_SELECTOR,
        server_replicas=2,
        server_account=MTLS_SERVER_ACCOUNT,
        features=True,
    )
    deploy_server_mtls(env, deployed, operator_overlay(env, "overlays/mtls-service"))
    env.wait_pods_ready(CA_SELECTOR, 1, 180)
    deployed.ready_seconds = time.time() - deployed.applied_at
    return deployed


# ------------------------------------------------------------------------------------------ restarts
def rolling_restart(env: NodeEnvironment, deployed: Deployed) -> float:
    """``kubectl rollout restart`` of the server's Deployment; seconds until the new server pod(s) serve
    the CA again (Ready, and a CA loop with no provider error after it)."""
    deployment = "cluster-autoscaler" if deployed.sidecar else "ca-externalgrpc-server"
    before = {p.metadata.uid for p in env.pods(deployed.server_selector)}
    started = time.time()
    env.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{deployment}")

    def replaced() -> bool:
        pods = [p for p in env.pods(deployed.server_selector) if p.metadata.deletion_timestamp is None]
        fresh = [p for p in pods if p.metadata.uid not in before]
        return len(fresh) == len(pods) == deployed.server_replicas and (
            all(_ready(p) for p in fresh) if deployed.sidecar else sum(_ready(p) for p in fresh) == 1
        )

    env.wait_for(replaced, 240, f"{deployment} replaced and Ready")
    log = ca_log(env)

    def serving() -> bool:
        loops = log.loops(since=started)
        return len(loops) >= 2 and not log.provider_errors(since=loops[-2].at)

    env.wait_for(serving, 120, "a CA loop without provider error after the restart")
    return time.time() - started
