"""Two replicas of our server with every Kubernetes feature on (leader election, change journal, learned
templates, Events), behind a readiness-gated proxy (their Service), the real CA 1.36.1 pointed at the
proxy. The leader is killed (kill -9) in the middle of a scale-up and the follower takes over:

- while the resize it was asked for is reaching the cloud (applied, answer not back yet): the journal
  holds the change in flight, and the CA's next scale-up decision for the same pod, on the new leader,
  must not create a second machine;
- after the size write's outcome became unknown (applied, answered after the CA's deadline): the journal
  holds it as unknown, and the retry of that increase on the new leader must not create a second machine.

Each prints the failover figures, machines created against requested, the cloud's resize calls, the
journal ConfigMap and our Events as ``kubectl get events -n kube-system`` lists them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from simulators.common import Fault
from tests.e2e.environment import E2EEnvironment, ScenarioTiming, StartEnvironment, measure
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, SCALE_UP, machines, pool_size
from tests.e2e.replicas import NAMESPACE, STATUS_CONFIGMAP, ReplicatedServer, two_replicas
from tests.e2e.report import event_listing, publish, record_timing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CLOUD = "scaleway"
# Scenario 1: the cloud applies the resize at once but holds its answer this long; the leader is killed in
# between, so neither it nor the CA learns the outcome from the write itself.
ANSWER_HELD = 3.0
# Scenario 1: the new machine takes this long to boot, longer than the failover and the CA's reconnection,
# so its pod is still pending when the CA talks to the new leader: the CA decides the scale-up again.
SLOW_BOOT = 75.0
# Scenario 1: the group backoff the CA applies after its failed IncreaseSize (5 min by default), short
# enough that the CA decides again within the scenario.
SHORT_BACKOFF = {"initial-node-group-backoff-duration": "5s"}
# Scenario 2: the cloud applies the resize and answers after this long, past the CA's 5 s gRPC deadline:
# the leader answers UNAVAILABLE and journals the change as unknown.
ANSWER_PAST_DEADLINE = 12.0
# How long our server remembers an unconfirmed increase to recognise its retry (providers/backend.py).
INTENT_MEMORY = 120.0


@dataclass
class Failover:
    """Wall-clock seconds from the kill -9 of the leader to each step of the take-over."""

    killed: float
    new_leader: str
    lease_taken: float = 0.0
    ready: float = 0.0
    reconnected: float = 0.0
    first_loop: float = 0.0


def fill(env: E2EEnvironment) -> None:
    (only,) = machines(env, CLOUD, "general")
    env.create_pod("filler", cpu=FILLER_CPU[CLOUD], node_name=only["name"])
    env.wait_pod_running("filler", 60)


def start(start_environment: StartEnvironment, ca_flags: dict[str, str] | None = None) -> E2EEnvironment:
    env = start_environment(SCALE_UP, ca_flags=ca_flags, prepare=fill, serve=two_replicas)
    replicas: ReplicatedServer = env.ours
    assert replicas.holder() == replicas.leader().name
    return env


def kill_leader(replicas: ReplicatedServer) -> Failover:
    """kill -9 the leader (nothing drained, the Lease not handed back)."""
    first = replicas.leader()
    (follower,) = [name for name in replicas.replicas if name != first.name]
    replicas.kill(first.name)
    return Failover(killed=time.time(), new_leader=follower)


def follow_failover(env: E2EEnvironment, replicas: ReplicatedServer, run: Failover) -> None:
    """Wait for each step of the take-over (bounded generously: the machine is busy) and time it."""
    follower = run.new_leader
    env.wait_for(
        lambda: replicas.holder() == follower, replicas.lease_duration + 15, "the follower taking the Lease", 0.05
    )
    run.lease_taken = time.time() - run.killed
    env.wait_for(replicas.proxy.ready_endpoint, 30, "the new leader Ready behind the proxy", 0.05)
    endpoint = replicas.proxy.ready_endpoint()
    assert endpoint is not None and endpoint.name == follower and endpoint.ready_since is not None
    run.ready = endpoint.ready_since - run.killed
    # The CA's gRPC client reconnects with its own backoff; then its loops succeed against the new leader.
    routed = env.wait_for(
        lambda: [at for at, name in replicas.proxy.record.routed if name == follower and at > run.killed],
        120,
        "the CA reconnecting through the proxy to the new leader",
        0.05,
    )
    run.reconnected = min(routed) - run.killed
    env.wait_for(lambda: env.ca.last_successful_loop() > run.killed + run.reconnected, 90, "a successful CA loop", 0.1)
    run.first_loop = env.ca.last_successful_loop() - run.killed


def timing(scenario: str, env: E2EEnvironment, created: float, applied: float) -> ScenarioTiming:
    """To the resize seen applied in the cloud (the simulator logs the request when it answers, and the
    answer is held here), and to the pod running."""
    return dataclasses.replace(measure(env, scenario, "app", created, CLOUD), to_cloud_call=applied - created)


def publish_failover(replicas: ReplicatedServer, run: Failover) -> None:
    publish(
        f"{'  failover after kill -9 (lease_duration ' + format(replicas.lease_duration, 'g') + 's)':56} "
        f"Lease taken {run.lease_taken:5.1f}s   new leader Ready {run.ready:5.1f}s   "
        f"CA reconnected {run.reconnected:5.1f}s   first successful loop {run.first_loop:5.1f}s"
    )


def publish_outcome(env: E2EEnvironment, replicas: ReplicatedServer, before: int, requested: int) -> tuple[int, int]:
    """Machines created and cloud resize calls, published; returned for the checks."""
    created = len(machines(env, CLOUD, "general")) - before
    resizes = env.cloud_requests(CLOUD, "update_pool")
    answered = {name: len(server.rpc_log("NodeGroupIncreaseSize")) for name, server in replicas.replicas.items()}
    publish(
        f"{'  machines created (requested ' + str(requested) + ')':56} {created}   cloud resize calls "
        f"{len(resizes)} {[r.body for r in resizes]}   IncreaseSize logged per replica {answered}"
    )
    return created, len(resizes)


def publish_journal(label: str, entries: dict[str, dict[str, Any]]) -> None:
    shown = {
        key: {k: entry.get(k) for k in ("kind", "base", "desired", "state", "replica", "recorded_at")}
        for key, entry in entries.items()
    }
    publish(f"  journal ConfigMap {NAMESPACE}/ca-externalgrpc-journal {label}: {json.dumps(shown) if shown else '{}'}")


def our_events(env: E2EEnvironment, title: str) -> list[Any]:
    events = env.our_events(NAMESPACE, STATUS_CONFIGMAP)
    publish(f"{title}: our server's Events (kubectl get events -n {NAMESPACE}; REPORTER = reportingInstance)")
    publish(event_listing(events, reporter=True))
    return events


def check_no_event_while_following(events: list[Any], run: Failover) -> None:
    """The replica that was the follower wrote no Event before it took the Lease (whole seconds: the
    Event's timestamps have no more)."""
    taken = int(run.killed + run.lease_taken)
    early = [e for e in events if e.reporting_instance == run.new_leader and e.first_timestamp.timestamp() < taken]
    assert not early, "the follower wrote Events while following:\n" + event_listing(early, reporter=True)


def new_leader_log(replicas: ReplicatedServer, run: Failover) -> str:
    return replicas.replicas[run.new_leader].log_path.read_text(errors="replace")


def test_leader_killed_mid_scale_up_the_follower_takes_over_and_exactly_one_machine_is_created(
    start_environment: StartEnvironment,
) -> None:
    env = start(start_environment, SHORT_BACKOFF)
    replicas: ReplicatedServer = env.ours
    group = env.group_id(CLOUD, "general")
    before = len(machines(env, CLOUD, "general"))
    env.scw.state.timings = dataclasses.replace(env.scw.state.timings, creating=SLOW_BOOT)
    env.scw.faults.add(Fault(route="update_pool", method="PATCH", delay=ANSWER_HELD, apply=True, times=1))

    created = env.create_pod("app", cpu=APP_CPU[CLOUD], node_selector={POOL_LABEL[CLOUD]: "general"})
    # Kill the leader the moment the cloud has applied the resize, before its answer comes back.
    env.wait_for(lambda: pool_size(env, CLOUD, "general") == 2, 90, "the CA's resize reaching the cloud", 0.01)
    applied = time.time()
    run = kill_leader(replicas)
    at_kill = replicas.journal()  # the dead leader's last word; the follower reads it only once it leads
    follow_failover(env, replicas, run)
    # The pod still waits for its machine: the CA, its backoff over, decides the scale-up again on the new
    # leader, which finds the change in the journal and the cloud already at its size, and writes nothing.
    env.wait_for(
        lambda: replicas.replicas[run.new_leader].rpc_log("NodeGroupIncreaseSize"),
        90,
        "the CA's next IncreaseSize reaching the new leader",
    )
    env.wait_for(lambda: not replicas.journal(), 30, "the journal entry settled by the new leader")
    pod = env.wait_pod_running("app", SLOW_BOOT + 120)
    env.ca.wait_for_loops(5, since=time.time(), timeout=90)  # room for a duplicate scale-up to show

    record_timing(timing("leader killed mid scale-up, 2 replicas, all features (scw)", env, created, applied))
    publish_failover(replicas, run)
    made, resizes = publish_outcome(env, replicas, before, requested=1)
    publish_journal("at the kill", at_kill)
    publish_journal("at the end", replicas.journal())
    decisions = [e.message for e in env.ca.log.matching(rf"^Scale-up: setting group {group} size to")]
    publish(f"{'  the CA decisions':56} {decisions} (the second one answered by the new leader: target 2)")
    events = our_events(env, "leader killed mid scale-up")

    assert made == 1, "exactly the requested machine, no duplicate after the failover"
    assert resizes == 1, "the new leader wrote nothing for the CA's second decision"
    assert pool_size(env, CLOUD, "general") == 2
    assert pod.spec.node_name in {m["name"] for m in machines(env, CLOUD, "general")}
    assert replicas.replicas[run.new_leader].target(group) == 2
    # The CA did decide the scale-up a second time, from the size the new leader reported (2 -> 3).
    assert [d.rsplit(" ", 1)[-1] for d in decisions] == ["2", "3"], decisions
    assert run.lease_taken <= replicas.lease_duration + 2 * replicas.retry_period + 1
    # The journal held the old leader's change in flight, and the new leader took it as its own.
    (entry,) = at_kill.values()
    assert (entry["kind"], entry["base"], entry["desired"], entry["replica"]) == ("increase", 1, 2, "replica-a")
    log = new_leader_log(replicas, run)
    assert "adopted an unconfirmed size change from the journal" in log
    assert "increase already applied by an earlier call whose answer was lost" in log
    # Events: one ScaledUpGroup for the one resize, by the new leader (the old one died before its answer).
    scaled = [e for e in events if e.reason == "ScaledUpGroup"]
    assert [(e.reporting_instance, e.count) for e in scaled] == [(run.new_leader, 1)], event_listing(events, True)
    assert "target size now 2" in scaled[0].message
    check_no_event_while_following(events, run)
    env.check_running()


def test_leader_killed_while_a_size_write_is_unknown_the_journal_keeps_the_retry_from_applying_twice(
    start_environment: StartEnvironment,
) -> None:
    env = start(start_environment)
    replicas: ReplicatedServer = env.ours
    group = env.group_id(CLOUD, "general")
    before = len(machines(env, CLOUD, "general"))
    env.scw.faults.add(Fault(route="update_pool", method="PATCH", delay=ANSWER_PAST_DEADLINE, apply=True, times=1))

    created = env.create_pod("app", cpu=APP_CPU[CLOUD], node_selector={POOL_LABEL[CLOUD]: "general"})
    env.wait_for(lambda: pool_size(env, CLOUD, "general") == 2, 90, "the CA's resize reaching the cloud", 0.01)
    applied = time.time()
    # The leader answers the CA UNAVAILABLE at the deadline and marks the change unknown in the journal.
    unknown = env.wait_for(
        lambda: [e for e in replicas.journal().values() if e.get("state") == "unknown"],
        30,
        "the journal entry marked unknown",
        0.05,
    )
    at_kill = replicas.journal()
    run = kill_leader(replicas)
    follow_failover(env, replicas, run)
    pod = env.wait_pod_running("app", 180)
    # The real CA does not retry: it backs the group off after the failed call (5 min by default) and its
    # pod has meanwhile found the machine. The retry is sent as the CA would send it, through the Service,
    # to the new leader. Answered OK with nothing written: the journal told it the change had landed.
    retried = time.time()
    assert retried - unknown[0]["since"] < INTENT_MEMORY, "the retry comes while the change is remembered"
    replicas.increase_through_proxy(group, 1)
    env.wait_for(lambda: not replicas.journal(), 30, "the journal entry settled by the new leader")
    env.ca.wait_for_loops(5, since=time.time(), timeout=90)  # room for a duplicate scale-up to show

    record_timing(timing("leader killed, size write unknown, 2 replicas (scw)", env, created, applied))
    publish_failover(replicas, run)
    publish(
        f"{'  retry: a direct gRPC IncreaseSize +1 through the proxy':56} {retried - run.killed:5.1f}s after the kill"
    )
    made, resizes = publish_outcome(env, replicas, before, requested=1)
    publish_journal("before the kill", at_kill)
    publish_journal("after the retry", replicas.journal())
    print("CA log lines about the increase:", [e.message for e in env.ca.log.matching(r"size to|increas")])
    events = our_events(env, "leader killed, size write unknown")

    assert made == 1, "exactly the requested machine: the retry after the failover was not applied again"
    assert resizes == 1
    assert pool_size(env, CLOUD, "general") == 2
    assert pod.spec.node_name in {m["name"] for m in machines(env, CLOUD, "general")}
    assert replicas.replicas[run.new_leader].target(group) == 2
    (entry,) = at_kill.values()
    assert (entry["kind"], entry["base"], entry["desired"], entry["state"]) == ("increase", 1, 2, "unknown")
    assert entry["replica"] != run.new_leader
    log = new_leader_log(replicas, run)
    assert "adopted an unconfirmed size change from the journal" in log
    assert "increase already applied by an earlier call whose answer was lost" in log
    # Events: the old leader's warning for the unconfirmed write, one ScaledUpGroup by the new leader.
    failed = [e for e in events if e.reason == "FailedScaleUp"]
    assert [e.reporting_instance for e in failed] == [entry["replica"]], event_listing(events, True)
    assert "not confirmed" in failed[0].message
    scaled = [e for e in events if e.reason == "ScaledUpGroup"]
    assert [(e.reporting_instance, e.count) for e in scaled] == [(run.new_leader, 1)], event_listing(events, True)
    check_no_event_while_following(events, run)
    env.check_running()
