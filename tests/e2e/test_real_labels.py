"""Scale both clouds from zero for pods that select the labels real nodes carry, before and after a
restart with learned templates on (docs/reference/scaleway.md and docs/reference/bizfly.md, "Evidence").

- Scaleway: the Kapsule pools API spells a pool's node type its own way (``pro2_xxs``); a real node
  carries the machine's commercial type (``PRO2-XXS``), which Scaleway's cloud-controller-manager copies
  from the Instance API. A pod selecting ``node.kubernetes.io/instance-type: PRO2-XXS`` must fit the
  empty pool.
- Bizfly: the cloud-controller-manager labels every node with its own region code, ``HN`` by default.
  A pod selecting ``topology.kubernetes.io/region: HN`` (and its pool's own label, so only the empty
  pool can take it) must fit the empty pool.

The simulators answer as the APIs do and the node agent labels nodes as the cloud-controller-managers
do. Once a node of each pool has run, its learned template must survive the restart of our server and
the CA (the two Scaleway spellings name one type; the cloud's labels, served over learned ones, must not
hide the real region) and scale the pool from zero again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

import pytest

from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from tests.e2e.environment import E2EEnvironment, StartEnvironment, bizfly_pool, measure, scaleway_pool, with_kubernetes
from tests.e2e.pools import machines, pool_size, two_clouds
from tests.e2e.replicas import TEMPLATES_PREFIX
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LEARNING = {"learned_templates": {"enabled": True, "min_write_interval": "1s"}}
# Each cloud: a pool holding one node, and a pool at zero that only the selecting pods fit.
LAYOUT = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 2), scaleway_pool("pro", "PRO2-XXS", 0, 0, 2)],
    [
        bizfly_pool("general", "nix.2c_4g", 1, 1, 2),
        bizfly_pool("batch", "nix.2c_4g", 0, 0, 3, labels={"workload": "batch"}),
    ],
)
# The pod a first machine runs is a bare pod, which the CA will not move: it marks the node unremovable
# and, by default, does not look at it again for 5 minutes after the pod has gone. Seconds here.
CA_FLAGS = {"unremovable-node-recheck-timeout": "5s"}


@dataclass(frozen=True)
class RealLabel:
    cloud: str
    backend: str  # the backend's name in the environment's config (its ConfigMap's suffix)
    pool: str  # at zero
    label: str  # the label real nodes carry ...
    value: str  # ... with this value, which the pods select
    also_selects: tuple[tuple[str, str], ...] = ()  # so that only the empty pool fits

    def selector(self) -> dict[str, str]:
        return {self.label: self.value, **dict(self.also_selects)}


INSTANCE_TYPE = RealLabel("scaleway", "scw", "pro", "node.kubernetes.io/instance-type", "PRO2-XXS")
REGION = RealLabel("bizfly", "bizfly", "batch", "topology.kubernetes.io/region", "HN", (("workload", "batch"),))
CASES = (INSTANCE_TYPE, REGION)


def served(env: E2EEnvironment, group: str) -> tuple[dict[str, str], str]:
    """Our template's labels for the group, and the group's debug text (which names the template's source)."""
    stub = env.ours.process.stub
    answer = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=group), timeout=5)
    labels = dict(k8s.Node.FromString(answer.nodeBytes).metadata.labels)
    debug = next(g.debug for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups if g.id == group)
    return labels, debug


def stored(env: E2EEnvironment, case: RealLabel, group: str) -> bool:
    """Whether the group's learned template is in its backend's ConfigMap (what a restart reads)."""
    try:
        cm = env.core.read_namespaced_config_map(f"{TEMPLATES_PREFIX}-{case.backend}", "kube-system")
    except Exception:  # not written yet
        return False
    return bool(json.loads((cm.data or {}).get(group, "null")))


def check_template(env: E2EEnvironment, case: RealLabel, group: str, source: str) -> None:
    labels, debug = served(env, group)
    assert source in debug, (case.cloud, debug)
    assert labels[case.label] == case.value, (case.cloud, labels)
    if case is REGION:  # the deprecated twin the CA still reads
        assert labels["failure-domain.beta.kubernetes.io/region"] == case.value, labels


def scale_from_zero(env: E2EEnvironment, case: RealLabel, group: str, pod: str, what: str) -> str:
    """A pending pod selecting the real label gets a new machine of the empty pool; returns its node name."""
    assert pool_size(env, case.cloud, case.pool) == 0 and machines(env, case.cloud, case.pool) == []
    created = env.create_pod(pod, cpu="500m", memory="256Mi", node_selector=case.selector())
    running = env.wait_pod_running(pod, 180)
    record_timing(measure(env, what, pod, created, case.cloud))
    (machine,) = machines(env, case.cloud, case.pool)
    assert running.spec.node_name == machine["name"]
    assert env.nodes()[machine["name"]].metadata.labels[case.label] == case.value
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    assert len(env.cloud_requests(case.cloud, "update_pool", since=created)) == 1
    assert not env.ca.log.provider_errors(since=created), env.ca.log.provider_errors(since=created)
    return str(machine["name"])


def test_pods_selecting_real_node_labels_scale_both_clouds_from_zero_before_and_after_a_restart(
    start_environment: StartEnvironment,
) -> None:
    env = start_environment(LAYOUT, ca_flags=CA_FLAGS, serve=with_kubernetes(LEARNING))
    groups = {case: env.group_id(case.cloud, case.pool) for case in CASES}
    assert env.scaleway_pool("pro")["node_type"] == "pro2_xxs"  # the API's spelling, not the label's

    # Before: from the templates built from the pools.
    first: dict[RealLabel, str] = {}
    for case in CASES:
        check_template(env, case, groups[case], "template=cloud")
        what = f"scale-from-zero on {case.label}={case.value} ({case.cloud})"
        first[case] = scale_from_zero(env, case, groups[case], f"first-{case.cloud}", what)
        env.wait_for(partial(stored, env, case, groups[case]), 60, f"the {case.cloud} {case.pool} template stored")

    # The pods leave, the CA removes the empty nodes, both pools are at zero again.
    for case in CASES:
        env.delete_pod_at(f"first-{case.cloud}")

    def emptied(case: RealLabel) -> bool:
        return machines(env, case.cloud, case.pool) == []

    def node_gone(case: RealLabel) -> bool:
        return first[case] not in env.nodes()

    for case in CASES:
        env.wait_for(partial(emptied, case), 180, f"the empty {case.cloud} node removed")
        env.wait_for(partial(node_gone, case), 60, f"the {case.cloud} node's Node object gone")

    # A restart of the pod that holds both (the sidecar layout): nothing in memory, the templates learned.
    env.ca.stop()
    env.ours.kill()
    env.ours.start_again()
    env.ca.start()
    second: dict[RealLabel, str] = {}
    for case in CASES:
        check_template(env, case, groups[case], f"template=learned from node {first[case]} at")
        what = f"scale-from-zero on {case.label}={case.value} after a restart, learned template ({case.cloud})"
        second[case] = scale_from_zero(env, case, groups[case], f"second-{case.cloud}", what)
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
    for case in CASES:
        publish(
            f"  {case.cloud}: pods selecting {case.label}={case.value} scaled the empty pool before ({first[case]}) "
            f"and after a restart on the learned template ({second[case]})"
        )
