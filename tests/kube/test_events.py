"""Kubernetes Events of our server, on the real API server, written with the RBAC the Helm values ship.

Our server runs as a child process (``ServerProcess``) in front of the Scaleway simulator, as a user of
the test API server bound to exactly the Role and ClusterRole the cluster-autoscaler chart renders from
deploy/helm/values-sidecar.yaml with values-sidecar-kubernetes-features.yaml (the sidecar runs as the CA's
service account). The Events are read back
through the API the way ``kubectl get events`` and ``kubectl describe configmap`` read them.
"""

from __future__ import annotations

import re
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client

from devstack.clouds import scaleway_backend
from devstack.harness import SCW_SECRET, ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from simulators.common import Fault, ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.deploy.chart import CA_1_36_1, sidecar_roles
from tests.e2e.control_plane import ControlPlane
from tests.e2e.report import event_listing
from tests.kube.polling import wait_for

CLUSTER = "c0c0c0c0-1111-4222-8333-5555aaaa0001"
POOL = "e7e7e7e7-0000-4000-8000-000000000001"
STATUS = "ca-externalgrpc-status"
IDENTITY = "events-test-replica"


def scenario() -> dict[str, Any]:
    pool = {"id": POOL, "name": "workers", "node_type": "DEV1-M", "size": 3, "min_size": 0, "max_size": 50}
    return {"seed": 5, "clusters": [{"id": CLUSTER, "name": "events", "pools": [pool]}]}


@cache
def shipped_rbac() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rules of the Role and the ClusterRole the chart renders with our sidecar values and the features file."""
    return sidecar_roles(CA_1_36_1, with_features=True)


@dataclass
class ServerUser:
    kubeconfig: Path
    admin: client.ApiClient
    namespace: str
    name: str

    def revoke(self) -> None:
        """Remove both bindings: the API server refuses every write of this user from now on."""
        rbac = client.RbacAuthorizationV1Api(self.admin)
        rbac.delete_namespaced_role_binding(self.name, self.namespace)
        rbac.delete_cluster_role_binding(self.name)


@pytest.fixture
def server_user(control_plane: ControlPlane, admin: client.ApiClient, namespace: str) -> Iterator[ServerUser]:
    """A user bound to the chart's Role (in the test namespace) and ClusterRole, nothing else."""
    name = f"ca-{namespace}"[:60]
    role_rules, cluster_rules = shipped_rbac()
    rbac = client.RbacAuthorizationV1Api(admin)
    subject = [client.RbacV1Subject(kind="User", name=name, api_group="rbac.authorization.k8s.io")]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": role_rules})
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=subject,
        ),
    )
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": cluster_rules})
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=subject,
        )
    )
    yield ServerUser(control_plane.user_kubeconfig(name), admin, namespace, name)
    for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
        try:
            delete(name)
        except client.ApiException as err:
            if err.status != 404:
                raise


@dataclass
class Setup:
    sim: ScalewaySimulator
    server: ServerProcess
    core: client.CoreV1Api
    namespace: str

    def events(self) -> list[Any]:
        return list(self.core.list_namespaced_event(self.namespace).items)

    def reasons(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for event in self.events():
            found.setdefault(event.reason, []).append(event)
        return found

    def status(self) -> str:
        """The status ConfigMap's text ("" until the server created it)."""
        try:
            found = self.core.read_namespaced_config_map(STATUS, self.namespace)
        except client.ApiException as err:
            if err.status == 404:
                return ""
            raise
        return str((found.data or {}).get("status", ""))

    def metric(self, name: str, **labels: str) -> float:
        status, body = self.server.http_get("/metrics")
        assert status == 200
        total = 0.0
        for line in body.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def start(server_user: ServerUser, tmp_path: Path) -> Iterator[Callable[..., Setup]]:
    started: list[Setup] = []

    def launch(events: dict[str, Any] | None = None, sync: dict[str, Any] | None = None, **kube_extra: Any) -> Setup:
        sim = ScalewaySimulator(scenario=scenario(), clock=ManualClock(), secret_key=SCW_SECRET).start()
        backend = scaleway_backend(sim, sync=sync or {"interval": "30s"})
        kube = {
            "kubeconfig": str(server_user.kubeconfig),
            "namespace": server_user.namespace,
            "identity": IDENTITY,
            "events": {"enabled": True, "status_interval": "1s", **(events or {})},
            **kube_extra,
        }
        try:
            server = ServerProcess(server_config([backend], kubernetes=kube), workdir=tmp_path)
        except BaseException:
            sim.stop()
            raise
        setup = Setup(sim, server, client.CoreV1Api(server_user.admin), server_user.namespace)
        started.append(setup)
        return setup

    yield launch
    for setup in started:
        setup.server.stop()
        setup.sim.stop()


def provider_ids(sim: ScalewaySimulator) -> list[str]:
    """The pool's nodes that have an instance (a node being created is listed with provider_id "")."""
    return sorted(n.provider_id for n in sim.nodes_of(POOL) if n.provider_id)


def increase(setup: Setup, delta: int) -> grpc.RpcError | None:
    try:
        setup.server.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=delta), timeout=5)
    except grpc.RpcError as err:
        return err
    return None


