"""Scale-from-zero on Bizfly after a restart, from the template learned from the group's last real node.

The node agent reports what a kubelet would: allocatable below capacity by its own reservations, which
are not the ones the flavor-based template assumes. On a 4-core 16 GiB machine the agent's kubelet keeps
more memory allocatable than the flavor template's estimate, so a pod asking for memory between the two
fits a real node while the flavor template says it cannot: the CA scales the empty pool up for it only if
our server hands it the learned template.
"""

from __future__ import annotations

import json

import pytest

from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from providers.bizfly.templates import build_template
from tests.e2e.environment import (
    E2EEnvironment,
    StartEnvironment,
    bizfly_pool,
    measure,
    scaleway_pool,
    with_kubernetes,
)
from tests.e2e.pools import machines, pool_size, two_clouds
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LEARNING = {"learned_templates": {"enabled": True, "min_write_interval": "1s"}}
CONFIGMAP = "ca-externalgrpc-templates-bizfly"
# "big" has one real node at the start; the CA removes it (empty) and the pool sits at zero.
HAD_A_NODE = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 4)],
    [bizfly_pool("general", "nix.2c_4g", 1, 1, 4), bizfly_pool("big", "nix.4c_16g", 1, 0, 3)],
)
MIB = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}


def mebibytes(quantity: str) -> float:
    for suffix, factor in MIB.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


def stored_groups(env: E2EEnvironment) -> dict[str, dict[str, object]]:
    try:
        cm = env.core.read_namespaced_config_map(CONFIGMAP, "kube-system")
    except Exception:  # not written yet
        return {}
    return {key: json.loads(value) for key, value in (cm.data or {}).items()}


def scale_to_zero_and_restart(env: E2EEnvironment, learning: bool) -> tuple[str, dict[str, str], dict[str, str], float]:
    """The big pool loses its one node to the CA, then our server and the CA restart (a pod restart of the
    sidecar layout: both start with nothing in memory). Returns its group id, the last node's and the
    flavor's allocatable, and a memory request (MiB) between the two."""
    group = env.group_id("bizfly", "big")
    (first,) = machines(env, "bizfly", "big")
    node_allocatable = dict(env.nodes()[first["name"]].status.allocatable)
    flavor = build_template(env.bizfly_pool("big"), "HN", None)
    assert flavor is not None
    flavor_allocatable = dict(flavor.allocatable)
    if learning:
        env.wait_for(lambda: group in stored_groups(env), 30, "the big pool's template stored in its ConfigMap")
    env.wait_for(lambda: machines(env, "bizfly", "big") == [], 120, "the CA removing the empty big node")
    env.wait_for(lambda: first["name"] not in env.nodes(), 30, "the big node's Node object gone")
    env.ca.stop()
    env.ours.kill()
    env.ours.start_again()
    env.ca.start()
    request = (mebibytes(flavor_allocatable["memory"]) + mebibytes(node_allocatable["memory"])) / 2
    assert mebibytes(flavor_allocatable["memory"]) < request < mebibytes(node_allocatable["memory"])
    return group, node_allocatable, flavor_allocatable, request


def served_template(env: E2EEnvironment, group: str) -> tuple[dict[str, str], str]:
    stub = env.ours.process.stub
    answer = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout=5)
    template = k8s.Node.FromString(answer.nodeBytes)
    debug = next(g.debug for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups if g.id == group)
    return {k: v.string for k, v in template.status.allocatable.items()}, debug


def test_bizfly_pool_scales_from_zero_after_a_restart_on_its_last_nodes_allocatable(
    start_environment: StartEnvironment,
) -> None:
    env = start_environment(HAD_A_NODE, serve=with_kubernetes(LEARNING))
    (first,) = machines(env, "bizfly", "big")
    group, node_allocatable, flavor_allocatable, request = scale_to_zero_and_restart(env, learning=True)
    served, debug = served_template(env, group)
    publish(
        f"learned template, bizfly nix.4c_16g at zero after a restart: allocatable cpu/memory "
        f"flavor {flavor_allocatable['cpu']}/{flavor_allocatable['memory']}, "
        f"last node {node_allocatable['cpu']}/{node_allocatable['memory']}, "
        f"template {served['cpu']}/{served['memory']}"
    )
    assert served == node_allocatable
    assert served != flavor_allocatable
    assert f"template=learned from node {first['name']} at" in debug

    # Between the two: the flavor template would leave this pod pending, the learned one scales for it.
    created = env.create_pod("between", cpu="500m", memory=f"{int(request)}Mi")
    pod = env.wait_pod_running("between", 180)
    record_timing(measure(env, "scale-from-zero on a learned template (bizfly)", "between", created, "bizfly"))

    (new,) = machines(env, "bizfly", "big")
    assert pod.spec.node_name == new["name"]
    assert pool_size(env, "bizfly", "big") == 1
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    assert not env.ca.log.provider_errors(since=created), env.ca.log.provider_errors(since=created)


def test_without_learning_the_flavor_template_leaves_the_same_pod_pending(start_environment: StartEnvironment) -> None:
    # The control: the same history without the feature; after the restart only the flavor is known.
    env = start_environment(HAD_A_NODE)
    group, _, flavor_allocatable, request = scale_to_zero_and_restart(env, learning=False)
    served, debug = served_template(env, group)
    assert served == flavor_allocatable and debug.endswith("template=cloud")
    created = env.create_pod("between", cpu="500m", memory=f"{int(request)}Mi")
    env.ca.wait_for_loops(5, since=created, timeout=60)
    assert env.pod("between").status.phase == "Pending"
    assert not env.cloud_requests("bizfly", "update_pool", since=created)
    assert env.events("NotTriggerScaleUp")
    publish(f"  control without learned templates: a {int(request)}Mi pod stays pending on the flavor's template")
