"""A real server plus cloud simulators, driven over gRPC on 127.0.0.1, for the reliability tests.

``CampaignStack`` starts one simulator and, through the harness (``devstack.harness``), the server
in-process; it can restart the server at any moment (a new process image would behave the same: all
server state is in memory) and records every answer against its deadline. ``CloudKit`` hides what
differs between the clouds the tests drive: how to build a simulator with a given set of pools, the
backend config entry pointing at it, and how to read pools and nodes back from the simulator's own
state (the ground truth the tests compare the server against). Child-process servers come from
``devstack.harness.ServerProcess``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from devstack.harness import InProcessServer, server_config
from protos import externalgrpc_pb2 as pb
from providers.deadline import Deadline
from simulators.common.faults import Fault
from simulators.common.request_log import RecordedRequest

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
MUTATING_HTTP_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Codes a well-behaved server may answer; anything else (UNKNOWN, INTERNAL from a handler bug,
# DEADLINE_EXCEEDED) is a failure of the campaign.
EXPECTED_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    min_size: int
    max_size: int
    size: int


@dataclass(frozen=True)
class NodeView:
    provider_id: str  # what the Kubernetes Node carries in spec.providerID
    name: str
    phase: str  # running | creating | deleting | failed | other


@dataclass(frozen=True)
class PoolView:
    id: str  # the node-group id the server publishes
    min_size: int
    max_size: int
    target: int
    nodes: tuple[NodeView, ...]

    def live(self, phase: str | None = None) -> list[NodeView]:
        return [n for n in self.nodes if n.phase != "deleting" and (phase is None or n.phase == phase)]


class CloudKit(Protocol):
    """What the tests need to know about one simulated cloud."""

    name: str
    update_route: str  # route of the size write (PATCH pool)
    delete_route: str  # route of the node deletion
    read_routes: tuple[str, ...]  # routes the sync and re-reads use
    auth_routes: tuple[str, ...]  # POSTs that only authenticate (not mutations)

    def make_sim(self, pools: Sequence[PoolSpec], secret: str) -> Any: ...

    def backend_entry(self, sim: Any, secret: str, name: str = "") -> dict[str, Any]: ...

    def pools(self, sim: Any) -> dict[str, PoolView]: ...

    def env(self, secret: str) -> dict[str, str]: ...


@dataclass(frozen=True)
class Answer:
    method: str
    code: grpc.StatusCode
    details: str
    response: Any
    seconds: float
    timeout: float

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK


@dataclass
class RpcStats:
    """Every answer the tests got, by method and code, and the worst answer time against its deadline."""

    by_code: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    worst_fraction_of_deadline: float = 0.0
    deadline_misses: list[Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, answer: Answer) -> None:
        with self.lock:
            self.by_code[(answer.method, answer.code.name)] += 1
            self.worst_fraction_of_deadline = max(self.worst_fraction_of_deadline, answer.seconds / answer.timeout)
            if answer.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.deadline_misses.append(answer)

    @property
    def total(self) -> int:
        return sum(self.by_code.values())

    def count(self, code: str | None = None, method: str | None = None) -> int:
        return sum(
            n for (m, c), n in self.by_code.items() if (code is None or c == code) and (method is None or m == method)
        )


def server_raw_config(
    backends: Sequence[Mapping[str, Any]],
    *,
    http: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The campaign's server settings: no drain on stop (restarts are kills), JSON logs."""
    return server_config(
        backends, http=http, shutdown_grace="0s", log={"format": "json", "level": "info"}, **(extra or {})
    )