# ------------------------------------------------------------------------------------------------ tests
def test_each_scale_action_and_failed_cloud_write_is_one_event_on_the_status_configmap(
    start: Callable[..., Setup],
) -> None:
    setup = start()
    stub = setup.server.stub
    assert increase(setup, 2) is None
    stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=POOL, delta=-1), timeout=5)
    victim = provider_ids(setup.sim)[0]
    node_name = "scw-workers-" + victim.rsplit("/", 1)[-1][:8]
    stub.NodeGroupDeleteNodes(
        pb.NodeGroupDeleteNodesRequest(id=POOL, nodes=[pb.ExternalGrpcNode(providerID=victim, name=node_name)]),
        timeout=5,
    )
    # The cloud refuses the next writes, and its error body carries the API secret: it must not leak.
    refusal = f"quota exceeded for token {SCW_SECRET}"
    setup.sim.faults.add(Fault(route="update_pool", method="PATCH", status=403, message=refusal, times=1))
    assert increase(setup, 1) is not None
    setup.sim.faults.add(Fault(route="delete_node", method="DELETE", status=400, message=refusal, times=1))
    other = provider_ids(setup.sim)[1]
    with pytest.raises(grpc.RpcError):
        stub.NodeGroupDeleteNodes(
            pb.NodeGroupDeleteNodesRequest(id=POOL, nodes=[pb.ExternalGrpcNode(providerID=other, name="n2")]),
            timeout=5,
        )
    # A request the server refuses itself (beyond max) is the CA's business, not an Event.
    assert increase(setup, 500) is not None

    expected = {"ScaledUpGroup", "ScaledDownGroup", "DeletedNodes", "FailedScaleUp", "FailedToDeleteNode"}

    def all_there() -> dict[str, list[Any]] | None:
        reasons = setup.reasons()
        return reasons if set(reasons) >= expected else None

    found = wait_for("one event per action", all_there, 15)
    print("\n" + event_listing(setup.events()))
    assert set(found) == expected, sorted(found)
    assert all(len(events) == 1 and events[0].count == 1 for events in found.values())

    status = setup.core.read_namespaced_config_map(STATUS, setup.namespace)
    assert POOL in status.data["status"] and "backend scw: serving" in status.data["status"]
    for event in setup.events():
        # Where kubectl describe looks for them: the ConfigMap by kind, name and uid.
        ref = event.involved_object
        uid = status.metadata.uid
        assert (ref.kind, ref.name, ref.namespace, ref.uid) == ("ConfigMap", STATUS, setup.namespace, uid)
        assert event.source.component == "ca-externalgrpc" and event.reporting_component == "ca-externalgrpc"
        assert event.reporting_instance == IDENTITY
        assert event.type == ("Warning" if event.reason.startswith("Failed") else "Normal")
        assert SCW_SECRET not in event.message
    up = found["ScaledUpGroup"][0].message
    assert "by 2" in up and "target size now 5" in up, up
    deleted = found["DeletedNodes"][0]
    assert node_name in deleted.message and victim in deleted.message
    assert (deleted.related.kind, deleted.related.name) == ("Node", node_name)
    failed = found["FailedScaleUp"][0].message
    assert "quota exceeded for token" in failed and SCW_SECRET not in failed, failed
    selector = f"involvedObject.kind=ConfigMap,involvedObject.name={STATUS},involvedObject.uid={status.metadata.uid}"
    described = setup.core.list_namespaced_event(setup.namespace, field_selector=selector).items
    assert len(described) == len(expected)
    assert setup.metric("ca_externalgrpc_events_written_total", operation="create") == len(expected)


