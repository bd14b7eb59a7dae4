"""When the server reads the cloud: at the CA's Refresh once the snapshot is older than the interval.

Over a real gRPC channel against the Scaleway simulator, counting listings in its request log (one
listing is one GET of the pools and one of the nodes; the nodes GET is answered last, so it counts
finished listings, and only listings read it: a size write reads the pools alone).

1. a Refresh lists when the snapshot is older than the interval, waits for it and answers from it;
   a younger snapshot makes no listing;
2. Refreshes at the same moment share one listing;
3. a slow listing never holds Refresh past its deadline, the staleness bound still decides, and a
   backend whose cloud is failing is not waited for;
4. with no Refresh, the timer lists by itself after a few intervals (sooner with a tight staleness
   bound), and a size change still brings a listing forward, even while a listing runs;
5. ``follow_refresh: false``: the timer lists every interval and Refresh never waits for a listing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devstack.harness import Stack, start_stack
from protos import externalgrpc_pb2 as pb
from providers.deadline import Deadline
from simulators.common import Fault
from simulators.scaleway import ScalewaySimulator
from tests.integration.test_concurrency_faults import (
    BIG,
    SMALL,
    Answer,
    call,
    in_parallel,
    increase,
    scaleway_scenario,
    scw_pool,
    wait_until,
)

INTERVAL = 1.0


def sync_keys(**keys: Any) -> dict[str, Any]:
    return {"interval": f"{INTERVAL:g}s", "min_interval": "0s", **keys}


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """A stack with a two-pool Scaleway cluster and the given ``sync`` keys for its backend."""
    stacks: list[Stack] = []

    def make(**sync: Any) -> Stack:
        scenario = scaleway_scenario(scw_pool(BIG, 3, 0, 8, "big"), scw_pool(SMALL, 1, 0, 4, "small"))
        stacks.append(start_stack(tmp_path, scaleway=scenario, backend_extra={"scw": {"sync": sync}}))
        return stacks[-1]

    yield make
    for stack in stacks:
        stack.stop()


def sim_of(stack: Stack) -> ScalewaySimulator:
    assert stack.scaleway is not None
    return stack.scaleway


def listings(stack: Stack) -> int:
    return sim_of(stack).requests.count("list_nodes", "GET")


def listings_started(stack: Stack) -> int:
    return sim_of(stack).requests.count("list_pools", "GET")


def refresh(stack: Stack, timeout: float = 5.0) -> Answer:
    return call(stack.stub.Refresh, pb.RefreshRequest(), timeout)


def snapshot_age(stack: Stack) -> float:
    age = stack.backend("scw").health().age
    assert age is not None
    return age


def wait_for_age(stack: Stack, older_than: float) -> None:
    time.sleep(max(older_than - snapshot_age(stack), 0.0) + 0.05)


# ---------------------------------------------------------------------- 1. a due Refresh lists
def test_a_refresh_lists_once_the_snapshot_is_older_than_the_interval_and_answers_from_it(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack(**sync_keys())
    sim = sim_of(stack)
    assert listings(stack) == 1  # the first sync, at start
    requests = len(sim.requests)
    answer = refresh(stack)
    assert answer.ok, answer
    assert len(sim.requests) == requests  # younger than the interval: no cloud request at all

    added = sim.add_pool("late", size=2, min_size=0, max_size=5, autoscaling=True)
    wait_for_age(stack, INTERVAL)
    answer = refresh(stack)
    assert answer.ok, answer
    assert listings(stack) == 2  # one listing, and Refresh waited for it ...
    assert added.id in stack.groups()  # ... so the NodeGroups after it already shows the new pool
    answer = refresh(stack)
    assert answer.ok and listings(stack) == 2  # the snapshot is young again


# ---------------------------------------------------------------------- 2. shared listing
def test_refreshes_at_the_same_moment_share_one_listing(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(**sync_keys())
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", delay=1.5, times=1))
    wait_for_age(stack, INTERVAL)
    version = stack.backend("scw").snapshot.version
    answers = in_parallel(*[(lambda: refresh(stack)) for _ in range(6)])
    assert all(a.ok for a in answers), answers
    assert listings_started(stack) == 2 and listings(stack) == 2  # the first sync and one shared listing
    assert stack.backend("scw").snapshot.version == version + 1
    assert min(a.seconds for a in answers) > 0.7  # each waited for that listing, none answered before it


# ---------------------------------------------------------------------- 3. bounded waits
@pytest.mark.parametrize(("timeout", "waits"), [(2.0, 1.0), (10.0, 3.0)])
def test_a_slow_listing_never_holds_refresh_past_its_deadline(
    make_stack: Callable[..., Stack], timeout: float, waits: float
) -> None:
    # The wait ends 1 s before the deadline and after 3 s at most; the listing takes 5 s.
    stack = make_stack(**sync_keys())
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", delay=5.0, times=1))
    wait_for_age(stack, INTERVAL)
    version = stack.backend("scw").snapshot.version
    answer = refresh(stack, timeout)
    assert answer.ok, answer  # answered from the snapshot in place, well within its bound
    assert waits - 0.3 < answer.seconds < min(waits + 1.0, timeout - 0.3), answer
    assert listings(stack) == 1 and stack.backend("scw").snapshot.version == version
    # The listing went on in the background; the next Refresh finds its snapshot and lists nothing.
    # The simulator counts the request when it answers; the snapshot is swapped just after (under load,
    # after this thread looked): wait for both.
    wait_until(lambda: listings(stack) == 2 and stack.backend("scw").snapshot.version == version + 1, seconds=6.0)
    again = refresh(stack)
    assert again.ok and again.seconds < 0.5 and listings_started(stack) == 2, again


def test_a_refresh_waiting_for_a_slow_listing_still_fails_a_stale_backend_in_time(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack(**sync_keys(max_staleness="2s"))
    # The next listing takes 4 s: the snapshot passes its 2 s bound while it runs.
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", delay=4.0, times=1))
    wait_until(lambda: listings_started(stack) == 2, seconds=3.0)  # the timer started it (1 s here)
    wait_for_age(stack, 2.0)
    answer = refresh(stack, timeout=2.5)
    assert answer.code == grpc.StatusCode.UNAVAILABLE and answer.in_time, answer
    assert "stale" in answer.details and "scw" in answer.details, answer.details
    assert listings_started(stack) == 2  # it joined the running listing instead of starting another
    wait_until(lambda: listings(stack) == 2, seconds=5.0)
    assert refresh(stack).ok  # the listing's snapshot is within the bound again


def test_a_refresh_does_not_wait_for_a_backend_whose_cloud_is_failing(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(**sync_keys(min_interval="0.5s"))
    backend = stack.backend("scw")
    # Every node listing now fails slowly (the transport retries it), so a retry is nearly always running.
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", status=500, delay=0.5))
    wait_until(lambda: backend.health().consecutive_failures >= 1, seconds=12.0)
    retried = listings_started(stack)
    wait_until(lambda: listings_started(stack) > retried, seconds=5.0)  # the timer's retry is under way
    answer = refresh(stack)
    assert answer.ok and answer.seconds < 0.5, answer  # the last good snapshot is within its bound


# ---------------------------------------------------------------------- 4. the timer covers for a missing CA
@pytest.mark.parametrize(("staleness", "timer"), [("10m", 4 * INTERVAL), ("4s", 2.0)])
def test_without_any_refresh_the_timer_lists_after_a_few_intervals(
    make_stack: Callable[..., Stack], staleness: str, timer: float
) -> None:
    # Four intervals, but never later than half the staleness bound.
    stack = make_stack(**sync_keys(max_staleness=staleness))
    backend = stack.backend("scw")
    first = backend.snapshot
    wait_until(lambda: backend.snapshot.version == first.version + 1, seconds=timer + 3.0)
    assert listings(stack) == 2
    gap = backend.snapshot.started_at - first.finished_at  # from the first listing's end to the next start
    assert timer - 0.1 < gap < timer + 1.0, gap


def test_a_size_change_still_brings_a_listing_forward(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(interval="30s", min_interval="0s")
    assert increase(stack, SMALL, 2).ok
    took = wait_until(lambda: listings(stack) == 2, seconds=6.0)
    assert took < 5.0, took  # within a few seconds, no Refresh and 30 s from the interval


def test_a_size_change_during_a_listing_gets_a_listing_of_its_own_after_it(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(interval="30s", min_interval="0s")
    backend = stack.backend("scw")
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", delay=2.0, times=1))
    threading.Thread(target=lambda: backend.sync(Deadline.after(10)), daemon=True).start()
    wait_until(lambda: listings_started(stack) == 2, seconds=3.0)  # that listing read the pools already
    assert increase(stack, SMALL, 2).ok
    changed = time.monotonic()
    # The listing under way may have missed the change; it must not cancel the one the change asked for.
    wait_until(lambda: listings(stack) == 3, seconds=8.0)
    wait_until(lambda: backend.snapshot.version == 3, seconds=2.0)
    assert backend.snapshot.started_at > changed


# ---------------------------------------------------------------------- 5. the timer alone
def test_without_following_refresh_the_timer_lists_every_interval_and_refresh_never_waits(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack(**sync_keys(follow_refresh=False))
    wait_until(lambda: listings(stack) >= 3, seconds=2 * INTERVAL + 2.0)  # with no Refresh at all
    # A listing that takes 3 s makes the snapshot older than the interval; Refresh does not wait for it.
    sim_of(stack).faults.add(Fault(route="list_nodes", method="GET", delay=3.0, times=1))
    wait_until(lambda: snapshot_age(stack) > INTERVAL + 0.3, seconds=5.0)  # the slow listing is under way
    before = listings_started(stack)
    answer = refresh(stack)
    assert answer.ok and answer.seconds < 0.5, answer
    assert listings_started(stack) == before
