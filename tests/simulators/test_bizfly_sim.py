"""The Bizfly Cloud Kubernetes Engine simulator, spoken to over HTTP on 127.0.0.1 like the real API.

Facts asserted here are those of docs/reference/bizfly.md ("Authentication", "Endpoints used", "The simulator").
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from simulators.bizfly import (
    DEFAULT_APP_CREDENTIALS,
    DEFAULT_PROJECT_ID,
    DEFAULT_USERS,
    DEMO_CLUSTER_UID,
    NODE_ID_LABEL,
    ROUTE_GET_CLUSTER,
    ROUTE_TOKEN,
    ROUTE_UPDATE_POOL,
    BizflySimulator,
    ScenarioError,
    demo_scenario,
)
from simulators.common.clock import ManualClock, WallClock
from simulators.common.faults import Fault

CLUSTER = "kecluster0000001"
POOL = "5f959e0ac0b18944d0a4f101"
FIXED_POOL = "5f959e0ac0b18944d0a4f102"
EMAIL, PASSWORD = next(iter(DEFAULT_USERS.items()))
CRED_ID, CRED_SECRET = next(iter(DEFAULT_APP_CREDENTIALS.items()))
PROVISION, DELETE = 100.0, 20.0


def scenario(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "timings": {"provision_seconds": PROVISION, "delete_seconds": DELETE},
        "clusters": [
            {
                "uid": CLUSTER,
                "name": "test-cluster",
                "pools": [
                    {
                        "id": POOL,
                        "name": "workers",
                        "flavor": "nix.2c_4g",
                        "min_size": 0,
                        "max_size": 5,
                        "desired_size": 2,
                        "enable_autoscaling": True,
                        "labels": {"tier": "web"},
                        "taints": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}],
                    },
                    {
                        "id": FIXED_POOL,
                        "name": "system",
                        "flavor": "nix.4c_8g",
                        "min_size": 1,
                        "max_size": 1,
                        "desired_size": 1,
                        "enable_autoscaling": False,
                    },
                ],
            }
        ],
    }
    base.update(overrides)
    return base


@pytest.fixture
def sim(manual_clock: ManualClock) -> Iterator[BizflySimulator]:
    simulator = BizflySimulator(scenario(), clock=manual_clock).start()
    yield simulator
    simulator.stop()


def password_body() -> dict[str, str]:
    return {"auth_method": "password", "username": EMAIL, "password": PASSWORD}


def login(http: requests.Session, sim: BizflySimulator) -> str:
    response = http.post(sim.token_url, json=password_body())
    assert response.status_code == 200, response.text
    return str(response.json()["token"])


def k8s(sim: BizflySimulator, *parts: str) -> str:
    return "/".join([sim.kubernetes_engine_url, "_", *parts])


def auth(token: str, project: str | None = None) -> dict[str, str]:
    """The current vendor client's headers (X-Project-ID only when a project is chosen)."""
    return {"X-Auth-Token": token, "X-Auth-Type": "token", **({"X-Project-ID": project} if project else {})}


def get_pool(http: requests.Session, sim: BizflySimulator, token: str, pool: str = POOL) -> dict[str, Any]:
    response = http.get(k8s(sim, CLUSTER, pool), headers=auth(token))
    assert response.status_code == 200, response.text
    return dict(response.json())


def statuses(pool: dict[str, Any]) -> list[str]:
    return sorted(node["status"] for node in pool["nodes"])


# -- authentication -------------------------------------------------------------------------------------


def test_password_login_issues_a_token_that_opens_the_kubernetes_api(
    sim: BizflySimulator, http: requests.Session
) -> None:
    response = http.post(sim.token_url, json=password_body())
    assert response.status_code == 200
    body = response.json()
    assert body["token"] and body["expires_at"].endswith("Z") and body["expire_at"] == body["expires_at"]
    assert http.get(k8s(sim, CLUSTER), headers=auth(body["token"])).status_code == 200


def test_go_encoded_login_body_with_trailing_newline_is_accepted(sim: BizflySimulator, http: requests.Session) -> None:
    # gobizfly uses json.Encoder: compact, with a trailing newline.
    raw = json.dumps(password_body(), separators=(",", ":")) + "\n"
    headers = {"Content-Type": "application/json; charset=utf-8", "X-Auth-Type": "token", "X-Tenant-Id": ""}
    response = http.post(sim.token_url, data=raw.encode(), headers=headers)
    assert response.status_code == 200 and response.json()["token"]


@pytest.mark.parametrize(
    "fields",
    [
        {"credential_id": CRED_ID, "credential_secret": CRED_SECRET},  # gobizfly spelling
        {"application_credential_id": CRED_ID, "application_credential_secret": CRED_SECRET},  # docs spelling
    ],
    ids=["gobizfly-spelling", "docs-spelling"],
)
def test_application_credential_login_accepts_both_field_spellings(
    sim: BizflySimulator, http: requests.Session, fields: dict[str, str]
) -> None:
    body = {"auth_method": "application_credential", "project_name": "ignored", **fields}
    response = http.post(sim.token_url, json=body)
    assert response.status_code == 200
    assert http.get(k8s(sim, CLUSTER), headers=auth(response.json()["token"])).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"auth_method": "password", "username": EMAIL, "password": "wrong"},
        {"auth_method": "password", "username": "nobody@example.com", "password": PASSWORD},
        {"auth_method": "application_credential", "credential_id": CRED_ID, "credential_secret": "wrong"},
        {"auth_method": ""},  # what upstream re-sends when it never stored credentials
        {"auth_method": "password"},
    ],
    ids=["bad-password", "unknown-user", "bad-secret", "empty-method", "missing-fields"],
)
def test_bad_credentials_get_401_with_a_message(
    sim: BizflySimulator, http: requests.Session, body: dict[str, str]
) -> None:
    response = http.post(sim.token_url, json=body)
    assert response.status_code == 401
    assert response.json()["message"]


