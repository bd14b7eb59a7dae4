"""Each layout's RBAC against the real API server: our server (a child process) runs as a user with
exactly the rights the layout ships, and everything its config switches on works, with no refusal.

- the sidecar with every feature off and no rights at all: it serves and scales, and never calls the API
  server (its kubeconfig points through a proxy that counts connections);
- the sidecar with learned templates, the journal and Events on, as the chart renders the CA's roles from
  values-sidecar.yaml and values-sidecar-kubernetes-features.yaml;
- server-mtls with its four features on, as its kustomization binds its ServiceAccount.

tests/deploy/test_rbac.py checks on the rendered files that these rights are no more than the features use.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from devstack.clouds import scaleway_backend
from devstack.container import ContainerServer
from devstack.harness import ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from server.kube.leader import holder_name
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.deploy.chart import CA_1_36_1, SIDECAR_VALUES, helm_template, sidecar_roles
from tests.deploy.rendering import one, render, service_account_roles
from tests.e2e.control_plane import ControlPlane
from tests.kube.polling import wait_for
from tests.kube.rbac import bind_user

POOL = "f1f1f1f1-0000-4000-8000-0000000000a1"
SCENARIO = {
    "seed": 7,
    "clusters": [
        {
            "id": "c1c1c1c1-1111-4222-8333-0000000000a1",
            "name": "rbac",
            "pools": [{"id": POOL, "name": "workers", "node_type": "DEV1-M", "size": 2, "min_size": 0, "max_size": 9}],
        }
    ],
}
#: the backend name the shipped configs use: the templates ConfigMap's name ends with it
BACKEND = "scaleway"
JOURNAL, STATUS, TEMPLATES = "ca-externalgrpc-journal", "ca-externalgrpc-status", "ca-externalgrpc-templates-scaleway"
SERVER_ACCOUNT = "ca-externalgrpc-server"
ALLOCATABLE = {"cpu": "2800m", "memory": "7270Mi", "pods": "110"}
#: how the features log a refusal by RBAC: "HTTP 403 Forbidden", "the API server answered 403 Forbidden"
REFUSAL = re.compile(r"\b403 Forbidden\b|\bForbidden\b|\bforbidden:")


class CountingProxy:
    """A TCP forwarder on loopback in front of the API server that counts the connections it accepts."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("https://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.stopped = True
        self.listener.close()


@pytest.fixture
def cloud() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()) as sim:
        yield sim


