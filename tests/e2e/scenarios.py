"""Scenario bodies that more than one test file runs against the real CA: a failed creation backed off
(test_faults.py with CA 1.36.1, test_ca_matrix.py with every release of the compatibility matrix)."""

from __future__ import annotations

from tests.e2e.environment import E2EEnvironment, Layout, StartEnvironment, bizfly_pool, measure, scaleway_pool
from tests.e2e.pools import machines, pool_size
from tests.e2e.report import record_timing

# Two empty pools can host the pod (1.5 CPU, 5 GiB); "tight" wastes less, so the least-waste expander
# tries it first. Its next scale-up is set to fail; the CA must back it off and scale "roomy".
FAILING = {
    "scaleway": Layout(
        scaleway_pools=[
            scaleway_pool("general", "DEV1-M", 1, 1, 3),
            scaleway_pool("tight", "POP2-2C-8G", 0, 0, 3),
            scaleway_pool("roomy", "PRO2-XS", 0, 0, 3),
        ],
        bizfly_pools=[bizfly_pool("general", "nix.2c_4g", 1, 1, 3)],
    ),
    "bizfly": Layout(
        scaleway_pools=[scaleway_pool("general", "DEV1-M", 1, 1, 3)],
        bizfly_pools=[
            bizfly_pool("general", "nix.2c_4g", 1, 1, 3),
            bizfly_pool("tight", "nix.2c_8g", 0, 0, 3),
            bizfly_pool("roomy", "nix.4c_16g", 0, 0, 3),
        ],
    ),
}
FAILURES = [
    ("scaleway", "quota"),  # the resize is refused: 403 quotas_exceeded
    ("scaleway", "out_of_stock"),  # the resize is refused: 503 out_of_stock
    ("scaleway", "creation_error"),  # the resize is accepted, the new machine ends in creation_error
    ("bizfly", "creation_error"),  # the resize is accepted, the new machine ends in ERROR
]


def failed_creation_backs_the_group_off(
    start_environment: StartEnvironment, cloud: str, mode: str, title: str
) -> E2EEnvironment:
    """The failure ``mode`` armed on ``cloud``'s "tight" pool; a pod both empty pools can host. The CA tries
    "tight", backs it off and scales "roomy", where the pod runs; ``title`` names the timing. Returns the
    environment, still running, for a caller's further checks."""

    def arm(env: E2EEnvironment) -> None:
        if cloud == "scaleway":
            env.scw.fail_next_scale_up(env.scaleway_pool("tight")["id"], mode=mode)
        else:
            env.bz.fail_next_scale_up(env.bizfly_pool("tight")["id"], count=1)

    env = start_environment(FAILING[cloud], prepare=arm)
    tight, roomy = env.group_id(cloud, "tight"), env.group_id(cloud, "roomy")

    created = env.create_pod("app", cpu="1500m", memory="5Gi")
    pod = env.wait_pod_running("app", 180)
    record_timing(measure(env, title, "app", created, cloud))

    # The CA tried "tight" first, backed it off, then scaled "roomy", where the pod runs.
    attempts = env.cloud_requests(cloud, "update_pool", since=created)
    pools = {
        env.scaleway_pool(n)["id"] if cloud == "scaleway" else env.bizfly_pool(n)["id"]: n for n in ("tight", "roomy")
    }
    tried = [pools[r.path.rsplit("/", 1)[-1]] for r in attempts if r.path.rsplit("/", 1)[-1] in pools]
    assert tried[0] == "tight" and "roomy" in tried, tried
    assert env.ca.log.matching(rf"Disabling scale-up for node group {tight} until", since=created)
    assert not env.ca.log.matching(rf"Disabling scale-up for node group {roomy}")
    (new,) = machines(env, cloud, "roomy")
    assert pod.spec.node_name == new["name"]
    assert pool_size(env, cloud, "roomy") == 1
    if mode == "creation_error":
        # The failed machine is reported as a creation error and the CA has it deleted: the pool ends empty.
        assert env.events("ScaleUpFailed")
        env.wait_for(lambda: machines(env, cloud, "tight") == [], 60, "the failed machine of 'tight' deleted")
        assert env.ours.rpc_log("NodeGroupDeleteNodes")
    else:
        assert env.events("FailedToScaleUpGroup")
        assert [r.status for r in attempts if pools.get(r.path.rsplit("/", 1)[-1]) == "tight"][0] >= 400
    assert pool_size(env, cloud, "tight") == 0
    assert env.ours.target(tight) == 0
    return env
