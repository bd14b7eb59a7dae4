"""Fail-over as the real CA 1.36.1 lives it, through the Service (issue 30): two replicas with every
Kubernetes feature on and the shipped timings (lease 15 s, renew deadline 10 s, retry 2 s, a follower's
connections 5 s), behind the readiness-gated stand-in for their Service probing every 2 s as the shipped
readiness probe does, the leader cut off by kill -9, SIGTERM or an API-server partition
(tests/e2e/failover.py says what each measures).

Then the split brain: the leader cut off from the API server, not from the clouds nor from the CA, round
after round (``--partition-rounds``; ``make e2e`` runs 10 per variant, ``make test`` one round as a smoke),
with the real CA scaling and a client writing to both replicas directly twice a second. From the clouds'
request logs, each write naming its term: no term writes after the next term's first write, none after
its own renew deadline, and each pool grew by exactly what the calls answered OK asked for.
"""

from __future__ import annotations

import math
import time

import pytest

from tests.e2e.environment import E2EEnvironment, StartEnvironment
from tests.e2e.failover import (
    CA_FLAGS,
    LAYOUT,
    Arrivals,
    Hammer,
    check_sizes,
    check_terms,
    cloud_writes,
    fail_over,
    leadership_terms,
    pool_sizes,
    prepare,
    settle,
)
from tests.e2e.replicas import ReplicatedServer, replicas, stand_in
from tests.e2e.report import publish

pytestmark = [pytest.mark.timeout(1800)]

# The stand-in probes readiness as the shipped readinessProbe does (periodSeconds 2).
PROBE_INTERVAL = 2.0


def start(start_environment: StartEnvironment, off: tuple[str, ...] = ()) -> E2EEnvironment:
    serve = replicas(service=stand_in(PROBE_INTERVAL), off=off, api_proxies=True)
    return start_environment(LAYOUT, ca_flags=CA_FLAGS, prepare=prepare, serve=serve)


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["kill", "sigterm", "partition"])
def test_the_ca_follows_the_leader_through_the_service(start_environment: StartEnvironment, how: str) -> None:
    env = start(start_environment)
    group: ReplicatedServer = env.ours
    sizes = pool_sizes(env)
    figures = fail_over(env, group, how)
    publish(f"  fail-over through the Service, real CA: {figures.row()}")
    for line in figures.refused_details:
        publish(f"    refused: {line}")
    settle(env, group, sizes)
    check = check_terms(cloud_writes(env), leadership_terms(group))
    publish(f"    writes per term (term, replica, writes) {check.writes_per_term}")
    assert figures.refused_after_ready == 0, figures.refused_details
    assert math.isfinite(figures.first_write) and math.isfinite(figures.first_cloud_write)
    assert not check.overlaps and not check.after_deadline and not check.unnamed, check
    for growth in check_sizes(env, group, sizes):
        assert growth.once, growth
    env.check_running()


def partition_rounds(env: E2EEnvironment, group: ReplicatedServer, rounds: int) -> list[str]:
    """Cut the leader off the API server, wait for the next one to serve and write, heal; ``rounds`` times.
    A line per round: when the next leader was Ready and wrote, from the cut."""
    burst = str(env.bizfly_pool("burst")["id"])
    hammer = Hammer(group, burst).start()
    arrivals = Arrivals(env, every=8.0, prefix="partition-pod").start()
    lines = []
    try:
        time.sleep(6)  # the leader writes before its first cut too
        for number in range(rounds):
            old = group.leader().name
            (new,) = [name for name in group.replicas if name != old]
            cut = time.time()
            group.cut_api(old)
            env.wait_for(lambda n=new: group.service.ready() == n, group.lease_duration + 40, "the next leader", 0.05)
            ready = (group.service.ready_since(new) or math.nan) - cut
            wrote = env.wait_for(
                lambda n=new, c=cut: [call for call in hammer.ok() if call.replica == n and call.at > c],
                30,
                "a write accepted by the next leader",
            )
            time.sleep(2)
            group.heal_api(old)
            time.sleep(2 * group.retry_period + 1)  # it reads the Lease again and stays a follower
            lines.append(f"round {number + 1}: {old} cut, {new} Ready {ready:4.1f}s, wrote {wrote[0].at - cut:4.1f}s")
    finally:
        arrivals.stop()
        hammer.stop()
    return lines


def split_brain(start_environment: StartEnvironment, rounds: int, off: tuple[str, ...]) -> None:
    env = start(start_environment, off=off)
    group: ReplicatedServer = env.ours
    sizes = pool_sizes(env)
    failed_before = env.ca.metric("failed_scale_ups_total")
    lines = partition_rounds(env, group, rounds)
    settle(env, group, sizes)
    time.sleep(3)  # answers of the last calls reach the logs
    terms = leadership_terms(group)
    writes = cloud_writes(env)
    check = check_terms(writes, terms)
    grown = check_sizes(env, group, sizes)
    journal = "off" if "journal" in off else "on"
    publish(
        f"  partition (split brain), journal {journal}: {rounds} rounds, {len(terms)} terms, {len(writes)} cloud "
        f"writes; overlaps {len(check.overlaps)}, writes after a renew deadline {len(check.after_deadline)}, "
        f"writes naming no term {len(check.unnamed)}"
    )
    publish(f"    writes per term (term, replica, writes) {check.writes_per_term}")
    if check.gaps:
        publish(
            f"    next term's first write after the last one of the term before: min {min(check.gaps):.1f}s, "
            f"max {max(check.gaps):.1f}s"
        )
    if check.before_deadline:
        publish(f"    last write before its term's renew deadline: at least {min(check.before_deadline):.3f}s")
    for growth in grown:
        publish(
            f"    {growth.pool}: grew by {growth.grew}; OK answers asked for {growth.asked}, {growth.absorbed} of them "
            f"taken for the retry of a change whose answer was lost; {growth.unknown} of unknown outcome"
        )
    publish(f"    CA failed scale-ups {round(env.ca.metric('failed_scale_ups_total') - failed_before)}")
    for line in lines:
        print(f"    {line}")
    assert not check.overlaps, check.overlaps
    assert not check.after_deadline, check.after_deadline
    assert not check.unnamed, check.unnamed
    assert len(terms) >= rounds + 1
    if "journal" not in off:  # without it, a change whose answer was lost at a fail-over may be applied again
        for growth in grown:
            assert growth.once, f"a change applied twice, or an OK answer that wrote nothing unannounced: {growth}"
    env.check_running()


@pytest.mark.e2e
@pytest.mark.parametrize("journal", ["on", "off"])
def test_a_leader_cut_off_from_the_api_server_never_writes_once_the_next_term_writes(
    start_environment: StartEnvironment, partition_rounds_option: int, journal: str
) -> None:
    split_brain(start_environment, partition_rounds_option, () if journal == "on" else ("journal",))


def test_partition_smoke(start_environment: StartEnvironment) -> None:
    """One round of the split-brain scenario with the shipped configuration, in ``make test``."""
    split_brain(start_environment, 1, ())