def test_a_backend_going_stale_and_fresh_again_is_an_event_each(start: Callable[..., Setup]) -> None:
    setup = start(sync={"interval": "1s", "min_interval": "0.2s", "max_staleness": "3s"})
    wait_for("status ConfigMap", lambda: "serving" in setup.status(), 10)
    before = setup.core.read_namespaced_config_map(STATUS, setup.namespace).metadata.resource_version
    time.sleep(2.5)  # two syncs and two status intervals that change nothing: the ConfigMap is not rewritten
    assert setup.core.read_namespaced_config_map(STATUS, setup.namespace).metadata.resource_version == before
    setup.sim.faults.add(Fault(route="*", status=503))  # the cloud's outage
    stale = wait_for("BackendStale", lambda: setup.reasons().get("BackendStale"), 15)
    wait_for("the status ConfigMap showing the backend stale", lambda: "STALE" in setup.status(), 10)
    setup.sim.faults.clear()
    fresh = wait_for("BackendFresh", lambda: setup.reasons().get("BackendFresh"), 15)
    print("\n" + event_listing(setup.events()))
    assert len(stale) == 1 and stale[0].type == "Warning" and "503" in stale[0].message
    assert len(fresh) == 1 and fresh[0].type == "Normal"
    assert fresh[0].last_timestamp >= stale[0].last_timestamp


def test_credentials_that_stop_working_are_a_backend_refused_event_naming_the_setting(
    start: Callable[..., Setup],
) -> None:
    setup = start(sync={"interval": "1s", "min_interval": "0.2s", "max_staleness": "10m"})
    wait_for("status ConfigMap", lambda: "serving" in setup.status(), 10)
    setup.sim.api.secret_key = "revoked"  # the key is deleted in the console: every call answers 401
    refused = wait_for("BackendRefused", lambda: setup.reasons().get("BackendRefused"), 15)
    wait_for("the status ConfigMap saying so", lambda: "REFUSED BY THE CLOUD (credentials" in setup.status(), 10)
    print("\n" + event_listing(setup.events()))
    (event,) = refused
    assert event.type == "Warning"
    assert event.message.startswith("Backend scw: the cloud refused the credentials; its last good snapshot")
    assert "Check the key in backends[0].scaleway.secret_key" in event.message and "401" in event.message
    assert SCW_SECRET not in event.message
    # Within max_staleness: not stale, so no BackendStale, yet it is named at once.
    assert not setup.reasons().get("BackendStale")
    setup.sim.api.secret_key = SCW_SECRET
    wait_for("BackendFresh", lambda: setup.reasons().get("BackendFresh"), 15)


