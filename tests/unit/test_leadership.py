"""What a replica may do, decided by its own clock (server/kube/leader.py ``Leadership``) and the
order of the leader-election durations (config)."""

from __future__ import annotations

import pytest

from providers.config_errors import ConfigError
from providers.errors import NotLeader
from server.config import parse
from server.kube.leader import Leadership, holder_name, lease_identity
from server.kube.settings import LeaderElectionConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leadership(clock: Clock) -> Leadership:
    config = LeaderElectionConfig(enabled=True, lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)
    return Leadership(config, identity="pod-a", clock=clock)


def test_a_new_replica_is_a_follower_that_refuses_writes_and_is_unready() -> None:
    role = leadership(Clock())
    with pytest.raises(NotLeader, match=r"this replica \(pod-a\) is not the leader.*not known yet"):
        role.check_write("PATCH /pools/{pool_id}")
    assert role.readiness() == (False, "follower; leader is unknown")


def test_a_follower_names_the_leader_it_last_saw() -> None:
    role = leadership(Clock())
    role.observed("pod-b")
    with pytest.raises(NotLeader, match="NodeGroupIncreaseSize refused: .* the leader is pod-b"):
        role.check_serving("NodeGroupIncreaseSize")
    assert role.readiness() == (False, "follower; leader is pod-b")


def test_a_new_leader_writes_to_the_cloud_but_serves_mutations_only_after_its_first_sync() -> None:
    clock = Clock()
    role = leadership(clock)
    term = role.acquired(clock.now)
    role.check_write("PATCH /pools/{pool_id}")
    with pytest.raises(NotLeader, match="has just become the leader and syncs"):
        role.check_serving("NodeGroupIncreaseSize")
    assert role.readiness() == (False, "leader (pod-a), first sync pending")
    assert role.synced(term)
    role.check_serving("NodeGroupIncreaseSize")
    assert role.readiness() == (True, "leader (pod-a)")


def test_a_leader_stops_writing_at_its_renew_deadline_on_its_own_clock() -> None:
    clock = Clock()
    role = leadership(clock)
    role.synced(role.acquired(clock.now))
    clock.now += 9.99
    role.check_write("PATCH /pools/{pool_id}")
    clock.now += 0.01  # renew deadline (10 s) since the start of the last successful renewal
    with pytest.raises(NotLeader, match=r"could not renew .* within renew_deadline \(10s\)"):
        role.check_write("PATCH /pools/{pool_id}")
    assert not role.readiness()[0]
    assert role.leading, "the elector has not stepped down yet; the clock alone stopped the writes"


def test_a_renewal_extends_from_the_moment_it_was_sent() -> None:
    clock = Clock()
    role = leadership(clock)
    role.acquired(clock.now)
    clock.now += 8
    role.renewed(clock.now - 1)  # a renewal sent 1 s ago that just succeeded
    clock.now += 8.5
    assert role.holds()
    clock.now += 0.5
    assert not role.holds()


def test_the_sync_of_an_ended_term_does_not_make_the_replica_serve() -> None:
    clock = Clock()
    role = leadership(clock)
    old = role.acquired(clock.now)
    role.lost("pod-b")
    role.acquired(clock.now)
    assert not role.synced(old)
    assert not role.serving()


def test_the_write_gate_answers_how_long_the_leader_may_still_write() -> None:
    clock = Clock()
    role = leadership(clock)
    role.acquired(clock.now - 1)  # its write was sent 1 s ago
    assert role.check_write("PATCH /pools/{pool_id}") == pytest.approx(9.0)
    clock.now += 8.5
    assert role.check_write("PATCH /pools/{pool_id}") == pytest.approx(0.5)


def test_a_write_that_came_back_after_the_renew_deadline_starts_no_term() -> None:
    clock = Clock()
    role = leadership(clock)
    assert role.acquired(clock.now - 10) is None  # sent 10 s ago: it allows no writing at all
    assert not role.leading and role.term == 0
    assert role.acquired(clock.now - 9) == 1


