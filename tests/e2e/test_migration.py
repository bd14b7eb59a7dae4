"""Migration off the CA's in-tree Scaleway and Bizfly providers, with the real CA 1.36.1 on both sides.

Phase 1: the CA built with its in-tree providers runs the cluster and scales it (a scale-up; on
Scaleway also a scale-from-zero: the in-tree Bizfly provider has no templates, so it cannot). Phase 2:
``ca-externalgrpc config from-in-tree`` converts the in-tree provider's own settings, our server starts
on that config, and the externalgrpc CA takes over the same cluster: its status ConfigMap shows the same
groups, bounds, targets and registered nodes, and its first ten loops change nothing in the cloud or
the cluster; then a scale-up (on Bizfly, the scale-from-zero phase 1 could not do) and a scale-down
complete. Phase 3, the rollback: the in-tree CA again, and again its first ten loops change nothing.
Bizfly's in-tree client logs in at its production host: an intercepting HTTPS proxy plays it
(tests/support/https_intercept.py). ``make test`` runs the Scaleway smoke (scale-up, switch, scale-down,
rollback); ``make e2e`` both clouds in full.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from protos import externalgrpc_pb2 as pb
from tests.e2e.environment import (
    AutoscalerPrograms,
    E2EEnvironment,
    GroupStatus,
    Layout,
    bizfly_pool,
    scaleway_pool,
)
from tests.e2e.migration import (
    MigrationEnvironment,
    QuietWindow,
    in_tree_program,
    show,
    sizes,
    user_agents,
)
from tests.e2e.pools import POOL_LABEL, machines, pool_size
from tests.e2e.report import publish
from tests.support.https_intercept import BIZFLY_PRODUCTION_HOST

#: loops of the new CA watched after each switch, in which nothing may change
QUIET_LOOPS = 10
FILLER_CPU = {"scaleway": "2", "bizfly": "1500m"}  # of 3 and 1.9 allocatable CPUs
APP_CPU = {"scaleway": "2", "bizfly": "1200m"}  # fits no machine already there; over half of a new one
IN_TREE_AGENT = {"scaleway": "cluster-autoscaler/1.36.1", "bizfly": "bizfly-client-go/0.0.1"}
OUR_AGENT = {"scaleway": "ca-externalgrpc-server/0.2.0", "bizfly": "ca-externalgrpc-server/0.2"}
LAYOUTS = {
    "scaleway": Layout(
        scaleway_pools=[scaleway_pool("general", "DEV1-M", 1, 1, 4), scaleway_pool("big", "POP2-4C-16G", 0, 0, 3)]
    ),
    "bizfly": Layout(
        bizfly_pools=[bizfly_pool("general", "nix.2c_4g", 1, 1, 4), bizfly_pool("big", "nix.4c_16g", 0, 0, 3)]
    ),
}


@pytest.fixture
def start_migration(programs: AutoscalerPrograms, tmp_path: Path) -> Iterator[Callable[[str], MigrationEnvironment]]:
    """A factory: ``start_migration(cloud)`` -> that cloud's cluster, run by the in-tree CA (phase 1)."""
    started: list[MigrationEnvironment] = []

    def start(cloud: str) -> MigrationEnvironment:
        def fill(env: E2EEnvironment) -> None:
            (only,) = machines(env, cloud, "general")
            env.create_pod("filler", cpu=FILLER_CPU[cloud], node_name=only["name"])
            env.wait_pod_running("filler", 30)

        env = MigrationEnvironment(programs, in_tree_program(), tmp_path / cloud, cloud, LAYOUTS[cloud], fill)
        started.append(env)
        env.start()
        return env

    yield start
    for env in started:
        env.stop()


def pool_ids(env: MigrationEnvironment) -> dict[str, str]:
    """Pool id (the group id on both sides) -> pool name."""
    if env.cloud == "scaleway":
        return {p["id"]: p["name"] for p in env.scw.state.snapshot()["pools"]}
    return {p["id"]: p["name"] for p in env.bz.snapshot()["clusters"][0]["worker_pools"]}


