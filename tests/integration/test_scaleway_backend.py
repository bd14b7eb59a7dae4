"""The shared Backend over the Scaleway adapter, against the real Scaleway simulator on 127.0.0.1.

Each scenario of the CA's own Scaleway provider tests that concerns behaviour visible at this level
is re-tested here (marked "as in the CA's Scaleway tests"), next to the failure modes upstream
does not handle (retries, timeouts, malformed answers, breaker, the size race).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from providers.backend import Backend, SyncSettings
from providers.deadline import Deadline
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudAuthFailed,
    CloudRequestRejected,
    CloudTimeout,
    CloudUnavailable,
    DomainError,
    GroupBusy,
    InvalidDelta,
    NodeGroupNotFound,
    NodeNotInGroup,
    SizeLimitExceeded,
)
from providers.http_transport import BreakerSettings, RetryPolicy
from providers.model import ErrorClass, InstanceState, LearnedTemplate, NodeRef, NodeTemplate
from providers.scaleway.adapter import SYNTHETIC_ID_PREFIX, ScalewayAdapter
from providers.scaleway.config import ScalewayConfig
from simulators.common.faults import Fault
from simulators.scaleway.scenarios import generated_cluster
from simulators.scaleway.simulator import ScalewaySimulator

# The backend against the simulator, no server: the same on every serving engine.
pytestmark = pytest.mark.one_engine

SECRET = "sim-secret-key"
CLUSTER = "11111111-0000-4000-8000-000000000001"
P1, P2, P3 = (f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 3))


def scenario(pools: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"clusters": [{"id": CLUSTER, "name": "test", "pools": pools}], **top}


# As in the CA's Scaleway tests: p1 (autoscaling, 3/1/10), p2 (autoscaling, 2/1/5), p3 (not autoscaling)
STANDARD = scenario(
    [
        {"id": P1, "name": "p1", "node_type": "DEV1-M", "size": 3, "min_size": 1, "max_size": 10},
        {"id": P2, "name": "p2", "node_type": "PRO2-S", "size": 2, "min_size": 1, "max_size": 5},
        {"id": P3, "name": "p3", "node_type": "GP1-XS", "size": 1, "min_size": 1, "max_size": 1, "autoscaling": False},
    ]
)


@pytest.fixture
def make_sim() -> Iterator[Any]:
    started: list[ScalewaySimulator] = []

    def make(data: dict[str, Any] | None = None) -> ScalewaySimulator:
        sim = ScalewaySimulator(data if data is not None else STANDARD, secret_key=SECRET).start()
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(make_sim: Any) -> ScalewaySimulator:
    return make_sim()


def make_adapter(sim: ScalewaySimulator, **config: Any) -> ScalewayAdapter:
    settings: dict[str, Any] = {"cluster_id": sim.cluster_id, "secret_key": SECRET, "api_url": sim.url}
    settings["request_timeout"] = config.pop("request_timeout", 2.0)
    settings.update(config)
    # Short backoff keeps retry tests fast; the policy's shape is tested in test_http_transport.py.
    return ScalewayAdapter(
        ScalewayConfig(**settings),
        retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05),
        breaker=BreakerSettings(failure_threshold=50),
    )


def make_backend(sim: ScalewaySimulator, backends: list[Backend], **config: Any) -> Backend:
    backend = Backend("scw-test", make_adapter(sim, **config), SyncSettings(min_interval=0.0))
    backends.append(backend)
    backend.sync(deadline())
    return backend


def deadline(seconds: float = 5.0) -> Deadline:
    return Deadline.after(seconds)


def node_ref(sim: ScalewaySimulator, node_id: str) -> NodeRef:
    node = sim.node(node_id)
    return NodeRef(provider_id=node.provider_id, name=node.name)


def ids_of(sim: ScalewaySimulator, pool_id: str, status: str = "ready") -> list[str]:
    return sorted(n.id for n in sim.nodes_of(pool_id) if n.status == status)


def wait_for(condition: Any, what: str) -> None:
    """Wait (bounded) for the simulator to finish work a client already gave up on."""
    for _ in range(200):
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------------- listing and sync


def test_sync_lists_only_autoscaled_pools_with_their_nodes(sim, backends):
    backend = make_backend(sim, backends)
    assert sorted(g.id for g in backend.groups()) == [P1, P2]  # as in the CA's Scaleway tests: p3 and its node dropped
    assert len(backend.instances(P1)) == 3
    assert len(backend.instances(P2)) == 2
    group = backend.group(P1)
    # as in the CA's Scaleway tests: min, max and target come from the pool
    assert (group.min_size, group.max_size, group.target_size) == (1, 10, 3)
    for node in sim.nodes_of(P1):  # as in the CA's Scaleway tests: a node's group by its providerID
        assert backend.group_id_for(node.provider_id) == P1
    (fixed_node,) = sim.nodes_of(P3)
    assert backend.group_id_for(fixed_node.provider_id) is None


def test_requests_carry_the_key_user_agent_and_page_parameters(sim, backends):
    make_backend(sim, backends)
    (pools_request,) = sim.requests.filter(route="list_pools")
    assert pools_request.headers["x-auth-token"] == SECRET
    assert pools_request.headers["user-agent"].startswith("ca-externalgrpc-server/")
    assert f"cluster-id/{sim.cluster_id}" in pools_request.headers["user-agent"]
    assert pools_request.query == {"page": "1", "page_size": "100"}
    assert sim.requests.count(route="list_nodes") == 1


def test_hot_reads_do_not_call_the_cloud(sim, backends):
    # as in the CA's Scaleway tests: repeated reads within the interval cost nothing
    backend = make_backend(sim, backends)
    before = len(sim.requests.all())
    for _ in range(50):
        backend.groups()
        backend.target_size(P1)
        backend.instances(P1)
        backend.template(P1)
    assert len(sim.requests.all()) == before


def test_pagination_over_more_than_100_pools_and_nodes(make_sim, backends):
    sim = make_sim(generated_cluster(pools=130, nodes=250, seed=3))
    backend = make_backend(sim, backends)
    assert len(list(backend.groups())) == 130
    assert sum(len(backend.instances(g.id)) for g in backend.groups()) == 250
    assert [r.query["page"] for r in sim.requests.filter(route="list_pools")] == ["1", "2"]
    assert [r.query["page"] for r in sim.requests.filter(route="list_nodes")] == ["1", "2", "3"]


def test_an_exactly_full_page_with_null_next_page_is_accepted(make_sim, backends):
    sim = make_sim(generated_cluster(pools=100, nodes=0, seed=1))
    sim.set_behaviour(null_empty_pages=True)
    adapter = make_adapter(sim)
    try:
        assert len(adapter.list_groups(deadline()).groups) == 100
        # total_count says the first page was all of it: no empty page is fetched
        assert sim.requests.count(route="list_pools") == 1
    finally:
        adapter.close()


def test_cache_control_max_age_of_the_lists_is_the_listing_max_age(sim):
    adapter = make_adapter(sim)
    try:
        sim.set_behaviour(cache_max_age=45)
        assert adapter.list_groups(deadline()).max_age == 45.0
        sim.set_behaviour(cache_max_age=None)
        assert adapter.list_groups(deadline()).max_age is None  # no hint: the Backend uses its interval
    finally:
        adapter.close()


# ---------------------------------------------------------------------- statuses


def test_every_node_status_maps_to_the_documented_table(make_sim, backends):
    statuses = ["ready", "creating", "starting", "registering", "not_ready", "rebooting", "upgrading", "deleting"]
    statuses += ["creation_error", "deleted", "locked"]
    specs = [{"status": s, "name": f"n-{s}"} for s in statuses]
    sim = make_sim(scenario([{"id": P1, "name": "p1", "size": 9, "max_size": 20, "nodes": specs}]))
    sim.set_node_status(next(n.id for n in sim.nodes_of(P1) if n.name == "n-ready"), "unknown")
    sim.set_node_status(
        next(n.id for n in sim.nodes_of(P1) if n.name == "n-creation_error"),
        "creation_error",
        "quotas_exceeded: k8s_nodes",
    )
    backend = make_backend(sim, backends)
    by_name = {i.name: i for i in backend.instances(P1)}
    expected = {
        "n-creating": InstanceState.CREATING,
        "n-starting": InstanceState.CREATING,
        "n-registering": InstanceState.CREATING,
        "n-not_ready": InstanceState.CREATING,
        "n-rebooting": InstanceState.CREATING,
        "n-upgrading": InstanceState.CREATING,
        "n-deleting": InstanceState.DELETING,
        "n-creation_error": InstanceState.CREATING,
        "n-deleted": InstanceState.UNSPECIFIED,
        "n-locked": InstanceState.UNSPECIFIED,
        "n-ready": InstanceState.UNSPECIFIED,  # now "unknown": reported, not crashing
    }
    assert {name: by_name[name].state for name in expected} == expected
    failed = by_name["n-creation_error"].error
    assert (failed.code, failed.error_class) == ("creation_error", ErrorClass.OUT_OF_RESOURCES)
    assert by_name["n-ready"].error.code == "unknown"
    assert by_name["n-deleted"].error.code == "deleted"
    assert by_name["n-locked"].error.code == "locked"


def test_failed_scale_up_shows_creation_errors_the_ca_can_back_off_on(sim, backends):
    backend = make_backend(sim, backends)
    sim.fail_next_scale_up(P1, "creation_error", nodes=2)
    backend.increase_size(P1, 2, deadline())
    sim.advance(120)
    backend.sync(deadline())
    failed = [i for i in backend.instances(P1) if i.error is not None]
    assert len(failed) == 2
    assert all(i.state == InstanceState.CREATING and i.error.code == "creation_error" for i in failed)
    assert all(i.error.error_class == ErrorClass.OUT_OF_RESOURCES for i in failed)  # "insufficient capacity"


def test_nodes_without_provider_id_are_listed_with_stable_synthetic_ids(sim, backends):
    sim.set_behaviour(provider_id_at_creation=False)
    backend = make_backend(sim, backends)
    backend.increase_size(P1, 2, deadline())
    backend.sync(deadline())
    pending = [i for i in backend.instances(P1) if i.id.startswith(SYNTHETIC_ID_PREFIX)]
    assert len(pending) == 2 and len({i.id for i in pending}) == 2
    assert len(backend.instances(P1)) == 5
    backend.sync(deadline())
    assert sorted(i.id for i in backend.instances(P1) if i.id.startswith(SYNTHETIC_ID_PREFIX)) == sorted(
        i.id for i in pending
    )
    # The CA deletes such an instance through its fake node, whose providerID is the synthetic id.
    backend.delete_nodes(P1, [NodeRef(provider_id=pending[0].id)], deadline())
    assert sim.node(pending[0].cloud_id).status == "deleting"
    sim.advance(31)  # creating -> starting: Kapsule assigns the machine
    backend.sync(deadline())
    survivor = next(i for i in backend.instances(P1) if i.cloud_id == pending[1].cloud_id)
    assert survivor.id == sim.node(pending[1].cloud_id).provider_id != ""


# ---------------------------------------------------------------------- size changes


def test_increase_size_patches_the_absolute_size(sim, backends):
    backend = make_backend(sim, backends)  # as in the CA's Scaleway tests: size 3, +2 -> PATCH size 5
    assert backend.increase_size(P1, 2, deadline()) == 5
    (patch,) = sim.requests.filter(route="update_pool")
    assert patch.body == {"size": 5}
    assert sim.pool(P1).size == 5
    assert backend.target_size(P1) == 5
    backend.sync(deadline())
    assert len(backend.instances(P1)) == 5
    assert sum(i.state == InstanceState.CREATING for i in backend.instances(P1)) == 2


def test_increase_size_checks_happen_before_any_cloud_call(sim, backends):
    backend = make_backend(sim, backends)
    with pytest.raises(InvalidDelta):
        backend.increase_size(P1, 0, deadline())
    with pytest.raises(SizeLimitExceeded, match="max 10"):
        backend.increase_size(P1, 8, deadline())
    assert sim.requests.count(route="update_pool") == 0


def test_decrease_target_size_patches_the_lower_size(make_sim, backends):
    specs = [{"status": "ready"}] * 2 + [{"status": "creating"}] * 3
    sim = make_sim(scenario([{"id": P1, "name": "p1", "size": 5, "min_size": 1, "max_size": 10, "nodes": specs}]))
    backend = make_backend(sim, backends)  # as in the CA's Scaleway tests: 5, -2 -> PATCH 3
    assert backend.decrease_target_size(P1, -2, deadline()) == 3
    assert sim.requests.filter(route="update_pool")[0].body == {"size": 3}
    assert sim.pool(P1).size == 3
    with pytest.raises(InvalidDelta):
        backend.decrease_target_size(P1, 1, deadline())
    with pytest.raises(SizeLimitExceeded):
        backend.decrease_target_size(P1, -3, deadline())  # would go below the 2 running nodes / min 1
    assert sim.requests.count(route="update_pool") == 1


def test_delete_nodes_deletes_and_the_cloud_lowers_the_size(sim, backends):
    backend = make_backend(sim, backends)  # as in the CA's Scaleway tests: 2 known nodes of size 5 -> 2 deletes, size 3
    backend.increase_size(P1, 2, deadline())
    backend.sync(deadline())
    victims = ids_of(sim, P1)[:2]
    assert backend.delete_nodes(P1, [node_ref(sim, v) for v in victims], deadline()) == 2
    assert sorted(r.path.rsplit("/", 1)[1] for r in sim.requests.filter(route="delete_node")) == victims
    assert sim.requests.count(route="update_pool") == 1  # only the increase: DELETE shrinks the pool itself
    assert sim.pool(P1).size == 3
    assert backend.target_size(P1) == 3
    assert {i.state for i in backend.instances(P1) if i.cloud_id in victims} == {InstanceState.DELETING}


def test_delete_of_a_node_of_another_group_is_refused_before_any_call(sim, backends):
    backend = make_backend(sim, backends)
    other = node_ref(sim, ids_of(sim, P2)[0])
    with pytest.raises(NodeNotInGroup, match="nothing was deleted"):
        backend.delete_nodes(P1, [node_ref(sim, ids_of(sim, P1)[0]), other], deadline())
    with pytest.raises(NodeNotInGroup):
        backend.delete_nodes(P1, [NodeRef(provider_id="scaleway://instance/fr-par-1/unknown")], deadline())
    assert sim.requests.count(route="delete_node") == 0


def test_delete_of_an_already_gone_node_is_success(sim, backends):
    backend = make_backend(sim, backends)
    victim = ids_of(sim, P1)[0]
    gone = {"message": "resource is not found", "resource": "node", "resource_id": victim, "type": "not_found"}
    sim.inject(Fault(route="delete_node", status=404, times=1, body=gone))
    assert backend.delete_nodes(P1, [node_ref(sim, victim)], deadline()) == 1
    assert backend.target_size(P1) == 2


def test_a_bare_404_to_a_delete_is_not_taken_for_a_gone_node(sim, backends):
    # A gateway's 404 ({"message": ...}, no type, no resource) says the route was not reached: the node
    # may well still run, so the deletion is reported as failed rather than done.
    backend = make_backend(sim, backends)
    victim = ids_of(sim, P1)[0]
    sim.inject(Fault(route="delete_node", status=404, times=1, body={"message": "Not Found"}))
    with pytest.raises(CloudRequestRejected, match="names no resource: node .* was not reached") as info:
        backend.delete_nodes(P1, [node_ref(sim, victim)], deadline())
    assert info.value.status == 404
    assert sim.node(victim).status == "ready"
    assert backend.target_size(P1) == 3


def test_repeated_delete_of_a_deleting_node_is_success(sim, backends):
    sim.set_behaviour(repeated_delete="conflict")
    victim = ids_of(sim, P1)[0]
    adapter = make_adapter(sim)
    try:
        group = next(g for g in adapter.list_groups(deadline()).groups if g.id == P1)
        instance = next(i for i in group.instances if i.cloud_id == victim)
        adapter.delete_instance(group, instance, node_ref(sim, victim), deadline())
        adapter.delete_instance(group, instance, node_ref(sim, victim), deadline())  # 409, node is deleting
        assert [r.status for r in sim.requests.filter(route="delete_node")] == [200, 409]
        assert sim.pool(P1).size == 2
    finally:
        adapter.close()


def test_concurrent_delete_and_increase_on_one_pool_end_with_the_right_size(sim, backends):
    backend = make_backend(sim, backends)
    victim = node_ref(sim, ids_of(sim, P1)[0])
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(action: Any) -> None:
        start.wait()
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(lambda: backend.delete_nodes(P1, [victim], deadline()),)),
        threading.Thread(target=run, args=(lambda: backend.increase_size(P1, 2, deadline()),)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert sim.pool(P1).size == 3 - 1 + 2
    assert backend.target_size(P1) == 4
    backend.sync(deadline())
    assert backend.target_size(P1) == 4


# ---------------------------------------------------------------------- cloud refusals


def test_wrong_secret_is_an_auth_failure_without_the_secret_in_it(sim, backends):
    adapter = make_adapter(sim, secret_key="wrong-secret-value")
    try:
        with pytest.raises(CloudAuthFailed, match="authentication is denied") as info:
            adapter.list_groups(deadline())
        assert "wrong-secret-value" not in str(info.value)
        assert sim.requests.count(route="list_pools") == 1  # a static key: nothing to refresh, no repeat
    finally:
        adapter.close()


def test_a_refused_key_is_sent_once_per_sync_and_logged_as_refused(sim, backends, caplog):
    """Scaleway's secret key is static: a 401 is final. (It was taken for an expired token: each sync sent
    the refused key twice and logged "refreshing the token and repeating".)"""
    backend = Backend("scw-test", make_adapter(sim, secret_key="wrong-secret-value"), SyncSettings(min_interval=0.0))
    backends.append(backend)
    caplog.set_level(logging.WARNING, logger="providers.http")
    for syncs in (1, 2):
        with pytest.raises(CloudAuthFailed):
            backend.sync(deadline())
        assert sim.requests.count(route="list_pools") == syncs
    lines = [r.getMessage() for r in caplog.records if r.name == "providers.http"]
    pattern = r"scaleway GET /k8s/v1/regions/\{region\}/autoscaler/clusters/\{cluster_id\}/pools -> 401 in \d+ms"
    assert len(lines) == 2 and all(re.fullmatch(pattern + "; refused, not retried", line) for line in lines), lines


def test_403_permissions_denied_is_an_auth_failure(sim, backends):
    backend = make_backend(sim, backends)
    sim.inject(Fault(route="update_pool", status=403, times=1))
    with pytest.raises(CloudAuthFailed, match="permission"):
        backend.increase_size(P1, 1, deadline())
    assert backend.target_size(P1) == 3


def test_quota_refusal_is_a_rejection_not_an_auth_failure(sim, backends):
    backend = make_backend(sim, backends)
    sim.fail_next_scale_up(P1, "quota")
    with pytest.raises(CloudRequestRejected, match="quotas_exceeded") as info:
        backend.increase_size(P1, 1, deadline())
    assert info.value.status == 403


def test_size_change_of_a_pool_deleted_meanwhile_is_group_not_found(sim, backends):
    backend = make_backend(sim, backends)
    sim.remove_pool(P1)
    with pytest.raises(NodeGroupNotFound):
        backend.increase_size(P1, 1, deadline())


def test_pool_no_longer_autoscaled_is_not_found_on_fresh_read(sim):
    adapter = make_adapter(sim)
    try:
        sim.set_autoscaling(P1, False)
        with pytest.raises(NodeGroupNotFound):
            adapter.read_group(P1, deadline())
        assert adapter.read_group(P2, deadline()).id == P2
    finally:
        adapter.close()


def test_an_upgrading_pool_is_asked_and_its_409_names_the_state_the_api_gave(sim, backends):
    backend = make_backend(sim, backends)
    sim.upgrade_pool(P1)  # after the sync: the snapshot still says ready, the API answers 409 upgrading
    with pytest.raises(GroupBusy, match="the API says the pool is upgrading") as info:
        backend.increase_size(P1, 1, deadline())
    assert "is ready" not in str(info.value)  # never our cached status
    assert [r.status for r in sim.requests.filter(route="update_pool")] == [409]
    backend.sync(deadline())  # the snapshot now says upgrading: the PATCH is still sent, Kapsule decides
    with pytest.raises(GroupBusy, match="upgrading"):
        backend.increase_size(P1, 1, deadline())
    assert sim.requests.count(route="update_pool") == 2
    sim.release_pool(P1)
    backend.sync(deadline())
    assert backend.increase_size(P1, 1, deadline()) == 4


def test_a_pool_seen_upgrading_is_scaled_when_kapsule_accepts(sim, backends):
    # Nothing public says Kapsule refuses a size change during an upgrade (a surge upgrade of a big pool
    # takes long): with an API that accepts it, the pending pods get their machine now.
    sim.set_behaviour(transient_pool_writes="accept")
    sim.upgrade_pool(P1)
    backend = make_backend(sim, backends)
    assert backend.group(P1).cloud_data.status == "upgrading"
    assert backend.increase_size(P1, 2, deadline()) == 5
    assert sim.pool(P1).size == 5
    assert [r.status for r in sim.requests.filter(route="update_pool")] == [200]


def test_locked_pool_refuses_deletion(sim, backends):
    backend = make_backend(sim, backends)
    sim.lock_pool(P1)
    with pytest.raises(GroupBusy, match="locked"):
        backend.delete_nodes(P1, [node_ref(sim, ids_of(sim, P1)[0])], deadline())


def test_size_outside_the_pool_bounds_is_rejected_by_the_cloud(sim):
    adapter = make_adapter(sim)
    try:
        group = adapter.read_group(P1, deadline())
        with pytest.raises(CloudRequestRejected, match="size must be between") as info:
            adapter.set_target_size(group, 11, deadline())  # as in the CA's Scaleway tests: 400 -> client-side error
        assert info.value.status == 400
    finally:
        adapter.close()


# ---------------------------------------------------------------------- transient failures


def test_429_with_retry_after_is_retried(sim, backends):
    sim.inject(Fault(route="list_pools", status=429, retry_after=0.05, times=1))
    backend = make_backend(sim, backends)
    assert len(list(backend.groups())) == 2
    assert [r.status for r in sim.requests.filter(route="list_pools")] == [429, 200]


def test_5xx_on_reads_is_retried(sim, backends):
    sim.inject(Fault(route="list_nodes", status=503, times=2))
    backend = make_backend(sim, backends)
    assert len(backend.instances(P1)) == 3
    assert [r.status for r in sim.requests.filter(route="list_nodes")] == [503, 503, 200]


def test_failed_sync_keeps_the_last_good_snapshot(sim, backends):
    backend = make_backend(sim, backends)
    before = backend.snapshot
    sim.inject(Fault(route="list_pools", status=500))  # as in the CA's Scaleway tests: the pool listing fails ...
    with pytest.raises(CloudUnavailable, match="answered 500"):
        backend.sync(deadline())
    assert backend.snapshot is before
    assert len(backend.instances(P1)) == 3
    health = backend.health()
    assert health.consecutive_failures == 1 and "500" in health.last_error
    sim.faults.clear()
    sim.inject(Fault(route="list_nodes", status=503))  # ... and the node listing fails
    with pytest.raises(CloudUnavailable, match="answered 503"):
        backend.sync(deadline())
    assert backend.snapshot is before
    sim.faults.clear()
    backend.sync(deadline())
    assert backend.health().consecutive_failures == 0


def test_size_write_is_not_retried_on_500(sim, backends):
    backend = make_backend(sim, backends)
    sim.inject(Fault(route="update_pool", status=500))
    with pytest.raises(CloudUnavailable):
        backend.increase_size(P1, 1, deadline())  # as in the CA's Scaleway tests: the API error is propagated
    assert sim.requests.count(route="update_pool") == 1
    assert backend.target_size(P1) == 3


def test_size_write_timeout_is_outcome_unknown_and_the_retry_is_not_applied_twice(sim, backends):
    backend = make_backend(sim, backends, request_timeout=0.3)
    sim.inject(Fault(route="update_pool", delay=1.0, times=1))
    with pytest.raises(ChangeOutcomeUnknown):
        backend.increase_size(P1, 2, deadline())
    wait_for(lambda: sim.pool(P1).size == 5, "the delayed PATCH to land")
    assert backend.increase_size(P1, 2, deadline()) == 5  # the CA's retry of the same request
    assert sim.requests.count(route="update_pool") == 1
    assert sim.pool(P1).size == 5


def test_list_timeout_fails_the_sync_with_cloud_timeout(sim, backends):
    backend = make_backend(sim, backends, request_timeout=0.2)
    sim.inject(Fault(route="list_pools", delay=0.6, times=3))
    with pytest.raises(CloudTimeout):
        backend.sync(deadline())
    assert len(backend.instances(P1)) == 3


def test_dropped_delete_connection_is_retried_as_delete_is_idempotent(sim, backends):
    backend = make_backend(sim, backends)
    sim.inject(Fault(route="delete_node", drop=True, times=1))
    victim = ids_of(sim, P1)[0]
    assert backend.delete_nodes(P1, [node_ref(sim, victim)], deadline()) == 1
    assert sim.node(victim).status == "deleting"
    assert sim.pool(P1).size == 2


@pytest.mark.parametrize(
    "fault",
    [
        Fault(route="list_pools", malformed=True, times=1),
        Fault(route="list_pools", content_type="text/html", times=1),
        Fault(route="list_nodes", malformed=True, times=1),
    ],
)
def test_malformed_answers_fail_the_sync_and_keep_the_snapshot(sim, backends, fault):
    backend = make_backend(sim, backends)
    sim.inject(fault)
    with pytest.raises(CloudUnavailable, match="malformed answer"):
        backend.sync(deadline())
    assert len(backend.instances(P1)) == 3


def test_json_with_charset_is_accepted(sim):
    sim.inject(Fault(route="list_pools", content_type="application/json; charset=utf-8"))
    adapter = make_adapter(sim)
    try:
        assert len(adapter.list_groups(deadline()).groups) == 2
    finally:
        adapter.close()


def test_non_json_502_is_a_server_side_failure(sim):
    sim.inject(Fault(route="list_pools", status=502, content_type="text/html"))
    adapter = make_adapter(sim)
    try:
        with pytest.raises(CloudUnavailable, match="answered 502") as info:
            adapter.list_groups(deadline())
        assert not isinstance(info.value, CloudRequestRejected)
    finally:
        adapter.close()


def test_breaker_opens_after_repeated_failures_and_reports_it(sim):
    adapter = ScalewayAdapter(
        ScalewayConfig(cluster_id=sim.cluster_id, secret_key=SECRET, api_url=sim.url, request_timeout=2.0),
        retry=RetryPolicy(attempts=1),
        breaker=BreakerSettings(failure_threshold=2, reset_after=60),
    )
    try:
        sim.inject(Fault(route="list_pools", status=503))
        for _ in range(2):
            with pytest.raises(CloudUnavailable):
                adapter.list_groups(deadline())
        with pytest.raises(CloudUnavailable, match="circuit breaker open"):
            adapter.list_groups(deadline())
        assert sim.requests.count(route="list_pools") == 2
        assert "breaker open" in adapter.health_detail()
    finally:
        adapter.close()


def backend_with_open_breaker(sim: ScalewaySimulator, backends: list[Backend], route: str) -> Backend:
    """A synced backend whose Scaleway breaker was opened by two failed listings (``route`` answering 503)."""
    adapter = ScalewayAdapter(
        ScalewayConfig(cluster_id=sim.cluster_id, secret_key=SECRET, api_url=sim.url, request_timeout=2.0),
        retry=RetryPolicy(attempts=1),
        breaker=BreakerSettings(failure_threshold=2, reset_after=60),
    )
    backend = Backend("scw-test", adapter, SyncSettings(min_interval=0.0))
    backends.append(backend)
    backend.sync(deadline())
    sim.inject(Fault(route=route, status=503))
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            backend.sync(deadline())
    return backend


def test_after_an_outage_a_size_change_is_the_breakers_probe_instead_of_failing_fast(sim, backends):
    """The CA backs a group off for minutes after a failed scale-up: one asked as the cloud comes back
    must not be refused for the rest of the breaker's reset time."""
    backend = backend_with_open_breaker(sim, backends, "list_pools")
    with pytest.raises(CloudUnavailable, match="circuit breaker open"):
        backend.sync(deadline())  # a listing still fails fast: the cloud is not hammered
    sim.faults.clear()
    target = backend.target_size(P1)
    assert backend.increase_size(P1, 1, deadline()) == target + 1
    assert sim.pool(P1).size == target + 1
    assert backend.adapter.client.transport.breaker_state == "closed"


