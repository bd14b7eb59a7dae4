"""Two replicas of our server with leader election behind a readiness-gated proxy (their Service), the
real CA 1.36.1 pointed at the proxy: the leader is killed (kill -9) while the scale-up it was asked for
is reaching the cloud, and the follower takes over."""

from __future__ import annotations

import time

import pytest

from simulators.common import Fault
from tests.e2e.environment import E2EEnvironment, StartEnvironment, measure
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, SCALE_UP, machines, pool_size
from tests.e2e.replicas import ReplicatedServer, two_replicas
from tests.e2e.report import publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

# The cloud applies the resize at once but holds its answer this long: the leader is killed in between,
# so neither it nor the CA learns the outcome from the write itself.
ANSWER_HELD = 3.0


def test_leader_killed_mid_scale_up_the_follower_takes_over_and_exactly_one_machine_is_created(
    start_environment: StartEnvironment,
) -> None:
    cloud = "scaleway"

    def fill(env: E2EEnvironment) -> None:
        (only,) = machines(env, cloud, "general")
        env.create_pod("filler", cpu=FILLER_CPU[cloud], node_name=only["name"])
        env.wait_pod_running("filler", 30)

    env = start_environment(SCALE_UP, prepare=fill, serve=two_replicas)
    replicas: ReplicatedServer = env.ours
    first = replicas.leader()
    (follower,) = [name for name in replicas.replicas if name != first.name]
    assert replicas.holder() == first.name
    group = env.group_id(cloud, "general")
    before = len(machines(env, cloud, "general"))
    env.scw.faults.add(Fault(route="update_pool", method="PATCH", delay=ANSWER_HELD, apply=True, times=1))

    created = env.create_pod("app", cpu=APP_CPU[cloud], node_selector={POOL_LABEL[cloud]: "general"})
    # Kill the leader the moment the cloud has applied the resize, before its answer comes back.
    env.wait_for(lambda: pool_size(env, cloud, "general") == 2, 60, "the CA's resize reaching the cloud", 0.01)
    replicas.kill(first.name)
    killed = time.time()

    env.wait_for(lambda: replicas.holder() == follower, replicas.lease_duration + 5, "the follower taking the Lease")
    lease_taken = time.time() - killed
    env.wait_for(lambda: replicas.proxy.ready_endpoint(), 30, "the new leader Ready behind the proxy", 0.05)
    endpoint = replicas.proxy.ready_endpoint()
    assert endpoint is not None and endpoint.name == follower and endpoint.ready_since is not None
    failover = endpoint.ready_since - killed
    # The CA's gRPC client reconnects with its own backoff; then its loops succeed against the new leader.
    routed = env.wait_for(
        lambda: [at for at, name in replicas.proxy.record.routed if name == follower and at > killed],
        120,
        "the CA reconnecting through the proxy to the new leader",
        0.05,
    )
    reconnected = min(routed) - killed
    env.wait_for(lambda: env.ca.last_successful_loop() > killed + reconnected, 60, "a successful CA loop", 0.1)
    ca_recovered = env.ca.last_successful_loop() - killed
    pod = env.wait_pod_running("app", 180)
    env.ca.wait_for_loops(5, since=time.time(), timeout=60)  # room for a duplicate scale-up to show

    record_timing(measure(env, "leader killed mid scale-up, 2 replicas (scaleway)", "app", created, cloud))
    publish(
        f"{'  failover after kill -9 (lease_duration ' + format(replicas.lease_duration, 'g') + 's)':56} "
        f"Lease taken {lease_taken:5.1f}s   new leader Ready {failover:5.1f}s"
    )
    publish(
        f"{'  CA back after kill -9':56} reconnected {reconnected:5.1f}s   first successful loop {ca_recovered:5.1f}s"
    )
    resizes = env.cloud_requests(cloud, "update_pool")
    created_machines = len(machines(env, cloud, "general")) - before
    increase_calls = env.ca.log.matching(r"[Ss]cale-up: setting group .* size to|Error increasing|Failed to increase")
    publish(
        f"{'  machines created (requested 1)':56} {created_machines}   cloud resize calls {len(resizes)}   "
        f"IncreaseSize answered by a replica {len(replicas.rpc_log('NodeGroupIncreaseSize'))}"
    )
    print("CA log lines about the increase:", [e.message for e in increase_calls])

    assert created_machines == 1, "exactly the requested machine, no duplicate after the failover"
    assert len(resizes) == 1
    assert pool_size(env, cloud, "general") == 2
    assert pod.spec.node_name in {m["name"] for m in machines(env, cloud, "general")}
    assert replicas.replicas[follower].target(group) == 2
    assert lease_taken <= replicas.lease_duration + 2 * replicas.retry_period + 1
    env.check_running()
