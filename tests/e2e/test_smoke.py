"""The end-to-end smoke that ``make test`` runs: the real CA scales a Scaleway pool up for a pending pod,
removes the node again once it is empty, and loops without a provider error while nothing changes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.environment import E2EEnvironment, Layout, StartEnvironment, measure, measure_removal, with_kubernetes
from tests.e2e.report import event_listing, publish, record_timing

SCW_POOL = "k8s.scaleway.com/pool-name"


def smoke_layout() -> Layout:
    return Layout(
        scaleway_pools=[{"name": "general", "node_type": "DEV1-M", "size": 1, "min_size": 1, "max_size": 4}],
        bizfly_pools=[
            {"name": "general", "flavor": "nix.2c_4g", "min_size": 1, "max_size": 3, "desired_size": 1,
             "enable_autoscaling": True},
        ],
    )  # fmt: skip


def scale_up_then_remove_the_empty_node(env: E2EEnvironment, label: str) -> dict[str, Any]:
    """On ``smoke_layout``: a pending pod makes the CA grow the Scaleway pool by one machine, the pod runs
    there; once the pod is gone the CA removes that node through NodeGroupDeleteNodes. The machine."""
    group = env.group_id("scaleway", "general")
    (first,) = env.scaleway_nodes("general")
    # The one machine is busy: a pod pinned to it takes 2 of its 3 allocatable CPUs.
    env.create_pod("filler", cpu="2", node_name=first["name"])
    env.wait_pod_running("filler", 30)

    created = env.create_pod("app", cpu="2", node_selector={SCW_POOL: "general"})
    pod = env.wait_pod_running("app", 120)
    timing = measure(env, f"{label}: scale-up (Scaleway, pending pod)", "app", created, "scaleway")
    record_timing(timing)

    # The cloud: one resize to 2, two machines running, the new one is where the pod runs.
    resizes = env.cloud_requests("scaleway", "update_pool", since=created)
    assert [r.body for r in resizes] == [{"size": 2}], resizes
    nodes = env.scaleway_nodes("general")
    assert len(nodes) == 2 and all(n["status"] == "ready" for n in nodes), nodes
    (new,) = [n for n in nodes if n["id"] != first["id"]]
    # Kubernetes: the pod runs on the new machine's Node, registered under the providerID our server reports.
    assert pod.spec.node_name == new["name"]
    assert env.nodes()[new["name"]].spec.provider_id == new["provider_id"]
    assert sorted(i.id for i in env.ours.instances(group)) == sorted(n["provider_id"] for n in nodes)
    assert env.ours.target(group) == 2
    # The CA: it decided this scale-up itself, and no provider call failed.
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 2", since=created)
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()

    # Scale-down: the new node is empty once the pod goes, the CA removes it through NodeGroupDeleteNodes.
    emptied = env.delete_pod_at("app")
    env.wait_for(lambda: new["name"] not in env.nodes(), 120, f"node {new['name']} removed")
    record_timing(measure_removal(env, f"{label}: scale-down (Scaleway, emptied node)", {new["name"]}, emptied))
    deletes = env.cloud_requests("scaleway", "delete_node", since=emptied)
    assert [r.path.rsplit("/", 1)[-1] for r in deletes] == [new["id"]], deletes
    assert env.ca.log.matching(rf'^Scale-down: removing empty node "{new["name"]}"', since=emptied)
    assert [n["id"] for n in env.scaleway_nodes("general")] == [first["id"]]
    assert env.scaleway_pool("general")["size"] == 1
    assert env.ours.target(group) == 1
    assert env.pod("filler").spec.node_name == first["name"]
    assert not env.events("ScaleDownFailed")
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
    return new


@pytest.mark.timeout(300)
def test_pending_pod_scales_scaleway_up_then_the_empty_node_is_removed(start_environment: StartEnvironment) -> None:
    # Our server writes Kubernetes Events too (kubernetes.events): they are listed at the end.
    env = start_environment(smoke_layout(), serve=with_kubernetes({"events": {"enabled": True}}))
    new = scale_up_then_remove_the_empty_node(env, "smoke")

    # Our server's Events: the scale-up and the node deletion, on its status ConfigMap.
    def scaled_up_and_deleted() -> list[Any]:
        found = env.our_events()
        return found if {"ScaledUpGroup", "DeletedNodes"} <= {e.reason for e in found} else []

    ours = env.wait_for(scaled_up_and_deleted, 15, "our server's ScaledUpGroup and DeletedNodes Events")
    publish("smoke: our server's Events (kubectl get events -n kube-system)\n" + event_listing(ours))
    (deleted,) = [e for e in ours if e.reason == "DeletedNodes"]
    assert new["name"] in deleted.message and deleted.related.name == new["name"]
    assert not [e for e in ours if e.type == "Warning"], event_listing(ours)


def steady_layout() -> Layout:
    # Every pool at its minimum: nothing to remove, nothing pending, so every loop should be quiet.
    return Layout(
        scaleway_pools=[
            {"name": "general", "node_type": "DEV1-M", "size": 2, "min_size": 2, "max_size": 4},
            {"name": "big", "node_type": "POP2-4C-16G", "size": 0, "min_size": 0, "max_size": 2},
        ],
        bizfly_pools=[
            {"name": "general", "flavor": "nix.2c_4g", "min_size": 2, "max_size": 3, "desired_size": 2,
             "enable_autoscaling": True},
            {"name": "big", "flavor": "nix.4c_16g", "min_size": 0, "max_size": 2, "desired_size": 0,
             "enable_autoscaling": True},
        ],
    )  # fmt: skip


def test_steady_state_loops_raise_no_provider_error(start_environment: StartEnvironment, steady_seconds: float) -> None:
    env = start_environment(steady_layout())
    nodes_before = {name: node.spec.provider_id for name, node in env.nodes().items()}
    start = time.time()
    time.sleep(steady_seconds)
    env.check_running()

    loops = env.ca.log.loops(since=start)
    assert len(loops) >= steady_seconds / 2.5, f"{len(loops)} CA loops in {steady_seconds:.0f}s (scan interval 2s)"
    assert env.ca.last_successful_loop() > time.time() - 5
    assert env.ca.metric("errors_total") == 0
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
    # Every node belongs to a group our server serves; nothing was resized or deleted.
    assert not env.ca.log.matching(r"No node group for node|Nodegroup is nil")
    assert {name: node.spec.provider_id for name, node in env.nodes().items()} == nodes_before
    for cloud in ("scaleway", "bizfly"):
        assert not env.cloud_requests(cloud, "update_pool") and not env.cloud_requests(cloud, "delete_node")
    publish(f"steady state: {len(loops)} CA loops in {steady_seconds:.0f}s, no provider error, no cloud call")
