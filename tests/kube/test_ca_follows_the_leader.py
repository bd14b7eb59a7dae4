"""The CA follows the leader (issue 30): after a step-down, a client that reaches the replicas only through
their Service is never refused "not the leader" once the new leader is Ready.

Two replicas against the real API server, behind the e2e suite's readiness-gated stand-in for their
Service (``tests/e2e/readiness_proxy.py``: new connections go only to a replica whose /readyz answers
200, probed every ``PROBE_INTERVAL``; an open connection stays where it is). A client calls through it
every 0.2 s, as a CA's loop does but faster: Refresh, NodeGroups, TargetSize twice, then IncreaseSize +1.
The leader then stops leading:

- ``api-cut``: its RoleBinding is deleted, so every Lease renewal is refused (403) and it steps down at
  its renew deadline, staying up as a follower;
- ``sigterm``: it is stopped gracefully (a rolling update), handing the Lease back.

Before issue 30 the replica that stepped down sent the connection away once, at the moment it stopped
leading; the client reconnected through the Service at once, while that replica was still its only Ready
endpoint, and nothing sent it away again: 20 of 20 IncreaseSize calls over the next 20 s were refused
("this replica is not the leader"), on both engines.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest
from kubernetes import client

from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from tests.e2e.readiness_proxy import Endpoint, ReadinessProxy
from tests.kube.test_leader_election import (
    FOLLOWER_AGE,
    LEASE_DURATION,
    POOL,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    Replicas,
    ready,
    replicas,  # noqa: F401 - the fixture
    sim,  # noqa: F401 - the fixture
    wait_for,
)

# The stand-in's readiness probe period: within the follower's connection age (as the kubelet's 2 s
# period is within the shipped 5 s).
PROBE_INTERVAL = 0.5
CALL_EVERY = 0.2
# How long the calls are watched once the new leader is Ready.
OBSERVED = 20.0
# One "loop" of the client: four reads and a write, one call every CALL_EVERY.
LOOP = ("Refresh", "NodeGroups", "NodeGroupTargetSize", "NodeGroupTargetSize", "NodeGroupIncreaseSize")


@dataclass
class Call:
    at: float  # wall-clock time it was sent
    method: str
    code: str  # "OK" or the gRPC status name
    details: str


@dataclass
class Caller:
    """Calls the replicas through the proxy every CALL_EVERY seconds on one channel, as the CA's loop does:
    Refresh first, and when Refresh fails the rest of that loop is skipped (the CA's RunOnce ends there)."""

    address: str
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Caller:
        threading.Thread(target=self._run, name="caller", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        requests: dict[str, Callable[[pb_grpc.CloudProviderStub], object]] = {
            "Refresh": lambda stub: stub.Refresh(pb.RefreshRequest(), timeout=5),
            "NodeGroups": lambda stub: stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5),
            "NodeGroupTargetSize": lambda stub: stub.NodeGroupTargetSize(
                pb.NodeGroupTargetSizeRequest(id=POOL), timeout=5
            ),
            "NodeGroupIncreaseSize": lambda stub: stub.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id=POOL, delta=1), timeout=5
            ),
        }
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            while not self._stop.is_set():
                for method in LOOP:
                    if self._stop.wait(CALL_EVERY):
                        return
                    at = time.time()
                    try:
                        requests[method](stub)
                        self.calls.append(Call(at, method, "OK", ""))
                    except grpc.RpcError as err:
                        self.calls.append(Call(at, method, err.code().name, err.details() or ""))
                        if method == "Refresh":
                            self._stop.wait(CALL_EVERY * (len(LOOP) - 1))  # the loop ends here
                            break


def failed(calls: list[Call], method: str, since: float, refused: bool = False) -> list[Call]:
    """Calls of ``method`` from ``since`` that did not answer OK; ``refused``: only those a replica refused
    itself ("... refused: this replica ... is not the leader"), not those that found no connection."""
    return [
        c
        for c in calls
        if c.method == method and c.at >= since and c.code != "OK" and (not refused or " refused: " in c.details)
    ]