def test_while_the_cloud_is_still_down_a_size_change_probes_once_and_fails_fast_after(sim, backends):
    backend = backend_with_open_breaker(sim, backends, "*")
    sent = len(sim.requests.all())
    with pytest.raises(DomainError):
        backend.increase_size(P1, 1, deadline())
    # The write as the probe (a single attempt), then the read-back its unclear 503 calls for.
    probes = [(r.method, r.route) for r in sim.requests.all()[sent:]]
    assert [method for method, _ in probes] == ["PATCH", "GET"] and probes[0][1] == "update_pool", probes
    with pytest.raises(CloudUnavailable, match="circuit breaker open"):
        backend.sync(deadline())  # and the cloud is left alone again until the next probe
    assert len(sim.requests.all()) == sent + 2


# ---------------------------------------------------------------------- templates, GPUs, prices


def test_template_from_the_pool_with_whole_units(make_sim, backends):
    pool = {
        "id": P1,
        "name": "p1",
        "node_type": "DEV1-M",
        "size": 0,
        "max_size": 3,
        "capacity": {"cpu": 2000, "memory": 4096000000, "ephemeral-storage": 20000000000, "pods": 110},
        "allocatable": {"cpu": 1800, "memory": 3500000000, "ephemeral-storage": 18000000000, "pods": 110},
        "labels": {"kubernetes.io/hostname": "test-node", "node.kubernetes.io/instance-type": "DEV1-M"},
        "taints": {"key1": "value1:NoSchedule", "key2": "NoExecute"},
    }
    sim = make_sim(scenario([pool]))
    backend = make_backend(sim, backends)
    template = backend.template(P1)  # as in the CA's Scaleway tests: whole units, map-form taints
    assert template.capacity == {
        "cpu": "2000",
        "memory": "4096000000",
        "ephemeral-storage": "20000000000",
        "pods": "110",
    }
    assert template.allocatable["cpu"] == "1800"
    assert template.labels["node.kubernetes.io/instance-type"] == "DEV1-M"
    assert template.labels["k8s.scaleway.com/pool"] == P1
    assert [(t.key, t.value, t.effect) for t in template.taints] == [
        ("key1", "value1", "NoSchedule"),
        ("key2", "", "NoExecute"),
    ]