def configmap(admin: client.ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    """The ConfigMap's data; None while it does not exist."""
    try:
        return dict(client.CoreV1Api(admin).read_namespaced_config_map(name, namespace).data or {})
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def start_server(
    cloud: ScalewaySimulator,
    tmp: Path,
    kubernetes: dict[str, Any],
    name: str = "ours",
    env: dict[str, str] | None = None,
    image: str | None = None,
) -> ServerProcess:
    """A child process, or with ``image`` that container image run as the manifests run it."""
    # Listings only after a write, so the journal's read-back and its clearing follow the write at once.
    backend = scaleway_backend(cloud, name=BACKEND, sync={"interval": "60s"})
    config = server_config([backend], kubernetes=kubernetes)
    if image is None:
        return ServerProcess(config, env=env, workdir=tmp, name=name)
    # The image's user reads the kubeconfig as a pod reads its mounted Secret: one file, credentials inline.
    mounted = tmp / f"{name}-kubeconfig"
    mounted.mkdir()
    kubernetes = {**kubernetes, "kubeconfig": str(inline_kubeconfig(Path(kubernetes["kubeconfig"]), mounted))}
    config = server_config([backend], kubernetes=kubernetes)
    volume = f"--volume={mounted}:{mounted}:ro"
    return ContainerServer(image, config, env or {}, tmp, name=name, extra_args=[volume])


def inline_kubeconfig(path: Path, directory: Path) -> Path:
    """``path``'s kubeconfig with its certificate and key files inlined, written readable to any user."""
    kubeconfig = yaml.safe_load(path.read_text())
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in kubeconfig[section]:
            fields = entry[key]
            for name in ("certificate-authority", "client-certificate", "client-key"):
                if name in fields:
                    fields[f"{name}-data"] = base64.b64encode(Path(fields.pop(name)).read_bytes()).decode()
    inlined = directory / "kubeconfig"
    inlined.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    directory.chmod(0o755)
    inlined.chmod(0o644)  # a test user's key: the image runs as UID 65532, not as this test's root
    return inlined


def start_server_mtls_replica(
    control_plane: ControlPlane,
    admin: client.ApiClient,
    namespace: str,
    cloud: ScalewaySimulator,
    tmp: Path,
    env: dict[str, str] | None = None,
    image: str | None = None,
) -> tuple[ServerProcess, str]:
    """Our server as server-mtls ships it, its four features on, as a user bound to exactly the roles its
    kustomization gives its ServiceAccount (in the container ``image`` when given); and its Lease's name."""
    docs = render("server-mtls")
    user = f"mtls-{uuid.uuid4().hex[:8]}"
    bind_user(admin, namespace, user, *service_account_roles(docs, SERVER_ACCOUNT))
    shipped = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])["kubernetes"]
    kubernetes = {
        **shipped,
        "kubeconfig": str(control_plane.user_kubeconfig(user)),
        "namespace": namespace,
        "identity": "replica-a",
        # The shipped names and lease timings; only the write intervals are shortened for the test.
        "learned_templates": {**shipped["learned_templates"], "min_write_interval": "200ms"},
        "events": {**shipped["events"], "status_interval": "1s"},
    }
    server = start_server(cloud, tmp, kubernetes, name="replica-a", env=env, image=image)
    return server, str(shipped["leader_election"]["lease_name"])


def lease_holder(admin: client.ApiClient, namespace: str, lease: str) -> str:
    """The identity part of the Lease's holder ("" when it has none or does not exist)."""
    try:
        found = client.CoordinationV1Api(admin).read_namespaced_lease(lease, namespace)
    except ApiException as err:
        if err.status == 404:
            return ""
        raise
    return holder_name(str(found.spec.holder_identity or ""))


def register_a_node(admin: client.ApiClient, cloud: ScalewaySimulator, created: list[str]) -> str:
    """The Node of one of the pool's machines, Ready, as the kubelet and the cloud controller make it."""
    ref = next(r for r in cloud.node_refs() if r["pool_id"] == POOL)
    core = client.CoreV1Api(admin)
    metadata = {"name": ref["name"], "labels": ref["labels"]}
    core.create_node({"metadata": metadata, "spec": {"providerID": ref["provider_id"]}})
    created.append(ref["name"])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    ready |= {"lastHeartbeatTime": now, "lastTransitionTime": now}
    status = {"capacity": {**ALLOCATABLE, "cpu": "3"}, "allocatable": ALLOCATABLE, "conditions": [ready]}
    core.patch_node_status(ref["name"], {"status": status})
    return str(ref["name"])


def scale_up_and_see_every_feature_work(
    server: ServerProcess, cloud: ScalewaySimulator, admin: client.ApiClient, namespace: str, nodes: list[str]
) -> None:
    """Learned template, a journaled scale-up, its Event; then no API refusal in the server's log."""
    node = register_a_node(admin, cloud, nodes)
    learned = wait_for("the template learned", lambda: (configmap(admin, namespace, TEMPLATES) or {}).get(POOL))
    assert json.loads(learned)["node"] == node and json.loads(learned)["allocatable"] == ALLOCATABLE

    server.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=2), timeout=10)
    assert cloud.pool(POOL).size == 4
    # The journal's ConfigMap exists (the entry was recorded before the cloud call) and ends up empty.
    wait_for("the journal entry cleared", lambda: configmap(admin, namespace, JOURNAL) == {})
    _, metrics = server.http_get("/metrics")
    assert f'ca_externalgrpc_journal_operations_total{{backend="{BACKEND}",operation="record",result="ok"}} 1.0' in (
        metrics
    )

    def scaled_up() -> list[Any]:
        events = client.CoreV1Api(admin).list_namespaced_event(namespace).items
        return [e for e in events if e.reason == "ScaledUpGroup"]

    (event,) = wait_for("the ScaledUpGroup Event", scaled_up)
    assert (event.involved_object.kind, event.involved_object.name) == ("ConfigMap", STATUS)
    assert POOL in wait_for("the status ConfigMap", lambda: (configmap(admin, namespace, STATUS) or {}).get("status"))
    refusals = [line for line in server.output.splitlines() if REFUSAL.search(line)]
    assert not refusals, "\n".join(refusals)


