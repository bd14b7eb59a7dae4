"""Contract tests: the answer shapes the public evidence shows for Bizfly, through the real code.

The fixtures below are written for this project (ids, names and values are ours) in the shapes the
vendor's own examples, its clients and the services behind it show (docs/reference/bizfly.md, "Evidence", names
each source): the bare cluster and pool objects with ``stats``, naive timestamps, a pending pool with
``null`` autoscaling ids, Senlin's node statuses and reasons, Senlin's mixed-case node names, a login
answer naming its project. A small server answers them on the real routes (login, catalog, Kubernetes
Engine), so the real client, adapter and backend read them, and the server does over gRPC where the
answer reaches the CA.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from devstack.harness import InProcessServer, server_config
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from providers.backend import Backend, SyncSettings
from providers.bizfly.adapter import BizflyAdapter
from providers.bizfly.client import BizflyClient
from providers.bizfly.config import parse_config
from providers.deadline import Deadline
from providers.errors import CloudRequestRejected
from providers.http_transport import RetryPolicy
from providers.model import ErrorClass, InstanceState
from simulators.bizfly.api import error_body
from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse

UID = "kecontract0fixt1"
PROJECT = "5e6f708192a3b4c5d6e7f8091a2b3c4d"
AUTOSCALED = "65f0c0ffee00000000000001"
PENDING = "65f0c0ffee00000000000002"
FIXED = "65f0c0ffee00000000000003"
EMAIL, PASSWORD = "ops@example.com", "contract-password"
K8S = "/api/kubernetes-engine"
OUT_OF_RESOURCES = 1  # the CA's cloudprovider.OutOfResourcesErrorClass


def node(node_id: str, name: str, status: str, reason: str, physical_id: str | None = None) -> dict[str, Any]:
    """A pool node: the six fields the pool answer gives, nothing else (no creation time)."""
    return {
        "id": node_id,
        "name": name,
        "physical_id": physical_id if physical_id is not None else f"{node_id}-server",
        "ip_addresses": ["10.20.7.31"],
        "status": status,
        "status_reason": reason,
    }


# Senlin's statuses with Senlin's kind of reasons; names as Senlin makes them (pool, cluster uid, 8
# characters of both cases). The Kubernetes nodes of these machines are named in lower case.
NODES = [
    node("n-active", f"workers-{UID}-node-Qa7ZpL0x", "ACTIVE", "Creation succeeded"),
    node("n-init", f"workers-{UID}-node-bW3kT9sE", "INIT", "Initializing", physical_id=""),
    node("n-creating", f"workers-{UID}-node-R2d2C3pO", "CREATING", "Creation in progress"),
    node("n-warning", f"workers-{UID}-node-Lb0Mxx7Y", "WARNING", "Failed in adding node into lb pool."),
    node("n-updating", f"workers-{UID}-node-Up9dAte1", "UPDATING", "Update in progress"),
    node("n-recovering", f"workers-{UID}-node-ReC0vER1", "RECOVERING", "Recovery in progress"),
    node("n-operating", f"workers-{UID}-node-0peRat3s", "OPERATING", "Operation 'reboot' in progress"),
    node("n-checked", f"workers-{UID}-node-HeaLthX1", "ERROR", "Check: Node is not ACTIVE."),
    node("n-gone", f"workers-{UID}-node-G0neS3rv", "ERROR", "Failed in found server 'n-gone-server': not found."),
    node(
        "n-quota",
        f"workers-{UID}-node-Qu0taXyZ",
        "ERROR",
        "Failed in creating server: Quota exceeded for ram: Requested 4096, but already used 65536 of 65536 ram.",
    ),
    node("n-deleting", f"workers-{UID}-node-DeL3teMe", "DELETING", "Deletion in progress"),
]
EXPECTED = {  # pool node id -> (state, error class or None)
    "n-active": (InstanceState.RUNNING, None),
    "n-init": (InstanceState.CREATING, None),
    "n-creating": (InstanceState.CREATING, None),
    "n-warning": (InstanceState.RUNNING, None),
    "n-updating": (InstanceState.RUNNING, None),
    "n-recovering": (InstanceState.RUNNING, None),
    "n-operating": (InstanceState.RUNNING, None),
    "n-checked": (InstanceState.RUNNING, None),  # a failed health check: never a failed scale-up
    "n-gone": (InstanceState.RUNNING, None),
    "n-quota": (InstanceState.CREATING, ErrorClass.OUT_OF_RESOURCES),  # a failed creation
    "n-deleting": (InstanceState.DELETING, None),
}


def pool_entry(pool_id: str, name: str, desired: int, **extra: Any) -> dict[str, Any]:
    """A worker pool as the cluster answer lists it."""
    return {
        "id": pool_id,
        "name": name,
        "version": "v1.30.4",
        "provision_type": "standard",
        "flavor": "nix.2c_2g",
        "profile_type": "premium",
        "volume_type": "PREMIUM-SSD1",
        "volume_size": 40,
        "availability_zone": "HN1",
        "desired_size": desired,
        "enable_autoscaling": True,
        "min_size": 0,
        "max_size": 12,
        "network_plan": "free_datatransfer",
        "billing_plan": "on_demand",
        "tags": ["team-a", ""],
        "provision_status": "PROVISIONED",
        "launch_config_id": "0b7c9d2e-4f1a-4c3b-9e8d-7a6b5c4d3e2f",
        "autoscaling_group_id": "8e9f0a1b-2c3d-4e5f-8a7b-6c5d4e3f2a1b",
        "created_at": "2025-06-02T08:14:51.302000",  # naive, microseconds
        "labels": {"workload": "web"},
        "taints": [],
        "flavor_detail": {"name": "nix.2c_2g", "vcpus": 2, "ram": 2048, "gpu": None, "category": "premium"},
        **extra,
    }


def cluster_answer(pools: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": UID,
        "name": "contract",
        "version": {"id": "6650a0b0c0d0e0f001020304", "name": "v1.30.4-6650a0b0", "description": None},
        "package": {"id": "6609a0b0c0d0e0f001020304", "name": "STANDARD - 1", "max_nodes": 50},
        "private_network_id": "a1b2c3d4-0000-4000-8000-000000000001",
        "auto_upgrade": False,
        "tags": [],
        "provision_status": "PROVISIONED",
        "cluster_status": "PROVISIONED",
        "created_at": "2025-06-02T08:14:51.298000",
        "created_by": EMAIL,
        "worker_pools_count": len(pools),
        "worker_pools": pools,
        "stats": {"worker_pools": len(pools), "total_cpu": None, "total_memory": None, "total_disk": {}},
    }


def default_pools() -> dict[str, dict[str, Any]]:
    autoscaled = pool_entry(AUTOSCALED, "workers", desired=10)
    # Just added: no autoscaling group yet, so both of its ids are null, and no nodes.
    pending = pool_entry(
        PENDING,
        "batch",
        desired=1,
        provision_status="PENDING_PROVISION",
        launch_config_id=None,
        autoscaling_group_id=None,
        labels={},
    )
    fixed = pool_entry(FIXED, "system", desired=1, enable_autoscaling=False, min_size=1, max_size=1)
    return {AUTOSCALED: autoscaled, PENDING: pending, FIXED: fixed}


class FixtureApi:
    """Answers the fixtures on Bizfly's routes and records what the client sent."""

    def __init__(self) -> None:
        self.pools = default_pools()
        self.nodes: dict[str, list[dict[str, Any]]] = {AUTOSCALED: copy.deepcopy(NODES), PENDING: [], FIXED: []}
        self.apply_patches = True
        self.server = JsonApiServer(error_body)
        self.server.route("POST", "/api/token", "token", self.token)
        self.server.route("GET", "/api/auth/service", "service_catalog", self.catalog)
        self.server.route("GET", f"{K8S}/_/{{uid}}", "get_cluster", self.cluster)
        self.server.route("GET", f"{K8S}/_/{{uid}}/{{pool}}", "get_pool", self.pool)
        self.server.route("PATCH", f"{K8S}/_/{{uid}}/{{pool}}", "update_pool", self.update)

    def start(self) -> FixtureApi:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def token(self, request: SimRequest) -> SimResponse:
        # The newer answer: expire_at, and the project the token is scoped to.
        return SimResponse(
            200,
            {
                "token": "gAAAAAcontract-token",
                "expire_at": "2099-01-01T00:00:00Z",
                "project_id": PROJECT,
                "project_name": "contract-project",
            },  # fmt: skip
        )

    def catalog(self, request: SimRequest) -> SimResponse:
        entry = {"canonical_name": "kubernetes_engine", "region": "HaNoi", "service_url": f"{self.url}{K8S}"}
        return SimResponse(200, {"services": [entry]})

    def cluster(self, request: SimRequest) -> SimResponse:
        if request.params["uid"] != UID:
            raise SimError(404, "Cluster not found")
        return SimResponse(200, cluster_answer([dict(p) for p in self.pools.values()]))

    def pool(self, request: SimRequest) -> SimResponse:
        pool_id = request.params["pool"]
        if pool_id not in self.pools:
            raise SimError(404, "Worker pool not found")
        body = {
            **self.pools[pool_id],
            "auto_repair": True,
            "everywhere_nodes": [],
            "shoot_id": UID,
            "nodes": self.nodes[pool_id],
        }
        return SimResponse(200, body)

    def update(self, request: SimRequest) -> SimResponse:
        if self.apply_patches and isinstance(request.body, dict) and "desired_size" in request.body:
            self.pools[request.params["pool"]]["desired_size"] = request.body["desired_size"]
        return SimResponse(200, {})

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def api() -> Iterator[FixtureApi]:
    fixtures = FixtureApi().start()
    yield fixtures
    fixtures.stop()


