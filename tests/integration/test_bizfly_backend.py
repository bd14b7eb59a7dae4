"""The Bizfly backend (shared Backend + BizflyAdapter) against the real Bizfly simulator on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from providers.backend import Backend, SyncSettings
from providers.bizfly.adapter import BizflyAdapter
from providers.bizfly.client import BizflyClient
from providers.bizfly.config import parse_config
from providers.deadline import Deadline
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudAuthFailed,
    CloudRequestRejected,
    CloudUnavailable,
    DeadlineTooShort,
    GroupBusy,
    InvalidDelta,
    NodeGroupNotFound,
    SizeLimitExceeded,
)
from providers.http_transport import BreakerSettings, RetryPolicy
from providers.model import ErrorClass, InstanceState, NodeRef
from simulators.bizfly import (
    ROUTE_CATALOG,
    ROUTE_DELETE_NODE,
    ROUTE_GET_CLUSTER,
    ROUTE_GET_POOL,
    ROUTE_TOKEN,
    ROUTE_UPDATE_POOL,
    UPSTREAM_VOCABULARY,
    BizflySimulator,
)
from simulators.bizfly.state import PoolUpdate
from simulators.common.clock import ManualClock
from simulators.common.faults import Fault

# The backend against the simulator, no server: the same on every serving engine.
pytestmark = pytest.mark.one_engine

CLUSTER = "ke1m4ea3j8w6kkvp"
POOL = "5f959e0ac0b18944d0a4f13a"
STATIC = "5f959e0ac0b18944d0a4f13b"
OTHER = "5f959e0ac0b18944d0a4f13c"
EMAIL, PASSWORD = "user@example.com", "s3cret-password"
APP_ID, APP_SECRET = "app-cred-id", "app-cred-secret"
FAST_RETRY = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


def pool(pool_id: str = POOL, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": pool_id,
        "name": "general",
        "flavor": "nix.2c_4g",
        "min_size": 1,
        "max_size": 10,
        "desired_size": 3,
        "enable_autoscaling": True,
        "labels": {"tier": "web"},
    }
    spec.update(overrides)
    return spec


def scenario(*pools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"clusters": [{"uid": CLUSTER, "name": "demo", "pools": list(pools) or [pool()]}], **extra}


@pytest.fixture
def make() -> Iterator[Any]:
    started: list[tuple[BizflySimulator, Backend]] = []

    def build(
        scen: dict[str, Any] | None = None,
        *,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        sim_kwargs: dict[str, Any] | None = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> tuple[BizflySimulator, Backend]:
        sim = BizflySimulator(scen or scenario(), **(sim_kwargs or {})).start()
        raw = {"email": EMAIL, "password": PASSWORD, "api_url": sim.url, "cluster_name": CLUSTER}
        raw.update(config or {})
        cfg = parse_config("backends[0].bizfly", {k: v for k, v in raw.items() if v is not None}, env or {}, True)
        kwargs: dict[str, Any] = {"retry": FAST_RETRY, "sleep": lambda _s: None}
        kwargs.update(client_kwargs or {})
        backend = Backend("bizfly-test", BizflyAdapter(cfg, BizflyClient(cfg, **kwargs)), SyncSettings())
        started.append((sim, backend))
        return sim, backend

    yield build
    for sim, backend in started:
        backend.adapter.close()
        sim.stop()


def logged(sim: BizflySimulator, expected: int, route: str | None = None, method: str | None = None) -> int:
    """The simulator's count of matching requests, once at least ``expected`` are recorded.

    The simulator records a request just after it has written the answer, so the client can see
    the answer a moment before the entry exists; wait (bounded) for it instead of racing it.
    """
    end = time.monotonic() + 2.0
    while sim.requests.count(route=route, method=method) < expected and time.monotonic() < end:
        time.sleep(0.005)
    return sim.requests.count(route=route, method=method)


def history(sim: BizflySimulator, expected: int) -> list[tuple[str, int]]:
    logged(sim, expected)
    return [(r.route, r.status) for r in sim.requests.all()]


def sync(backend: Backend, seconds: float = 5.0) -> None:
    backend.sync(Deadline.after(seconds))


def soon(seconds: float = 5.0) -> Deadline:
    return Deadline.after(seconds)


def k8s_node(sim: BizflySimulator, physical_or_id: str, *, with_label: bool = True) -> NodeRef:
    for ref in sim.node_refs(CLUSTER):
        if physical_or_id in (ref["provider_id"], ref["labels"]["bke.bizflycloud.vn/node-id"], ref["name"]):
            labels = dict(ref["labels"])
            if not with_label:
                labels.pop("bke.bizflycloud.vn/node-id")
            return NodeRef(ref["provider_id"], ref["name"], labels)
    raise AssertionError(f"no node {physical_or_id}")


def pool_nodes(sim: BizflySimulator, pool_id: str = POOL) -> list[dict[str, Any]]:
    for cluster in sim.snapshot()["clusters"]:
        for p in cluster["worker_pools"]:
            if p["id"] == pool_id:
                return list(p["nodes"])
    raise AssertionError(pool_id)


def desired(sim: BizflySimulator, pool_id: str = POOL) -> int:
    for cluster in sim.snapshot()["clusters"]:
        for p in cluster["worker_pools"]:
            if p["id"] == pool_id:
                return int(p["desired_size"])
    raise AssertionError(pool_id)


# ================================================================== listing and identities
def test_only_autoscaled_pools_are_groups_with_min_max_target_and_instances(make: Any) -> None:
    sim, backend = make(
        scenario(pool(), pool(STATIC, name="static", enable_autoscaling=False, min_size=1, max_size=1, desired_size=1))
    )
    sync(backend)
    assert [g.id for g in backend.groups()] == [POOL]
    group = backend.group(POOL)
    assert (group.min_size, group.max_size, group.target_size) == (1, 10, 3)
    physical = {n["physical_id"] for n in pool_nodes(sim)}
    assert {i.id for i in group.instances} == {f"bizflycloud://{p}" for p in physical}
    assert all(i.state == InstanceState.RUNNING and i.error is None for i in group.instances)
    static_node = k8s_node(sim, pool_nodes(sim, STATIC)[0]["id"])
    assert backend.group_id_for(static_node.provider_id) is None
    for ref in sim.node_refs(CLUSTER):
        if ref["pool_id"] == POOL:
            assert backend.group_id_for(ref["provider_id"]) == POOL


def test_requests_carry_the_current_vendor_headers_and_password_login(make: Any) -> None:
    sim, backend = make(config={"email": EMAIL})
    sync(backend)
    logged(sim, 1, ROUTE_TOKEN)
    token_call = sim.requests.filter(route=ROUTE_TOKEN)[0]
    assert token_call.body == {"auth_method": "password", "username": EMAIL, "password": PASSWORD}
    for call in sim.requests.filter(route=ROUTE_GET_CLUSTER) + sim.requests.filter(route=ROUTE_GET_POOL):
        assert call.headers["x-auth-type"] == "token"
        assert call.headers["x-auth-token"]
        # the project the token answer named, as gobizfly sends it; not the X-Tenant-* pair it marked deprecated
        assert call.headers["x-project-id"] == sim.project_id
        assert "x-tenant-name" not in call.headers and "x-tenant-id" not in call.headers
    assert "x-auth-token" not in sim.requests.filter(route=ROUTE_CATALOG)[0].headers


OTHER_PROJECT = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"


def in_another_project(*pools: dict[str, Any]) -> dict[str, Any]:
    """The cluster in a project of the account other than its default one."""
    base = scenario(*pools, account={"projects": {OTHER_PROJECT: "staging"}})
    base["clusters"][0]["project_id"] = OTHER_PROJECT
    return base


@pytest.mark.parametrize("key", ["project_id", "tenant_id"])
def test_a_cluster_outside_the_default_project_is_visible_with_its_project_configured(make: Any, key: str) -> None:
    # Issue 31, item 5: with X-Tenant-Id (what the in-tree client sends, deprecated by the vendor) the API
    # looks in the default project and the cluster "does not exist"; X-Project-ID (and the login scoped to
    # the project, as Bizfly's Terraform provider does) find it. tenant_id is the older name of the key.
    sim, backend = make(in_another_project(), config={key: OTHER_PROJECT})
    sync(backend)
    assert backend.group(POOL).target_size == 3
    assert sim.requests.filter(route=ROUTE_TOKEN)[0].body["project_id"] == OTHER_PROJECT
    assert {c.headers["x-project-id"] for c in sim.requests.filter(route=ROUTE_GET_POOL)} == {OTHER_PROJECT}


def test_without_the_project_a_cluster_of_another_project_is_an_actionable_error(make: Any) -> None:
    sim, backend = make(in_another_project())
    with pytest.raises(CloudRequestRejected) as err:
        sync(backend)
    assert "does not exist for these credentials" in str(err.value)


def test_the_project_variable_of_the_vendors_terraform_provider_configures_it(make: Any) -> None:
    sim, backend = make(in_another_project(), env={"BIZFLYCLOUD_PROJECT_ID": OTHER_PROJECT})
    sync(backend)
    assert backend.has_group(POOL)


def test_application_credential_login(make: Any) -> None:
    sim, backend = make(
        config={"email": None, "password": None, "app_credential_id": APP_ID, "app_credential_secret": APP_SECRET}
    )
    sync(backend)
    logged(sim, 1, ROUTE_TOKEN)
    body = sim.requests.filter(route=ROUTE_TOKEN)[0].body
    assert body["auth_method"] == "application_credential"
    assert (body["credential_id"], body["credential_secret"]) == (APP_ID, APP_SECRET)
    assert backend.group(POOL).target_size == 3


def test_upstream_environment_variables_drive_the_backend(make: Any) -> None:
    sim, backend = make(
        config={"email": None, "password": None, "cluster_name": "placeholder"},
        env={
            "BIZFLYCLOUD_AUTH_METHOD": "application_credential",
            "BIZFLYCLOUD_APP_CREDENTIAL_ID": APP_ID,
            "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": APP_SECRET,
            "CLUSTER_NAME": CLUSTER,
        },
    )
    sync(backend)
    assert backend.has_group(POOL)


def test_wrong_password_is_auth_failed_without_leaking_it(make: Any) -> None:
    sim, backend = make(config={"password": "wrong-password-123"})
    with pytest.raises(CloudAuthFailed) as err:
        sync(backend)
    assert "wrong-password-123" not in str(err.value)
    assert "password login" in str(err.value)
    assert logged(sim, 1, ROUTE_TOKEN) == 1


# ================================================================== tokens
def test_one_token_serves_many_calls(make: Any) -> None:
    sim, backend = make()
    for _ in range(3):
        sync(backend)
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    assert logged(sim, 1, ROUTE_CATALOG) == 1


def test_token_is_refreshed_before_it_expires(make: Any) -> None:
    clock = ManualClock()
    # The client reads the simulator's clock so the token's expires_at means the same to both.
    sim, backend = make(
        sim_kwargs={"token_ttl": 3600.0, "clock": clock}, client_kwargs={"clock": clock.now, "wall_clock": clock.now}
    )
    sync(backend)
    sim.advance(3600 - 200)  # inside the 300 s refresh margin, still valid on the server
    sync(backend)
    assert logged(sim, 2, ROUTE_TOKEN) == 2
    assert all(r.status == 200 for r in sim.requests.all())  # no 401 was needed


def test_concurrent_401s_cause_one_token_request(make: Any) -> None:
    sim, backend = make(scenario(*[pool(f"{i:024x}", name=f"p{i}", desired_size=1) for i in range(1, 7)]))
    sync(backend)
    sim.requests.clear()
    sim.expire_tokens()
    sync(backend)  # the cluster GET refreshes; then six pool GETs run concurrently with the new token
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    adapter: BizflyAdapter = backend.adapter  # type: ignore[assignment]
    sim.expire_tokens()
    sim.requests.clear()
    with ThreadPoolExecutor(6) as pool_threads:
        list(pool_threads.map(lambda gid: adapter.client.get_pool(gid, soon()), [g.id for g in backend.groups()]))
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    assert len(list(backend.groups())) == 6


def test_expired_token_is_refreshed_once_on_401_and_the_call_retried(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.requests.clear()
    sim.expire_tokens()
    sync(backend)
    statuses = history(sim, 3)
    assert statuses[:3] == [(ROUTE_GET_CLUSTER, 401), (ROUTE_TOKEN, 200), (ROUTE_GET_CLUSTER, 200)]
    assert logged(sim, 1, ROUTE_TOKEN) == 1


def test_a_token_endpoint_that_keeps_refusing_costs_a_bounded_number_of_requests(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.requests.clear()
    sim.expire_tokens()
    sim.fail_token_endpoint(401, times=None)
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    assert logged(sim, 1, ROUTE_GET_CLUSTER) == 1
    # Within the cooldown the refused login is not asked again.
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    assert len(sim.requests.all()) <= 3


def test_a_refused_login_is_asked_again_after_the_cooldown(make: Any) -> None:
    clock = ManualClock()
    sim, backend = make(config={"password": "wrong-password"}, client_kwargs={"clock": clock.now})
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    with pytest.raises(CloudAuthFailed) as err:
        sync(backend)
    assert "not retried" in str(err.value)
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    clock.advance(6)
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    assert logged(sim, 2, ROUTE_TOKEN) == 2


def test_a_failing_token_endpoint_is_retried_a_bounded_number_of_times(make: Any) -> None:
    sim, backend = make()
    sim.fail_token_endpoint(500, times=None)
    with pytest.raises(CloudUnavailable):
        sync(backend)
    assert logged(sim, 2, ROUTE_TOKEN) == 2
    assert logged(sim, 0, ROUTE_GET_CLUSTER) == 0


def test_a_persistent_401_on_the_api_is_final_after_one_refresh(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.requests.clear()
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=401))
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    assert logged(sim, 2, ROUTE_GET_CLUSTER) == 2
    assert logged(sim, 1, ROUTE_TOKEN) == 1


def test_403_is_auth_failed_without_a_token_refresh(make: Any) -> None:
    sim, backend = make()
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=403, times=1))
    with pytest.raises(CloudAuthFailed):
        sync(backend)
    assert logged(sim, 1, ROUTE_TOKEN) == 1
    assert logged(sim, 1, ROUTE_GET_CLUSTER) == 1


# ================================================================== catalog
@pytest.mark.parametrize(("catalog", "configured"), [("HN", "HN"), ("hn", "HN"), ("HaNoi", "hn"), ("HN", "ha-noi")])
def test_catalog_region_spellings_match(make: Any, catalog: str, configured: str) -> None:
    sim, backend = make(config={"region": configured})
    sim.set_catalog_regions(catalog, ["HCM", "HoChiMinh"])  # decoys listed first, at URLs not served
    sync(backend)
    assert backend.group(POOL).target_size == 3


def test_catalog_without_the_region_is_an_actionable_error(make: Any) -> None:
    sim, backend = make(config={"region": "HCM"})
    sim.set_catalog_regions("HN", [])
    with pytest.raises(CloudRequestRejected) as err:
        sync(backend)
    assert "HCM" in str(err.value) or "HoChiMinh" in str(err.value)
    assert "regions offered: HN" in str(err.value)
    assert logged(sim, 0, ROUTE_GET_CLUSTER) == 0


def test_explicit_kubernetes_engine_url_skips_the_catalog(make: Any) -> None:
    sim, _ = make()
    cfg = parse_config(
        "backends[0].bizfly",
        {
            "email": EMAIL,
            "password": PASSWORD,
            "cluster_name": CLUSTER,
            "api_url": "https://catalog.invalid",  # never contacted
            "token_url": sim.token_url,
            "kubernetes_engine_url": sim.kubernetes_engine_url,
        },
        {},
        True,
    )
    explicit = Backend("explicit", BizflyAdapter(cfg, BizflyClient(cfg, retry=FAST_RETRY)))
    try:
        sync(explicit)
    finally:
        explicit.adapter.close()
    assert explicit.group(POOL).target_size == 3
    assert logged(sim, 0, ROUTE_CATALOG) == 0


# ================================================================== scale to zero and back
def test_scale_to_zero_sends_desired_size_zero(make: Any) -> None:
    sim, backend = make(scenario(pool(min_size=0, desired_size=1, nodes=[{"status": "PROVISIONING"}])))
    sync(backend)
    assert backend.decrease_target_size(POOL, -1, soon()) == 0
    patches = [r for r in sim.requests.filter(route=ROUTE_UPDATE_POOL) if r.status == 200]
    assert [r.body for r in patches] == [{"desired_size": 0}]  # upstream sent {} here (omitempty)
    assert desired(sim) == 0


def test_a_zero_the_api_accepts_but_does_not_apply_is_a_precise_error_and_a_metric(make: Any) -> None:
    # Issue 31, item 7: no public client has sent desired_size 0 (gobizfly omits a zero), so nothing says
    # the API applies it. After a 2xx the pool is read back; one still at 1 is an error naming what it reads.
    from prometheus_client import CollectorRegistry

    from server.metrics import Metrics

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    sim, backend = make(scenario(pool(min_size=0, desired_size=1, nodes=[{"status": "CREATING"}])))
    backend.adapter.instrument(metrics.for_backend("bfly"))
    sync(backend)
    # The API answers 200 and changes nothing, as a server that reads 0 as "not given" would.
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, method="PATCH", status=200, body={}, times=1))
    with pytest.raises(CloudRequestRejected) as err:
        backend.decrease_target_size(POOL, -1, soon())
    assert "accepted desired_size 0" in str(err.value) and "still reads desired_size 1" in str(err.value)
    assert desired(sim) == 1 and backend.target_size(POOL) == 1  # never reported as done
    backend.decrease_target_size(POOL, -1, soon())  # applied this time: confirmed by the read-back
    assert desired(sim) == 0 and backend.target_size(POOL) == 0

    def checks(result: str) -> float:
        name = "ca_externalgrpc_cloud_write_checks_total"
        labels = {"backend": "bfly", "api": "bizfly", "check": "desired_size_zero", "result": result}
        return registry.get_sample_value(name, labels) or 0.0

    assert (checks("mismatch"), checks("confirmed"), checks("unverified")) == (1, 1, 0)


def test_a_zero_whose_read_back_fails_stands_on_the_2xx(make: Any) -> None:
    sim, backend = make(scenario(pool(min_size=0, desired_size=1, nodes=[{"status": "CREATING"}])))
    sync(backend)
    # The decrease first lists the group afresh (one pool read), then PATCHes, then reads the pool back.
    sim.faults.add(Fault(route=ROUTE_GET_POOL, status=404, times=1, after=1))  # the read-back finds no pool
    with pytest.raises(CloudRequestRejected, match="the pool is gone"):
        backend.decrease_target_size(POOL, -1, soon())
    sim.state.update_pool(CLUSTER, POOL, PoolUpdate(desired_size=1))
    sim.faults.add(Fault(route=ROUTE_GET_POOL, status=503, after=1))  # the read-back cannot be made at all
    assert backend.decrease_target_size(POOL, -1, soon()) == 0  # the API said yes: the write stands
    assert desired(sim) == 0
    sim.faults.clear()


def test_scale_to_zero_by_deleting_the_last_node(make: Any) -> None:
    sim, backend = make(scenario(pool(min_size=0, desired_size=1)))
    sync(backend)
    node = k8s_node(sim, pool_nodes(sim)[0]["id"])
    assert backend.delete_nodes(POOL, [node], soon()) == 1
    assert desired(sim) == 0
    assert backend.target_size(POOL) == 0
    sim.advance(60)
    sync(backend)
    assert backend.group(POOL).instances == ()
    assert backend.group(POOL).target_size == 0


def test_a_pool_at_zero_has_a_template_and_scales_back_up(make: Any) -> None:
    sim, backend = make(scenario(pool(min_size=0, desired_size=1)))
    sync(backend)
    real = k8s_node(sim, pool_nodes(sim)[0]["id"])
    nfd = "feature.node.kubernetes.io/cpu-model.vendor_id"
    by_hand = {"custom/team": "payments", "maintenance": "true"}
    backend.observe_node(POOL, {**real.labels, "kubernetes.io/hostname": real.name, nfd: "Intel", **by_hand})
    backend.delete_nodes(POOL, [real], soon())
    sim.advance(60)
    sync(backend)
    assert backend.group(POOL).instances == ()
    template = backend.template(POOL)
    assert template is not None
    assert template.capacity["cpu"] == "2" and template.capacity["memory"] == "4096Mi"
    assert template.labels[nfd] == "Intel"  # kept from the node the pool had: its machine type's
    assert not by_hand.keys() & template.labels.keys()  # put on that one node: never the group's
    assert "kubernetes.io/hostname" not in template.labels
    assert "bke.bizflycloud.vn/node-id" not in template.labels
    assert template.labels["bke.bizflycloud.vn/pool-name"] == "general"
    assert backend.increase_size(POOL, 2, soon()) == 2
    assert desired(sim) == 2
    sync(backend)
    assert [i.state for i in backend.group(POOL).instances] == [InstanceState.CREATING] * 2
    sim.advance(600)
    sync(backend)
    assert [i.state for i in backend.group(POOL).instances] == [InstanceState.RUNNING] * 2


def test_no_template_for_an_unknown_flavor_without_observed_nodes(make: Any) -> None:
    sim, backend = make(scenario(pool(flavor="mystery-flavor", min_size=0, desired_size=0)))
    sync(backend)
    assert backend.template(POOL) is None


def test_pool_taints_reach_the_template(make: Any) -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    sim, backend = make(scenario(pool(taints=[taint], desired_size=1)))
    sync(backend)
    template = backend.template(POOL)
    assert template is not None
    assert [(t.key, t.value, t.effect) for t in template.taints] == [("dedicated", "gpu", "NoSchedule")]


# ================================================================== deletes
def test_delete_uses_the_node_id_label_and_the_cloud_lowers_desired(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    victim = pool_nodes(sim)[1]
    node = k8s_node(sim, victim["id"])
    assert backend.delete_nodes(POOL, [node], soon()) == 1
    deletes = sim.requests.filter(route=ROUTE_DELETE_NODE)
    assert [r.path.rsplit("/", 1)[1] for r in deletes] == [victim["id"]]
    assert deletes[0].query == {}  # no ?force=true: the CA drained the node already
    assert desired(sim) == 2
    assert logged(sim, 0, ROUTE_UPDATE_POOL) == 0  # the DELETE itself lowers desired_size
    assert backend.target_size(POOL) == 2
    assert {i.id: i.state for i in backend.instances(POOL)}[node.provider_id] == InstanceState.DELETING


def test_delete_without_the_label_uses_the_node_matched_by_provider_id(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    victim = pool_nodes(sim)[0]
    node = k8s_node(sim, victim["id"], with_label=False)
    assert backend.delete_nodes(POOL, [node], soon()) == 1
    assert logged(sim, 1, ROUTE_DELETE_NODE) == 1
    assert sim.requests.filter(route=ROUTE_DELETE_NODE)[0].path.endswith("/" + victim["id"])
    assert desired(sim) == 2


def test_delete_falls_back_to_the_pool_node_id_when_the_label_holds_another_id(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    victim = pool_nodes(sim)[0]
    node = k8s_node(sim, victim["id"])
    wrong = NodeRef(node.provider_id, node.name, {**node.labels, "bke.bizflycloud.vn/node-id": victim["physical_id"]})
    assert backend.delete_nodes(POOL, [wrong], soon()) == 1
    assert history(sim, 2)[-2:] == [(ROUTE_DELETE_NODE, 404), (ROUTE_DELETE_NODE, 202)]
    assert desired(sim) == 2


def test_deleting_a_node_that_is_already_gone_succeeds(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    node = k8s_node(sim, pool_nodes(sim)[0]["id"])
    sim.faults.add(Fault(route=ROUTE_DELETE_NODE, status=404, times=2))
    assert backend.delete_nodes(POOL, [node], soon()) == 1


def test_delete_rejected_by_a_busy_pool_is_group_busy(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    node = k8s_node(sim, pool_nodes(sim)[0]["id"])
    sim.faults.add(Fault(route=ROUTE_DELETE_NODE, status=409, times=1, message="pool is upgrading"))
    with pytest.raises(GroupBusy) as err:
        backend.delete_nodes(POOL, [node], soon())
    assert "pool is upgrading" in str(err.value)


# ================================================================== statuses
def test_real_vocabulary_statuses(make: Any) -> None:
    nodes = [
        {"id": "n-prov", "physical_id": "p-prov", "status": "PROVISIONING"},
        {"id": "n-act", "physical_id": "p-act", "status": "ACTIVE"},
        {"id": "n-del", "physical_id": "p-del", "status": "DELETING"},
        {"id": "n-err", "physical_id": "p-err", "status": "ERROR", "status_reason": "Creation failed: disk"},
        {"id": "n-odd", "physical_id": "p-odd", "status": "HIBERNATED"},
    ]
    sim, backend = make(scenario(pool(desired_size=5, nodes=nodes)))
    sync(backend)
    by_id = {i.id: i for i in backend.group(POOL).instances}
    assert by_id["bizflycloud://p-prov"].state == InstanceState.CREATING
    assert by_id["bizflycloud://p-act"].state == InstanceState.RUNNING
    assert by_id["bizflycloud://p-del"].state == InstanceState.DELETING
    failed = by_id["bizflycloud://p-err"]
    assert failed.state == InstanceState.CREATING
    assert failed.error is not None and failed.error.code and failed.error.error_class == ErrorClass.OTHER
    assert by_id["bizflycloud://p-odd"].state == InstanceState.CREATING and by_id["bizflycloud://p-odd"].error is None


def test_senlin_life_cycle_of_a_node_through_the_backend(make: Any) -> None:
    # Issue 31, item 3: INIT and CREATING are being created; WARNING, RECOVERING, OPERATING and UPDATING
    # are machines that exist; a failed health check of a node that served is not a failed scale-up.
    sim, backend = make(scenario(pool(desired_size=1)))
    sync(backend)
    backend.increase_size(POOL, 1, soon())
    sync(backend)
    [new] = [i for i in backend.group(POOL).instances if i.cloud_status == "INIT"]
    assert new.state == InstanceState.CREATING and new.error is None
    sim.advance(5)
    sync(backend)
    assert {i.cloud_status: i.state for i in backend.group(POOL).instances}["CREATING"] == InstanceState.CREATING
    sim.advance(600)
    sync(backend)
    first, second = (n["id"] for n in pool_nodes(sim))
    for status in ("WARNING", "RECOVERING", "OPERATING", "UPDATING"):
        sim.set_node_status(first, status)
        sync(backend)
        by_status = {i.cloud_status: i for i in backend.group(POOL).instances}
        assert by_status[status].state == InstanceState.RUNNING and by_status[status].error is None, status
    sim.fail_health_check(second)
    sync(backend)
    [failed] = [i for i in backend.group(POOL).instances if i.cloud_status == "ERROR"]
    assert failed.state == InstanceState.RUNNING and failed.error is None  # exists: the CA sees it NotReady


def test_a_node_whose_recovery_failed_is_a_machine_that_exists_not_a_failed_scale_up(make: Any) -> None:
    """Issue 40, item 2: Senlin recovers a node that served by recreating its server; when "No valid host"
    fails the new server, the node reads ERROR "Failed in recovering node '<id>': Failed in creating server:
    No valid host was found." The creation failure inside it used to win: the CA saw a failed scale-up
    (OUT_OF_RESOURCES), deleted the node and backed its pool off."""
    sim, backend = make(scenario(pool(desired_size=2)))
    sim.advance(600)
    sync(backend)
    victim = pool_nodes(sim)[0]["id"]
    sim.fail_recovery(victim, "No valid host was found. There are not enough hosts available.")
    sync(backend)
    [failed] = [i for i in backend.group(POOL).instances if i.cloud_status == "ERROR"]
    assert failed.cloud_id == victim
    assert failed.state == InstanceState.RUNNING and failed.error is None, failed


def test_a_failed_creation_is_a_failed_scale_up_and_an_odd_error_is_decided_by_what_was_seen(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=1)))
    sync(backend)
    sim.fail_next_scale_up(POOL)  # Senlin: "Failed in creating server: Quota exceeded ..."
    backend.increase_size(POOL, 1, soon())
    sync(backend)  # seen INIT
    booting = next(n["id"] for n in pool_nodes(sim) if n["status"] == "INIT")
    sim.advance(600)
    sync(backend)
    [failed] = [i for i in backend.group(POOL).instances if i.cloud_status == "ERROR"]
    assert failed.state == InstanceState.CREATING and failed.error is not None
    assert failed.error.error_class == ErrorClass.OUT_OF_RESOURCES
    assert "Failed in creating server" in failed.error.message
    # A reason that says neither: seen being created, so its creation failed ...
    sim.set_node_status(booting, "ERROR", "unexpected state")
    sync(backend)
    assert {i.cloud_id: i.error is not None for i in backend.group(POOL).instances}[booting]
    # ... while for a node this server saw serving, the same reason is a machine that exists.
    serving = next(n["id"] for n in pool_nodes(sim) if n["status"] == "ACTIVE")
    sim.set_node_status(serving, "ERROR", "unexpected state")
    sync(backend)
    mine = {i.cloud_id: i for i in backend.group(POOL).instances}[serving]
    assert mine.state == InstanceState.RUNNING and mine.error is None


def test_after_a_restart_an_odd_error_on_a_node_never_seen_is_not_taken_for_a_failed_creation(make: Any) -> None:
    nodes = [{"status": "ACTIVE"}, {"id": "n-odd", "physical_id": "p-odd", "status": "ERROR", "status_reason": "??"}]
    sim, backend = make(scenario(pool(desired_size=2, nodes=nodes)))
    sync(backend)
    odd = {i.cloud_id: i for i in backend.group(POOL).instances}["n-odd"]
    assert odd.state == InstanceState.RUNNING and odd.error is None  # no evidence: the CA deletes nothing on it


def test_upstream_lowercase_vocabulary_statuses(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=2), status_vocabulary="upstream"))
    assert sim.state.vocabulary == UPSTREAM_VOCABULARY
    sync(backend)
    assert [i.state for i in backend.group(POOL).instances] == [InstanceState.RUNNING] * 2
    backend.increase_size(POOL, 1, soon())
    sync(backend)
    assert sorted(i.state for i in backend.group(POOL).instances) == [
        InstanceState.RUNNING,
        InstanceState.RUNNING,
        InstanceState.CREATING,
    ]


def test_a_scale_up_that_fails_for_quota_is_out_of_resources(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=1)))
    sync(backend)
    sim.fail_next_scale_up(POOL, reason="Quota exceeded for instances: Requested 1, but already used 10 of 10")
    backend.increase_size(POOL, 1, soon())
    sim.advance(600)
    sync(backend)
    errors = [i.error for i in backend.group(POOL).instances if i.error is not None]
    assert len(errors) == 1
    assert errors[0].error_class == ErrorClass.OUT_OF_RESOURCES and errors[0].code


# ================================================================== faults
def test_429_and_503_are_retried_within_the_call(make: Any) -> None:
    sim, backend = make()
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=429, retry_after=0, times=1))
    sim.faults.add(Fault(route=ROUTE_GET_POOL, status=503, times=1))
    sync(backend)
    assert backend.group(POOL).target_size == 3
    assert logged(sim, 2, ROUTE_GET_CLUSTER) == 2


def test_persistent_5xx_is_unavailable_after_bounded_attempts_and_keeps_the_snapshot(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.requests.clear()
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=500))
    with pytest.raises(CloudUnavailable):
        sync(backend)
    assert logged(sim, FAST_RETRY.attempts, ROUTE_GET_CLUSTER) == FAST_RETRY.attempts
    assert backend.group(POOL).target_size == 3  # the last good snapshot is still served


def test_a_patch_rate_limited_with_429_is_retried(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, status=429, retry_after=0, times=1))
    assert backend.increase_size(POOL, 1, soon()) == 4
    assert desired(sim) == 4


def test_a_patch_answered_500_is_not_repeated(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, status=500, times=1))
    with pytest.raises(CloudUnavailable):
        backend.increase_size(POOL, 1, soon())
    assert logged(sim, 1, ROUTE_UPDATE_POOL) == 1
    assert desired(sim) == 3


def test_patch_409_is_group_busy_and_400_is_rejected(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, status=409, times=1))
    with pytest.raises(GroupBusy):
        backend.increase_size(POOL, 1, soon())
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, status=400, times=1, message="desired_size out of range"))
    with pytest.raises(CloudRequestRejected) as err:
        backend.increase_size(POOL, 1, soon())
    assert err.value.status == 400 and "desired_size out of range" in str(err.value)


def test_patch_on_a_deleted_pool_is_group_not_found(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, status=404, times=1))
    with pytest.raises(NodeGroupNotFound):
        backend.increase_size(POOL, 1, soon())


def test_a_slow_read_answers_the_caller_within_its_deadline_and_finishes_in_the_background(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    version = backend.snapshot.version
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, delay=1.5, times=1))
    started = time.monotonic()
    with pytest.raises(DeadlineTooShort, match="continues in the background"):
        backend.sync(Deadline.after(0.8))
    assert time.monotonic() - started < 0.8
    # The listing was not abandoned: the next caller gets its result.
    end = time.monotonic() + 5.0
    while backend.snapshot.version == version and time.monotonic() < end:
        time.sleep(0.02)
    assert backend.snapshot.version == version + 1


def test_a_slow_patch_is_an_unknown_outcome_and_a_retry_does_not_double_it(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_UPDATE_POOL, delay=1.5, times=1))
    with pytest.raises(ChangeOutcomeUnknown):
        backend.increase_size(POOL, 2, Deadline.after(0.8))
    # The simulator applies the PATCH after its injected delay, i.e. after the client gave up.
    end = time.monotonic() + 5.0
    while desired(sim) != 5 and time.monotonic() < end:
        time.sleep(0.02)
    assert desired(sim) == 5
    assert backend.increase_size(POOL, 2, soon()) == 5  # the CA's retry: recognised, not applied twice
    assert desired(sim) == 5


@pytest.mark.parametrize(
    "fault",
    [
        Fault(route=ROUTE_GET_CLUSTER, malformed=True, times=1),
        Fault(route=ROUTE_GET_CLUSTER, content_type="text/html", times=1),
        Fault(route=ROUTE_GET_CLUSTER, status=200, body=["not", "an", "object"], times=1),
        Fault(route=ROUTE_GET_CLUSTER, status=200, body={"worker_pools": "nope"}, times=1),
        Fault(route=ROUTE_GET_POOL, status=200, body={"desired_size": "2", "nodes": []}, times=1),
        Fault(route=ROUTE_GET_POOL, status=200, body={"desired_size": 2, "nodes": {"a": 1}}, times=1),
    ],
)
def test_malformed_answers_are_unavailable_not_crashes(make: Any, fault: Fault) -> None:
    sim, backend = make()
    sim.faults.add(fault)
    with pytest.raises(CloudUnavailable) as err:
        sync(backend)
    assert "malformed" in str(err.value)
    sync(backend)  # the next sync, with a sane answer, works
    assert backend.group(POOL).target_size == 3


def test_a_pool_deleted_between_the_cluster_and_pool_reads_is_skipped(make: Any) -> None:
    sim, backend = make(scenario(pool(), pool(OTHER, name="other", desired_size=1)))
    sim.faults.add(Fault(route=ROUTE_GET_POOL, status=404, times=1))
    sync(backend)
    assert len(list(backend.groups())) == 1


def test_unknown_cluster_is_an_actionable_rejection(make: Any) -> None:
    sim, backend = make(config={"cluster_name": "nosuchcluster"})
    with pytest.raises(CloudRequestRejected) as err:
        sync(backend)
    assert "cluster_name" in str(err.value) and err.value.status == 404


def test_secrets_never_appear_in_error_messages(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    token = sim.requests.filter(route=ROUTE_GET_CLUSTER)[0].headers["x-auth-token"]
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=400, body={"message": f"bad token {token} / {PASSWORD}"}))
    with pytest.raises(CloudRequestRejected) as err:
        sync(backend)
    assert token not in str(err.value) and PASSWORD not in str(err.value)


def open_the_breaker(make: Any) -> tuple[Any, Backend]:
    """A synced backend whose Bizfly breaker two failed listings (the cluster GET answering 502) opened."""
    sim, backend = make(client_kwargs={"breaker": BreakerSettings(failure_threshold=2, reset_after=60)})
    sync(backend)
    sim.faults.add(Fault(route=ROUTE_GET_CLUSTER, status=502))
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            sync(backend)
    return sim, backend


def test_a_dead_api_opens_the_breaker_and_fails_fast(make: Any) -> None:
    sim, backend = open_the_breaker(make)
    before = logged(sim, 1 + 2 * FAST_RETRY.attempts, ROUTE_GET_CLUSTER)
    with pytest.raises(CloudUnavailable) as err:
        sync(backend)
    assert "circuit breaker" in str(err.value)
    assert sim.requests.count(route=ROUTE_GET_CLUSTER) == before
    assert "open" in backend.adapter.health_detail()


def test_after_an_outage_a_size_change_is_the_breakers_probe_instead_of_failing_fast(make: Any) -> None:
    sim, backend = open_the_breaker(make)
    sim.faults.clear()
    target = backend.target_size(POOL)
    # Its read-back of the group (the cluster and the pool, side by side) and the write go through at once.
    assert backend.increase_size(POOL, 1, soon()) == target + 1
    assert sim.requests.filter(route=ROUTE_UPDATE_POOL)[-1].body == {"desired_size": target + 1}


# ================================================================== the scenarios of the CA's own Bizfly provider tests
def test_upstream_target_size(make: Any) -> None:
    _, backend = make(scenario(pool(desired_size=3)))
    sync(backend)
    assert backend.target_size(POOL) == 3


def test_upstream_increase_size_success(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=3, max_size=10)))
    sync(backend)
    assert backend.increase_size(POOL, 2, soon()) == 5
    assert sim.requests.filter(route=ROUTE_UPDATE_POOL)[0].body == {"desired_size": 5}


def test_upstream_increase_size_to_maximum(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=2, min_size=1, max_size=3)))
    sync(backend)
    assert backend.increase_size(POOL, 1, soon()) == 3
    assert desired(sim) == 3


@pytest.mark.parametrize("delta", [-1, 0])
def test_upstream_increase_size_rejects_non_positive_delta(make: Any, delta: int) -> None:
    sim, backend = make()
    sync(backend)
    with pytest.raises(InvalidDelta):
        backend.increase_size(POOL, delta, soon())
    assert logged(sim, 0, ROUTE_UPDATE_POOL) == 0


def test_upstream_increase_size_above_max(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=3, min_size=0, max_size=3)))
    sync(backend)
    with pytest.raises(SizeLimitExceeded) as err:
        backend.increase_size(POOL, 10, soon())
    assert "13" in str(err.value) and "max 3" in str(err.value)
    assert logged(sim, 0, ROUTE_UPDATE_POOL) == 0


def test_upstream_decrease_target_size_success(make: Any) -> None:
    provisioning = [{"status": "PROVISIONING"}] * 5  # not yet running: a target decrease may drop them
    sim, backend = make(scenario(pool(desired_size=5, min_size=0, nodes=provisioning)))
    sync(backend)
    assert backend.decrease_target_size(POOL, -2, soon()) == 3
    assert sim.requests.filter(route=ROUTE_UPDATE_POOL)[0].body == {"desired_size": 3}


def test_upstream_decrease_target_size_to_minimum(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=2, min_size=1, nodes=[{"status": "PROVISIONING"}] * 2)))
    sync(backend)
    assert backend.decrease_target_size(POOL, -1, soon()) == 1
    assert desired(sim) == 1


@pytest.mark.parametrize("delta", [1, 0])
def test_upstream_decrease_target_size_rejects_non_negative_delta(make: Any, delta: int) -> None:
    _, backend = make()
    sync(backend)
    with pytest.raises(InvalidDelta):
        backend.decrease_target_size(POOL, delta, soon())


def test_upstream_decrease_target_size_below_min(make: Any) -> None:
    sim, backend = make(scenario(pool(desired_size=3, min_size=2, nodes=[{"status": "PROVISIONING"}] * 3)))
    sync(backend)
    with pytest.raises(SizeLimitExceeded) as err:
        backend.decrease_target_size(POOL, -2, soon())
    assert "min 2" in str(err.value)
    assert logged(sim, 0, ROUTE_UPDATE_POOL) == 0


def test_upstream_delete_nodes_success(make: Any) -> None:
    nodes = [
        {"id": "1", "physical_id": "xxxxxxxx1"},
        {"id": "2", "physical_id": "xxxxxxxx2"},
        {"id": "3", "physical_id": "xxxxxxxx3"},
    ]
    sim, backend = make(scenario(pool(desired_size=3, min_size=0, nodes=nodes)))
    sync(backend)
    refs = [k8s_node(sim, n) for n in ("1", "2", "3")]
    assert backend.delete_nodes(POOL, refs, soon()) == 3
    # Sent in parallel, so in any order: each exactly once.
    assert sorted(r.path.rsplit("/", 1)[1] for r in sim.requests.filter(route=ROUTE_DELETE_NODE)) == ["1", "2", "3"]
    assert desired(sim) == 0 and backend.target_size(POOL) == 0


def test_upstream_delete_nodes_reports_a_failure_among_parallel_deletions(make: Any) -> None:
    nodes = [
        {"id": "1", "physical_id": "xxxxxxxx1"},
        {"id": "2", "physical_id": "xxxxxxxx2"},
        {"id": "3", "physical_id": "xxxxxxxx3"},
    ]
    sim, backend = make(scenario(pool(desired_size=3, min_size=0, nodes=nodes)))
    sync(backend)
    # Unlike upstream, the deletions of one call go out in parallel (a CA deadline is 5 s), so a refusal
    # of one does not stop the others; the answer names the failure and how many were deleted.
    sim.faults.add(Fault(route=ROUTE_DELETE_NODE, status=400, times=1, message="random error"))
    with pytest.raises(CloudRequestRejected) as err:
        backend.delete_nodes(POOL, [k8s_node(sim, n) for n in ("1", "2", "3")], soon())
    assert "random error" in str(err.value) and "2 of 3 node(s) deleted" in str(err.value)
    assert sorted(r.path.rsplit("/", 1)[1] for r in sim.requests.filter(route=ROUTE_DELETE_NODE)) == ["1", "2", "3"]
    assert desired(sim) == 1 and backend.target_size(POOL) == 1


def test_upstream_nodes_ids_are_the_physical_ids(make: Any) -> None:
    nodes = [{"physical_id": "xxxxxxxx1"}, {"physical_id": "xxxxxxxx2"}]
    _, backend = make(scenario(pool(desired_size=2, nodes=nodes)))
    sync(backend)
    assert [i.id for i in backend.instances(POOL)] == ["bizflycloud://xxxxxxxx1", "bizflycloud://xxxxxxxx2"]


def test_upstream_missing_pool_is_not_found(make: Any) -> None:
    _, backend = make()
    sync(backend)
    with pytest.raises(NodeGroupNotFound):
        backend.target_size("no-such-pool")
    with pytest.raises(NodeGroupNotFound):
        backend.adapter.read_group("no-such-pool", soon())


def test_upstream_debug_names_min_and_max(make: Any) -> None:
    _, backend = make(scenario(pool(min_size=1, max_size=200)))
    sync(backend)
    assert "min=1" in backend.group(POOL).debug and "max=200" in backend.group(POOL).debug
    # The pool's name once, as one word status reads (a name with spaces is still one word).
    assert backend.group(POOL).name == "general" and backend.group(POOL).debug.split().count("name=general") == 1
    _, spaced = make(scenario(pool(name="web pool")))
    sync(spaced)
    assert "name=web_pool" in spaced.group(POOL).debug.split()


def test_upstream_refresh_of_an_empty_cluster_gives_no_groups(make: Any) -> None:
    sim, backend = make({"clusters": [{"uid": CLUSTER, "name": "demo", "pools": []}]})
    sync(backend)
    assert list(backend.groups()) == []


def test_upstream_pool_without_autoscaling_is_no_group(make: Any) -> None:
    _, backend = make(scenario(pool(enable_autoscaling=False)))
    sync(backend)
    assert list(backend.groups()) == []


@pytest.mark.parametrize("provider_id", ["bizflycloud://droplet-4", "bizflycloud://xxxxx-7", ""])
def test_upstream_node_group_for_an_unknown_node_is_none(make: Any, provider_id: str) -> None:
    _, backend = make()
    sync(backend)
    assert backend.group_id_for(provider_id) is None


def test_min_and_max_come_from_the_cluster_entry(make: Any) -> None:
    sim, backend = make()
    sync(backend)
    # Make the pool GET disagree with the cluster GET: upstream reads min/max from the cluster entry.
    sim.faults.add(
        Fault(
            route=ROUTE_GET_POOL,
            status=200,
            body={"id": POOL, "desired_size": 3, "min_size": 0, "max_size": 99, "nodes": []},
            times=1,
        )
    )
    sync(backend)
    assert (backend.group(POOL).min_size, backend.group(POOL).max_size) == (1, 10)


def test_every_cloud_call_is_reported_to_the_metrics_with_endpoint_names(make: Any) -> None:
    from prometheus_client import CollectorRegistry

    from server.metrics import Metrics

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    _, backend = make()
    backend.adapter.instrument(metrics.for_backend("bfly"))  # before the first call: the API transport is lazy
    sync(backend)

    def count(provider: str, endpoint: str, method: str) -> float:
        samples = [
            s.value
            for fam in registry.collect()
            for s in fam.samples
            if s.name.endswith("_total")
            and s.labels.get("api") == provider
            and s.labels.get("backend") == "bfly"
            and s.labels.get("endpoint") == endpoint
            and s.labels.get("method") == method
        ]
        return sum(samples)

    assert count("bizfly", "cluster", "GET") == 1
    assert count("bizfly", "worker pool", "GET") == 1
    assert count("bizfly-token", "/token", "POST") == 1
    assert count("bizfly-catalog", "/api/auth/service", "GET") == 1