# ------------------------------------------------------------------------------------------------ tests
def test_sidecar_with_no_rbac_serves_and_scales_without_calling_the_api_server(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str, cloud: ScalewaySimulator, tmp_path: Path
) -> None:
    # The server config the sidecar ships has no kubernetes section: every feature off.
    docs = helm_template(CA_1_36_1, (SIDECAR_VALUES,), "1.34.0")
    shipped = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    assert "kubernetes" not in shipped
    # A user with no rights whatever; its kubeconfig goes through a proxy that counts connections.
    user = f"nobody-{uuid.uuid4().hex[:8]}"
    proxy = CountingProxy(control_plane.server_url)
    kubeconfig = control_plane.user_kubeconfig(user)
    kubeconfig.write_text(kubeconfig.read_text().replace(control_plane.server_url, proxy.url))
    try:
        server = start_server(cloud, tmp_path, {"kubeconfig": str(kubeconfig), "namespace": namespace})
        try:
            groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
            assert [g.id for g in groups] == [POOL]
            server.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=2), timeout=10)
            assert cloud.pool(POOL).size == 4
            template = server.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=POOL), timeout=5)
            assert template.nodeBytes
            assert proxy.connections == 0, "the server called the API server with every feature off"
            assert "Kubernetes features on" not in server.output
        finally:
            server.stop()
        # The control: through the same proxy this user is refused, and the proxy saw it.
        api = config.new_client_from_config(config_file=str(kubeconfig))
        try:
            with pytest.raises(ApiException) as refused:
                client.CoreV1Api(api).list_namespaced_config_map(namespace)
            assert refused.value.status == 403
        finally:
            api.close()
        assert proxy.connections >= 1
    finally:
        proxy.stop()


def test_sidecar_with_its_features_on_works_with_the_charts_roles_and_the_features_file(
    control_plane: ControlPlane,
    admin: client.ApiClient,
    namespace: str,
    cloud: ScalewaySimulator,
    nodes: list[str],
    tmp_path: Path,
) -> None:
    user = f"sidecar-{uuid.uuid4().hex[:8]}"
    bind_user(admin, namespace, user, *sidecar_roles(CA_1_36_1, with_features=True))
    kubernetes = {
        "kubeconfig": str(control_plane.user_kubeconfig(user)),
        "namespace": namespace,
        "identity": "sidecar",
        # The three features a sidecar can use, with their default object names (the ones the rules name).
        "learned_templates": {"enabled": True, "min_write_interval": "200ms"},
        "journal": {"enabled": True},
        "events": {"enabled": True, "status_interval": "1s"},
    }
    server = start_server(cloud, tmp_path, kubernetes)
    try:
        scale_up_and_see_every_feature_work(server, cloud, admin, namespace, nodes)
    finally:
        server.stop()


def test_server_mtls_runs_its_four_features_with_its_service_accounts_roles(
    control_plane: ControlPlane,
    admin: client.ApiClient,
    namespace: str,
    cloud: ScalewaySimulator,
    nodes: list[str],
    tmp_path: Path,
) -> None:
    server, lease = start_server_mtls_replica(control_plane, admin, namespace, cloud, tmp_path)
    try:
        assert wait_for("the Lease held", lambda: lease_holder(admin, namespace, lease) == "replica-a")
        wait_for("leader and Ready", lambda: server.http_get("/readyz")[0] == 200)
        scale_up_and_see_every_feature_work(server, cloud, admin, namespace, nodes)
        assert lease_holder(admin, namespace, lease) == "replica-a"
    finally:
        server.stop()
