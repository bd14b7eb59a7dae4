"""Two server processes elect a leader on a Lease of the real API server; only the leader writes.

Each replica runs as a user of its own, bound to exactly the Role the mTLS layout ships (rendered from
deploy/kubernetes/server-mtls), on one Scaleway simulator. The two configs differ only in how they
spell the simulator's loopback host (127.0.0.1 and localhost), so the simulator's request log (which
records the Host header) says which replica sent each request.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from simulators.scaleway.simulator import ScalewaySimulator
from tests.deploy.rendering import one, render
from tests.deploy.test_leader_election_layout import lease_role
from tests.e2e.control_plane import ControlPlane

CLUSTER = "11111111-0000-4000-8000-000000000001"
POOL = "00000000-0000-4000-8000-000000000001"
SCENARIO = {
    "clusters": [
        {
            "id": CLUSTER,
            "name": "leader",
            "pools": [{"id": POOL, "name": "p1", "node_type": "DEV1-M", "size": 1, "min_size": 1, "max_size": 1000}],
        }
    ]
}
# Short, in the required order retry_period < renew_deadline < lease_duration, so a test takes seconds.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 1.0
# A first sync of one small pool on loopback: well under a second; the bound leaves room for a busy machine.
FIRST_SYNC_BOUND = 3.0
HOSTS = {"replica-a": "127.0.0.1", "replica-b": "localhost"}


def shipped() -> tuple[dict[str, Any], str]:
    """The Role the server is bound to in the mTLS layout, and the Lease name its config uses."""
    docs = render("server-mtls")
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    return lease_role(docs), config["kubernetes"]["leader_election"]["lease_name"]


def bind_to_shipped_role(admin: client.ApiClient, namespace: str, role: dict[str, Any], user: str) -> None:
    rbac = client.RbacAuthorizationV1Api(admin)
    name = role["metadata"]["name"]
    try:
        rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": role["rules"]})
    except client.ApiException as err:
        if err.status != 409:  # the second replica's binding reuses the Role
            raise
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


class Replicas:
    """Starts replicas of our server (ServerProcess) against one simulator and one Lease."""

    def __init__(
        self, plane: ControlPlane, admin: client.ApiClient, namespace: str, sim: ScalewaySimulator, tmp: Path
    ) -> None:
        self.plane, self.admin, self.namespace, self.sim, self.tmp = plane, admin, namespace, sim, tmp
        self.role, self.lease_name = shipped()
        self.running: list[ServerProcess] = []

    def start(self, identity: str) -> ServerProcess:
        bind_to_shipped_role(self.admin, self.namespace, self.role, identity)
        backend = scaleway_backend(self.sim, sync={"interval": "5s"})
        backend["scaleway"]["api_url"] = self.sim.url.replace("127.0.0.1", HOSTS[identity])
        config = server_config(
            [backend],
            kubernetes={
                "kubeconfig": str(self.plane.user_kubeconfig(identity)),
                "namespace": self.namespace,
                "identity": identity,
                "leader_election": {
                    "enabled": True,
                    "lease_name": self.lease_name,
                    "lease_duration": f"{LEASE_DURATION:g}s",
                    "renew_deadline": f"{RENEW_DEADLINE:g}s",
                    "retry_period": f"{RETRY_PERIOD:g}s",
                },
            },
        )
        server = ServerProcess(config, workdir=self.tmp, name=identity)
        self.running.append(server)
        return server

    def holder(self) -> str:
        lease = client.CoordinationV1Api(self.admin).read_namespaced_lease(self.lease_name, self.namespace)
        return str(lease.spec.holder_identity or "")

    def stop(self) -> None:
        for server in self.running:
            if server.process.poll() is None:
                server.stop()


@pytest.fixture
def sim() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=SCENARIO) as simulator:
        yield simulator


@pytest.fixture
def replicas(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str, sim: ScalewaySimulator, tmp_path: Path
) -> Iterator[Replicas]:
    started = Replicas(control_plane, admin, namespace, sim, tmp_path)
    try:
        yield started
    finally:
        started.stop()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition`` held (polled every 50 ms); fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.1f}s")
        time.sleep(0.05)
    return time.monotonic() - start


def ready(server: ServerProcess) -> bool:
    return server.http_get("/readyz")[0] == 200


def metric(server: ServerProcess, name: str) -> float:
    _, body = server.http_get("/metrics")
    found = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    assert found, f"{name} is not on /metrics"
    return float(found.group(1))


def requests_from(sim: ScalewaySimulator, identity: str) -> list[Any]:
    host = HOSTS[identity]
    return [r for r in sim.requests.all() if r.headers.get("host", "").split(":")[0] == host]


def increase(server: ServerProcess, delta: int = 1) -> grpc.RpcError | None:
    try:
        server.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=delta), timeout=5)
    except grpc.RpcError as err:
        return err
    return None


def pool_size(sim: ScalewaySimulator) -> int:
    return sim.pool(POOL).size


def test_one_replica_leads_and_the_follower_never_touches_the_cloud(replicas: Replicas, sim: ScalewaySimulator) -> None:
    leader = replicas.start("replica-a")
    wait_for(lambda: ready(leader), 10, "the first replica leads and syncs")
    follower = replicas.start("replica-b")
    time.sleep(LEASE_DURATION + 1)  # past a lease duration: the follower must still not take over

    assert replicas.holder() == "replica-a"
    status, body = follower.http_get("/readyz")
    assert status == 503 and body.startswith("follower; leader is replica-a"), body
    assert ready(leader)
    assert metric(leader, "ca_externalgrpc_leader") == 1 and metric(follower, "ca_externalgrpc_leader") == 0
    # A follower serves no snapshot, so the "snapshot stale" alert has nothing to fire on there.
    assert metric(leader, 'ca_externalgrpc_snapshot_stale{backend="scw"}') == 0
    assert "ca_externalgrpc_snapshot_stale{" not in follower.http_get("/metrics")[1]

    refused = increase(follower)
    assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "not the leader" in (refused.details() or "") and "replica-a" in (refused.details() or "")
    assert increase(leader) is None
    assert pool_size(sim) == 2
    assert requests_from(sim, "replica-a"), "the leader's requests are in the log (the count below can see some)"
    assert requests_from(sim, "replica-b") == [], "a follower sends no request at all to the cloud"


def test_a_killed_leader_is_replaced_within_the_lease_duration(replicas: Replicas, sim: ScalewaySimulator) -> None:
    first = replicas.start("replica-a")
    wait_for(lambda: ready(first), 10, "the first replica leads and syncs")
    second = replicas.start("replica-b")
    time.sleep(1)
    assert not ready(second)

    first.process.kill()  # kill -9: no drain, no release of the Lease
    killed_at = time.monotonic()
    first.process.wait(5)
    took_over = wait_for(lambda: replicas.holder() == "replica-b", LEASE_DURATION + 2, "the Lease changes hands")
    wait_for(lambda: ready(second), FIRST_SYNC_BOUND, "the new leader syncs and turns ready")
    failover = time.monotonic() - killed_at
    print(f"\nfailover after kill -9: Lease taken after {took_over:.2f}s, serving after {failover:.2f}s")
    assert took_over <= LEASE_DURATION + RETRY_PERIOD + 0.5
    assert failover <= LEASE_DURATION + RETRY_PERIOD + FIRST_SYNC_BOUND

    assert increase(second, 2) is None
    assert pool_size(sim) == 3
    assert metric(second, "ca_externalgrpc_leader") == 1
    assert metric(second, 'ca_externalgrpc_leadership_transitions_total{event="acquired"}') == 1


def test_a_leader_cut_off_from_the_api_server_stops_writing_within_the_renew_deadline(
    replicas: Replicas, admin: client.ApiClient, namespace: str, sim: ScalewaySimulator
) -> None:
    first = replicas.start("replica-a")
    wait_for(lambda: ready(first), 10, "the first replica leads and syncs")
    second = replicas.start("replica-b")
    assert increase(first) is None

    client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding("replica-a", namespace)
    cut_at = time.monotonic()
    # It keeps writing (each probe adds a machine) until its renew deadline, then refuses.
    stopped = wait_for(lambda: increase(first) is not None, RENEW_DEADLINE + 1, "the cut-off leader refuses writes")
    wait_for(lambda: replicas.holder() == "replica-b", LEASE_DURATION + 2, "the follower takes over")
    taken_after = time.monotonic() - cut_at
    print(f"\nAPI access cut: stopped writing after {stopped:.2f}s, follower took the Lease after {taken_after:.2f}s")
    assert stopped <= RENEW_DEADLINE + 0.4  # polling and one RPC; the elector alone could be a retry_period late
    # No overlap: the old leader had stopped before the new one could start.
    assert stopped < taken_after

    refused = increase(first)
    assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE
    writes_before = [r for r in requests_from(sim, "replica-a") if r.method != "GET"]
    wait_for(lambda: ready(second), FIRST_SYNC_BOUND, "the new leader serves")
    size = pool_size(sim)
    assert increase(second) is None
    assert pool_size(sim) == size + 1
    time.sleep(1)
    assert [r for r in requests_from(sim, "replica-a") if r.method != "GET"] == writes_before
    status, body = first.http_get("/readyz")
    assert status == 503 and body.startswith("follower"), body
    assert metric(first, 'ca_externalgrpc_leadership_transitions_total{event="lost"}') == 1
    assert metric(first, "ca_externalgrpc_leader_election_errors_total") > 0
