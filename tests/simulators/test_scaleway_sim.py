"""The Scaleway Kapsule simulator, spoken to over HTTP as the CA's own Scaleway client does."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from simulators.common.clock import ManualClock, WallClock
from simulators.common.faults import Fault
from simulators.scaleway import ScalewaySimulator, ScenarioError, demo_scenario, generated_cluster
from simulators.scaleway.state import Pool

SECRET = "test-secret"
REGION = "fr-par"
PROVIDER_ID = re.compile(r"^scaleway://instance/fr-par-1/[0-9a-f-]{36}$")
TIMINGS = {"creating": 10, "starting": 20, "registering": 5, "deleting": 15}


@pytest.fixture
def sim(manual_clock: ManualClock) -> Iterator[ScalewaySimulator]:
    scenario = {"timings": TIMINGS, "clusters": [{"name": "test"}]}
    simulator = ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET).start()
    yield simulator
    simulator.stop()


class Api:
    """The four autoscaler calls, shaped like the CA's scalewaygo client (docs/reference/scaleway.md, "Endpoints
    used")."""

    def __init__(self, sim: ScalewaySimulator, session: requests.Session, token: str = SECRET) -> None:
        self.base = f"{sim.url}/k8s/v1/regions/{REGION}/autoscaler"
        self.cluster_id = sim.cluster_id
        self.session = session
        self.headers = {"X-Auth-Token": token, "User-Agent": "cluster-autoscaler/1.34.0 cluster-id/test"}

    def list_pools(
        self, page: int = 1, page_size: int | None = 100, cluster_id: str | None = None
    ) -> requests.Response:
        params = {"page": page} if page_size is None else {"page": page, "page_size": page_size}
        url = f"{self.base}/clusters/{cluster_id or self.cluster_id}/pools"
        return self.session.get(url, params=params, headers=self.headers)

    def list_nodes(self, page: int = 1, page_size: int = 100) -> requests.Response:
        url = f"{self.base}/clusters/{self.cluster_id}/nodes"
        return self.session.get(url, params={"page": page, "page_size": page_size}, headers=self.headers)

    def set_size(self, pool_id: str, size: object) -> requests.Response:
        return self.session.patch(f"{self.base}/pools/{pool_id}", json={"size": size}, headers=self.headers)

    def delete_node(self, node_id: str) -> requests.Response:
        return self.session.delete(f"{self.base}/nodes/{node_id}", headers=self.headers)

    def all_nodes(self) -> list[dict]:
        nodes: list[dict] = []
        page = 1
        while True:
            batch = self.list_nodes(page).json()["nodes"] or []
            nodes.extend(batch)
            if len(batch) < 100:
                return nodes
            page += 1

    def pool(self, pool_id: str) -> dict:
        pools = self.list_pools().json()["pools"]
        return next(p for p in pools if p["id"] == pool_id)

    def statuses(self, pool_id: str) -> list[str]:
        return sorted(n["status"] for n in self.all_nodes() if n["pool_id"] == pool_id)


@pytest.fixture
def api(sim: ScalewaySimulator, http: requests.Session) -> Api:
    return Api(sim, http)


@pytest.fixture
def pool(sim: ScalewaySimulator) -> Pool:
    return sim.add_pool("workers", node_type="DEV1-M", size=2, min_size=1, max_size=6)


# -- authentication and addressing ----------------------------------------------------------------


def test_missing_token_is_401_with_the_scaleway_body(sim: ScalewaySimulator, http: requests.Session) -> None:
    response = Api(sim, http, token="").list_pools()
    assert response.status_code == 401
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {
        "message": "authentication is denied",
        "method": "api_key",
        "reason": "invalid_argument",
        "type": "denied_authentication",
    }


def test_wrong_token_is_401(sim: ScalewaySimulator, http: requests.Session) -> None:
    response = Api(sim, http, token="not-the-secret").set_size("anything", 1)
    assert response.status_code == 401
    assert response.json()["type"] == "denied_authentication"


def test_unknown_cluster_is_404_not_found(api: Api) -> None:
    response = api.list_pools(cluster_id="00000000-0000-4000-8000-000000000000")
    assert response.status_code == 404
    assert response.json()["type"] == "not_found"
    assert response.json()["resource"] == "cluster"  # as recorded: "cluster", "pool" (not "k8s_...")


def test_unknown_pool_and_node_are_404_naming_the_resource(api: Api) -> None:
    unknown = "00000000-0000-4000-8000-00000000000f"
    assert api.set_size(unknown, 1).json()["resource"] == "pool"
    assert api.delete_node(unknown).json() == {
        "message": "resource is not found",
        "resource": "node",
        "resource_id": unknown,
        "type": "not_found",
    }


def test_unknown_region_is_404(sim: ScalewaySimulator, http: requests.Session) -> None:
    url = f"{sim.url}/k8s/v1/regions/fr-nowhere/autoscaler/clusters/{sim.cluster_id}/pools"
    response = http.get(url, headers={"X-Auth-Token": SECRET})
    assert response.status_code == 404
    assert response.json()["type"] == "not_found"
    assert response.json()["resource"] == "region"


@pytest.mark.parametrize("region", ["nl-ams", "pl-waw", "it-mil"])
def test_every_kapsule_region_is_served_and_answers_404_for_a_cluster_elsewhere(
    sim: ScalewaySimulator, http: requests.Session, region: str
) -> None:
    url = f"{sim.url}/k8s/v1/regions/{region}/clusters/{sim.cluster_id}"
    response = http.get(url, headers={"X-Auth-Token": SECRET})
    assert response.status_code == 404
    assert response.json() == {
        "message": "resource is not found",
        "resource": "cluster",
        "resource_id": sim.cluster_id,
        "type": "not_found",
    }


def test_public_cluster_read_answers_the_recorded_fields(sim: ScalewaySimulator, http: requests.Session) -> None:
    response = http.get(
        f"{sim.url}/k8s/v1/regions/{REGION}/clusters/{sim.cluster_id}", headers={"X-Auth-Token": SECRET}
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["name"], body["region"], body["type"], body["status"]) == (
        sim.cluster_id,
        "test",
        REGION,
        "kapsule",
        "ready",
    )
    assert {"version", "cni", "tags", "autoscaler_config"} <= set(body)
    assert {"expander", "estimator", "scale_down_disabled"} <= set(body["autoscaler_config"])


