"""Scale-up, scale-from-zero and scale-down by the real CA 1.36.1 through our server, on both clouds."""

from __future__ import annotations

import pytest

from tests.e2e.environment import (
    E2EEnvironment,
    StartEnvironment,
    bizfly_pool,
    measure,
    measure_removal,
    scaleway_pool,
)
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, SCALE_UP, all_running, machines, pool_size, two_clouds
from tests.e2e.report import record_timing

# Each scenario starts its own cluster (about 15 s) and waits for real loops: more than the default 120 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.mark.parametrize("cloud", ["scaleway", "bizfly"])
def test_pending_pod_gets_a_new_machine_and_runs_on_it(start_environment: StartEnvironment, cloud: str) -> None:
    def fill(env: E2EEnvironment) -> None:
        (only,) = machines(env, cloud, "general")
        env.create_pod("filler", cpu=FILLER_CPU[cloud], node_name=only["name"])
        env.wait_pod_running("filler", 30)

    env = start_environment(SCALE_UP, prepare=fill)
    group = env.group_id(cloud, "general")
    (first,) = machines(env, cloud, "general")

    created = env.create_pod("app", cpu=APP_CPU[cloud], node_selector={POOL_LABEL[cloud]: "general"})
    pod = env.wait_pod_running("app", 120)
    record_timing(measure(env, f"scale-up ({cloud})", "app", created, cloud))

    resizes = env.cloud_requests(cloud, "update_pool", since=created)
    assert len(resizes) == 1, resizes
    assert pool_size(env, cloud, "general") == 2
    assert all_running(env, cloud, "general")
    (new,) = [m for m in machines(env, cloud, "general") if m["id"] != first["id"]]
    assert pod.spec.node_name == new["name"]
    assert env.nodes()[new["name"]].spec.provider_id == new["provider_id"]
    assert sorted(i.id for i in env.ours.instances(group)) == sorted(
        m["provider_id"] for m in machines(env, cloud, "general")
    )
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 2", since=created)
    other = "bizfly" if cloud == "scaleway" else "scaleway"
    assert not env.cloud_requests(other, "update_pool"), "the other cloud was resized"
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()


# Scale from zero: the pod asks for 10 GiB, which only the empty pool's machine type offers; the CA can
# only know that from our server's template for the pool.
FROM_ZERO = {
    "scaleway": two_clouds(
        [scaleway_pool("general", "DEV1-M", 1, 1, 4), scaleway_pool("big", "POP2-4C-16G", 0, 0, 3)],
        [bizfly_pool("general", "nix.2c_4g", 1, 1, 4)],
    ),
    "bizfly": two_clouds(
        [scaleway_pool("general", "DEV1-M", 1, 1, 4)],
        [bizfly_pool("general", "nix.2c_4g", 1, 1, 4), bizfly_pool("big", "nix.4c_16g", 0, 0, 3)],
    ),
}


@pytest.mark.parametrize("cloud", ["scaleway", "bizfly"])
def test_pod_only_an_empty_pool_can_host_scales_it_from_zero(start_environment: StartEnvironment, cloud: str) -> None:
    env = start_environment(FROM_ZERO[cloud])
    group = env.group_id(cloud, "big")
    assert machines(env, cloud, "big") == []

    created = env.create_pod("memory-hungry", cpu="500m", memory="10Gi")
    pod = env.wait_pod_running("memory-hungry", 120)
    record_timing(measure(env, f"scale-from-zero ({cloud})", "memory-hungry", created, cloud))

    (new,) = machines(env, cloud, "big")
    assert pod.spec.node_name == new["name"]
    node = env.nodes()[new["name"]]
    assert node.spec.provider_id == new["provider_id"]
    assert node.metadata.labels[POOL_LABEL[cloud]] == "big"
    assert pool_size(env, cloud, "big") == 1
    assert env.ours.target(group) == 1
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    assert len(env.cloud_requests("scaleway", "update_pool")) + len(env.cloud_requests("bizfly", "update_pool")) == 1
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()


# Scale-down: three machines per cloud, one busy; the two empty ones of each cloud go, nothing else.
SCALE_DOWN = two_clouds(
    [scaleway_pool("general", "DEV1-M", 3, 0, 5)],
    [bizfly_pool("general", "nix.2c_4g", 3, 0, 5)],
)


