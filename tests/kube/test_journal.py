"""The durable change journal against the real API server, with our server as a child process.

The server runs as a user bound to exactly the Role the Helm values ship for the journal (rendered by the
real Helm CLI), so the test also proves that Role is enough. The Scaleway simulator applies a PATCH and
holds its answer past the caller's deadline: the outcome is unknown to the server, the server is killed
with SIGKILL before the CA's retry, and a new process answers the retry.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from server.kube.journal import entry_key
from simulators.common import Fault, ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.deploy.chart import CA_1_36_1, helm_template
from tests.e2e.control_plane import ControlPlane

SIDECAR_VALUES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "values-sidecar.yaml"
JOURNAL = "ca-externalgrpc-journal"
POOL = "b1b1b1b1-0000-4000-8000-00000000000a"
SCENARIO = {
    "seed": 5,
    "timings": {"creating": 30, "starting": 30, "registering": 20, "deleting": 30},
    "clusters": [
        {
            "id": "c0c0c0c0-1111-4222-8333-44444444444a",
            "name": "journal",
            "pools": [{"id": POOL, "name": "small", "node_type": "DEV1-M", "size": 2, "min_size": 0, "max_size": 8}],
        }
    ],
}


def shipped_journal_role() -> dict[str, Any]:
    """The journal's Role as the Helm values render it with the official chart."""
    docs = helm_template(CA_1_36_1, (SIDECAR_VALUES,), "1.34.0")
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == JOURNAL]
    return role


def bind_user_to_shipped_role(admin: client.ApiClient, namespace: str, user: str) -> None:
    role = shipped_journal_role()
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(
        namespace, {"metadata": {"name": JOURNAL}, "rules": role["rules"], "apiVersion": role["apiVersion"]}
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=JOURNAL),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=JOURNAL),
            subjects=[client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")],
        ),
    )


def journal_entries(admin: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    try:
        found = client.CoreV1Api(admin).read_namespaced_config_map(JOURNAL, namespace)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    return {key: json.loads(value) for key, value in (found.data or {}).items()}


def wait_until(check: Callable[[], bool], seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {seconds}s: {what}")
        time.sleep(0.05)


def increase(server: ServerProcess, delta: int, timeout: float) -> tuple[grpc.StatusCode, str, float]:
    started = time.monotonic()
    try:
        server.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=delta), timeout=timeout)
    except grpc.RpcError as err:
        return err.code(), err.details() or "", time.monotonic() - started
    return grpc.StatusCode.OK, "", time.monotonic() - started


@pytest.fixture
def cloud() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()) as sim:
        yield sim


def start_server(sim: ScalewaySimulator, tmp_path: Path, kubeconfig: Path | None, namespace: str) -> ServerProcess:
    # Listings only when the server asks (after a write), so the test decides what the cloud shows when.
    backend = scaleway_backend(sim, sync={"interval": "60s"})
    extra: dict[str, Any] = {}
    if kubeconfig is not None:
        extra["kubernetes"] = {
            "kubeconfig": str(kubeconfig),
            "namespace": namespace,
            "identity": "replica-a",
            "request_timeout": "2s",
            "journal": {"enabled": True, "configmap": JOURNAL},
        }
    return ServerProcess(server_config([backend], **extra), workdir=tmp_path)


def lose_an_applied_increase_then_restart(
    sim: ScalewaySimulator, server: ServerProcess, before_restart: Callable[[], None] = lambda: None
) -> None:
    """+2 on a pool of 2: the cloud applies it but answers after the caller's deadline; then SIGKILL and a
    new server process, which lists the cloud (size 4) at start."""
    sim.faults.add(Fault(route="update_pool", method="PATCH", delay=3.0, apply=True, times=1))
    code, details, seconds = increase(server, 2, timeout=1.5)
    assert code == grpc.StatusCode.UNAVAILABLE and seconds < 1.5, (code, details, seconds)
    assert "was not confirmed" in details, details
    assert sim.pool(POOL).size == 4  # applied: only its answer was lost
    before_restart()
    server.restart()  # SIGKILL: no drain, nothing in memory survives


def test_a_restart_between_a_lost_answer_and_the_ca_retry_applies_the_increase_once(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str, cloud: ScalewaySimulator, tmp_path: Path
) -> None:
    bind_user_to_shipped_role(admin, namespace, "journal-writer")
    server = start_server(cloud, tmp_path, control_plane.user_kubeconfig("journal-writer"), namespace)
    try:
        sim = cloud

        def recorded() -> None:
            # Recorded before the PATCH went out, and still there: its outcome is unknown.
            entry = journal_entries(admin, namespace)[entry_key("scw", POOL)]
            assert (entry["kind"], entry["base"], entry["desired"], entry["replica"]) == ("increase", 2, 4, "replica-a")
            assert entry["state"] in ("in-flight", "unknown")

        lose_an_applied_increase_then_restart(sim, server, recorded)

        patches = sim.requests.count("update_pool", "PATCH")
        code, details, _ = increase(server, 2, timeout=5.0)  # the CA retrying the call it saw fail
        assert code == grpc.StatusCode.OK, details
        assert sim.pool(POOL).size == 4, "the retry of the lost increase was applied a second time"
        assert sim.requests.count("update_pool", "PATCH") == patches  # recognised: nothing written
        wait_until(lambda: not journal_entries(admin, namespace), 5.0, "the entry is cleared after the read-back")

        # A new increase afterwards is a new change: applied, recorded, then cleared.
        code, details, _ = increase(server, 1, timeout=5.0)
        assert code == grpc.StatusCode.OK, details
        assert sim.pool(POOL).size == 5
        wait_until(lambda: not journal_entries(admin, namespace), 5.0, "a confirmed change leaves no entry")
        status, metrics = server.http_get("/metrics")
        assert status == 200
        assert 'ca_externalgrpc_journal_operations_total{backend="scw",operation="record",result="ok"} 1.0' in metrics
    finally:
        server.stop()


def test_without_the_journal_the_same_restart_applies_the_retry_twice(cloud: ScalewaySimulator, tmp_path: Path) -> None:
    # What the journal fixes: without it the new process cannot tell the retry from a new request.
    server = start_server(cloud, tmp_path, None, "")
    try:
        lose_an_applied_increase_then_restart(cloud, server)
        code, details, _ = increase(server, 2, timeout=5.0)
        assert code == grpc.StatusCode.OK, details
        assert cloud.pool(POOL).size == 6
    finally:
        server.stop()


def test_an_unreachable_api_server_refuses_the_write_and_sends_nothing_to_the_cloud(
    cloud: ScalewaySimulator, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # A port bound but never listened on refuses every connection while the socket is open.
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    try:
        kubeconfig = tmp_path / "unreachable.kubeconfig"
        text = control_plane.kubeconfig.read_text()
        kubeconfig.write_text(text.replace(control_plane.server_url, f"https://127.0.0.1:{refusing.getsockname()[1]}"))
        server = start_server(cloud, tmp_path, kubeconfig, "default")
        try:
            code, details, seconds = increase(server, 2, timeout=3.0)
            assert code == grpc.StatusCode.UNAVAILABLE and seconds < 3.0, (code, details, seconds)
            assert "could not read the change journal (ConfigMap default/ca-externalgrpc-journal)" in details
            assert "Nothing was sent to the cloud" in details
            assert cloud.pool(POOL).size == 2
            assert cloud.requests.count("update_pool", "PATCH") == 0
            status, metrics = server.http_get("/metrics")
            assert 'ca_externalgrpc_journal_operations_total{backend="scw",operation="read",result="failed"}' in metrics
        finally:
            server.stop()
    finally:
        refusing.close()