def scale_up(env: MigrationEnvironment, pod: str, pool: str, expected: int, **resources: Any) -> float:
    """A pod only a new machine of ``pool`` can hold; returns seconds to Running. Exactly one resize."""
    since = time.time()
    env.create_pod(pod, **resources)
    env.wait_pod_running(pod, 120)
    (resize,) = [r for r in env.cloud_writes(since) if r.route == "update_pool"]
    assert resize.body == ({"size": expected} if env.cloud == "scaleway" else {"desired_size": expected}), resize
    assert pool_size(env, env.cloud, pool) == expected
    assert env.pod(pod).spec.node_name in {m["name"] for m in machines(env, env.cloud, pool)}
    return time.time() - since


def scale_down(env: MigrationEnvironment, pod: str, pool: str) -> float:
    """The pod's machine empties and goes through the cloud's delete; returns seconds to the Node gone."""
    node = env.pod(pod).spec.node_name
    (machine,) = [m for m in machines(env, env.cloud, pool) if m["name"] == node]
    since = env.delete_pod_at(pod)
    env.wait_for(lambda: node not in env.nodes(), 120, f"node {node} removed")
    deletes = [r for r in env.cloud_writes(since) if r.route == "delete_node"]
    assert [r.path.rsplit("/", 1)[-1] for r in deletes] == [machine["id"]], deletes
    return time.time() - since


def check_quiet(window: QuietWindow, before: dict[str, GroupStatus]) -> None:
    """Nothing changed hands but the CA: same groups, bounds, targets and nodes; no write, no deletion."""
    assert window.writes == [], f"cloud writes in the first {window.loops} loops: {window.writes}"
    assert window.nodes_deleted == [], f"nodes deleted in the first {window.loops} loops: {window.nodes_deleted}"
    assert window.decisions == [], [e.text() for e in window.decisions]
    assert window.statuses, "the new CA wrote no status in its first loops"
    for status in window.statuses:
        assert sizes(status) == sizes(before), (status, before)
        assert {g: s.registered for g, s in status.items()} == {g: s.registered for g, s in before.items()}
        assert not [g for g, s in status.items() if s.scale_up == "Backoff"], status


def check_mapping(env: MigrationEnvironment) -> int:
    """Our server puts every Node (as the CA sends it) in the group of its machine's pool; returns how many."""
    pools = pool_ids(env).items()
    pool_of = {m["provider_id"]: pool_id for pool_id, pool in pools for m in machines(env, env.cloud, pool)}
    nodes = env.nodes().values()
    assert {n.spec.provider_id for n in nodes} == set(pool_of)
    for node in nodes:
        request = pb.ExternalGrpcNode(
            providerID=node.spec.provider_id, name=node.metadata.name, labels=node.metadata.labels or {}
        )
        answer = env.ours.process.stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=request), timeout=5)
        assert answer.nodeGroup.id == pool_of[node.spec.provider_id], (node.metadata.name, answer)
    return len(nodes)


def login_line(env: MigrationEnvironment, since: float, client: str) -> str:
    """Bizfly: every login since ``since`` was ``client``'s, at the production host through the proxy."""
    logins = env.logins(since)
    assert logins and {who for who, _ in logins} == {client}, logins
    assert {host for _, host in logins} == {BIZFLY_PRODUCTION_HOST}, logins
    assert env.proxy is not None and env.proxy.refused == [], env.proxy.refused
    return f"{len(logins)} login(s) by {client} at https://{BIZFLY_PRODUCTION_HOST}/api/token via the proxy"