def test_custom_accounts_replace_the_default_ones(manual_clock: ManualClock, http: requests.Session) -> None:
    with BizflySimulator(scenario(), clock=manual_clock, users={"ops@example.vn": "pw"}, app_credentials={}) as sim:
        assert http.post(sim.token_url, json=password_body()).status_code == 401
        ok = http.post(sim.token_url, json={"auth_method": "password", "username": "ops@example.vn", "password": "pw"})
        assert ok.status_code == 200
        app = {"auth_method": "application_credential", "credential_id": CRED_ID, "credential_secret": CRED_SECRET}
        assert http.post(sim.token_url, json=app).status_code == 401


def test_token_refresh_with_a_stale_token_header_is_accepted(sim: BizflySimulator, http: requests.Session) -> None:
    old = login(http, sim)
    sim.expire_tokens()
    # On refresh gobizfly still sends the old token in X-Auth-Token.
    response = http.post(sim.token_url, json=password_body(), headers=auth(old))
    assert response.status_code == 200 and response.json()["token"] != old


def test_token_expires_after_its_ttl(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    sim.advance(3600 - 1)
    assert http.get(k8s(sim, CLUSTER), headers=auth(token)).status_code == 200
    sim.advance(1)
    expired = http.get(k8s(sim, CLUSTER), headers=auth(token))
    assert expired.status_code == 401 and expired.json()["message"]
    assert http.get(k8s(sim, CLUSTER), headers=auth(login(http, sim))).status_code == 200


def test_token_ttl_is_configurable(manual_clock: ManualClock, http: requests.Session) -> None:
    with BizflySimulator(scenario(), clock=manual_clock, token_ttl=60) as sim:
        token = login(http, sim)
        sim.advance(60)
        assert http.get(k8s(sim, CLUSTER), headers=auth(token)).status_code == 401


def test_expire_tokens_control_route_invalidates_issued_tokens(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    assert http.post(f"{sim.url}/_sim/bizfly/expire-tokens").json() == {"expired": 1}
    assert http.get(k8s(sim, CLUSTER, POOL), headers=auth(token)).status_code == 401


@pytest.mark.parametrize("headers", [{}, {"X-Auth-Token": ""}, {"X-Auth-Token": "not-a-token"}])
def test_kubernetes_calls_without_a_valid_token_get_401(
    sim: BizflySimulator, http: requests.Session, headers: dict[str, str]
) -> None:
    for method, url in [
        ("GET", k8s(sim, CLUSTER)),
        ("GET", k8s(sim, CLUSTER, POOL)),
        ("PATCH", k8s(sim, CLUSTER, POOL)),
    ]:
        assert http.request(method, url, headers=headers, json={"desired_size": 3}).status_code == 401
    assert get_pool(http, sim, login(http, sim))["desired_size"] == 2  # the refused PATCH changed nothing


def test_newer_client_application_credential_headers_authenticate(sim: BizflySimulator, http: requests.Session) -> None:
    headers = {"X-Auth-Type": "application_credential", "X-App-Credential-ID": CRED_ID}
    good = http.get(k8s(sim, CLUSTER), headers={**headers, "X-App-Credential-Secret": CRED_SECRET})
    bad = http.get(k8s(sim, CLUSTER), headers={**headers, "X-App-Credential-Secret": "nope"})
    assert (good.status_code, bad.status_code) == (200, 401)


# -- service catalog ------------------------------------------------------------------------------------


def kubernetes_entries(http: requests.Session, sim: BizflySimulator) -> list[dict[str, Any]]:
    response = http.get(f"{sim.url}/api/auth/service")  # no headers at all, like upstream
    assert response.status_code == 200
    return [s for s in response.json()["services"] if s["canonical_name"] == "kubernetes_engine"]


def test_catalog_needs_no_auth_and_points_the_home_region_at_the_simulator(
    sim: BizflySimulator, http: requests.Session
) -> None:
    services = http.get(f"{sim.url}/api/auth/service").json()["services"]
    home = [s for s in services if s["region"] == "HN"]
    urls = {s["canonical_name"]: s["service_url"] for s in home}
    assert urls["kubernetes_engine"] == f"{sim.url}/api/kubernetes-engine"
    assert urls["auth"] == f"{sim.url}/api"
    assert all({"canonical_name", "region", "service_url", "enabled"} <= set(s) for s in services)


def test_catalog_lists_other_regions_first_at_urls_that_do_not_serve_this_cluster(
    sim: BizflySimulator, http: requests.Session
) -> None:
    entries = kubernetes_entries(http, sim)
    assert [e["region"] for e in entries] == ["HCM", "HN"]
    decoy = http.get(f"{entries[0]['service_url']}/_/{CLUSTER}", headers=auth(login(http, sim)))
    assert decoy.status_code == 404


def test_another_regions_engine_holds_the_clusters_a_scenario_puts_there(
    manual_clock: ManualClock, http: requests.Session
) -> None:
    cluster = {"uid": "kecluster0000hcm", "name": "south", "region": "HCM", "pools": []}
    with BizflySimulator(scenario(clusters=[*scenario()["clusters"], cluster]), clock=manual_clock) as sim:
        headers = auth(login(http, sim))
        south, home = (entry["service_url"] for entry in kubernetes_entries(http, sim))
        assert http.get(f"{south}/_/kecluster0000hcm", headers=headers).json()["name"] == "south"
        assert http.get(f"{home}/_/kecluster0000hcm", headers=headers).status_code == 404
        assert [c["uid"] for c in http.get(f"{south}/_/", headers=headers).json()["clusters"]] == ["kecluster0000hcm"]
        assert [c["uid"] for c in http.get(f"{home}/_/", headers=headers).json()["clusters"]] == [CLUSTER]
        assert http.get(f"{sim.url}/nowhere/api/kubernetes-engine/_/", headers=headers).status_code == 404


@pytest.mark.parametrize("spelling", ["HN", "hn", "HaNoi"])
def test_catalog_region_spelling_is_configurable(
    manual_clock: ManualClock, http: requests.Session, spelling: str
) -> None:
    with BizflySimulator(scenario(), clock=manual_clock, region_spelling=spelling) as sim:
        assert kubernetes_entries(http, sim)[-1]["region"] == spelling


def test_catalog_regions_change_at_run_time(sim: BizflySimulator, http: requests.Session) -> None:
    sim.set_catalog_regions("HaNoi", ["HCM", "VC-HaNoi"])
    assert [e["region"] for e in kubernetes_entries(http, sim)] == ["HCM", "VC-HaNoi", "HaNoi"]
    response = http.post(f"{sim.url}/_sim/bizfly/catalog", json={"region": "hn", "other_regions": []})
    assert response.status_code == 200
    assert [e["region"] for e in kubernetes_entries(http, sim)] == ["hn"]


def test_catalog_region_from_scenario(manual_clock: ManualClock, http: requests.Session) -> None:
    with BizflySimulator(scenario(catalog={"region": "HCM", "other_regions": ["HN"]}), clock=manual_clock) as sim:
        entries = kubernetes_entries(http, sim)
        assert [e["region"] for e in entries] == ["HN", "HCM"]
        assert entries[-1]["service_url"] == sim.kubernetes_engine_url


# -- projects -------------------------------------------------------------------------------------------

OTHER_PROJECT = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"


def two_projects() -> dict[str, Any]:
    """The default project's cluster, and a second cluster in another project of the same account."""
    base = scenario(account={"projects": {OTHER_PROJECT: "staging"}})
    other = {"uid": "keotherproject01", "name": "other", "project_id": OTHER_PROJECT, "pools": []}
    base["clusters"].append(other)
    return base


def test_a_token_is_scoped_to_the_default_project_unless_the_login_names_another(
    manual_clock: ManualClock, http: requests.Session
) -> None:
    with BizflySimulator(two_projects(), clock=manual_clock) as sim:
        default = http.post(sim.token_url, json=password_body()).json()
        assert (default["project_id"], default["project_name"]) == (DEFAULT_PROJECT_ID, "demo-project")
        scoped = http.post(sim.token_url, json={**password_body(), "project_id": OTHER_PROJECT}).json()
        assert (scoped["project_id"], scoped["project_name"]) == (OTHER_PROJECT, "staging")
        # the other project's cluster: visible with a token scoped to it, not with the default one
        assert http.get(k8s(sim, "keotherproject01"), headers=auth(scoped["token"])).status_code == 200
        assert http.get(k8s(sim, "keotherproject01"), headers=auth(default["token"])).status_code == 404
        unknown = http.post(sim.token_url, json={**password_body(), "project_id": "f" * 32})
        assert unknown.status_code == 401


def test_x_project_id_chooses_the_project_and_the_old_tenant_headers_do_not(
    manual_clock: ManualClock, http: requests.Session
) -> None:
    with BizflySimulator(two_projects(), clock=manual_clock) as sim:
        token = login(http, sim)
        assert http.get(k8s(sim, "keotherproject01"), headers=auth(token, OTHER_PROJECT)).status_code == 200
        assert http.get(k8s(sim, CLUSTER), headers=auth(token, OTHER_PROJECT)).status_code == 404
        tenant = {**auth(token), "X-Tenant-Id": OTHER_PROJECT, "X-Tenant-Name": EMAIL}
        assert http.get(k8s(sim, "keotherproject01"), headers=tenant).status_code == 404  # deprecated, ignored
        listed = http.get(k8s(sim, ""), headers=auth(token, OTHER_PROJECT)).json()["clusters"]
        assert [c["uid"] for c in listed] == ["keotherproject01"]
        foreign = http.get(k8s(sim, CLUSTER), headers=auth(token, "e" * 32))
        assert foreign.status_code == 403 and "not allowed" in foreign.json()["message"]


# -- clusters and pools ---------------------------------------------------------------------------------


def test_cluster_get_returns_the_bare_cluster_with_its_worker_pools(
    sim: BizflySimulator, http: requests.Session
) -> None:
    body = http.get(k8s(sim, CLUSTER), headers=auth(login(http, sim))).json()
    assert body["uid"] == CLUSTER and body["worker_pools_count"] == 2
    pools = {p["id"]: p for p in body["worker_pools"]}
    assert [p["id"] for p in body["worker_pools"]] == [POOL, FIXED_POOL]  # API order is scenario order
    workers = pools[POOL]
    assert (workers["min_size"], workers["max_size"], workers["desired_size"]) == (0, 5, 2)
    assert workers["enable_autoscaling"] is True and pools[FIXED_POOL]["enable_autoscaling"] is False
    assert workers["flavor"] == "nix.2c_4g" and workers["labels"] == {"tier": "web"}
    assert workers["taints"] == [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]
    assert "nodes" not in workers
    # As the API's own examples: "stats" (not "stat") with null totals, naive created_at, no time zone.
    assert body["stats"] == {"worker_pools": 2, "total_cpu": None, "total_memory": None, "total_disk": {}}
    assert "stat" not in body
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", body["created_at"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", workers["created_at"])
    assert uuid.UUID(workers["autoscaling_group_id"]) and uuid.UUID(workers["launch_config_id"])


def test_the_former_answer_shapes_stay_as_scenario_options(manual_clock: ManualClock, http: requests.Session) -> None:
    shapes = {"timestamps": "utc", "stats_key": "stat", "node_names": "lower"}
    with BizflySimulator(scenario(api=shapes), clock=manual_clock) as sim:
        token = login(http, sim)
        body = http.get(k8s(sim, CLUSTER), headers=auth(token)).json()
        assert body["stat"] == {"worker_pools": 2, "total_cpu": 2 * 2 + 4, "total_memory": 2 * 4 + 8}
        assert body["created_at"].endswith("Z") and "stats" not in body
        assert all(n["name"] == n["name"].lower() for n in get_pool(http, sim, token)["nodes"])


def test_invalid_answer_shape_options_are_rejected() -> None:
    with pytest.raises(ScenarioError, match="api.stats_key"):
        BizflySimulator(scenario(api={"stats_key": "statistics"}))


def test_a_pending_pool_has_null_autoscaling_ids_and_no_nodes_until_provisioned(
    manual_clock: ManualClock, http: requests.Session
) -> None:
    base = scenario(timings={"provision_seconds": PROVISION, "pool_provision_seconds": 60})
    base["clusters"][0]["pools"][0]["pending"] = True
    with BizflySimulator(base, clock=manual_clock) as sim:
        token = login(http, sim)
        cluster = http.get(k8s(sim, CLUSTER), headers=auth(token)).json()
        pending = cluster["worker_pools"][0]
        assert pending["provision_status"] == "PENDING_PROVISION"
        assert pending["launch_config_id"] is None and pending["autoscaling_group_id"] is None
        assert get_pool(http, sim, token)["nodes"] == []
        sim.advance(60)
        pool = get_pool(http, sim, token)
        assert pool["autoscaling_group_id"] and len(pool["nodes"]) == 2
        assert statuses(pool) == ["INIT", "INIT"]


def test_pool_get_lists_nodes_with_distinct_id_and_physical_id(sim: BizflySimulator, http: requests.Session) -> None:
    pool = get_pool(http, sim, login(http, sim))
    assert pool["desired_size"] == 2 and len(pool["nodes"]) == 2
    for node in pool["nodes"]:
        assert set(node) == {"id", "name", "physical_id", "ip_addresses", "status", "status_reason"}
        assert node["id"] != node["physical_id"]
        assert (node["status"], node["status_reason"]) == ("ACTIVE", "Creation succeeded")


def test_list_clusters_returns_the_clusters_wrapper(sim: BizflySimulator, http: requests.Session) -> None:
    body = http.get(k8s(sim, ""), headers=auth(login(http, sim))).json()
    assert [c["uid"] for c in body["clusters"]] == [CLUSTER]


@pytest.mark.parametrize("parts", [("nosuchcluster",), (CLUSTER, "5f959e0ac0b18944d0a4ffff")], ids=["cluster", "pool"])
def test_unknown_cluster_or_pool_is_404(sim: BizflySimulator, http: requests.Session, parts: tuple[str, ...]) -> None:
    response = http.get(k8s(sim, *parts), headers=auth(login(http, sim)))
    assert response.status_code == 404 and "not found" in response.json()["message"]


def test_fallback_path_used_on_catalog_mismatch_is_not_served(sim: BizflySimulator, http: requests.Session) -> None:
    # Upstream falls back to <api>/_/<cluster> without /kubernetes-engine when no region matches.
    assert http.get(f"{sim.url}/api/_/{CLUSTER}", headers=auth(login(http, sim))).status_code == 404


# -- PATCH ----------------------------------------------------------------------------------------------


def patch(http: requests.Session, sim: BizflySimulator, token: str, body: Any, pool: str = POOL) -> requests.Response:
    return http.patch(k8s(sim, CLUSTER, pool), headers=auth(token), json=body)


def test_patch_desired_size_changes_only_desired_size(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    response = patch(http, sim, token, {"desired_size": 4})
    assert response.status_code == 200
    pool = get_pool(http, sim, token)
    assert (pool["desired_size"], pool["min_size"], pool["max_size"], pool["enable_autoscaling"]) == (4, 0, 5, True)


def test_patch_with_empty_object_is_an_accepted_no_op(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    before = get_pool(http, sim, token)
    # Old gobizfly serialises desired_size 0 as {} (omitempty).
    response = http.patch(k8s(sim, CLUSTER, POOL), headers=auth(token), data=b"{}\n")
    assert response.status_code == 200
    assert get_pool(http, sim, token) == before


def test_patch_desired_size_zero_is_honoured(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    assert patch(http, sim, token, {"desired_size": 0}).status_code == 200
    pool = get_pool(http, sim, token)
    assert pool["desired_size"] == 0 and statuses(pool) == ["DELETING", "DELETING"]
    sim.advance(DELETE)
    assert get_pool(http, sim, token)["nodes"] == []


def test_patch_bounds_and_autoscaling_flag(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    body = {"min_size": 1, "max_size": 3, "enable_autoscaling": False}
    assert patch(http, sim, token, body).status_code == 200
    cluster = http.get(k8s(sim, CLUSTER), headers=auth(token)).json()
    workers = next(p for p in cluster["worker_pools"] if p["id"] == POOL)
    assert (workers["min_size"], workers["max_size"], workers["desired_size"]) == (1, 3, 2)
    assert workers["enable_autoscaling"] is False


@pytest.mark.parametrize(
    "body",
    [{"desired_size": 6}, {"min_size": 3}, {"max_size": 1}, {"min_size": 4, "max_size": 3}, {"desired_size": -1}],
    ids=["above-max", "min-above-desired", "max-below-desired", "min-above-max", "negative"],
)
def test_patch_outside_bounds_is_400_and_changes_nothing(
    sim: BizflySimulator, http: requests.Session, body: dict[str, int]
) -> None:
    token = login(http, sim)
    before = get_pool(http, sim, token)
    response = patch(http, sim, token, body)
    assert response.status_code == 400 and response.json()["message"]
    assert get_pool(http, sim, token) == before


@pytest.mark.parametrize("body", [{"desired_size": "3"}, {"desired_size": True}, {"enable_autoscaling": 1}, [3]])
def test_patch_with_mistyped_fields_is_400(sim: BizflySimulator, http: requests.Session, body: Any) -> None:
    assert patch(http, sim, login(http, sim), body).status_code == 400


def test_patch_unknown_pool_is_404(sim: BizflySimulator, http: requests.Session) -> None:
    assert patch(http, sim, login(http, sim), {"desired_size": 1}, pool="nope").status_code == 404


# -- node lifecycle -------------------------------------------------------------------------------------


def test_scale_up_nodes_go_init_creating_active_as_senlin_nodes(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    patch(http, sim, token, {"desired_size": 4})
    pool = get_pool(http, sim, token)
    assert statuses(pool) == ["ACTIVE", "ACTIVE", "INIT", "INIT"]
    assert {n["status_reason"] for n in pool["nodes"] if n["status"] == "INIT"} == {"Initializing"}
    sim.advance(2)
    pool = get_pool(http, sim, token)
    assert statuses(pool) == ["ACTIVE", "ACTIVE", "CREATING", "CREATING"]
    assert {n["status_reason"] for n in pool["nodes"] if n["status"] == "CREATING"} == {"Creation in progress"}
    sim.advance(PROVISION - 3)
    assert statuses(get_pool(http, sim, token)).count("CREATING") == 2
    sim.advance(1)
    pool = get_pool(http, sim, token)
    assert statuses(pool) == ["ACTIVE"] * 4
    assert {n["status_reason"] for n in pool["nodes"]} == {"Creation succeeded"}
    assert len({n["id"] for n in pool["nodes"]} | {n["physical_id"] for n in pool["nodes"]}) == 8


def test_node_names_are_senlins_mixed_case_and_the_kubernetes_node_is_lower_case(
    sim: BizflySimulator, http: requests.Session
) -> None:
    token = login(http, sim)
    patch(http, sim, token, {"desired_size": 5})
    nodes = get_pool(http, sim, token)["nodes"]
    for node in nodes:
        assert re.fullmatch(rf"workers-{CLUSTER}-node-[A-Za-z0-9]{{8}}", node["name"])
    assert any(n["name"] != n["name"].lower() for n in nodes)  # 5 names of 8 random characters: some upper case
    refs = {r["labels"][NODE_ID_LABEL]: r for r in sim.node_refs(CLUSTER)}
    assert all(refs[n["id"]]["name"] == n["name"].lower() for n in nodes)


def test_the_former_provisioning_vocabulary_stays_as_a_scenario_option(
    manual_clock: ManualClock, http: requests.Session
) -> None:
    with BizflySimulator(scenario(status_vocabulary="provisioning"), clock=manual_clock) as sim:
        token = login(http, sim)
        patch(http, sim, token, {"desired_size": 3})
        assert statuses(get_pool(http, sim, token)) == ["ACTIVE", "ACTIVE", "PROVISIONING"]


def test_a_failed_health_check_is_error_on_a_node_that_stays_in_the_pool(
    sim: BizflySimulator, http: requests.Session
) -> None:
    token = login(http, sim)
    node = get_pool(http, sim, token)["nodes"][0]
    assert http.post(f"{sim.url}/_sim/bizfly/fail-health-check", json={"node": node["id"]}).status_code == 200
    after = {n["id"]: n for n in get_pool(http, sim, token)["nodes"]}[node["id"]]
    assert (after["status"], after["status_reason"]) == ("ERROR", "Check: Node is not ACTIVE.")
    phases = {n["id"]: n["phase"] for n in sim.snapshot()["clusters"][0]["worker_pools"][0]["nodes"]}
    assert phases[node["id"]] == "unhealthy"
    sim.advance(10 * PROVISION)
    assert len(get_pool(http, sim, token)["nodes"]) == 2  # not replaced: Senlin recovers or the CA deletes


@pytest.mark.parametrize("status", ["WARNING", "UPDATING", "RECOVERING", "OPERATING"])
def test_senlin_statuses_of_an_existing_node_keep_it_running(
    sim: BizflySimulator, http: requests.Session, status: str
) -> None:
    token = login(http, sim)
    node = get_pool(http, sim, token)["nodes"][0]
    sim.set_node_status(node["name"].lower(), status)  # by the Kubernetes Node's name too
    after = {n["id"]: n for n in get_pool(http, sim, token)["nodes"]}[node["id"]]
    assert after["status"] == status and after["status_reason"]
    phases = {n["id"]: n["phase"] for n in sim.snapshot()["clusters"][0]["worker_pools"][0]["nodes"]}
    assert phases[node["id"]] == "running"


def test_advance_through_the_control_api_runs_transitions(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    patch(http, sim, token, {"desired_size": 3})
    assert http.post(f"{sim.url}/_sim/advance", json={"seconds": PROVISION}).status_code == 200
    assert statuses(get_pool(http, sim, token)) == ["ACTIVE"] * 3


def test_wall_clock_jumps_run_transitions_too(http: requests.Session) -> None:
    with BizflySimulator(scenario(), clock=WallClock(speed=1.0)) as sim:
        token = login(http, sim)
        patch(http, sim, token, {"desired_size": 3})
        assert "INIT" in statuses(get_pool(http, sim, token))
        sim.advance(PROVISION)
        assert statuses(get_pool(http, sim, token)) == ["ACTIVE"] * 3


def test_upstream_vocabulary_uses_lowercase_statuses(manual_clock: ManualClock, http: requests.Session) -> None:
    with BizflySimulator(scenario(status_vocabulary="upstream"), clock=manual_clock) as sim:
        token = login(http, sim)
        patch(http, sim, token, {"desired_size": 3})
        assert statuses(get_pool(http, sim, token)) == ["provisioning", "running", "running"]
        nodes = get_pool(http, sim, token)["nodes"]
        http.delete(k8s(sim, CLUSTER, POOL, nodes[0]["id"]), headers=auth(token))
        assert "deleting" in statuses(get_pool(http, sim, token))


def test_failed_scale_up_leaves_a_node_in_error_without_replacing_it(
    sim: BizflySimulator, http: requests.Session
) -> None:
    token = login(http, sim)
    no_host = "No valid host was found. There are not enough hosts available"
    sim.fail_next_scale_up(POOL, reason=no_host)
    patch(http, sim, token, {"desired_size": 4})
    sim.advance(PROVISION)
    pool = get_pool(http, sim, token)
    assert statuses(pool) == ["ACTIVE", "ACTIVE", "ACTIVE", "ERROR"]
    failed = next(n for n in pool["nodes"] if n["status"] == "ERROR")
    # Senlin's wording of a failed creation around the cloud's message
    assert (
        failed["status_reason"]
        == "Failed in creating server: No valid host was found. There are not enough hosts available."
    )
    sim.advance(10 * PROVISION)
    assert len(get_pool(http, sim, token)["nodes"]) == 4  # counted towards desired_size: no retry storm


def test_fail_next_scale_up_through_the_control_api(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    response = http.post(f"{sim.url}/_sim/bizfly/fail-next-scale-up", json={"pool_id": "workers", "count": 2})
    assert response.status_code == 200
    patch(http, sim, token, {"desired_size": 5})
    sim.advance(PROVISION)
    assert statuses(get_pool(http, sim, token)) == ["ACTIVE"] * 3 + ["ERROR"] * 2
    missing = http.post(f"{sim.url}/_sim/bizfly/fail-next-scale-up", json={"pool_id": "nope"})
    assert missing.status_code == 404


def test_scale_down_removes_failed_nodes_first(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    sim.fail_next_scale_up(POOL)
    patch(http, sim, token, {"desired_size": 3})
    sim.advance(PROVISION)
    patch(http, sim, token, {"desired_size": 2})
    sim.advance(DELETE)
    assert statuses(get_pool(http, sim, token)) == ["ACTIVE", "ACTIVE"]


def test_set_node_status_shows_any_status(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    node = get_pool(http, sim, token)["nodes"][0]
    sim.set_node_status(node["id"], "SHUTOFF", "Stopped by operator")
    response = http.post(f"{sim.url}/_sim/bizfly/node-status", json={"node": node["physical_id"], "status": "ERROR"})
    assert response.status_code == 200
    shown = next(n for n in get_pool(http, sim, token)["nodes"] if n["id"] == node["id"])
    assert shown["status"] == "ERROR"
    sim.set_node_status(node["name"], "SHUTOFF", "Stopped by operator")
    sim.advance(1000)
    shown = next(n for n in get_pool(http, sim, token)["nodes"] if n["id"] == node["id"])
    assert (shown["status"], shown["status_reason"]) == ("SHUTOFF", "Stopped by operator")


# -- DELETE node ----------------------------------------------------------------------------------------


def test_delete_node_marks_it_deleting_and_decrements_desired(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    victim, survivor = get_pool(http, sim, token)["nodes"]
    response = http.delete(k8s(sim, CLUSTER, POOL, victim["id"]), headers=auth(token))
    assert response.status_code == 202
    pool = get_pool(http, sim, token)
    assert pool["desired_size"] == 1
    assert {n["id"]: n["status"] for n in pool["nodes"]} == {victim["id"]: "DELETING", survivor["id"]: "ACTIVE"}
    sim.advance(DELETE)
    pool = get_pool(http, sim, token)
    assert [n["id"] for n in pool["nodes"]] == [survivor["id"]]  # gone, and not replaced


def test_forced_delete_removes_the_node_at_once(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    victim = get_pool(http, sim, token)["nodes"][0]
    response = http.delete(k8s(sim, CLUSTER, POOL, victim["id"]), headers=auth(token), params={"force": "true"})
    assert response.status_code == 202
    pool = get_pool(http, sim, token)
    assert victim["id"] not in {n["id"] for n in pool["nodes"]} and pool["desired_size"] == 1
    assert sim.requests.filter("delete_node")[-1].query == {"force": "true"}


def test_deleting_a_node_twice_decrements_desired_once(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    victim = get_pool(http, sim, token)["nodes"][0]
    for _ in range(2):
        assert http.delete(k8s(sim, CLUSTER, POOL, victim["id"]), headers=auth(token)).status_code == 202
    assert get_pool(http, sim, token)["desired_size"] == 1


def test_delete_by_physical_id_or_unknown_id_is_404(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    node = get_pool(http, sim, token)["nodes"][0]
    for wrong in (node["physical_id"], "00000000-0000-4000-8000-000000000000"):
        response = http.delete(k8s(sim, CLUSTER, POOL, wrong), headers=auth(token))
        assert response.status_code == 404
    assert http.delete(k8s(sim, CLUSTER, FIXED_POOL, node["id"]), headers=auth(token)).status_code == 404
    assert get_pool(http, sim, token)["desired_size"] == 2


def test_delete_by_physical_id_can_be_allowed(manual_clock: ManualClock, http: requests.Session) -> None:
    with BizflySimulator(scenario(api={"delete_accepts_physical_id": True}), clock=manual_clock) as sim:
        token = login(http, sim)
        node = get_pool(http, sim, token)["nodes"][0]
        assert http.delete(k8s(sim, CLUSTER, POOL, node["physical_id"]), headers=auth(token)).status_code == 202


def test_node_refs_pair_provider_id_with_physical_id_and_label_with_id(
    sim: BizflySimulator, http: requests.Session
) -> None:
    nodes = {n["id"]: n for n in get_pool(http, sim, login(http, sim))["nodes"]}
    refs = [r for r in sim.node_refs(CLUSTER) if r["pool_id"] == POOL]
    assert len(refs) == 2
    for ref in refs:
        node = nodes[ref["labels"][NODE_ID_LABEL]]
        assert ref["provider_id"] == f"bizflycloud://{node['physical_id']}"
        assert ref["name"] == node["name"].lower()  # the kubelet registers the host name in lower case
        assert ref["labels"]["bke.bizflycloud.vn/pool-name"] == "workers" and ref["labels"]["tier"] == "web"
    assert http.get(f"{sim.url}/_sim/bizfly/node-refs/{CLUSTER}").json() == sim.node_refs(CLUSTER)


# -- faults, rate limit and the request log -------------------------------------------------------------


def test_status_fault_applies_the_given_number_of_times(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=503, times=1))
    first = http.get(k8s(sim, CLUSTER), headers=auth(token))
    assert first.status_code == 503 and first.json()["message"]
    assert http.get(k8s(sim, CLUSTER), headers=auth(token)).status_code == 200


def test_token_endpoint_failure_helper(sim: BizflySimulator, http: requests.Session) -> None:
    sim.fail_token_endpoint(status=500, times=2)
    assert [http.post(sim.token_url, json=password_body()).status_code for _ in range(3)] == [500, 500, 200]


def test_throttling_fault_sends_retry_after(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    http.post(f"{sim.url}/_sim/faults", json={"route": ROUTE_UPDATE_POOL, "status": 429, "retry_after": 7, "times": 1})
    throttled = patch(http, sim, token, {"desired_size": 3})
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "7"
    assert get_pool(http, sim, token)["desired_size"] == 2  # the handler never ran


def test_dropped_connection_and_malformed_body_faults(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    sim.faults.add(Fault(route="get_pool", drop=True, times=1))
    sim.faults.add(Fault(route="get_pool", malformed=True, after=1, times=1))
    with pytest.raises(requests.ConnectionError):
        http.get(k8s(sim, CLUSTER, POOL), headers=auth(token))
    malformed = http.get(k8s(sim, CLUSTER, POOL), headers=auth(token))
    assert malformed.status_code == 200
    with pytest.raises(ValueError):
        malformed.json()
    assert get_pool(http, sim, token)["id"] == POOL


def test_rate_limit_from_scenario(manual_clock: ManualClock, http: requests.Session) -> None:
    limited = scenario(api={"rate_limit": {"per_second": 0.001, "burst": 2}})
    with BizflySimulator(limited, clock=manual_clock) as sim:
        codes = [http.get(f"{sim.url}/api/auth/service").status_code for _ in range(3)]
        assert codes == [200, 200, 429]


def test_request_log_records_routes_bodies_and_auth_headers(sim: BizflySimulator, http: requests.Session) -> None:
    token = login(http, sim)
    patch(http, sim, token, {"desired_size": 3})
    http.get(f"{sim.url}/_sim/state")  # control calls are not logged
    routes = [(r.method, r.route, r.status) for r in sim.requests.all()]
    assert routes == [("POST", ROUTE_TOKEN, 200), ("PATCH", ROUTE_UPDATE_POOL, 200)]
    recorded = sim.requests.filter(ROUTE_UPDATE_POOL)[0]
    assert recorded.body == {"desired_size": 3} and recorded.headers["x-auth-token"] == token
    assert recorded.path == f"/api/kubernetes-engine/_/{CLUSTER}/{POOL}"
    over_http = http.get(f"{sim.url}/_sim/requests", params={"route": ROUTE_TOKEN}).json()
    assert [entry["body"]["username"] for entry in over_http] == [EMAIL]


def test_state_endpoint_shows_phases_catalog_and_tokens(sim: BizflySimulator, http: requests.Session) -> None:
    login(http, sim)
    state = http.get(f"{sim.url}/_sim/state").json()
    assert state["catalog"]["region"] == "HN" and state["active_tokens"] == 1
    pool = next(p for p in state["clusters"][0]["worker_pools"] if p["id"] == POOL)
    assert [n["phase"] for n in pool["nodes"]] == ["running", "running"]


# -- scenarios and the standalone process ---------------------------------------------------------------


def test_scenario_nodes_may_be_listed_explicitly(manual_clock: ManualClock, http: requests.Session) -> None:
    custom = scenario()
    custom["clusters"][0]["pools"][0]["nodes"] = [
        {"id": "node-a", "physical_id": "server-a", "status": "ACTIVE"},
        {"id": "node-b", "physical_id": "server-b", "status": "ERROR", "status_reason": "Creation failed"},
    ]
    with BizflySimulator(custom, clock=manual_clock) as sim:
        nodes = get_pool(http, sim, login(http, sim))["nodes"]
        assert [(n["id"], n["physical_id"], n["status"]) for n in nodes] == [
            ("node-a", "server-a", "ACTIVE"),
            ("node-b", "server-b", "ERROR"),
        ]


@pytest.mark.parametrize(
    "broken",
    [
        {"status_vocabulary": "klingon"},
        {"clusters": [{"pools": []}]},
        {"clusters": "x"},
        {"timings": {"provision_seconds": -1}},
        {"catalog": {"other_regions": "HCM"}},
        {"api": {"rate_limit": {"per_second": "fast"}}},
    ],
    ids=["vocabulary", "cluster-without-name", "clusters-not-a-list", "negative-timing", "regions", "rate-limit"],
)
def test_invalid_scenarios_are_rejected(broken: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError):
        BizflySimulator(broken)


def test_scenario_pool_outside_its_bounds_is_rejected() -> None:
    bad = scenario()
    bad["clusters"][0]["pools"][0]["desired_size"] = 9
    with pytest.raises(ScenarioError, match=r"clusters\[0\]"):
        BizflySimulator(bad)


def test_demo_scenario_has_three_autoscaling_pools_and_a_fixed_one(manual_clock: ManualClock) -> None:
    with BizflySimulator(demo_scenario(), clock=manual_clock) as sim:
        cluster = sim.state.cluster_json(DEMO_CLUSTER_UID)
        autoscaled = [p for p in cluster["worker_pools"] if p["enable_autoscaling"]]
        assert len(autoscaled) == 3 and len(cluster["worker_pools"]) == 4
        assert all(p["desired_size"] < p["max_size"] for p in autoscaled)
        assert sorted(p["desired_size"] for p in autoscaled)[0] == 0
        for pool in autoscaled:
            nodes = sim.state.pool_json(DEMO_CLUSTER_UID, pool["id"])["nodes"]
            assert len(nodes) == pool["desired_size"] and all(n["status"] == "ACTIVE" for n in nodes)


def read_url(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line.startswith("http://127.0.0.1:"), line
    return line


def test_standalone_process_serves_until_sigterm(tmp_path: Path, http: requests.Session) -> None:
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario(catalog={"region": "HaNoi"})))
    command = [sys.executable, "-m", "simulators.bizfly", "--port", "0", "--scenario", str(scenario_file)]
    process = subprocess.Popen([*command, "--clock", "manual"], stdout=subprocess.PIPE, text=True)
    try:
        url = read_url(process)
        entries = [s for s in http.get(f"{url}/api/auth/service").json()["services"] if s["region"] == "HaNoi"]
        assert entries and entries[0]["service_url"].startswith(url)
        token = http.post(f"{url}/api/token", json=password_body()).json()["token"]
        http.patch(f"{url}/api/kubernetes-engine/_/{CLUSTER}/{POOL}", headers=auth(token), json={"desired_size": 3})
        assert http.post(f"{url}/_sim/advance", json={"seconds": PROVISION}).status_code == 200
        pool = http.get(f"{url}/api/kubernetes-engine/_/{CLUSTER}/{POOL}", headers=auth(token)).json()
        assert statuses(pool) == ["ACTIVE"] * 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_standalone_process_rejects_a_missing_scenario_file(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "simulators.bizfly", "--scenario", str(tmp_path / "absent.yaml")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "error" in result.stderr