def test_empty_nodes_are_deleted_through_delete_nodes_and_only_they(start_environment: StartEnvironment) -> None:
    busy: dict[str, dict[str, str]] = {}

    def pin(env: E2EEnvironment) -> None:
        for cloud in ("scaleway", "bizfly"):
            busy[cloud] = machines(env, cloud, "general")[0]
            env.create_pod(f"busy-{cloud}", cpu="500m", node_name=busy[cloud]["name"])
            env.wait_pod_running(f"busy-{cloud}", 30)

    env = start_environment(SCALE_DOWN, prepare=pin)
    empty = {cloud: [m for m in machines(env, cloud, "general") if m != busy[cloud]] for cloud in busy}
    empty_names = {m["name"] for ms in empty.values() for m in ms}
    assert len(empty_names) == 4

    env.wait_for(lambda: not empty_names & set(env.nodes()), 120, "the four empty nodes removed")
    # The nodes were empty from the CA's start.
    record_timing(measure_removal(env, "scale-down (2 empty nodes on each cloud)", empty_names, env.ca.started_at))
    for cloud in ("scaleway", "bizfly"):
        deleted = sorted(r.path.rsplit("/", 1)[-1] for r in env.cloud_requests(cloud, "delete_node"))
        assert deleted == sorted(m["id"] for m in empty[cloud]), (cloud, deleted)
        assert [m["id"] for m in machines(env, cloud, "general")] == [busy[cloud]["id"]]
        assert pool_size(env, cloud, "general") == 1
        assert env.ours.target(env.group_id(cloud, "general")) == 1
    # Each went through NodeGroupDeleteNodes, one node a call, answered OK.
    calls = env.ours.rpc_log("NodeGroupDeleteNodes")
    assert sorted(p for c in calls for p in c["nodes"]) == sorted(m["provider_id"] for ms in empty.values() for m in ms)
    assert all(c["grpcCode"] == "OK" for c in calls), calls
    removed = {e.message.split('"')[1] for e in env.ca.log.matching(r"^Scale-down: removing empty node \"")}
    assert removed == empty_names
    assert set(env.nodes()) == {busy["scaleway"]["name"], busy["bizfly"]["name"]}
    assert not env.events("ScaleDownFailed")
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()


# Ten empty nodes of one group at once: the CA deletes them in one loop, ten concurrent DeleteNodes.
PARALLEL = {
    "scaleway": two_clouds(
        [scaleway_pool("wide", "DEV1-M", 11, 1, 12)], [bizfly_pool("general", "nix.2c_4g", 1, 1, 2)]
    ),
    "bizfly": two_clouds([scaleway_pool("general", "DEV1-M", 1, 1, 2)], [bizfly_pool("wide", "nix.2c_4g", 11, 1, 12)]),
}


@pytest.mark.parametrize("cloud", ["scaleway", "bizfly"])
def test_ten_empty_nodes_of_one_group_go_in_one_loop(start_environment: StartEnvironment, cloud: str) -> None:
    keep: dict[str, str] = {}

    def pin(env: E2EEnvironment) -> None:
        keep.update(machines(env, cloud, "wide")[0])
        env.create_pod("busy", cpu="500m", node_name=keep["name"])
        env.wait_pod_running("busy", 30)

    env = start_environment(PARALLEL[cloud], prepare=pin)
    empty = [m for m in machines(env, cloud, "wide") if m["id"] != keep["id"]]
    assert len(empty) == 10
    names = {m["name"] for m in empty}

    env.wait_for(lambda: not names & set(env.nodes()), 120, "the ten empty nodes removed")
    record_timing(measure_removal(env, f"parallel scale-down (10 nodes, {cloud})", names, env.ca.started_at))
    removals = env.ca.log.matching(r"^Scale-down: removing empty node \"")
    assert {e.message.split('"')[1] for e in removals} == names
    # One loop: every removal decision was logged between the same two loop starts.
    loop_starts = [e.at for e in env.ca.log.loops()]
    loops_of = {sum(1 for start in loop_starts if start <= e.at) for e in removals}
    assert len(loops_of) == 1, f"removals spread over loops {sorted(loops_of)}"
    deleted = sorted(r.path.rsplit("/", 1)[-1] for r in env.cloud_requests(cloud, "delete_node"))
    assert deleted == sorted(m["id"] for m in empty)
    calls = env.ours.rpc_log("NodeGroupDeleteNodes")
    assert len(calls) == 10 and all(c["grpcCode"] == "OK" for c in calls), calls
    assert pool_size(env, cloud, "wide") == 1
    assert [m["id"] for m in machines(env, cloud, "wide")] == [keep["id"]]
    assert not env.events("ScaleDownFailed")
    assert env.ca.metric("errors_total") == 0
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
