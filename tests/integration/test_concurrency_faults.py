"""The CA's real concurrency and ordinary cloud faults, over a real gRPC channel against the simulators.

One behaviour per test, each named after what the CA must be able to rely on:

1. parallel scale-down of one group (ten single-node DeleteNodes at once) against a slow cloud, and an
   increase racing those deletions without a lost update;
2. a write the cloud applied but answered with an error, or answered too late, is read back from the
   cloud instead of being guessed, and TargetSize equals the cloud again within seconds;
3. every wait is bounded by the caller's deadline, and concurrent callers share one listing;
4. one unreachable cloud does not stop autoscaling of the others (the isolation rule);
5. a stopped Bizfly VM is a machine that exists, and DeleteNodes really deletes it;
7. a hostile DeleteNodes (10,000 entries) is refused or reduced before any work under the group's lock.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.clouds import bizfly_cluster_uid
from devstack.harness import Stack, running_stack
from protos import externalgrpc_pb2 as pb
from simulators.common import Fault

CLUSTER = "c0c0c0c0-1111-4222-8333-444444444444"
BIG = "b1b1b1b1-0000-4000-8000-000000000001"
SMALL = "b1b1b1b1-0000-4000-8000-000000000002"
HUGE = "b1b1b1b1-0000-4000-8000-000000000003"


def scaleway_scenario(*pools: dict[str, Any]) -> dict[str, Any]:
    return {
        "seed": 11,
        "timings": {"creating": 30, "starting": 30, "registering": 20, "deleting": 30},
        "clusters": [{"id": CLUSTER, "name": "concurrency", "pools": list(pools)}],
    }


def scw_pool(pool_id: str, size: int, min_size: int, max_size: int, name: str = "") -> dict[str, Any]:
    return {
        "id": pool_id,
        "name": name or pool_id[-4:],
        "node_type": "DEV1-M",
        "size": size,
        "min_size": min_size,
        "max_size": max_size,
    }


BIZFLY_SCENARIO = {
    "seed": 3,
    "timings": {"provision_seconds": 60, "delete_seconds": 30},
    "clusters": [
        {
            "name": "concurrency",
            "pools": [
                {"name": "big", "flavor": "nix.2c_4g", "min_size": 0, "max_size": 20, "desired_size": 12},
                {"name": "small", "flavor": "nix.2c_4g", "min_size": 1, "max_size": 5, "desired_size": 2},
            ],
        }
    ],
}


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    seconds: float
    timeout: float

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    @property
    def in_time(self) -> bool:
        return self.code != grpc.StatusCode.DEADLINE_EXCEEDED and self.seconds < self.timeout


def call(method: Callable[..., Any], request: Any, timeout: float = 5.0) -> Answer:
    started = time.monotonic()
    try:
        method(request, timeout=timeout)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
    return Answer(code, details, time.monotonic() - started, timeout)


def in_parallel(*calls: Callable[[], Answer]) -> list[Answer]:
    answers: list[Answer | None] = [None] * len(calls)

    def run(index: int) -> None:
        answers[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(a is not None for a in answers), "a call never returned"
    return [a for a in answers if a is not None]


def delete_nodes(stack: Stack, group: str, provider_ids: list[str], timeout: float = 5.0) -> Answer:
    request = pb.NodeGroupDeleteNodesRequest(
        id=group, nodes=[pb.ExternalGrpcNode(providerID=pid, name=pid.rsplit("/", 1)[-1]) for pid in provider_ids]
    )
    return call(stack.stub.NodeGroupDeleteNodes, request, timeout)


def increase(stack: Stack, group: str, delta: int, timeout: float = 5.0) -> Answer:
    return call(stack.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta), timeout)


def decrease(stack: Stack, group: str, delta: int, timeout: float = 5.0) -> Answer:
    request = pb.NodeGroupDecreaseTargetSizeRequest(id=group, delta=delta)
    return call(stack.stub.NodeGroupDecreaseTargetSize, request, timeout)


def wait_until(condition: Callable[[], bool], seconds: float) -> float:
    """Poll until ``condition`` holds; return how long it took (raises when it never does)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"condition not met within {seconds}s")
        time.sleep(0.05)
    return time.monotonic() - started


