"""The Scaleway public mode (``scaleway.mode: public``) with the real CA 1.36.1.

(docs/reference/scaleway.md, "Public mode")

Our server talks only to Kapsule's public pool and node endpoints and the Instance product catalog. The
customer's pools have Kapsule's autoscaling off and are named in the config with their bounds; a third
pool, also named, has it on (Kapsule's managed autoscaler owns it) and must be left untouched whatever
happens, before and after a restart of our server. Its two nodes are empty all along: had our server made
it a group (with the config's min_size 0), the CA would have removed them.

- scale-up: a pod that only a second machine of ``general`` can hold;
- scale-from-zero on a catalog template: a pod that selects the label Kapsule derives from a pool tag
  (``workload=batch`` -> ``k8s.scaleway.com/workload=batch``) and tolerates the taint it derives from
  another (``taint=dedicated=batch:NoSchedule`` -> ``k8s.scaleway.com/dedicated=batch:NoSchedule``);
- scale-down: both new machines removed once empty, by the node DELETE alone (no size PATCH);
- after a restart of our server: the managed pool still refused, and the batch pool scales from zero again.

Each name carries "public", so ``pytest tests/e2e --e2e -k public`` selects them.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.environment import E2EEnvironment, Layout, StartEnvironment, measure, measure_removal, scaleway_pool
from tests.e2e.pools import machines, pool_size
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BATCH_TAGS = ["workload=batch", "taint=dedicated=batch:NoSchedule"]
BATCH_SELECTOR = {"k8s.scaleway.com/workload": "batch"}
BATCH_TOLERATION = {"key": "k8s.scaleway.com/dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}
PUBLIC = Layout(
    scaleway_pools=[
        scaleway_pool("general", "DEV1-M", 1, 1, 1, autoscaling=False),
        scaleway_pool("batch", "PRO2-XXS", 0, 0, 0, autoscaling=False, tags=BATCH_TAGS),
        # Kapsule's own autoscaler acts on this pool (its switch is on, bounds 1..3 of its own).
        scaleway_pool("managed", "DEV1-M", 2, 1, 3),
    ],
    bizfly_pools=[],
    scaleway_settings={
        "mode": "public",
        "pools": {
            "general": {"min_size": 1, "max_size": 4},
            "batch": {"min_size": 0, "max_size": 2},
            "managed": {"min_size": 0, "max_size": 3},
        },
    },
)
CA_FLAGS = {"unremovable-node-recheck-timeout": "5s"}
PRIVATE_ROUTES = ("list_pools", "list_nodes", "update_pool", "delete_node")


def refusals(env: E2EEnvironment) -> list[str]:
    """Our server's log lines that refuse the managed pool."""
    lines = []
    for line in env.ours.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and "is left untouched: its Kapsule autoscaling is on" in line:
            lines.append(json.loads(line)["msg"])
    return lines


def check_managed_pool_untouched(env: E2EEnvironment) -> None:
    managed = env.scaleway_pool("managed")
    assert managed["autoscaling"] and managed["size"] == 2, managed
    assert len(machines(env, "scaleway", "managed")) == 2
    assert managed["id"] not in env.ours.group_ids()
    its_nodes = {m["id"] for m in machines(env, "scaleway", "managed")}
    writes = [r for r in env.scw.requests.filter() if r.method != "GET"]
    touched = [r for r in writes if managed["id"] in r.path or r.path.rsplit("/", 1)[-1] in its_nodes]
    assert not touched, touched


def scale_batch_from_zero(env: E2EEnvironment, pod: str, what: str) -> str:
    group = env.group_id("scaleway", "batch")
    assert pool_size(env, "scaleway", "batch") == 0
    created = env.create_pod(pod, cpu="500m", node_selector=BATCH_SELECTOR, tolerations=[BATCH_TOLERATION])
    running = env.wait_pod_running(pod, 180)
    record_timing(measure(env, what, pod, created, "scaleway"))
    (machine,) = machines(env, "scaleway", "batch")
    assert running.spec.node_name == machine["name"]
    node = env.nodes()[machine["name"]]
    assert node.metadata.labels["k8s.scaleway.com/workload"] == "batch"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints or [] if t.key.startswith("k8s.scaleway.com/")] == [
        ("k8s.scaleway.com/dedicated", "batch", "NoSchedule")
    ]
    assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created)
    return str(machine["name"])