def test_a_flapping_cloud_gets_at_most_burst_plus_refills_writes_and_exact_counts(
    start: Callable[..., Setup],
) -> None:
    burst, refill = 3, 0.5
    setup = start(events={"burst": burst, "refill_interval": f"{refill}s"})
    setup.sim.faults.add(Fault(route="update_pool", method="PATCH", status=403, message="pool is locked"))
    began = time.monotonic()
    calls = 40
    for i in range(calls):
        # Six distinct messages (the delta is in it), each repeated: aggregation and the bucket both work.
        assert increase(setup, 1 + i % 6) is not None
    flapping = time.monotonic() - began

    def settled() -> bool:
        counted = sum(e.count for e in setup.reasons().get("FailedScaleUp", []))
        dropped = setup.metric("ca_externalgrpc_events_dropped_total", reason="rate_limited")
        return counted + dropped == calls

    wait_for("every failure counted or dropped", settled, 15)
    elapsed = time.monotonic() - began
    events = setup.reasons()["FailedScaleUp"]
    print(f"\n{calls} failures in {flapping:.1f}s\n" + event_listing(events))
    writes = setup.metric("ca_externalgrpc_events_written_total", event_reason="FailedScaleUp")
    dropped = setup.metric("ca_externalgrpc_events_dropped_total", reason="rate_limited")
    print(f"API writes {writes:.0f} in {elapsed:.1f}s (bound {burst} + {elapsed:.1f}/{refill}), dropped {dropped:.0f}")
    assert writes <= burst + elapsed / refill + 1, (writes, elapsed)
    assert len(events) <= burst + flapping / refill + 1
    assert max(e.count for e in events) > 1  # repeats were aggregated into one Event
    assert dropped > 0
    # One more repeat of an Event already written: its count grows on the same object, by a PATCH.
    (first,) = [e for e in events if "by 1 failed" in e.message]
    assert increase(setup, 1) is not None

    def grown() -> bool:
        return any(e.metadata.name == first.metadata.name and e.count == first.count + 1 for e in setup.events())

    wait_for("the repeat raising the count of the same Event", grown, 10)
    assert setup.metric("ca_externalgrpc_events_written_total", operation="patch") > 0
    assert len(setup.reasons()["FailedScaleUp"]) == len(events)


def test_an_api_server_that_refuses_every_write_never_slows_an_rpc(
    start: Callable[..., Setup], server_user: ServerUser
) -> None:
    setup = start()
    stub = setup.server.stub

    def round_trip() -> float:
        began = time.perf_counter()
        stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=1), timeout=5)
        stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=POOL, delta=-1), timeout=5)
        return time.perf_counter() - began

    allowed = [round_trip() for _ in range(10)]
    wait_for("events written while allowed", lambda: len(setup.reasons().get("ScaledUpGroup", [])) == 1, 10)
    server_user.revoke()
    refused = [round_trip() for _ in range(10)]
    wait_for("refusals", lambda: setup.metric("ca_externalgrpc_events_dropped_total", reason="api_error") > 0, 10)
    print(f"\nallowed: median {statistics.median(allowed) * 1000:.1f} ms, max {max(allowed) * 1000:.1f} ms")
    print(f"refused: median {statistics.median(refused) * 1000:.1f} ms, max {max(refused) * 1000:.1f} ms")
    assert max(refused) < 2.0
    # Generous: the machine running the tests may be busy; a refusal costs the RPC nothing by design.
    assert statistics.median(refused) < max(0.25, 3 * statistics.median(allowed))
    assert re.search(r"Kubernetes API write for Events failed", setup.server.output)


def test_an_api_server_that_never_answers_slows_neither_rpcs_nor_the_shutdown(
    start: Callable[..., Setup], server_user: ServerUser, tmp_path: Path
) -> None:
    # A listener that takes connections into its backlog and never answers: TLS never completes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        config = yaml.safe_load(server_user.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{silent.getsockname()[1]}"
        unreachable = tmp_path / "unreachable.kubeconfig"
        unreachable.write_text(yaml.safe_dump(config))
        # Each API call waits this long before giving up: an RPC that waited for one would take as long.
        api_timeout = 3.0
        setup = start(kubeconfig=str(unreachable), request_timeout=f"{api_timeout}s")
        stub = setup.server.stub
        took = []
        for _ in range(10):
            began = time.perf_counter()
            stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=1), timeout=5)
            took.append(time.perf_counter() - began)
            began = time.perf_counter()
            stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=POOL, delta=-1), timeout=5)
            took.append(time.perf_counter() - began)
        # The client library retries a failed connection, so one write gives up after a few timeouts.
        wait_for("timeouts", lambda: setup.metric("ca_externalgrpc_events_dropped_total", reason="api_error") > 0, 60)
        median, longest = statistics.median(took) * 1000, max(took) * 1000
        print(f"\nunreachable API server: median {median:.1f} ms, max {longest:.1f} ms")
        assert max(took) < api_timeout, took
        began = time.monotonic()
        code = setup.server.stop()
        assert code == 0, setup.server.log_tail(40)
        stopping = time.monotonic() - began
    print(f"stopped in {stopping:.1f}s")
    assert stopping < 2.0 + 5.0 + 3.0  # the drain (shutdown_grace) plus the Events' bounded last writes