def test_gpu_pools_give_gpu_types_label_and_resource(make_sim, backends):
    gpu_pool = {"id": P2, "name": "gpu", "node_type": "L4-1-24G", "size": 0, "max_size": 2}
    labelled = {"id": P3, "name": "h100", "node_type": "H100-1-80G", "size": 0, "max_size": 1}
    labelled["labels"] = {"k8s.scw.cloud/gpu": "nvidia-h100"}
    sim = make_sim(scenario([{"id": P1, "name": "cpu", "size": 1, "max_size": 3}, gpu_pool, labelled]))
    backend = make_backend(sim, backends)
    assert backend.adapter.gpu_label == "k8s.scw.cloud/gpu"  # as in the CA's Scaleway tests
    # The pool's own GPU label when it has one, else its node type in lower case (the API answers
    # "l4_1_24g"; the label reads as the commercial type does).
    assert backend.adapter.available_gpu_types() == ("l4-1-24g", "nvidia-h100")
    template = backend.template(P2)
    assert template.labels["k8s.scw.cloud/gpu"] == "l4-1-24g"
    assert template.capacity["nvidia.com/gpu"] == "1"
    assert backend.template(P3).labels["k8s.scw.cloud/gpu"] == "nvidia-h100"
    assert "k8s.scw.cloud/gpu" not in backend.template(P1).labels