def backend_entry(api: FixtureApi, **extra: Any) -> dict[str, Any]:
    return {
        "auth_method": "password",
        "email": EMAIL,
        "password": PASSWORD,
        "region": "HN",
        "api_url": api.url,
        "token_url": f"{api.url}/api/token",
        "cluster_name": UID,
        **extra,
    }


@pytest.fixture
def backend(api: FixtureApi) -> Iterator[Backend]:
    cfg = parse_config("backends[0].bizfly", backend_entry(api), {}, True)
    client = BizflyClient(cfg, retry=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02))
    made = Backend("bizfly", BizflyAdapter(cfg, client), SyncSettings())
    yield made
    made.adapter.close()


def sync(backend: Backend) -> None:
    backend.sync(Deadline.after(5))


# ================================================================== through client, adapter, backend
def test_the_evidence_shapes_make_the_groups_they_describe(backend: Backend, api: FixtureApi) -> None:
    sync(backend)
    assert sorted(g.id for g in backend.groups()) == sorted([AUTOSCALED, PENDING])  # the fixed pool is none
    pending = backend.group(PENDING)
    assert (pending.min_size, pending.max_size, pending.target_size, pending.instances) == (0, 12, 1, ())
    assert "status=PENDING_PROVISION" in pending.debug
    workers = backend.group(AUTOSCALED)
    assert workers.target_size == 10 and len(workers.instances) == len(NODES)