def test_refused_private_endpoints_answer_the_recorded_iam_403_once_the_key_is_accepted(
    sim: ScalewaySimulator, http: requests.Session, api: Api
) -> None:
    sim.set_behaviour(private_endpoints="refused")
    assert Api(sim, http, token="not-the-secret").list_pools().status_code == 401
    for response in (api.list_pools(), api.list_nodes(), api.set_size("anything", 1), api.delete_node("anything")):
        assert response.status_code == 403
        assert response.json() == {"details": [], "message": "insufficient permissions", "type": "permissions_denied"}
    cluster = http.get(f"{sim.url}/k8s/v1/regions/{REGION}/clusters/{sim.cluster_id}", headers={"X-Auth-Token": SECRET})
    assert cluster.status_code == 200  # the public API still serves the key


def test_cluster_is_not_found_through_another_known_region(manual_clock: ManualClock, http: requests.Session) -> None:
    scenario = {"clusters": [{"name": "a", "region": "fr-par"}, {"name": "b", "region": "nl-ams"}]}
    with ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET) as simulator:
        par_cluster = simulator.cluster_id
        url = f"{simulator.url}/k8s/v1/regions/nl-ams/autoscaler/clusters/{par_cluster}/pools"
        assert http.get(url, headers={"X-Auth-Token": SECRET}).status_code == 404


# -- list pools ---------------------------------------------------------------------------------------


def test_pool_carries_every_field_the_backend_needs(sim: ScalewaySimulator, api: Api) -> None:
    created = sim.add_pool(
        "gpu", node_type="L4-1-24G", size=0, max_size=2, taints={"nvidia.com/gpu": "true:NoSchedule", "x": "NoExecute"}
    )
    response = api.list_pools()
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    pool = response.json()["pools"][0]
    assert pool["id"] == created.id
    assert set(pool) >= {
        "id", "cluster_id", "name", "status", "version", "node_type", "autoscaling", "size", "min_size",
        "max_size", "zone", "node_price_per_hour", "capacity", "allocatable", "labels", "taints",
        "created_at", "updated_at",
    }  # fmt: skip
    assert pool["taints"] == {"nvidia.com/gpu": "true:NoSchedule", "x": "NoExecute"}
    assert pool["capacity"]["nvidia.com/gpu"] == 1
    assert pool["capacity"]["cpu"] == 8  # whole cores, as upstream decodes them
    assert pool["allocatable"]["memory"] < pool["capacity"]["memory"]
    assert pool["labels"] == {}  # as recorded: only what the pool's owner set
    assert pool["node_type"] == "l4_1_24g"  # as recorded: the pools API's own spelling
    assert pool["node_price_per_hour"] > 0
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$", pool["created_at"])


def test_list_answers_carry_no_cache_control_unless_a_scenario_names_a_max_age(
    sim: ScalewaySimulator, api: Api
) -> None:
    # Recorded list answers carry Content-Length, Content-Type, Date, Server and X-Request-Id only.
    assert "Cache-Control" not in api.list_pools().headers
    assert "Cache-Control" not in api.list_nodes().headers
    sim.set_behaviour(cache_max_age=30)
    assert api.list_pools().headers["Cache-Control"] == "max-age=30"
    assert api.list_nodes().headers["Cache-Control"] == "max-age=30"


def test_pools_paginate_over_more_than_100(sim: ScalewaySimulator, api: Api) -> None:
    ids = [sim.add_pool(f"p{i}", size=0, max_size=3).id for i in range(150)]
    first, second, third = (api.list_pools(page).json() for page in (1, 2, 3))
    assert len(first["pools"]) == 100
    assert len(second["pools"]) == 50
    assert third["pools"] == []
    assert first["total_count"] == second["total_count"] == third["total_count"] == 150
    assert [p["id"] for p in first["pools"] + second["pools"]] == ids


def test_page_size_defaults_to_100(sim: ScalewaySimulator, api: Api) -> None:
    for i in range(101):
        sim.add_pool(f"p{i}", size=0, max_size=1)
    assert len(api.list_pools(page_size=None).json()["pools"]) == 100


def test_small_page_sizes_are_honoured(sim: ScalewaySimulator, api: Api) -> None:
    for i in range(5):
        sim.add_pool(f"p{i}", size=0, max_size=1)
    assert [len(api.list_pools(page, page_size=2).json()["pools"]) for page in (1, 2, 3, 4)] == [2, 2, 1, 0]


@pytest.mark.parametrize(("page", "page_size"), [(0, 100), (1, 0), (1, 101), ("x", 100)])
def test_bad_paging_arguments_are_400_invalid_arguments(api: Api, page: object, page_size: int) -> None:
    response = api.list_pools(page, page_size)  # type: ignore[arg-type]
    assert response.status_code == 400
    assert response.json()["type"] == "invalid_arguments"
    assert response.json()["details"][0]["argument_name"] in {"page", "page_size"}


def test_empty_page_can_be_null(sim: ScalewaySimulator, api: Api) -> None:
    sim.set_behaviour(null_empty_pages=True)
    assert api.list_pools().json() == {"pools": None, "total_count": 0}
    assert api.list_nodes().json() == {"nodes": None, "total_count": 0}


# -- list nodes ---------------------------------------------------------------------------------------


def test_nodes_paginate_over_more_than_100(sim: ScalewaySimulator, api: Api) -> None:
    big = sim.add_pool("big", size=250, max_size=300)
    pages = [api.list_nodes(page).json() for page in (1, 2, 3, 4)]
    assert [len(p["nodes"]) for p in pages] == [100, 100, 50, 0]
    assert {p["total_count"] for p in pages} == {250}
    nodes = [n for p in pages for n in p["nodes"]]
    assert len({n["id"] for n in nodes}) == 250
    assert all(n["pool_id"] == big.id and n["cluster_id"] == sim.cluster_id for n in nodes)
    assert all(PROVIDER_ID.match(n["provider_id"]) and n["status"] == "ready" for n in nodes)


def test_node_ids_and_provider_ids_are_distinct(api: Api, pool: Pool) -> None:
    nodes = api.all_nodes()
    assert {n["id"] for n in nodes}.isdisjoint({n["provider_id"].rsplit("/", 1)[1] for n in nodes})
    assert len({n["provider_id"] for n in nodes}) == 2


