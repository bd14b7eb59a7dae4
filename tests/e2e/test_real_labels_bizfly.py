"""Scale a Bizfly pool from zero for pods that select the region label real Bizfly nodes carry.

Bizfly's cloud-controller-manager labels every node with its own region setting, ``HN`` by default
(docs/bizfly.md, "Evidence"); the node agent does the same. A pod selecting
``topology.kubernetes.io/region: HN`` (and its pool's label, so only the empty pool can take it) fits a
pool at zero only if our template says ``HN`` too. With learned templates on, the same must hold after
our server and the CA restart, when the template is learned from the pool's last real node: the
cloud's labels are served over the learned ones, so a wrong region there would hide the real one.
"""

from __future__ import annotations

import json

import pytest

from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from tests.e2e.environment import E2EEnvironment, StartEnvironment, bizfly_pool, measure, scaleway_pool, with_kubernetes
from tests.e2e.pools import machines, pool_size, two_clouds
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

LEARNING = {"learned_templates": {"enabled": True, "min_write_interval": "1s"}}
# The node held a pod when the CA last looked, so the CA took it for unremovable: look again in seconds,
# not the default 5 minutes, once the pod is gone.
CA_FLAGS = {"unremovable-node-recheck-timeout": "5s"}
CONFIGMAP = "ca-externalgrpc-templates-bizfly"
REGION = {"topology.kubernetes.io/region": "HN"}
SELECTOR = {**REGION, "workload": "batch"}
LAYOUT = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 4)],
    [
        bizfly_pool("general", "nix.2c_4g", 1, 1, 4),
        bizfly_pool("batch", "nix.2c_4g", 0, 0, 3, labels={"workload": "batch"}),
    ],
)


def served_template(env: E2EEnvironment, group: str) -> tuple[dict[str, str], str]:
    stub = env.ours.process.stub
    answer = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout=5)
    labels = dict(k8s.Node.FromString(answer.nodeBytes).metadata.labels)
    debug = next(g.debug for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups if g.id == group)
    return labels, debug


def stored_groups(env: E2EEnvironment) -> set[str]:
    try:
        cm = env.core.read_namespaced_config_map(CONFIGMAP, "kube-system")
    except Exception:  # not written yet
        return set()
    return {key for key, value in (cm.data or {}).items() if json.loads(value)}


def scale_from_zero(env: E2EEnvironment, group: str, pod: str, scenario: str) -> str:
    """A pending pod selecting the real region label gets the empty pool's new machine; its name."""
    assert pool_size(env, "bizfly", "batch") == 0 and machines(env, "bizfly", "batch") == []
    created = env.create_pod(pod, cpu="500m", memory="256Mi", node_selector=SELECTOR)
    running = env.wait_pod_running(pod, 180)
    record_timing(measure(env, scenario, pod, created, "bizfly"))
    (new,) = machines(env, "bizfly", "batch")
    assert running.spec.node_name == new["name"]
    assert env.nodes()[new["name"]].metadata.labels["topology.kubernetes.io/region"] == "HN"
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    assert len(env.cloud_requests("bizfly", "update_pool", since=created)) == 1
    return str(new["name"])


def test_bizfly_pool_scales_from_zero_for_the_real_region_label_before_and_after_a_restart(
    start_environment: StartEnvironment,
) -> None:
    env = start_environment(LAYOUT, ca_flags=CA_FLAGS, serve=with_kubernetes(LEARNING))
    group = env.group_id("bizfly", "batch")

    labels, debug = served_template(env, group)
    assert debug.endswith("template=cloud")
    assert labels["topology.kubernetes.io/region"] == "HN"
    assert labels["failure-domain.beta.kubernetes.io/region"] == "HN"
    first = scale_from_zero(env, group, "first", "scale-from-zero for region HN (bizfly)")

    # The pool goes back to zero once its node is empty; the node's template is stored on the way.
    env.wait_for(lambda: group in stored_groups(env), 60, "the batch pool's template stored in its ConfigMap")
    env.delete_pod_at("first")
    env.wait_for(lambda: machines(env, "bizfly", "batch") == [], 180, "the CA removing the empty batch node")
    env.wait_for(lambda: first not in env.nodes(), 60, "the batch node's Node object gone")

    # A restart of the pod that holds both (the sidecar layout): nothing in memory, the template learned.
    env.ca.stop()
    env.ours.kill()
    env.ours.start_again()
    env.ca.start()
    labels, debug = served_template(env, group)
    assert f"template=learned from node {first} at" in debug
    assert labels["topology.kubernetes.io/region"] == "HN"
    assert labels["failure-domain.beta.kubernetes.io/region"] == "HN"
    scale_from_zero(env, group, "second", "scale-from-zero for region HN after a restart (bizfly)")
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
    publish(
        "  bizfly: pods selecting topology.kubernetes.io/region=HN scaled the empty pool, before and after a restart"
    )