def test_public_mode_scales_up_from_zero_on_tags_and_down_and_leaves_a_managed_pool_alone_across_a_restart(
    start_environment: StartEnvironment,
) -> None:
    def fill(env: E2EEnvironment) -> None:
        (only,) = machines(env, "scaleway", "general")
        env.create_pod("filler", cpu="2", node_name=only["name"])
        env.wait_pod_running("filler", 30)

    env = start_environment(PUBLIC, ca_flags=CA_FLAGS, prepare=fill)
    general, batch = env.group_id("scaleway", "general"), env.group_id("scaleway", "batch")
    assert sorted(g for g in env.ours.group_ids() if g in (general, batch)) == sorted([general, batch])
    assert len(refusals(env)) == 1, refusals(env)
    check_managed_pool_untouched(env)

    # Scale-up: the busy general pool gets a second machine for a 2-CPU pod.
    (first,) = machines(env, "scaleway", "general")
    created = env.create_pod("app", cpu="2", node_selector={"k8s.scaleway.com/pool-name": "general"})
    env.wait_pod_running("app", 120)
    record_timing(measure(env, "public mode: scale-up (scaleway)", "app", created, "scaleway"))
    assert pool_size(env, "scaleway", "general") == 2
    (patch,) = env.cloud_requests("scaleway", "public_update_pool", since=created)
    assert patch.body == {"size": 2}
    assert env.ca.log.matching(rf"^Scale-up: setting group {general} size to 2", since=created)

    # Scale-from-zero on the catalog's template, for a pod on the tag-derived label and taint.
    batch_node = scale_batch_from_zero(env, "batch-1", "public mode: scale-from-zero on pool tags (scaleway)")
    (app_node,) = [m["name"] for m in machines(env, "scaleway", "general") if m["id"] != first["id"]]

    # Scale-down: both emptied machines go, by the node DELETE alone.
    emptied = max(env.delete_pod_at("app"), env.delete_pod_at("batch-1"))
    resizes_before = len(env.cloud_requests("scaleway", "public_update_pool"))

    def removed() -> bool:
        return pool_size(env, "scaleway", "general") == 1 and machines(env, "scaleway", "batch") == []

    env.wait_for(removed, 180, "the two emptied machines removed")
    env.wait_for(lambda: not {app_node, batch_node} & set(env.nodes()), 60, "their Node objects gone")
    record_timing(measure_removal(env, "public mode: scale-down (scaleway)", {app_node, batch_node}, emptied))
    deletes = env.cloud_requests("scaleway", "public_delete_node", since=emptied)
    assert len(deletes) == 2 and all(d.query == {"skip_drain": "false"} for d in deletes), deletes
    assert len(env.cloud_requests("scaleway", "public_update_pool")) == resizes_before  # no PATCH after a DELETE
    assert pool_size(env, "scaleway", "batch") == 0
    check_managed_pool_untouched(env)

    # A restart of our server (and the CA): the managed pool is refused again and stays untouched; the batch
    # pool scales from zero again on the catalog's template (no learned template: the feature is off).
    env.ca.stop()
    env.ours.kill()
    env.ours.start_again()
    env.ca.start()
    env.wait_for(lambda: len(refusals(env)) == 2, 30, "the restarted server's refusal of the managed pool")
    scale_batch_from_zero(env, "batch-2", "public mode: scale-from-zero after a restart (scaleway)")
    check_managed_pool_untouched(env)

    assert not [r for r in env.scw.requests.filter() if r.route in PRIVATE_ROUTES], "a private endpoint was called"
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()
    publish(
        "  scaleway public mode: scale-up, scale-from-zero on tag-derived label and taint, scale-down by node "
        "DELETE only; the pool with Kapsule autoscaling on untouched before and after a restart"
    )


def test_public_mode_leaves_a_pool_with_kapsule_autoscaling_on_alone_for_a_pod_only_it_could_hold(
    start_environment: StartEnvironment,
) -> None:
    def fill(env: E2EEnvironment) -> None:
        # Both machines of the managed pool busy: a 2-CPU pod for that pool needs a third machine.
        for index, machine in enumerate(machines(env, "scaleway", "managed")):
            env.create_pod(f"busy-{index}", cpu="2", node_name=machine["name"])
            env.wait_pod_running(f"busy-{index}", 30)

    env = start_environment(PUBLIC, ca_flags=CA_FLAGS, prepare=fill)
    managed = env.scaleway_pool("managed")
    created = env.create_pod("wants-managed", cpu="2", node_selector={"k8s.scaleway.com/pool-name": "managed"})
    # Ten CA loops at least: the pod stays pending, the CA names no group for it, nothing is written.
    env.ca.wait_for_loops(10, since=created, timeout=90)
    assert env.pod("wants-managed").status.phase == "Pending"
    assert not env.cloud_requests("scaleway", ("public_update_pool", "public_delete_node"), since=created)
    assert not env.ca.log.matching(rf"setting group {managed['id']}")
    assert env.ca.log.matching(r"NotTriggerScaleUp|pod didn't trigger scale-up|No expansion options", since=created)
    check_managed_pool_untouched(env)