# -- scale up and node transitions -------------------------------------------------------------------------


def test_scale_up_answers_the_pool_with_new_size_and_scaling(api: Api, pool: Pool) -> None:
    response = api.set_size(pool.id, 4)
    assert response.status_code == 200
    assert response.json()["size"] == 4
    assert response.json()["status"] == "scaling"
    assert api.statuses(pool.id) == ["creating", "creating", "ready", "ready"]


def test_a_node_being_created_is_listed_with_an_empty_provider_id(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    api.set_size(pool.id, 3)
    [creating] = [n for n in api.all_nodes() if n["status"] == "creating"]
    assert creating["provider_id"] == ""  # as recorded
    sim.advance(30)  # past creating: the machine exists
    [started] = [n for n in api.all_nodes() if n["id"] == creating["id"]]
    assert started["status"] != "creating" and PROVIDER_ID.match(started["provider_id"])


def test_provider_id_at_creation_is_a_scenario_option(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_behaviour(provider_id_at_creation=True)
    api.set_size(pool.id, 3)
    [creating] = [n for n in api.all_nodes() if n["status"] == "creating"]
    assert PROVIDER_ID.match(creating["provider_id"])


def test_nodes_go_creating_starting_registering_ready_on_clock_advance(sim: ScalewaySimulator, api: Api) -> None:
    empty = sim.add_pool("empty", size=0, max_size=3)
    api.set_size(empty.id, 1)
    seen = api.statuses(empty.id)
    for seconds in (TIMINGS["creating"], TIMINGS["starting"], TIMINGS["registering"]):
        sim.advance(seconds - 1)
        assert api.statuses(empty.id) == seen[-1:], "changed before its time"
        sim.advance(1)
        seen += api.statuses(empty.id)
    assert seen == ["creating", "starting", "registering", "ready"]


def test_pool_returns_to_ready_when_all_nodes_are_ready(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    api.set_size(pool.id, 3)
    sim.advance(TIMINGS["creating"] + TIMINGS["starting"])
    assert api.pool(pool.id)["status"] == "scaling"
    sim.advance(TIMINGS["registering"])
    assert api.pool(pool.id)["status"] == "ready"


def test_one_large_clock_jump_plays_the_whole_sequence(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    api.set_size(pool.id, 5)
    sim.advance(3600)
    assert api.statuses(pool.id) == ["ready"] * 5


def test_not_ready_step_is_optional(manual_clock: ManualClock, http: requests.Session) -> None:
    scenario = {"timings": {**TIMINGS, "not_ready": 7}, "clusters": [{"name": "c"}]}
    with ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET) as simulator:
        created = simulator.add_pool("p", size=0, max_size=1)
        api = Api(simulator, http)
        api.set_size(created.id, 1)
        simulator.advance(TIMINGS["creating"] + TIMINGS["starting"] + TIMINGS["registering"])
        assert api.statuses(created.id) == ["not_ready"]
        simulator.advance(7)
        assert api.statuses(created.id) == ["ready"]


def test_provider_id_can_stay_empty_until_the_node_starts(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_behaviour(provider_id_at_creation=False)
    api.set_size(pool.id, 4)
    creating = [n for n in api.all_nodes() if n["status"] == "creating"]
    assert [n["provider_id"] for n in creating] == ["", ""]  # the upstream map-key collision case
    sim.advance(TIMINGS["creating"])
    started = [n for n in api.all_nodes() if n["status"] == "starting"]
    assert len(started) == 2 and all(PROVIDER_ID.match(n["provider_id"]) for n in started)


def test_patch_to_the_same_size_changes_nothing(api: Api, pool: Pool) -> None:
    response = api.set_size(pool.id, 2)
    assert response.json()["status"] == "ready"
    assert api.statuses(pool.id) == ["ready", "ready"]


# -- scale down, delete node ---------------------------------------------------------------------------


def test_scale_down_removes_non_ready_nodes_first_then_the_newest(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    original = {n["id"] for n in api.all_nodes()}
    api.set_size(pool.id, 4)
    sim.advance(3600)
    api.set_size(pool.id, 5)  # one node still creating
    response = api.set_size(pool.id, 3)
    assert response.json()["status"] == "scaling"
    nodes = api.all_nodes()
    deleting = [n for n in nodes if n["status"] == "deleting"]
    assert len(deleting) == 2
    newest_ready = [n for n in nodes if n["id"] not in original]
    assert {n["id"] for n in deleting} <= {n["id"] for n in newest_ready}
    assert original <= {n["id"] for n in nodes if n["status"] == "ready"}


def test_deleting_nodes_disappear_after_the_drain_time(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    api.set_size(pool.id, 1)
    sim.advance(TIMINGS["deleting"] - 1)
    assert api.statuses(pool.id) == ["deleting", "ready"]
    sim.advance(1)
    assert api.statuses(pool.id) == ["ready"]
    assert api.pool(pool.id)["status"] == "ready"


def test_after_a_decrease_the_pool_reads_ready_while_the_removed_node_is_deleting(
    sim: ScalewaySimulator, api: Api, pool: Pool
) -> None:
    # As recorded: the PATCH answer says scaling, a read within the second too, then "ready" while the
    # node the decrease removed is still "deleting".
    assert api.set_size(pool.id, 1).json()["status"] == "scaling"
    assert api.pool(pool.id)["status"] == "scaling"
    sim.advance(1)
    assert api.pool(pool.id)["status"] == "ready"
    assert api.statuses(pool.id) == ["deleting", "ready"]


def test_a_pool_scaling_until_its_removed_nodes_are_gone_is_a_scenario_option(
    sim: ScalewaySimulator, api: Api, pool: Pool
) -> None:
    sim.set_behaviour(pool_scaling_while_deleting=True)
    api.set_size(pool.id, 1)
    sim.advance(TIMINGS["deleting"] - 1)
    assert (api.pool(pool.id)["status"], api.statuses(pool.id)) == ("scaling", ["deleting", "ready"])
    sim.advance(1)
    assert api.pool(pool.id)["status"] == "ready"


def test_deleted_nodes_can_stay_listed_for_a_while(manual_clock: ManualClock, http: requests.Session) -> None:
    scenario = {"timings": {**TIMINGS, "deleted_kept": 30}, "clusters": [{"name": "c"}]}
    with ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET) as simulator:
        created = simulator.add_pool("p", size=1, max_size=1, min_size=0)
        api = Api(simulator, http)
        api.set_size(created.id, 0)
        simulator.advance(TIMINGS["deleting"])
        assert api.statuses(created.id) == ["deleted"]
        simulator.advance(30)
        assert api.statuses(created.id) == []


def test_delete_node_answers_deleting_and_shrinks_the_pool(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    node = api.all_nodes()[0]
    response = api.delete_node(node["id"])
    assert response.status_code == 200
    assert response.json()["id"] == node["id"]
    assert response.json()["status"] == "deleting"
    assert api.pool(pool.id)["size"] == 1
    assert api.pool(pool.id)["status"] == "scaling"
    sim.advance(1)
    assert api.pool(pool.id)["status"] == "ready"  # the node is still deleting
    sim.advance(TIMINGS["deleting"])
    assert [n["id"] for n in api.all_nodes()] != [node["id"]]
    assert len(api.all_nodes()) == 1
    assert api.pool(pool.id)["status"] == "ready"


def test_repeated_delete_is_idempotent_by_default(api: Api, pool: Pool) -> None:
    node_id = api.all_nodes()[0]["id"]
    api.delete_node(node_id)
    again = api.delete_node(node_id)
    assert again.status_code == 200
    assert again.json()["status"] == "deleting"
    assert api.pool(pool.id)["size"] == 1


def test_repeated_delete_can_be_a_409(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_behaviour(repeated_delete="conflict")
    node_id = api.all_nodes()[0]["id"]
    api.delete_node(node_id)
    again = api.delete_node(node_id)
    assert again.status_code == 409
    assert again.json()["type"] == "transient_state"
    assert again.json()["current_state"] == "deleting"


def test_unknown_node_and_pool_are_404(api: Api) -> None:
    missing = "11111111-1111-4111-8111-111111111111"
    for response in (api.delete_node(missing), api.set_size(missing, 1)):
        assert response.status_code == 404
        assert response.json()["type"] == "not_found"
        assert response.json()["resource_id"] == missing


# -- validation and held pools ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 7])
def test_size_outside_min_max_is_400_with_field_details(api: Api, pool: Pool, size: int) -> None:
    response = api.set_size(pool.id, size)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "invalid_arguments"
    assert body["details"][0]["argument_name"] == "size"
    assert body["details"][0]["reason"] == "constraint"
    assert api.pool(pool.id)["size"] == 2


def test_size_bounds_check_can_be_disabled(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_behaviour(enforce_size_bounds=False)
    assert api.set_size(pool.id, 7).json()["size"] == 7


@pytest.mark.parametrize("size", ["3", 2.5, True, None])
def test_non_integer_size_is_400(api: Api, pool: Pool, size: object) -> None:
    response = api.set_size(pool.id, size)
    assert response.status_code == 400
    assert response.json()["details"][0]["argument_name"] == "size"


def test_patch_without_size_is_400(api: Api, pool: Pool) -> None:
    response = api.session.patch(f"{api.base}/pools/{pool.id}", json={"min_size": 1}, headers=api.headers)
    assert response.status_code == 400
    assert response.json()["details"][0]["reason"] == "required"


@pytest.mark.parametrize("hold", ["lock_pool", "upgrade_pool"])
def test_writes_on_a_held_pool_can_be_accepted(sim: ScalewaySimulator, api: Api, pool: Pool, hold: str) -> None:
    # No public evidence says Kapsule refuses them: a scenario can have the API accept them.
    sim.set_behaviour(transient_pool_writes="accept")
    getattr(sim, hold)(pool.id)
    response = api.set_size(pool.id, 3)
    assert response.status_code == 200 and response.json()["size"] == 3
    assert api.delete_node(api.all_nodes()[0]["id"]).status_code == 200
    assert api.pool(pool.id)["size"] == 2


@pytest.mark.parametrize("hold", ["lock_pool", "upgrade_pool"])
def test_locked_or_upgrading_pool_refuses_size_changes_with_409(
    sim: ScalewaySimulator, api: Api, pool: Pool, hold: str
) -> None:
    getattr(sim, hold)(pool.id)
    expected_state = "locked" if hold == "lock_pool" else "upgrading"
    response = api.set_size(pool.id, 3)
    assert response.status_code == 409
    assert response.json() == {
        "message": "resource is in a transient state",
        "resource": "pool",
        "resource_id": pool.id,
        "current_state": expected_state,
        "type": "transient_state",
    }
    assert api.delete_node(api.all_nodes()[0]["id"]).status_code == 409
    assert api.pool(pool.id)["status"] == expected_state  # held statuses are not recomputed
    sim.release_pool(pool.id)
    assert api.set_size(pool.id, 3).status_code == 200


def test_locked_pool_is_still_listed(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.lock_pool(pool.id)
    assert api.pool(pool.id)["status"] == "locked"


# -- scale-up failures ---------------------------------------------------------------------------------


def test_creation_error_nodes_stay_failed_and_the_pool_warns(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id)
    assert api.set_size(pool.id, 4).status_code == 200
    sim.advance(TIMINGS["creating"])
    assert api.statuses(pool.id) == ["creation_error", "creation_error", "ready", "ready"]
    failed = [n for n in api.all_nodes() if n["status"] == "creation_error"]
    assert all(n["error_message"] for n in failed)
    sim.advance(3600)
    assert api.statuses(pool.id) == ["creation_error", "creation_error", "ready", "ready"]
    assert api.pool(pool.id)["status"] == "warning"


def test_creation_error_can_hit_only_some_nodes(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id, nodes=1)
    api.set_size(pool.id, 5)
    sim.advance(3600)
    assert api.statuses(pool.id) == ["creation_error", "ready", "ready", "ready", "ready"]


def test_failure_applies_to_the_next_scale_up_only(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id)
    api.set_size(pool.id, 3)
    api.set_size(pool.id, 4)
    sim.advance(3600)
    assert api.statuses(pool.id) == ["creation_error", "ready", "ready", "ready"]


def test_creation_error_nodes_can_be_deleted(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id)
    api.set_size(pool.id, 3)
    sim.advance(TIMINGS["creating"])
    failed = next(n for n in api.all_nodes() if n["status"] == "creation_error")
    assert api.delete_node(failed["id"]).json()["status"] == "deleting"
    sim.advance(TIMINGS["deleting"])
    assert api.statuses(pool.id) == ["ready", "ready"]
    assert api.pool(pool.id)["status"] == "ready"


def test_quota_failure_is_403_quotas_exceeded_and_changes_nothing(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id, mode="quota")
    response = api.set_size(pool.id, 4)
    assert response.status_code == 403
    assert response.json()["type"] == "quotas_exceeded"
    assert {"resource", "quota", "current"} <= set(response.json()["details"][0])
    assert api.pool(pool.id)["size"] == 2
    assert api.set_size(pool.id, 4).status_code == 200


def test_cluster_node_quota_refuses_scale_ups_beyond_it(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_behaviour(node_quota=3)
    assert api.set_size(pool.id, 3).status_code == 200
    response = api.set_size(pool.id, 4)
    assert response.status_code == 403
    assert response.json()["details"][0] == {"resource": "k8s_nodes", "quota": 3, "current": 3}


def test_out_of_stock_failure_is_503(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.fail_next_scale_up(pool.id, mode="out_of_stock")
    response = api.set_size(pool.id, 3)
    assert response.status_code == 503
    assert response.json()["type"] == "out_of_stock"


# -- manual edits -------------------------------------------------------------------------------------


def test_set_node_status_forces_a_status(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    node_id = api.all_nodes()[0]["id"]
    sim.set_node_status(node_id, "rebooting")
    assert sorted(api.statuses(pool.id)) == ["ready", "rebooting"]
    sim.advance(3600)
    assert sorted(api.statuses(pool.id)) == ["ready", "rebooting"]  # not a timed status


def test_set_node_status_to_a_boot_step_resumes_the_sequence(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    node_id = api.all_nodes()[0]["id"]
    sim.set_node_status(node_id, "starting")
    assert api.pool(pool.id)["status"] == "scaling"
    sim.advance(TIMINGS["starting"] + TIMINGS["registering"])
    assert api.statuses(pool.id) == ["ready", "ready"]


def test_autoscaling_flag_can_be_toggled_and_pools_removed(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    sim.set_autoscaling(pool.id, False)
    assert api.pool(pool.id)["autoscaling"] is False
    sim.remove_pool(pool.id)
    assert api.list_pools().json()["pools"] == []
    assert api.all_nodes() == []


def test_unknown_statuses_are_refused_by_helpers(sim: ScalewaySimulator, pool: Pool) -> None:
    with pytest.raises(ValueError):
        sim.set_node_status(sim.nodes_of(pool.id)[0].id, "sleeping")
    with pytest.raises(ValueError):
        sim.fail_next_scale_up(pool.id, mode="gremlins")


# -- faults, rate limit, request log -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 403, 409])
def test_service_faults_answer_typed_scaleway_json_errors(sim: ScalewaySimulator, api: Api, status: int) -> None:
    sim.faults.add(Fault(route="list_pools", status=status, times=1))
    response = api.list_pools()
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert isinstance(response.json()["message"], str) and isinstance(response.json()["type"], str)
    assert api.list_pools().status_code == 200


@pytest.mark.parametrize("status", [404, 500, 502, 503, 504])
def test_gateway_faults_answer_a_bare_message(sim: ScalewaySimulator, api: Api, status: int) -> None:
    # As recorded: {"message": "Internal error"} (500), {"message": "internal error"} (503), no "type".
    sim.faults.add(Fault(route="list_pools", status=status, times=1))
    response = api.list_pools()
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.json()) == {"message"}


def test_an_unknown_route_is_the_gateways_bare_404(api: Api) -> None:
    response = api.session.get(f"{api.base}/no-such-thing", headers=api.headers)
    assert response.status_code == 404 and set(response.json()) == {"message"}


def test_a_429_fault_is_the_gateways_empty_answer(sim: ScalewaySimulator, api: Api) -> None:
    sim.faults.add(Fault(route="list_pools", status=429, times=1))
    response = api.list_pools()
    assert response.status_code == 429
    assert response.content == b"" and "Content-Type" not in response.headers


@pytest.mark.parametrize("status", [404, 429, 500, 503])
def test_typed_error_shapes_are_a_scenario_option(sim: ScalewaySimulator, api: Api, status: int) -> None:
    sim.set_behaviour(error_shapes="typed")
    sim.faults.add(Fault(route="list_pools", status=status, times=1))
    response = api.list_pools()
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert isinstance(response.json()["message"], str) and isinstance(response.json()["type"], str)


def test_rate_limit_answers_like_the_gateway(sim: ScalewaySimulator, api: Api) -> None:
    # As recorded: 429, no body, no Content-Type, no Retry-After; only X-Envoy-Ratelimited: true.
    sim.rate_limit(per_second=0.01, burst=2)
    statuses = [api.list_pools().status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    throttled = api.list_pools()
    assert throttled.content == b""
    assert "Content-Type" not in throttled.headers and "Retry-After" not in throttled.headers
    assert throttled.headers["X-Envoy-Ratelimited"] == "true"
    assert "X-Ratelimit-Remaining" not in throttled.headers


def test_a_typed_rate_limit_answer_is_a_scenario_option(sim: ScalewaySimulator, api: Api) -> None:
    sim.set_behaviour(error_shapes="typed")
    sim.rate_limit(per_second=0.01, burst=1)
    assert api.list_pools().status_code == 200
    throttled = api.list_pools()
    assert throttled.json()["type"] == "too_many_requests"
    assert int(throttled.headers["Retry-After"]) >= 1
    assert throttled.headers["X-Ratelimit-Remaining"] == "0"
    assert int(throttled.headers["X-Ratelimit-Reset"]) >= 1


def test_request_log_records_auth_user_agent_and_patch_body(sim: ScalewaySimulator, api: Api, pool: Pool) -> None:
    api.list_pools()
    api.set_size(pool.id, 3)
    api.delete_node(api.all_nodes()[0]["id"])
    assert sim.requests.count(route="list_pools") == 1
    assert sim.requests.count(route="list_nodes") == 1
    patch = sim.requests.filter(route="update_pool")[0]
    assert patch.body == {"size": 3}
    assert patch.headers["x-auth-token"] == SECRET
    assert patch.headers["user-agent"].startswith("cluster-autoscaler/")
    assert patch.headers["content-type"] == "application/json"
    listing = sim.requests.filter(route="list_pools")[0]
    assert listing.query == {"page": "1", "page_size": "100"}
    assert sim.requests.filter(route="delete_node")[0].status == 200


def test_bodies_on_get_and_delete_are_tolerated(api: Api, pool: Pool) -> None:
    url = f"{api.base}/clusters/{api.cluster_id}/pools"
    headers = {**api.headers, "Content-Type": "application/json"}
    assert api.session.get(url, data=b"{}", headers=headers).status_code == 200
    node_id = api.all_nodes()[0]["id"]
    assert api.session.delete(f"{api.base}/nodes/{node_id}", data=b"{}", headers=headers).status_code == 200


# -- control API ----------------------------------------------------------------------------------------


def test_control_api_advances_time_and_edits_state(sim: ScalewaySimulator, api: Api, http: requests.Session) -> None:
    added = http.post(
        f"{sim.url}/_sim/clusters/{sim.cluster_id}/pools", json={"name": "extra", "size": 1, "max_size": 3}
    )
    assert added.status_code == 200
    pool_id = added.json()["id"]
    api.set_size(pool_id, 2)
    assert http.post(f"{sim.url}/_sim/advance", json={"seconds": 3600}).status_code == 200
    assert api.statuses(pool_id) == ["ready", "ready"]
    node_id = api.all_nodes()[0]["id"]
    assert http.patch(f"{sim.url}/_sim/nodes/{node_id}", json={"status": "locked"}).json()["status"] == "locked"
    assert http.patch(f"{sim.url}/_sim/pools/{pool_id}", json={"status": "upgrading"}).json()["status"] == "upgrading"
    http.post(f"{sim.url}/_sim/pools/{pool_id}/fail_next_scale_up", json={"mode": "quota"})
    http.patch(f"{sim.url}/_sim/pools/{pool_id}", json={"status": "ready"})
    assert api.set_size(pool_id, 3).status_code == 403
    state = http.get(f"{sim.url}/_sim/state").json()
    assert {p["id"] for p in state["pools"]} == {pool_id}
    assert len(state["nodes"]) == 2


def test_control_api_rejects_bad_edits(sim: ScalewaySimulator, http: requests.Session, pool: Pool) -> None:
    assert http.patch(f"{sim.url}/_sim/pools/{pool.id}", json={"colour": "red"}).status_code == 400
    assert http.patch(f"{sim.url}/_sim/nodes/nope", json={"status": "ready"}).status_code == 404
    assert http.patch(f"{sim.url}/_sim/behaviour", json={"repeated_delete": "maybe"}).status_code == 400
    assert http.post(f"{sim.url}/_sim/clusters/{sim.cluster_id}/pools", json={"size": 1}).status_code == 400


def test_wall_clock_transitions_happen_without_explicit_ticks(http: requests.Session) -> None:
    clock = WallClock()
    scenario = {"timings": TIMINGS, "clusters": [{"name": "c"}]}
    with ScalewaySimulator(scenario, clock=clock, secret_key=SECRET) as simulator:
        created = simulator.add_pool("p", size=0, max_size=2)
        api = Api(simulator, http)
        api.set_size(created.id, 2)
        clock.advance(3600)  # moves wall-based time; the next request applies what is due
        assert api.statuses(created.id) == ["ready", "ready"]


# -- scenarios -------------------------------------------------------------------------------------------


def test_scenario_declares_pools_and_initial_nodes(manual_clock: ManualClock, http: requests.Session) -> None:
    scenario = {
        "secret_key": "ignored-here",
        "clusters": [
            {
                "id": "c0ffee00-0000-4000-8000-000000000000",
                "name": "s",
                "pools": [
                    {"id": "pool-a", "name": "a", "node_type": "GP1-XS", "size": 2, "min_size": 1, "max_size": 4,
                     "nodes": [{"status": "ready", "provider_id": "scaleway://instance/fr-par-1/x"},
                               {"status": "creation_error"}]},
                    {"id": "pool-b", "name": "b", "node_type": "CUSTOM-1", "size": 0, "max_size": 2,
                     "capacity": {"cpu": 2, "memory": 1000}, "node_price_per_hour": 0.5, "autoscaling": False},
                ],
            }
        ],
    }  # fmt: skip
    with ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET) as simulator:
        api = Api(simulator, http)
        pools = api.list_pools().json()["pools"]
        assert [(p["id"], p["autoscaling"]) for p in pools] == [("pool-a", True), ("pool-b", False)]
        assert pools[1]["allocatable"] == {"cpu": 2, "memory": 1000}
        assert pools[0]["status"] == "warning"
        assert api.statuses("pool-a") == ["creation_error", "ready"]
        assert "scaleway://instance/fr-par-1/x" in {n["provider_id"] for n in api.all_nodes()}


def test_scenario_with_fewer_nodes_than_size_boots_the_rest(manual_clock: ManualClock, http: requests.Session) -> None:
    scenario = {"clusters": [{"name": "s", "pools": [{"id": "p", "name": "p", "size": 3, "max_size": 3, "nodes": 1}]}]}
    with ScalewaySimulator(scenario, clock=manual_clock, secret_key=SECRET) as simulator:
        assert Api(simulator, http).statuses("p") == ["creating", "creating", "ready"]


@pytest.mark.parametrize(
    "scenario",
    [
        {"clusters": [{"name": "c", "pools": [{"name": "p", "node_type": "NOPE-1"}]}]},
        {"clusters": [{"name": "c", "pools": [{"name": "p", "min_size": 3, "max_size": 1}]}]},
        {"clusters": [{"name": "c", "pools": [{"name": "p", "flavour": "x"}]}]},
        {"clusters": [{"name": "c", "pools": [{"name": "p", "size": 1, "nodes": [{"status": "asleep"}]}]}]},
        {"clusters": [{"name": "c", "pools": [{"size": 1}]}]},
        {"clusters": [{"name": "c", "pools": [{"name": "p", "size": "2"}]}]},
        {"clusters": [{"name": "c", "pools": [{"name": "p", "size": 1, "nodes": -1}]}]},
        {"timings": {"creating": 1, "booting": 2}},
        {"clusterz": []},
    ],
)
def test_invalid_scenarios_raise_scenario_error(scenario: dict) -> None:
    with pytest.raises(ScenarioError):
        ScalewaySimulator(scenario)


def test_demo_scenario_shape() -> None:
    simulator = ScalewaySimulator(demo_scenario())
    pools = list(simulator.state.pools.values())
    autoscaling = [p for p in pools if p.autoscaling]
    assert len(simulator.state.clusters) == 1
    assert len(autoscaling) == 4
    assert len(pools) - len(autoscaling) == 1
    assert all(p.size < p.max_size for p in autoscaling)
    assert any(p.size > 0 and all(n.status == "ready" for n in p.nodes.values()) for p in autoscaling)
    gpu = [p for p in autoscaling if p.size == 0 and "nvidia.com/gpu" in p.capacity]
    assert len(gpu) == 1


def test_demo_scenario_ids_are_stable() -> None:
    assert demo_scenario() == demo_scenario()
    first = ScalewaySimulator(demo_scenario()).state.snapshot()["nodes"]
    second = ScalewaySimulator(demo_scenario()).state.snapshot()["nodes"]
    assert [n["id"] for n in first] == [n["id"] for n in second]


def test_generated_cluster_lists_5000_nodes_in_pages(http: requests.Session) -> None:
    with ScalewaySimulator(generated_cluster(pools=100, nodes=5000, seed=3), secret_key=SECRET) as simulator:
        api = Api(simulator, http)
        pools = [p for page in (1, 2) for p in api.list_pools(page).json()["pools"]]
        assert len(pools) == 100
        assert sum(p["size"] for p in pools) == 5000
        assert all(p["size"] < p["max_size"] for p in pools)
        nodes = api.all_nodes()
        assert len(nodes) == 5000
        assert {n["status"] for n in nodes} == {"ready"}
        assert len({n["provider_id"] for n in nodes}) == 5000


def test_scenario_file_loads_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(generated_cluster(pools=3, nodes=7, seed=1)))
    from simulators.scaleway import load_scenario_file

    simulator = ScalewaySimulator(load_scenario_file(path))
    assert len(simulator.state.nodes) == 7


# -- standalone ------------------------------------------------------------------------------------------


def test_standalone_module_serves_until_sigterm(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"timings": TIMINGS, "clusters": [{"id": "cl-1", "name": "x", "pools": [
        {"id": "p-1", "name": "p", "size": 1, "max_size": 3}]}]}))  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "simulators.scaleway", "--port", "0", "--scenario", str(scenario),
         "--clock", "manual", "--secret-key", "k"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert re.match(r"^http://127\.0\.0\.1:\d+$", url)
        session = requests.Session()
        session.trust_env = False
        base = f"{url}/k8s/v1/regions/fr-par/autoscaler"
        headers = {"X-Auth-Token": "k"}
        assert session.patch(f"{base}/pools/p-1", json={"size": 2}, headers=headers).status_code == 200
        session.post(f"{url}/_sim/advance", json={"seconds": 3600})
        nodes = session.get(f"{base}/clusters/cl-1/nodes", headers=headers).json()["nodes"]
        assert [n["status"] for n in nodes] == ["ready", "ready"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the public endpoints (the server's public mode) --------------------------------------------------


def public(sim: ScalewaySimulator, path: str) -> str:
    return f"{sim.url}/k8s/v1/regions/{REGION}{path}"


def test_public_pool_listing_uses_list_form_taints_and_no_template_data(
    sim: ScalewaySimulator, http: requests.Session
) -> None:
    created = sim.add_pool("t", size=0, max_size=2, taints={"a": "b:NoSchedule", "c": "NoExecute"})
    response = http.get(public(sim, f"/clusters/{sim.cluster_id}/pools"), headers={"X-Auth-Token": SECRET})
    pool = response.json()["pools"][0]
    assert pool["id"] == created.id
    assert pool["taints"] == [
        {"key": "a", "value": "b", "effect": "NoSchedule"},
        {"key": "c", "value": "", "effect": "NoExecute"},
    ]
    assert not {"capacity", "allocatable", "node_price_per_hour"} & set(pool)
    assert response.json()["total_count"] == 1


def test_public_get_and_patch_pool(sim: ScalewaySimulator, http: requests.Session, pool: Pool) -> None:
    headers = {"X-Auth-Token": SECRET}
    assert http.get(public(sim, f"/pools/{pool.id}"), headers=headers).json()["size"] == 2
    patched = http.patch(public(sim, f"/pools/{pool.id}"), json={"size": 3, "max_size": 8}, headers=headers)
    assert patched.status_code == 200
    assert (patched.json()["size"], patched.json()["max_size"], patched.json()["status"]) == (3, 8, "scaling")
    bad = http.patch(public(sim, f"/pools/{pool.id}"), json={"min_size": 9}, headers=headers)
    assert bad.status_code == 400


def test_public_node_listing_filters_by_pool(sim: ScalewaySimulator, http: requests.Session, pool: Pool) -> None:
    other = sim.add_pool("other", size=1, max_size=1)
    headers = {"X-Auth-Token": SECRET}
    url = public(sim, f"/clusters/{sim.cluster_id}/nodes")
    assert http.get(url, headers=headers).json()["total_count"] == 3
    only = http.get(url, params={"pool_id": other.id}, headers=headers).json()
    assert [n["pool_id"] for n in only["nodes"]] == [other.id]
    assert {"error_message", "conditions", "region"} <= set(only["nodes"][0])


def test_public_delete_node_accepts_skip_drain(sim: ScalewaySimulator, http: requests.Session, pool: Pool) -> None:
    headers = {"X-Auth-Token": SECRET}
    node_id = sim.nodes_of(pool.id)[0].id
    response = http.delete(
        public(sim, f"/nodes/{node_id}"), params={"skip_drain": "False"}, data=b"{}", headers=headers
    )
    assert response.status_code == 200
    assert response.json()["status"] == "deleting"
    assert http.get(public(sim, f"/nodes/{node_id}"), headers=headers).json()["status"] == "deleting"
    assert sim.pool(pool.id).size == 1


def test_instance_product_list_is_paged_as_recorded(sim: ScalewaySimulator, http: requests.Session) -> None:
    url = f"{sim.url}/instance/v1/zones/fr-par-1/products/servers"
    headers = {"X-Auth-Token": SECRET}
    everything = http.get(url, params={"per_page": 100}, headers=headers)
    servers = everything.json()["servers"]
    assert (servers["DEV1-M"]["ncpus"], servers["DEV1-M"]["ram"], servers["DEV1-M"]["arch"]) == (
        3,
        4 * 1024**3,
        "x86_64",
    )
    assert servers["L4-1-24G"]["gpu"] == 1 and servers["COPARM1-4C-16G"]["arch"] == "arm64"
    # Recorded: the count in X-Total-Count, none in the body; pages linked; 50 a page unless asked.
    assert "total_count" not in everything.json()
    assert everything.headers["X-Total-Count"] == str(len(servers))
    first = http.get(url, params={"per_page": 5}, headers=headers)
    second = http.get(url, params={"per_page": 5, "page": 2}, headers=headers)
    assert len(first.json()["servers"]) == 5 and not set(first.json()["servers"]) & set(second.json()["servers"])
    assert 'rel="next"' in first.headers["Link"] and 'rel="previous"' in second.headers["Link"]
    assert http.get(url, params={"per_page": 101}, headers=headers).status_code == 400
    assert http.get(f"{sim.url}/instance/v1/zones/xx-nowhere-1/products/servers", headers=headers).status_code == 404
    assert http.get(url).status_code == 401


def test_public_pools_carry_tags_root_volume_and_kubelet_args(sim: ScalewaySimulator, http: requests.Session) -> None:
    tags = ["workload=batch", "taint=noprefix=dedicated=batch:NoSchedule"]
    created = sim.add_pool(
        "tagged", size=1, max_size=2, tags=tags, root_volume_size=50_000_000_000, kubelet_args={"maxPods": "60"}
    )
    pool = http.get(public(sim, f"/pools/{created.id}"), headers={"X-Auth-Token": SECRET}).json()
    assert (pool["tags"], pool["root_volume_size"], pool["kubelet_args"]) == (tags, 50_000_000_000, {"maxPods": "60"})
    # Kapsule copies the tags onto the pool's servers, and its nodes get their labels (docs/tags.md of the CCM).
    (ref,) = [r for r in sim.node_refs() if r["pool_id"] == created.id]
    assert ref["labels"]["k8s.scaleway.com/workload"] == "batch"
    assert "dedicated" not in ref["labels"]


def test_size_bounds_hold_only_while_the_pools_autoscaling_is_on(
    sim: ScalewaySimulator, http: requests.Session
) -> None:
    headers = {"X-Auth-Token": SECRET}
    fixed = sim.add_pool("fixed", size=1, min_size=1, max_size=1, autoscaling=False)
    assert http.patch(public(sim, f"/pools/{fixed.id}"), json={"size": 3}, headers=headers).status_code == 200
    scaled = sim.add_pool("scaled", size=1, min_size=1, max_size=1)
    assert http.patch(public(sim, f"/pools/{scaled.id}"), json={"size": 3}, headers=headers).status_code == 400


def test_node_refs_list_registered_nodes_with_pool_labels(
    sim: ScalewaySimulator, api: Api, pool: Pool, http: requests.Session
) -> None:
    api.set_size(pool.id, 3)
    refs = sim.node_refs()
    assert len(refs) == 2  # the creating node has no Kubernetes Node yet
    assert all(r["labels"]["k8s.scaleway.com/pool"] == pool.id for r in refs)
    assert all(r["labels"]["kubernetes.io/hostname"] == r["name"] for r in refs)
    assert {r["provider_id"] for r in refs} <= {n["provider_id"] for n in api.all_nodes()}
    assert len(sim.node_refs(registered_only=False)) == 3
    over_http = http.get(f"{sim.url}/_sim/clusters/{sim.cluster_id}/node_refs").json()
    assert [r["provider_id"] for r in over_http] == [r["provider_id"] for r in refs]


def test_pool_labels_are_the_owners_unless_a_scenario_adds_the_well_known_ones(
    sim: ScalewaySimulator, api: Api
) -> None:
    bare = sim.add_pool("bare", node_type="DEV1-M", size=1, max_size=2, labels={"team": "a"})
    plain = sim.add_pool("plain", node_type="DEV1-M", size=0, max_size=2, labels={"team": "b"}, default_labels=True)
    assert api.pool(bare.id)["labels"] == {"team": "a"}
    assert api.pool(plain.id)["labels"]["team"] == "b"
    assert api.pool(plain.id)["labels"]["node.kubernetes.io/instance-type"] == "DEV1-M"


def test_a_nodes_kubernetes_labels_are_a_real_kapsule_nodes(sim: ScalewaySimulator) -> None:
    pool = sim.add_pool("pro", node_type="PRO2-XXS", size=1, max_size=2, labels={"team": "a"})
    assert sim.pool(pool.id).node_type == "pro2_xxs"
    [node] = sim.nodes_of(pool.id)
    [ref] = [r for r in sim.node_refs() if r["pool_id"] == pool.id]
    assert ref["labels"] == {
        "team": "a",
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "PRO2-XXS",  # the machine's commercial type
        "beta.kubernetes.io/instance-type": "PRO2-XXS",
        "topology.kubernetes.io/region": "fr-par",
        "topology.kubernetes.io/zone": "fr-par-1",
        "failure-domain.beta.kubernetes.io/region": "fr-par",
        "failure-domain.beta.kubernetes.io/zone": "fr-par-1",
        "k8s.scaleway.com/kapsule": sim.cluster_id,
        "k8s.scaleway.com/pool": pool.id,
        "k8s.scaleway.com/pool-name": "pro",
        "k8s.scaleway.com/runtime": "containerd",
        "k8s.scaleway.com/managed": "true",
        "k8s.scaleway.com/node": node.id,
    }


@pytest.mark.parametrize("given", ["PRO2-XXS", "PRO2_XXS", "pro2_xxs"])
def test_node_types_are_answered_in_the_pools_api_spelling(sim: ScalewaySimulator, api: Api, given: str) -> None:
    pool = sim.add_pool("p", node_type=given, size=0, max_size=2)
    assert api.pool(pool.id)["node_type"] == "pro2_xxs"
    sim.set_behaviour(node_type_spelling="as_given")
    kept = sim.add_pool("q", node_type=given, size=0, max_size=2)
    assert api.pool(kept.id)["node_type"] == given