def test_senlins_statuses_and_reasons_map_to_the_states_the_ca_needs(backend: Backend) -> None:
    sync(backend)
    by_node = {i.cloud_id: i for i in backend.group(AUTOSCALED).instances}
    for node_id, (state, error_class) in EXPECTED.items():
        instance = by_node[node_id]
        assert instance.state == state, node_id
        assert (instance.error.error_class if instance.error else None) == error_class, node_id
    # identities: the server id in the providerID; an INIT node without a server yet gets a pending id
    assert by_node["n-active"].id == "bizflycloud://n-active-server"
    assert by_node["n-init"].id == "bizflycloud-pending://n-init"
    assert by_node["n-active"].name == f"workers-{UID}-node-Qa7ZpL0x"  # kept as the pool lists it


def test_an_unexplained_error_is_decided_by_what_the_earlier_listings_showed(backend: Backend, api: FixtureApi) -> None:
    sync(backend)
    nodes = {n["id"]: n for n in api.nodes[AUTOSCALED]}
    for node_id in ("n-creating", "n-active"):  # one seen being created, one seen serving
        nodes[node_id].update(status="ERROR", status_reason="unexpected")
    api.nodes[AUTOSCALED].append(node("n-new", f"workers-{UID}-node-NeW0nE11", "ERROR", "unexpected"))
    sync(backend)
    by_node = {i.cloud_id: i for i in backend.group(AUTOSCALED).instances}
    assert by_node["n-creating"].state == InstanceState.CREATING and by_node["n-creating"].error is not None
    assert by_node["n-new"].state == InstanceState.CREATING and by_node["n-new"].error is not None
    assert by_node["n-active"].state == InstanceState.RUNNING and by_node["n-active"].error is None