def test_node_price_rounds_hours_up_for_the_pool_named_by_the_label(make_sim, backends):
    sim = make_sim(scenario([{"id": P1, "name": "p1", "size": 1, "max_size": 3, "node_price_per_hour": 0.10}]))
    backend = make_backend(sim, backends)
    # as in the CA's Scaleway tests: the pool is found by its node label
    node = NodeRef(provider_id="", labels={"k8s.scaleway.com/pool": P1})
    group_id = backend.adapter.group_for_price_node(node)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    price = backend.adapter.node_price(backend.group(group_id), node, start, start + dt.timedelta(hours=2, minutes=30))
    assert price == pytest.approx(0.30, abs=0.001)
    assert backend.adapter.group_for_price_node(NodeRef(provider_id="x")) is None


# ---------------------------------------------------------------------- instance type spelling


def learned_from_a_real_node(instance_type: str) -> LearnedTemplate:
    """A template learned from a Ready Kapsule node: its label as the cloud-controller-manager set it."""
    labels = {"node.kubernetes.io/instance-type": instance_type, "kubernetes.io/os": "linux", "team": "a"}
    return LearnedTemplate(
        NodeTemplate(labels, (), {"cpu": "2", "memory": "8Gi"}, {"cpu": "1910m", "memory": "6840Mi"}),
        "scw-pro-0123456789abcdef",
        "2026-08-20T10:00:00Z",
    )