# ---------------------------------------------------------------------------------------- the clouds
class Cloud:
    """What differs between the two simulated clouds for these tests: ids, sizes, the request log."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.sim: Any = stack.scaleway if stack.scaleway is not None else stack.bizfly

    def group(self, name: str) -> str:
        if self.stack.scaleway is not None:
            return {"big": BIG, "small": SMALL}[name]
        pools = self.stack.bizfly.snapshot()["clusters"][0]["worker_pools"]  # type: ignore[union-attr]
        return str(next(p["id"] for p in pools if p["name"] == name))

    def target(self, group: str) -> int:
        if self.stack.scaleway is not None:
            return self.stack.scaleway.pool(group).size
        pools = self.stack.bizfly.snapshot()["clusters"][0]["worker_pools"]  # type: ignore[union-attr]
        return int(next(p["desired_size"] for p in pools if p["id"] == group))

    def provider_ids(self, group: str) -> list[str]:
        if self.stack.scaleway is not None:
            return sorted(n.provider_id for n in self.stack.scaleway.nodes_of(group))
        assert self.stack.bizfly is not None
        refs = self.stack.bizfly.node_refs(bizfly_cluster_uid(self.stack.bizfly))
        return sorted(r["provider_id"] for r in refs if r["pool_id"] == group)

    def requests(self, method: str) -> int:
        return self.sim.requests.count("update_pool" if method == "PATCH" else "delete_node", method)


@pytest.fixture(params=["scaleway", "bizfly"])
def cloud(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cloud]:
    if request.param == "scaleway":
        scenario = scaleway_scenario(scw_pool(BIG, 12, 0, 20, "big"), scw_pool(SMALL, 2, 1, 5, "small"))
        with running_stack(tmp_path, scaleway=scenario) as stack:
            yield Cloud(stack)
    else:
        with running_stack(tmp_path, bizfly=BIZFLY_SCENARIO) as stack:
            yield Cloud(stack)


# ------------------------------------------------------------------------------- 1. parallel scale-down
def test_ten_parallel_single_node_deletions_all_succeed_inside_the_deadline(cloud: Cloud) -> None:
    big = cloud.group("big")
    victims = cloud.provider_ids(big)[:10]
    cloud.sim.faults.add(Fault(route="delete_node", method="DELETE", delay=1.0))
    answers = in_parallel(*[(lambda pid=pid: delete_nodes(cloud.stack, big, [pid])) for pid in victims])
    assert [a.code for a in answers] == [grpc.StatusCode.OK] * 10, [(a.code.name, a.details) for a in answers]
    assert max(a.seconds for a in answers) < 3.0, [round(a.seconds, 2) for a in answers]
    assert cloud.requests("DELETE") == 10
    assert cloud.target(big) == 2
    assert cloud.stack.target(big) == 2


def test_an_increase_racing_deletions_of_the_same_group_loses_no_update(cloud: Cloud) -> None:
    big = cloud.group("big")
    victims = cloud.provider_ids(big)[:4]
    cloud.sim.faults.add(Fault(route="delete_node", method="DELETE", delay=1.0))

    def late_increase() -> Answer:
        time.sleep(0.3)  # the deletions are on their way to the cloud
        return increase(cloud.stack, big, 3)

    answers = in_parallel(*[(lambda pid=pid: delete_nodes(cloud.stack, big, [pid])) for pid in victims], late_increase)
    assert all(a.ok for a in answers), [(a.code.name, a.details) for a in answers]
    assert max(a.seconds for a in answers) < 3.0, [round(a.seconds, 2) for a in answers]
    # 12 - 4 deleted + 3 added: neither the increase nor any deletion's decrement was lost.
    assert cloud.target(big) == 11
    assert cloud.stack.target(big) == 11


# -------------------------------------------------------------------------- 2. unknown outcomes
@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_an_increase_applied_but_answered_5xx_is_read_back_not_guessed(cloud: Cloud, status: int) -> None:
    small = cloud.group("small")
    cloud.sim.faults.add(Fault(route="update_pool", method="PATCH", status=status, apply=True, times=1))
    answer = increase(cloud.stack, small, 2)
    assert cloud.target(small) == 4  # the cloud did apply it
    # The server read the cloud back: the change is reported as done, and TargetSize shows it, so the
    # CA has no reason to ask again (which on a stale TargetSize of 2 would take the cloud to 6).
    assert answer.ok, answer
    assert cloud.stack.target(small) == 4
    assert cloud.requests("PATCH") == 1  # no blind retry of the write


def test_a_deletion_applied_but_answered_too_late_is_reconciled_within_seconds(cloud: Cloud) -> None:
    big = cloud.group("big")
    victim = cloud.provider_ids(big)[0]
    cloud.sim.faults.add(Fault(route="delete_node", method="DELETE", delay=3.0, apply=True, times=1))
    answer = delete_nodes(cloud.stack, big, [victim], timeout=1.5)
    assert answer.code == grpc.StatusCode.UNAVAILABLE and answer.in_time, answer
    assert "unknown" in answer.details or "may" in answer.details, answer.details
    assert cloud.target(big) == 11
    took = wait_until(lambda: cloud.stack.target(big) == 11, seconds=3.0)
    assert took < 3.0


def test_an_increase_answered_too_late_is_reconciled_and_its_retry_applies_once(cloud: Cloud) -> None:
    small = cloud.group("small")
    cloud.sim.faults.add(Fault(route="update_pool", method="PATCH", delay=3.0, apply=True, times=1))
    answer = increase(cloud.stack, small, 2, timeout=1.5)
    assert answer.code == grpc.StatusCode.UNAVAILABLE and answer.in_time, answer
    assert cloud.target(small) == 4
    wait_until(lambda: cloud.stack.target(small) == 4, seconds=3.0)
    retry = increase(cloud.stack, small, 2)  # the CA retrying the call it saw fail
    assert retry.ok, retry
    assert cloud.target(small) == 4 and cloud.stack.target(small) == 4


# -------------------------------------------------------------------------- 3. bounded waits
def test_a_slow_listing_never_holds_a_caller_past_its_deadline_and_is_shared(tmp_path: Path) -> None:
    scenario = scaleway_scenario(scw_pool(BIG, 2, 0, 8, "big"), scw_pool(SMALL, 2, 0, 8, "small"))
    quiet = {"scw": {"sync": {"interval": "60s", "min_interval": "30s"}}}  # no timer listing during the test
    with running_stack(tmp_path, scaleway=scenario, backend_extra=quiet) as stack:
        sim = stack.scaleway
        assert sim is not None
        # Machines that boot: a decrease must decide on a fresh listing (one of them may run by now).
        assert increase(stack, BIG, 2).ok and increase(stack, SMALL, 2).ok
        stack.sync()
        time.sleep(2.5)  # that listing is now too old for the decision
        listed = sim.requests.count("list_nodes", "GET")
        # The next node listing takes 4 s (a big cluster); any second listing would fail with 500.
        sim.faults.add(Fault(route="list_nodes", method="GET", delay=4.0, times=1))
        sim.faults.add(Fault(route="list_nodes", method="GET", status=500))
        first, second, raced = in_parallel(
            lambda: decrease(stack, BIG, -1, timeout=2.0),
            lambda: decrease(stack, SMALL, -1, timeout=2.0),
            lambda: (time.sleep(0.2), increase(stack, BIG, 1, timeout=2.0))[1],
        )
        assert raced.ok and raced.seconds < 1.0, raced  # the group is not blocked by the waiting decrease
        for answer in (first, second):
            # UNAVAILABLE with the reason, before the deadline, never DEADLINE_EXCEEDED after it.
            assert answer.code == grpc.StatusCode.UNAVAILABLE and answer.seconds < 1.95, answer
            assert "listing" in answer.details, answer.details
        # One listing serves both callers (single flight); it finishes after they answered ...
        wait_until(lambda: sim.requests.count("list_nodes", "GET") > listed, seconds=5.0)
        # ... and its result serves the CA's next call, which starts no listing of its own.
        again = decrease(stack, BIG, -1, timeout=2.0)
        assert again.ok, again
        assert [r.status for r in sim.requests.filter(route="list_nodes")][listed:] == [200]
        assert sim.pool(BIG).size == 4 and stack.target(BIG) == 4


# -------------------------------------------------------------------------- 4. backends fail alone
def test_an_unreachable_cloud_that_never_synced_does_not_stop_the_others(tmp_path: Path) -> None:
    # A port bound but never listened on refuses every connection for as long as the socket is open.
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{refusing.getsockname()[1]}"
    unreachable = {
        "bizfly": {
            "auth_method": "password",
            "email": "nobody@example.com",
            "password": "never-used-password",
            "region": "HN",
            "api_url": dead,
            "token_url": dead + "/api/token",
            "kubernetes_engine_url": dead + "/api/kubernetes-engine",
            "cluster_name": "kedeadcluster00",
        }
    }
    scenario = scaleway_scenario(scw_pool(BIG, 2, 0, 8, "big"))
    with (
        refusing,
        running_stack(
            tmp_path, scaleway=scenario, bizfly=BIZFLY_SCENARIO, backend_extra={"bizfly": unreachable}
        ) as stack,
    ):
        groups = stack.groups()
        assert sorted(groups) == [BIG]
        refresh = call(stack.stub.Refresh, pb.RefreshRequest())
        assert refresh.ok, refresh  # every CA loop starts with Refresh: it must not abort them all
        assert increase(stack, BIG, 1).ok
        # The broken backend reports through its own channels instead.
        health = health_pb2_grpc.HealthStub(stack.channel)
        status = {
            name: health.Check(health_pb2.HealthCheckRequest(service=f"ca-externalgrpc.backend.{name}"), timeout=5)
            for name in ("scw", "bizfly")
        }
        assert status["scw"].status == health_pb2.HealthCheckResponse.SERVING
        assert status["bizfly"].status == health_pb2.HealthCheckResponse.NOT_SERVING
        port = stack.server.http.port  # type: ignore[union-attr]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.status == 200
            assert "bizfly" in answer.read().decode()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        assert re.search(r'ca_externalgrpc_snapshot_stale\{backend="bizfly"\} 1', metrics), metrics
        assert re.search(r'ca_externalgrpc_snapshot_stale\{backend="scw"\} 0', metrics), metrics


# -------------------------------------------------------------------------- 5. stopped Bizfly VMs
@pytest.mark.parametrize("status", ["SHUTOFF", "shutdown", "Stopped"])
def test_a_stopped_bizfly_vm_is_a_machine_and_delete_nodes_deletes_it(tmp_path: Path, status: str) -> None:
    with running_stack(tmp_path, bizfly=BIZFLY_SCENARIO) as stack:
        cloud = Cloud(stack)
        small = cloud.group("small")
        assert stack.bizfly is not None
        victim = cloud.provider_ids(small)[0]
        stack.bizfly.set_node_status(victim.removeprefix("bizflycloud://"), status)
        stack.sync()
        states = {i.id: i.status.instanceState for i in stack.instances(small)}
        assert states[victim] != pb.InstanceStatus.instanceDeleting, states
        answer = delete_nodes(stack, small, [victim])
        assert answer.ok, answer
        assert cloud.requests("DELETE") == 1  # OK only because the deletion was sent to the cloud
        assert cloud.target(small) == 1 and stack.target(small) == 1


# -------------------------------------------------------------------------- 7. hostile request sizes
def test_a_huge_delete_nodes_is_refused_before_the_group_lock_and_other_rpcs_stay_fast(tmp_path: Path) -> None:
    scenario = scaleway_scenario(scw_pool(HUGE, 3000, 0, 3000, "huge"))
    with running_stack(tmp_path, scaleway=scenario) as stack:
        sim = stack.scaleway
        assert sim is not None
        real = sorted(n.provider_id for n in sim.nodes_of(HUGE))
        strangers = [f"scaleway://instance/fr-par-1/{i:08d}-0000-4000-8000-000000000000" for i in range(7000)]
        hostile = real + strangers  # 10,000 entries, about 1.4 MB
        side: list[Answer] = []
        stop = threading.Event()

        def other_rpcs() -> None:
            while not stop.is_set():
                side.append(call(stack.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id=HUGE), 5.0))

        reader = threading.Thread(target=other_rpcs)
        reader.start()
        try:
            refused = delete_nodes(stack, HUGE, hostile)
        finally:
            stop.set()
            reader.join()
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused
        assert refused.seconds < 1.0, refused
        assert sim.requests.count("delete_node", "DELETE") == 0
        # Reads take no group lock: each answers within the bound the refusal itself keeps (a read that
        # waited for the 10,000 entries to be handled under a lock would take as long as they do, and more).
        assert side and all(a.ok for a in side) and max(a.seconds for a in side) < 1.0, max(a.seconds for a in side)

        # Duplicates are dropped first: 10,000 entries naming two machines delete exactly those two.
        repeated = delete_nodes(stack, HUGE, [real[0], real[1]] * 5000)
        assert repeated.ok, repeated
        assert repeated.seconds < 1.0, repeated
        assert sim.requests.count("delete_node", "DELETE") == 2
        assert sim.pool(HUGE).size == 2998 and stack.target(HUGE) == 2998