def accepted_writes(output: str) -> list[float]:
    """Wall-clock times of the IncreaseSize calls a replica answered OK, from its JSON log."""
    found = []
    for line in output.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("grpcMethod") == "NodeGroupIncreaseSize" and record.get("grpcCode") == "OK":
                found.append(float(record["ts"]) / 1000)
    return found


@pytest.mark.parametrize("engine", ["grpcio", "native"])
@pytest.mark.parametrize("step_down", ["api-cut", "sigterm"])
def test_after_a_step_down_no_write_is_refused_once_the_new_leader_is_ready(
    replicas: Replicas,  # noqa: F811
    admin: client.ApiClient,
    namespace: str,
    engine: str,
    step_down: str,
) -> None:
    first = replicas.start("replica-a", engine=engine)
    wait_for(lambda: ready(first), 10, "the first replica leads and syncs")
    second = replicas.start("replica-b", engine=engine)
    proxy = ReadinessProxy(
        [
            Endpoint(name, server.address, f"http://{server.http_address}/readyz")
            for name, server in (("replica-a", first), ("replica-b", second))
        ],
        probe_interval=PROBE_INTERVAL,
    ).start()
    caller = Caller(proxy.address).start()
    try:
        wait_for(lambda: accepted_writes(first.output), 10, "a write through the Service")
        cut = time.time()
        if step_down == "api-cut":
            client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding("replica-a", namespace)
        else:
            first.stop()
        wait_for(lambda: replicas.holder() == "replica-b", LEASE_DURATION + RENEW_DEADLINE + 5, "the new leader")
        wait_for(
            lambda: (e := proxy.ready_endpoint()) is not None and e.name == "replica-b",
            10,
            "the new leader Ready behind the Service",
        )
        new_ready = proxy.endpoints[1].ready_since
        assert new_ready is not None
        time.sleep(OBSERVED)
    finally:
        caller.stop()
        proxy.stop()
    refused_after = failed(caller.calls, "NodeGroupIncreaseSize", new_ready, refused=True)
    failed_after = failed(caller.calls, "NodeGroupIncreaseSize", new_ready)
    writes = [c for c in caller.calls if c.method == "NodeGroupIncreaseSize" and c.at >= new_ready]
    first_write = min(accepted_writes(second.output), default=float("nan")) - cut
    routed = [(round(at - cut, 1), name) for at, name in proxy.record.routed if at > cut]
    print(
        f"\n{engine}, {step_down}: new leader Ready {new_ready - cut:.1f}s after the cut, its first accepted "
        f"write {first_write:.1f}s; after Ready: {len(refused_after)} of {len(writes)} IncreaseSize refused, "
        f"{len(failed_after)} failed in all, Refresh failed {len(failed(caller.calls, 'Refresh', new_ready))}; "
        f"from the cut: IncreaseSize refused {len(failed(caller.calls, 'NodeGroupIncreaseSize', cut, True))}, "
        f"Refresh refused {len(failed(caller.calls, 'Refresh', cut, True))}; connections through the Service "
        f"after the cut (s, to) {routed}"
    )
    assert writes, "the client made no write after the new leader was Ready"
    assert refused_after == [], "\n".join(f"{c.at - cut:.1f}s {c.method} {c.code} {c.details}" for c in refused_after)
    assert failed_after == [], "\n".join(f"{c.at - cut:.1f}s {c.method} {c.code} {c.details}" for c in failed_after)
    assert first_write < new_ready - cut + 5, "the client did not reach the new leader soon"
    if step_down == "api-cut":
        assert not ready(first)  # still up, a follower
    assert FOLLOWER_AGE <= LEASE_DURATION - RENEW_DEADLINE and RETRY_PERIOD < RENEW_DEADLINE