def test_a_learned_template_is_kept_when_only_the_spelling_of_the_instance_type_differs(sim, backends):
    # The pools API answers node_type "pro2_xxs"; the real node was labelled "PRO2-XXS". After a restart the
    # learned template comes back from its ConfigMap: it still describes the pool's machines and is served.
    pool = sim.add_pool("pro", node_type="PRO2-XXS", size=0, min_size=0, max_size=3)
    assert sim.pool(pool.id).node_type == "pro2_xxs"
    backend = make_backend(sim, backends)
    assert backend.template(pool.id).labels["node.kubernetes.io/instance-type"] == "PRO2-XXS"
    learned = learned_from_a_real_node("PRO2-XXS")
    backend.set_learned_template(pool.id, learned)
    assert backend.template_source(pool.id) == learned.source
    served = backend.template(pool.id)
    assert served.allocatable == learned.template.allocatable
    assert served.labels["node.kubernetes.io/instance-type"] == "PRO2-XXS"


def test_a_learned_template_of_another_machine_type_is_still_dropped(sim, backends):
    pool = sim.add_pool("pro", node_type="PRO2-XXS", size=0, min_size=0, max_size=3)
    backend = make_backend(sim, backends)
    backend.set_learned_template(pool.id, learned_from_a_real_node("PRO2-S"))  # the pool changed type since
    assert backend.template_source(pool.id) == "cloud"
    assert backend.template(pool.id).allocatable["cpu"] == "2"  # the catalog's PRO2-XXS, whole cores