def test_a_refusal_after_a_step_down_says_why() -> None:
    clock = Clock()
    role = leadership(clock)
    role.synced(role.acquired(clock.now))
    assert role.lost(reason="could not renew the Lease within renew_deadline (10s)")
    with pytest.raises(NotLeader, match=r"not the leader .* not known yet \(it stopped leading: could not renew"):
        role.check_serving("NodeGroupIncreaseSize")
    assert not role.lost(), "already a follower"


def test_a_retired_replica_never_leads_again() -> None:
    clock = Clock()
    role = leadership(clock)
    role.acquired(clock.now)
    assert role.retire()
    assert not role.holds()
    assert role.acquired(clock.now) is None, "a renewal that lands after stop() must not make it a leader"
    with pytest.raises(NotLeader, match="shutting down"):
        role.check_write("PATCH /pools/{pool_id}")


def test_a_holder_is_shown_by_its_identity_and_a_namesake_whole() -> None:
    assert holder_name("pod-b_0a1b2c3d") == "pod-b"
    assert holder_name("pod_b") == "pod_b" and holder_name("pod-b") == "pod-b"  # other writers' holders
    assert lease_identity("pod-a") != lease_identity("pod-a")
    role = leadership(Clock())
    role.lease_identity = "pod-a_00000001"
    role.observed("pod-b_0a1b2c3d")
    assert role.readiness() == (False, "follower; leader is pod-b")
    role.observed("pod-a_0a1b2c3d")  # another process with this replica's identity
    assert role.readiness() == (False, "follower; leader is pod-a_0a1b2c3d")


def _problems(election: dict[str, str]) -> list[str]:
    raw = {
        "backends": [
            {
                "name": "s",
                "type": "scaleway",
                "scaleway": {
                    "cluster_id": "11111111-1111-4111-8111-111111111111",
                    "region": "fr-par",
                    "secret_key": "11111111-1111-4111-8111-111111111111",
                },
            }
        ],
        "kubernetes": {"leader_election": {"enabled": True, **election}},
    }
    try:
        parse(raw, env={})
    except ConfigError as err:
        return [str(p) for p in err.problems]
    return []


def test_durations_must_be_ordered_retry_then_renew_then_lease() -> None:
    assert _problems({"lease_duration": "15s", "renew_deadline": "10s", "retry_period": "2s"}) == []
    found = _problems({"lease_duration": "5s", "renew_deadline": "6s", "retry_period": "7s"})
    assert len(found) == 2
    assert "renew_deadline" in found[0] and "shorter than lease_duration" in found[0]
    assert "retry_period" in found[1] and "shorter than renew_deadline" in found[1]
    # Against the defaults too: a lone lease_duration of 5s is below the default renew_deadline of 10s.
    assert any("renew_deadline" in p for p in _problems({"lease_duration": "5s"}))


def test_a_followers_connections_leave_before_the_next_leader_can_be_ready() -> None:
    # Issue 30: the CA's connection must leave a replica that stopped leading (cut off from the API server)
    # before the next one can take the Lease, lease_duration - renew_deadline later.
    assert _problems({"follower_connection_age": "5s"}) == []  # the defaults: 15s - 10s
    (found,) = _problems({"lease_duration": "12s", "follower_connection_age": "3s"})
    assert "follower_connection_age (3s) is longer than lease_duration - renew_deadline (2s)" in found
    assert "at most 2s" in found
    assert _problems({"lease_duration": "4s", "renew_deadline": "3s", "retry_period": "1s"})  # 5s default > 1s
    assert (
        _problems(
            {"lease_duration": "4s", "renew_deadline": "3s", "retry_period": "1s", "follower_connection_age": "1s"}
        )
        == []
    )
    assert "follower_connection_age" in _problems({"follower_connection_age": "0.1s"})[0]  # below 0.5s