def test_the_headers_are_the_current_vendor_clients_with_the_project_the_login_named(
    backend: Backend, api: FixtureApi
) -> None:
    sync(backend)
    reads = [r for r in api.server.requests.all() if r.route in ("get_cluster", "get_pool")]
    assert reads and {r.headers.get("x-project-id") for r in reads} == {PROJECT}
    assert all("x-tenant-id" not in r.headers and "x-tenant-name" not in r.headers for r in reads)
    assert all(r.headers["x-auth-type"] == "token" and r.headers["x-auth-token"] for r in reads)


def test_a_zero_the_api_ignores_is_never_reported_as_done(backend: Backend, api: FixtureApi) -> None:
    sync(backend)
    api.apply_patches = False  # 2xx, and the pool keeps its size
    with pytest.raises(CloudRequestRejected, match="still reads desired_size 1"):
        backend.decrease_target_size(PENDING, -1, Deadline.after(5))
    api.apply_patches = True
    assert backend.decrease_target_size(PENDING, -1, Deadline.after(5)) == 0


# ================================================================== over gRPC, as the CA sees it
@pytest.fixture
def served(api: FixtureApi) -> Iterator[InProcessServer]:
    entry = {"name": "bizfly", "type": "bizfly", "bizfly": backend_entry(api)}
    server = InProcessServer(server_config([entry], http=False))
    end = time.monotonic() + 10
    while time.monotonic() < end:
        groups = server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        if groups:
            break
        time.sleep(0.05)
    yield server
    server.stop(grace=0.0)


def test_the_ca_sees_running_creating_and_failed_creations_as_senlin_means_them(served: InProcessServer) -> None:
    answer = served.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=AUTOSCALED), timeout=5)
    by_id = {i.id: i.status for i in answer.instances}
    states = {
        InstanceState.RUNNING: pb.InstanceStatus.instanceRunning,
        InstanceState.CREATING: pb.InstanceStatus.instanceCreating,
        InstanceState.DELETING: pb.InstanceStatus.instanceDeleting,
    }
    for item in NODES:
        instance_id = (
            f"bizflycloud://{item['physical_id']}" if item["physical_id"] else f"bizflycloud-pending://{item['id']}"
        )
        state, error_class = EXPECTED[item["id"]]
        status = by_id[instance_id]
        assert status.instanceState == states[state], item["id"]
        assert bool(status.errorInfo.errorCode) == (error_class is not None), item["id"]
    quota = by_id["bizflycloud://n-quota-server"].errorInfo
    assert quota.instanceErrorClass == OUT_OF_RESOURCES and "Quota exceeded" in quota.errorMessage


def test_the_template_of_a_pool_at_zero_carries_the_labels_real_nodes_carry(served: InProcessServer) -> None:
    answer = served.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=PENDING), timeout=5)
    labels = dict(k8s.Node.FromString(answer.nodeBytes).metadata.labels)
    # what Bizfly's cloud-controller-manager writes (through the cloud node controller, GA and beta keys)
    assert labels["topology.kubernetes.io/region"] == "HN"
    assert labels["failure-domain.beta.kubernetes.io/region"] == "HN"
    assert labels["topology.kubernetes.io/zone"] == labels["failure-domain.beta.kubernetes.io/zone"] == "HN1"
    assert labels["node.kubernetes.io/instance-type"] == labels["beta.kubernetes.io/instance-type"] == "nix.2c_2g"


def test_a_zero_the_api_ignores_reaches_the_ca_as_a_precise_failed_precondition(
    served: InProcessServer, api: FixtureApi
) -> None:
    api.apply_patches = False
    with pytest.raises(grpc.RpcError) as raised:
        served.stub.NodeGroupDecreaseTargetSize(pb.NodeGroupDecreaseTargetSizeRequest(id=PENDING, delta=-1), timeout=10)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "did not apply a size of zero" in (raised.value.details() or "")
    target = served.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=PENDING), timeout=5).targetSize
    assert target == 1