class CampaignStack:
    """One simulator, one in-process server, one gRPC channel; restartable; every answer recorded."""

    def __init__(
        self,
        kit: CloudKit,
        pools: Sequence[PoolSpec],
        *,
        secret: str = "reliability-secret-0123456789",
        sync: Mapping[str, Any] | None = None,
        http: bool = False,
        workdir: Path | None = None,
    ) -> None:
        self.kit = kit
        self.secret = secret
        self.sim = kit.make_sim(pools, secret)
        self.sim.start()
        entry = kit.backend_entry(self.sim, secret)
        entry["sync"] = dict(sync or {"interval": "60s", "min_interval": "0.2s", "max_staleness": "10m"})
        self.stats = RpcStats()
        try:
            self.server = InProcessServer(server_raw_config([entry], http=http), env=kit.env(secret), base=workdir)
        except BaseException:
            self.sim.stop()
            raise

    @property
    def channel(self) -> grpc.Channel:
        return self.server.channel

    # ------------------------------------------------------------------ lifecycle
    @property
    def restarts(self) -> int:
        return self.server.restarts

    def restart(self) -> None:
        """Kill the server (no grace) and start a fresh one: every in-memory state is lost."""
        self.server.restart()

    def close(self) -> None:
        self.server.stop(grace=0)
        self.sim.stop()

    def __enter__(self) -> CampaignStack:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ server internals tests may drive
    @property
    def backend(self) -> Any:
        return self.server.running.registry.backends[0]

    def force_sync(self) -> None:
        """What the background sync does on its timer, done now (tests must not wait for timers)."""
        self.backend.sync(Deadline.after(10.0))

    # ------------------------------------------------------------------ gRPC
    def call(self, method: str, request: Any, timeout: float = 5.0) -> Answer:
        started = time.monotonic()
        try:
            response = getattr(self.server.stub, method)(request, timeout=timeout)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            response = None
            code, details = err.code(), err.details() or ""
        answer = Answer(method, code, details, response, time.monotonic() - started, timeout)
        self.stats.record(answer)
        return answer

    def target_size(self, group_id: str) -> Answer:
        return self.call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group_id))

    def increase(self, group_id: str, delta: int, timeout: float = 5.0) -> Answer:
        return self.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta), timeout)

    def decrease(self, group_id: str, delta: int, timeout: float = 5.0) -> Answer:
        return self.call(
            "NodeGroupDecreaseTargetSize", pb.NodeGroupDecreaseTargetSizeRequest(id=group_id, delta=delta), timeout
        )

    def delete(self, group_id: str, nodes: Sequence[NodeView], timeout: float = 5.0) -> Answer:
        request = pb.NodeGroupDeleteNodesRequest(
            id=group_id, nodes=[pb.ExternalGrpcNode(providerID=n.provider_id, name=n.name) for n in nodes]
        )
        return self.call("NodeGroupDeleteNodes", request, timeout)

    # ------------------------------------------------------------------ cloud side
    def pools(self) -> dict[str, PoolView]:
        return self.kit.pools(self.sim)

    def mutations(self, since: int = 0) -> list[RecordedRequest]:
        """Requests after index ``since`` of the simulator log that could change cloud state."""
        return [
            r
            for r in self.sim.requests.all()[since:]
            if r.method in MUTATING_HTTP_METHODS and r.route not in self.kit.auth_routes
        ]

    def log_size(self) -> int:
        return len(self.sim.requests)

    def add_fault(self, **fields: Any) -> Fault:
        fault = Fault(**fields)
        self.sim.faults.add(fault)
        return fault

    def clear_faults(self) -> None:
        self.sim.faults.clear()

    def wait_for_requests(self, route: str, method: str, count: int, timeout: float = 5.0) -> None:
        """Block until the simulator has answered ``count`` requests of that route (delayed ones included)."""
        end = time.monotonic() + timeout
        while self.sim.requests.count(route, method) < count:
            if time.monotonic() > end:
                raise AssertionError(f"simulator never answered {count} {method} {route} request(s)")
            time.sleep(0.005)


def full_method(rpc: str) -> str:
    return f"/{SERVICE}/{rpc}"


def rpc_names() -> Iterator[str]:
    yield from pb.DESCRIPTOR.services_by_name["CloudProvider"].methods_by_name
