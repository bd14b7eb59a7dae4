"""Contract tests: the shapes the real Kapsule API is publicly shown to answer, through the real client,
adapter and backend, and over gRPC where the answer reaches the CA.

Each fixture below is written in our own words (our ids, names and messages) after one row of the
evidence table in docs/reference/scaleway.md ("Evidence"; the row is named next to it); what is kept is the shape:
which fields, which types, which headers, which status with which body. The answers are replayed by a
scripted HTTP server (tests/support/scripted_http.py), not by the simulator, so that what reaches the
client is exactly the fixture.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devstack.harness import InProcessServer, server_config
from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from providers.backend import Backend, SyncSettings
from providers.deadline import Deadline
from providers.errors import ChangeOutcomeUnknown, CloudRequestRejected, GroupBusy, NodeGroupNotFound
from providers.http_transport import BreakerSettings, RetryPolicy
from providers.model import InstanceState, NodeRef
from providers.scaleway.adapter import SYNTHETIC_ID_PREFIX, ScalewayAdapter
from providers.scaleway.config import ScalewayConfig
from tests.support.scripted_http import Scripted, ScriptedServer

SECRET = "0d1e2f30-4a5b-4c6d-8e7f-000000000abc"
REGION = "fr-par"
CLUSTER = "c1a55e70-0000-4000-8000-0000000000c1"
POOL = "9001aaaa-0000-4000-8000-000000000001"
READY_NODE = "9001bbbb-0000-4000-8000-000000000001"
NEW_NODE = "9001bbbb-0000-4000-8000-000000000002"
SERVER = "5e7e7000-0000-4000-8000-000000000001"
PROVIDER_ID = f"scaleway://instance/fr-par-1/{SERVER}"
BASE = f"/k8s/v1/regions/{REGION}/autoscaler"
POOLS = f"{BASE}/clusters/{CLUSTER}/pools"
NODES = f"{BASE}/clusters/{CLUSTER}/nodes"
POOL_PATH = f"{BASE}/pools/[^/]+"
NODE_PATH = f"{BASE}/nodes/[^/]+"
# Rows 6 and 36: what the API gateway puts on every answer; lists carry no Cache-Control.
GATEWAY_HEADERS = {"Server": "Scaleway API Gateway (test;edge)", "X-Request-Id": "00000000-0000-4000-8000-00000000feed"}

# Rows 7, 8, 10, 11, 12, 13: a pool of the autoscaler endpoint, with the fields the public pool record
# carries too (unused by us, they must not disturb the reading): node_type in the API's own spelling,
# the owner's labels only, the map form of taints, timestamps with microseconds, nulls.
POOL_RECORD: dict[str, Any] = {
    "region": REGION,
    "id": POOL,
    "cluster_id": CLUSTER,
    "created_at": "2026-08-01T08:00:00.123456Z",
    "updated_at": "2026-08-01T08:00:00.123456Z",
    "name": "apps",
    "status": "ready",
    "version": "1.36.1",
    "node_type": "pro2_xxs",
    "autoscaling": True,
    "size": 1,
    "min_size": 0,
    "max_size": 4,
    "container_runtime": "containerd",
    "autohealing": True,
    "tags": ["team-apps"],
    "placement_group_id": None,
    "kubelet_args": {},
    "upgrade_policy": {"max_unavailable": 1, "max_surge": 0},
    "zone": "fr-par-1",
    "root_volume_type": "sbs_5k",
    "root_volume_size": 20000000000,
    "public_ip_disabled": False,
    "security_group_id": "5ec00000-0000-4000-8000-000000000001",
    "labels": {},
    "taints": {},
    "startup_taints": [],
    "error_message": None,
    "node_price_per_hour": 0.055,
    "capacity": {"cpu": 2, "memory": 8589934592, "ephemeral-storage": 20000000000, "pods": 110},
    "allocatable": {"cpu": 2, "memory": 7516192768, "ephemeral-storage": 18000000000, "pods": 110},
}
# Rows 16, 17, 18: a running node, and one being created (no providerID yet), with the public fields.
READY_RECORD: dict[str, Any] = {
    "region": REGION,
    "id": READY_NODE,
    "cluster_id": CLUSTER,
    "created_at": "2026-08-01T08:01:00.000001Z",
    "updated_at": "2026-08-01T08:03:00.000001Z",
    "pool_id": POOL,
    "status": "ready",
    "conditions": {"Ready": "True"},
    "name": "scw-apps-apps-9001bb",
    "public_ip_v4": "",
    "public_ip_v6": None,
    "provider_id": PROVIDER_ID,
    "error_message": "",
}
CREATING_RECORD: dict[str, Any] = {
    **READY_RECORD,
    "id": NEW_NODE,
    "status": "creating",
    "conditions": {"Creating": "True", "Ready": "False"},
    "name": "scw-apps-apps-9001bc",
    "provider_id": "",
}


def pools_page(*pools: dict[str, Any]) -> Scripted:
    return Scripted(body={"total_count": len(pools), "pools": list(pools)}, headers=GATEWAY_HEADERS)


def nodes_page(*nodes: dict[str, Any]) -> Scripted:
    return Scripted(body={"total_count": len(nodes), "nodes": list(nodes)}, headers=GATEWAY_HEADERS)


# Row 36: the gateway's rate limiter.
RATE_LIMITED = Scripted(status=429, headers={**GATEWAY_HEADERS, "X-Envoy-Ratelimited": "true"}, content_type=None)
# Row 37: server errors with a message and nothing else.
SERVER_ERROR = Scripted(status=500, body={"message": "internal failure"}, headers=GATEWAY_HEADERS)
UNAVAILABLE = Scripted(status=503, body={"message": "internal failure"}, headers=GATEWAY_HEADERS)
# Row 38: a bare 404.
BARE_NOT_FOUND = Scripted(status=404, body={"message": "not found"}, headers=GATEWAY_HEADERS)


def typed_not_found(resource: str, resource_id: str) -> Scripted:
    # Rows 26, 27: Kapsule's typed 404 names the resource ("pool", "cluster"; "node" by analogy).
    body = {"message": "no such resource", "resource": resource, "resource_id": resource_id, "type": "not_found"}
    return Scripted(status=404, body=body, headers=GATEWAY_HEADERS)


def transient_state(resource: str, resource_id: str, state: str) -> Scripted:
    # Row 26: a 409 names the state the API saw.
    body = {
        "message": "in a transient state",
        "resource": resource,
        "resource_id": resource_id,
        "current_state": state,
        "type": "transient_state",
    }
    return Scripted(status=409, body=body, headers=GATEWAY_HEADERS)


def pool_answer(**changes: Any) -> Scripted:
    return Scripted(body={**copy.deepcopy(POOL_RECORD), **changes}, headers=GATEWAY_HEADERS)


# Row 24: 2xx answers to a write that carry no readable record.
NO_RECORD = {
    "204-with-a-json-type": Scripted(status=204, headers={**GATEWAY_HEADERS, "Content-Type": "application/json"}),
    "200-empty": Scripted(status=200, headers=GATEWAY_HEADERS, content_type=None),
    "200-not-a-record": Scripted(status=200, body={"accepted": True}, headers=GATEWAY_HEADERS),
}


@pytest.fixture
def api() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    server.answer(Scripted(status=599, body={"message": "no fixture for this call"}))
    server.route("GET", POOLS, pools_page(POOL_RECORD))
    server.route("GET", NODES, nodes_page(READY_RECORD, CREATING_RECORD))
    yield server
    server.stop()


@pytest.fixture
def backend(api: ScriptedServer) -> Iterator[Backend]:
    config = ScalewayConfig(cluster_id=CLUSTER, secret_key=SECRET, region=REGION, api_url=api.url, request_timeout=2.0)
    adapter = ScalewayAdapter(
        config, retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02), breaker=BreakerSettings(50)
    )
    built = Backend("scw-contract", adapter, SyncSettings(min_interval=0.0))
    built.sync(Deadline.after(5))
    yield built
    built.stop()
    adapter.close()


def soon() -> Deadline:
    return Deadline.after(5)


# ------------------------------------------------------------------------------------------ reads


def test_the_recorded_pool_and_node_shapes_read_as_groups_instances_and_templates(backend: Backend) -> None:
    group = backend.group(POOL)
    assert (group.min_size, group.max_size, group.target_size) == (0, 4, 1)
    states = {i.id: i.state for i in backend.instances(POOL)}
    assert states == {PROVIDER_ID: InstanceState.RUNNING, SYNTHETIC_ID_PREFIX + NEW_NODE: InstanceState.CREATING}
    template = backend.template(POOL)
    assert template is not None
    assert template.labels["node.kubernetes.io/instance-type"] == "PRO2-XXS"  # rows 10 and 28
    assert template.labels["k8s.scaleway.com/pool"] == POOL
    assert template.allocatable["cpu"] == "2"


def test_lists_without_cache_control_leave_the_interval_to_the_server(backend: Backend, api: ScriptedServer) -> None:
    listing = backend.adapter.list_groups(soon())
    assert listing.max_age is None  # row 6: the server's own interval applies
    assert [s.path.split("?")[1] for s in api.requests("GET", POOLS)][-1] == "page=1&page_size=100"


def test_the_gateways_429_is_retried_with_backoff(backend: Backend, api: ScriptedServer) -> None:
    api.route("GET", POOLS, RATE_LIMITED, pools_page(POOL_RECORD))
    before = len(api.requests("GET", POOLS))
    backend.sync(soon())
    assert len(api.requests("GET", POOLS)) == before + 2


@pytest.mark.parametrize("failure", [SERVER_ERROR, UNAVAILABLE], ids=["500", "503"])
def test_bare_server_errors_on_a_list_are_retried(backend: Backend, api: ScriptedServer, failure: Scripted) -> None:
    api.route("GET", NODES, failure, nodes_page(READY_RECORD, CREATING_RECORD))
    before = len(api.requests("GET", NODES))
    backend.sync(soon())
    assert len(api.requests("GET", NODES)) == before + 2


# ------------------------------------------------------------------------------------------ writes


def test_a_size_write_on_a_pool_listed_upgrading_is_sent(api: ScriptedServer) -> None:
    # Row 14 and 23: the listing says "upgrading"; the PATCH goes out and Kapsule's 200 is the answer.
    api.route("GET", POOLS, pools_page({**POOL_RECORD, "status": "upgrading"}))
    config = ScalewayConfig(cluster_id=CLUSTER, secret_key=SECRET, region=REGION, api_url=api.url)
    backend = Backend("scw-contract", ScalewayAdapter(config), SyncSettings(min_interval=0.0))
    try:
        backend.sync(soon())
        api.route("PATCH", POOL_PATH, pool_answer(size=3, status="upgrading"))
        assert backend.increase_size(POOL, 2, soon()) == 3
        assert [s.body for s in api.requests("PATCH", POOL_PATH)] == [b'{"size": 3}']
    finally:
        backend.stop()
        backend.adapter.close()


def test_a_409_names_the_state_the_api_gave(backend: Backend, api: ScriptedServer) -> None:
    api.route("PATCH", POOL_PATH, transient_state("pool", POOL, "locked"))
    with pytest.raises(GroupBusy, match="the API says the pool is locked") as raised:
        backend.increase_size(POOL, 1, soon())
    assert "ready" not in str(raised.value).split("(")[0]  # the listing's status is not the reason given


@pytest.mark.parametrize("answer", sorted(NO_RECORD))
def test_a_size_write_answered_2xx_without_a_pool_is_done(backend: Backend, api: ScriptedServer, answer: str) -> None:
    api.route("PATCH", POOL_PATH, NO_RECORD[answer])
    assert backend.increase_size(POOL, 1, soon()) == 2
    assert len(api.requests("PATCH", POOL_PATH)) == 1
    assert backend.target_size(POOL) == 2


@pytest.mark.parametrize("applied", [True, False])
def test_a_size_write_answered_2xx_with_a_body_that_is_not_json_is_read_back(
    backend: Backend, api: ScriptedServer, applied: bool
) -> None:
    # Issue 40, item 4: not the API's answer (a proxy's page): the pool is listed again to know.
    api.route("PATCH", POOL_PATH, Scripted(status=200, body=b"<html>accepted</html>", content_type="text/html"))
    api.route("GET", POOLS, pools_page({**POOL_RECORD, "size": 2 if applied else 1}))
    if applied:
        assert backend.increase_size(POOL, 1, soon()) == 2
    else:
        with pytest.raises(ChangeOutcomeUnknown, match="not the API's answer"):
            backend.increase_size(POOL, 1, soon())
        assert backend.target_size(POOL) == 1
    assert len(api.requests("PATCH", POOL_PATH)) == 1


def test_a_size_write_answered_with_the_pool_record_is_done(backend: Backend, api: ScriptedServer) -> None:
    api.route("PATCH", POOL_PATH, pool_answer(size=2, status="scaling"))  # row 15: scaling in the answer
    assert backend.increase_size(POOL, 1, soon()) == 2


def test_a_size_write_answered_500_is_read_back_not_repeated(backend: Backend, api: ScriptedServer) -> None:
    # Row 37: the write may have been applied; the pool is listed again to know.
    api.route("PATCH", POOL_PATH, SERVER_ERROR)
    api.route("GET", POOLS, pools_page({**POOL_RECORD, "size": 2}))
    assert backend.increase_size(POOL, 1, soon()) == 2
    assert len(api.requests("PATCH", POOL_PATH)) == 1


def test_a_size_write_rate_limited_is_repeated(backend: Backend, api: ScriptedServer) -> None:
    # Row 36: the rate limiter refused it, so it certainly was not applied: sending it again is safe.
    api.route("PATCH", POOL_PATH, RATE_LIMITED, pool_answer(size=2))
    assert backend.increase_size(POOL, 1, soon()) == 2
    assert len(api.requests("PATCH", POOL_PATH)) == 2


def test_only_a_typed_404_naming_the_pool_means_it_is_gone(backend: Backend, api: ScriptedServer) -> None:
    api.route("PATCH", POOL_PATH, typed_not_found("pool", POOL))
    with pytest.raises(NodeGroupNotFound):
        backend.increase_size(POOL, 1, soon())
    backend.sync(soon())
    api.route("PATCH", POOL_PATH, BARE_NOT_FOUND)
    with pytest.raises(CloudRequestRejected, match="names no resource") as raised:
        backend.increase_size(POOL, 1, soon())
    assert not isinstance(raised.value, NodeGroupNotFound)


def ready_node() -> NodeRef:
    return NodeRef(provider_id=PROVIDER_ID, name=READY_RECORD["name"])


@pytest.mark.parametrize(
    "answer",
    [
        Scripted(body={**READY_RECORD, "status": "deleting"}, headers=GATEWAY_HEADERS),
        *NO_RECORD.values(),
    ],
    ids=["node-record", *sorted(NO_RECORD)],
)
def test_a_deletion_answered_2xx_is_done(backend: Backend, api: ScriptedServer, answer: Scripted) -> None:
    api.route("DELETE", NODE_PATH, answer)
    assert backend.delete_nodes(POOL, [ready_node()], soon()) == 1
    assert [s.path for s in api.requests("DELETE", NODE_PATH)] == [f"{BASE}/nodes/{READY_NODE}"]


def test_a_deletion_met_by_a_typed_404_for_the_node_is_done_a_bare_one_is_not(
    backend: Backend, api: ScriptedServer
) -> None:
    api.route("DELETE", NODE_PATH, typed_not_found("node", READY_NODE))
    assert backend.delete_nodes(POOL, [ready_node()], soon()) == 1
    backend.sync(soon())
    api.route("DELETE", NODE_PATH, BARE_NOT_FOUND)
    with pytest.raises(CloudRequestRejected, match="was not reached"):
        backend.delete_nodes(POOL, [ready_node()], soon())


def test_a_deletion_of_a_node_already_deleting_is_done(backend: Backend, api: ScriptedServer) -> None:
    api.route("DELETE", NODE_PATH, transient_state("node", READY_NODE, "deleting"))  # row 25
    assert backend.delete_nodes(POOL, [ready_node()], soon()) == 1


# ------------------------------------------------------------------------------------------ over gRPC


@pytest.fixture
def served(api: ScriptedServer, tmp_path: Path) -> Iterator[InProcessServer]:
    backend = {
        "name": "scw",
        "type": "scaleway",
        "scaleway": {"cluster_id": CLUSTER, "region": REGION, "api_url": api.url, "secret_key": SECRET},
    }
    server = InProcessServer(server_config([backend], http=False), env={}, base=tmp_path)
    yield server
    server.stop(grace=0.0)


def test_over_grpc_the_ca_gets_the_real_instance_type_and_every_machine(served: InProcessServer) -> None:
    answer = served.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=POOL), timeout=5)
    node = k8s.Node.FromString(answer.nodeBytes)
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "PRO2-XXS"
    instances = served.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=POOL), timeout=5).instances
    assert sorted(i.id for i in instances) == sorted([PROVIDER_ID, SYNTHETIC_ID_PREFIX + NEW_NODE])


def test_over_grpc_a_write_answered_2xx_without_a_body_is_ok(served: InProcessServer, api: ScriptedServer) -> None:
    api.route("PATCH", POOL_PATH, NO_RECORD["204-with-a-json-type"])
    served.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=1), timeout=5)
    size = served.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=POOL), timeout=5).targetSize
    assert size == 2


def test_over_grpc_a_409_reaches_the_ca_naming_the_apis_state(served: InProcessServer, api: ScriptedServer) -> None:
    api.route("PATCH", POOL_PATH, transient_state("pool", POOL, "upgrading"))
    with pytest.raises(grpc.RpcError) as raised:
        served.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=1), timeout=5)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the API says the pool is upgrading" in raised.value.details()
