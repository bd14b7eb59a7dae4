"""Scale from zero for pods that select a Scaleway node's real instance-type label, before and after a
restart with learned templates on.

The Kapsule pools API spells a pool's node type its own way (``pro2_xxs``); a real node carries the
machine's commercial type (``PRO2-XXS``), which Scaleway's cloud-controller-manager copies from the
Instance API (docs/scaleway.md, "Evidence"). The simulator answers as the API does and the node agent
labels nodes as the cloud-controller-manager does. A pending pod selecting
``node.kubernetes.io/instance-type: PRO2-XXS`` must scale the empty pool from our template; once a node
of the pool has run, its learned template must survive our server's restart (the two spellings name one
type) and scale the pool from zero again.
"""

from __future__ import annotations

import pytest

from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from tests.e2e.environment import E2EEnvironment, StartEnvironment, bizfly_pool, measure, scaleway_pool, with_kubernetes
from tests.e2e.pools import machines, pool_size, two_clouds
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

LEARNING = {"learned_templates": {"enabled": True, "min_write_interval": "1s"}}
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# "pro" is at zero; "general" holds the cluster's one node, of another type.
LAYOUT = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 2), scaleway_pool("pro", "PRO2-XXS", 0, 0, 2)],
    [bizfly_pool("general", "nix.2c_4g", 1, 1, 2)],
)
SELECTS_PRO = {INSTANCE_TYPE: "PRO2-XXS"}
# The pod the first machine runs is a bare pod, which the CA will not move: it marks the node unremovable
# and, by default, does not look at it again for 5 minutes after the pod has gone. Seconds here.
CA_FLAGS = {"unremovable-node-recheck-timeout": "5s"}


def served(env: E2EEnvironment, group: str) -> tuple[dict[str, str], str]:
    """Our template's labels for the group, and the group's debug text (which names the template's source)."""
    stub = env.ours.process.stub
    answer = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout=5)
    labels = dict(k8s.Node.FromString(answer.nodeBytes).metadata.labels)
    debug = next(g.debug for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups if g.id == group)
    return labels, debug


def scale_from_zero(env: E2EEnvironment, group: str, pod: str, what: str) -> str:
    """A pod selecting the real instance type gets a new machine of the empty pool; returns its node name."""
    assert pool_size(env, "scaleway", "pro") == 0 and machines(env, "scaleway", "pro") == []
    created = env.create_pod(pod, cpu="500m", node_selector=SELECTS_PRO)
    running = env.wait_pod_running(pod, 180)
    record_timing(measure(env, what, pod, created, "scaleway"))
    (machine,) = machines(env, "scaleway", "pro")
    assert running.spec.node_name == machine["name"]
    assert env.nodes()[machine["name"]].metadata.labels[INSTANCE_TYPE] == "PRO2-XXS"
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    assert not env.ca.log.provider_errors(since=created), env.ca.log.provider_errors(since=created)
    return str(machine["name"])


def test_pods_selecting_the_real_instance_type_scale_scaleway_from_zero_before_and_after_a_restart(
    start_environment: StartEnvironment,
) -> None:
    env = start_environment(LAYOUT, ca_flags=CA_FLAGS, serve=with_kubernetes(LEARNING))
    group = env.group_id("scaleway", "pro")
    assert env.scaleway_pool("pro")["node_type"] == "pro2_xxs"  # the API's spelling
    labels, debug = served(env, group)
    assert labels[INSTANCE_TYPE] == "PRO2-XXS" and debug.endswith("template=cloud")

    # Before: from the template built from the pool.
    first = scale_from_zero(env, group, "first", "scale-from-zero on the real instance type (scaleway)")
    env.wait_for(lambda: "template=learned from node" in served(env, group)[1], 60, "the pro pool's learned template")

    # The pod leaves, the CA removes the empty node, the pool is at zero again; then our server and the CA
    # restart (the sidecar layout's pod restart: both start with nothing in memory).
    env.delete_pod_at("first")
    env.wait_for(lambda: machines(env, "scaleway", "pro") == [], 120, "the CA removing the empty pro node")
    env.wait_for(lambda: first not in env.nodes(), 30, "the pro node's Node object gone")
    env.ca.stop()
    env.ours.kill()
    env.ours.start_again()
    env.ca.start()

    # After: the template learned from that node is kept, though the pool's API spelling differs from its label.
    labels, debug = served(env, group)
    assert f"template=learned from node {first} at" in debug, debug
    assert labels[INSTANCE_TYPE] == "PRO2-XXS"
    second = scale_from_zero(env, group, "second", "scale-from-zero after a restart, learned template (scaleway)")
    publish(
        f"real instance-type label (scaleway): the API says pro2_xxs, nodes and our template PRO2-XXS; pods "
        f"selecting it scaled the empty pool before ({first}) and after a restart on the learned template ({second})"
    )