def run_migration(env: MigrationEnvironment, *, full: bool) -> None:
    cloud = env.cloud
    names = pool_ids(env)
    general = next(i for i, n in names.items() if n == "general")
    label = POOL_LABEL[cloud]

    # Phase 1: the in-tree provider scales the cluster.
    phase = env.switched_at
    took = scale_up(env, "app", "general", 2, cpu=APP_CPU[cloud], node_selector={label: "general"})
    done = [f"scale-up general 1->2 ({took:.1f}s)"]
    if full and cloud == "scaleway":
        took = scale_up(env, "hungry", "big", 1, cpu="500m", memory="10Gi")
        done.append(f"scale-from-zero big 0->1 ({took:.1f}s)")
    assert env.ca.log.matching(rf"^Scale-up: setting group {general} size to 2", since=phase)
    assert user_agents(env.cloud_writes(phase)) == {IN_TREE_AGENT[cloud]}
    if cloud == "bizfly":
        done.append(login_line(env, phase, IN_TREE_AGENT[cloud]))
    before = env.settled_status()
    assert set(before) == set(names), (before, names)
    publish(f"migration {cloud}, phase 1 in-tree: {', '.join(done)}; status: {show(before, names)}")
    env.stop_autoscaling()

    # Phase 2: our server, on the config from-in-tree made of the same settings, and the externalgrpc CA.
    env.start_ours()
    window = env.quiet_window(QUIET_LOOPS)
    check_quiet(window, before)
    mapped = check_mapping(env)
    publish(
        f"migration {cloud}, phase 2 ours: first {window.loops} loops ({window.seconds:.1f}s): "
        f"{len(window.writes)} cloud writes, {len(window.nodes_deleted)} node deletions, "
        f"{len(window.decisions)} scale decisions, {len(window.statuses)} status writes all equal to phase 1's; "
        f"{mapped} nodes in the same groups"
    )
    phase = env.switched_at
    done = [login_line(env, phase, OUR_AGENT[cloud])] if cloud == "bizfly" else []
    if full:
        if cloud == "scaleway":
            took = scale_up(env, "app2", "general", 3, cpu=APP_CPU[cloud], node_selector={label: "general"})
            done.append(f"scale-up general 2->3 ({took:.1f}s)")
            took = scale_down(env, "app2", "general")
        else:  # what the in-tree provider could not do: a template for an empty pool
            took = scale_up(env, "hungry", "big", 1, cpu="500m", memory="10Gi")
            done.append(f"scale-from-zero big 0->1 ({took:.1f}s)")
            took = scale_down(env, "hungry", "big")
    else:
        took = scale_down(env, "app", "general")
    done.append(f"scale-down ({took:.1f}s to the Node gone)")
    assert user_agents(env.cloud_writes(phase)) == {OUR_AGENT[cloud]}
    assert not env.ca.log.provider_errors(since=phase), env.ca.log.provider_errors(since=phase)
    after = env.settled_status()
    publish(f"migration {cloud}, phase 2 ours: {', '.join(done)}; status: {show(after, names)}")
    env.stop_autoscaling()

    # Phase 3: rollback to the in-tree provider.
    env.start_in_tree()
    window = env.quiet_window(QUIET_LOOPS if full else QUIET_LOOPS // 2)
    check_quiet(window, after)
    publish(
        f"migration {cloud}, phase 3 rollback to in-tree: first {window.loops} loops ({window.seconds:.1f}s): "
        f"{len(window.writes)} cloud writes, {len(window.nodes_deleted)} node deletions, "
        f"{len(window.decisions)} scale decisions, {len(window.statuses)} status writes all equal to phase 2's end"
    )


@pytest.mark.timeout(360)
def test_scaleway_in_tree_to_ours_and_back_smoke(start_migration: Callable[[str], MigrationEnvironment]) -> None:
    run_migration(start_migration("scaleway"), full=False)


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cloud", ["scaleway", "bizfly"])
def test_in_tree_to_ours_and_back(start_migration: Callable[[str], MigrationEnvironment], cloud: str) -> None:
    run_migration(start_migration(cloud), full=True)
