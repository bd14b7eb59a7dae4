"""What a seed decides: the nemesis's faults and the workload's pods, with their times. Pure: the same
seed and the same length give the same schedule, event for event (``make chaos SEED=n`` replays it).

The schedule is a plan in seconds from the start of the seed's run. Faults arrive at random (exponential
gaps, ``FAULT_GAP`` on average), each lasts a random time drawn from its kind's range, and nothing ends
after the chaos window: any number may overlap. The workload creates and deletes bare pods of four shapes
(``SHAPES``), one pool each, scale-from-zero pools included, never more of a shape than its pool can hold
at its maximum size, so every pod fits a group.

What a schedule does not fix: which replica is the leader when "the leader" is cut, what the CA decides
and when, and how the kernel schedules the processes; see tests/e2e/README.md ("The chaos campaign").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Seconds before the first fault (the CA's first loops) and the mean gap between two faults.
WARMUP = 10.0
FAULT_GAP = 12.0
#: Seconds between two workload changes: uniform in this range.
WORKLOAD_GAP = (3.0, 12.0)
CLOUDS = ("scaleway", "bizfly")
ROUTE_SETS = ("writes", "reads", "all")


@dataclass(frozen=True)
class Shape:
    """Pods that only one pool's machines can hold (a node selector on its pool label)."""

    cloud: str
    pool: str
    cpu: str
    memory: str
    most: int  # at most this many at once: what the pool holds at its maximum size


# Each pod takes most of a machine, so nearly every new pod is a scale-up and every deletion empties one.
SHAPES: dict[str, Shape] = {
    "scw-small": Shape("scaleway", "general", "2", "256Mi", 5),  # DEV1-M: 3 CPUs
    "scw-big": Shape("scaleway", "big", "500m", "10Gi", 2),  # scale from zero: 10 GiB fits POP2-4C-16G only
    "bz-small": Shape("bizfly", "general", "1", "256Mi", 5),  # nix.2c_4g: 1.9 CPUs allocatable
    "bz-big": Shape("bizfly", "big", "500m", "10Gi", 2),  # scale from zero: nix.4c_16g
}


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str  # one line for the docs' table of faults
    weight: int  # relative frequency
    duration: tuple[float, float]  # seconds the fault lasts (a downtime, for kills and restarts)
    params: Callable[[random.Random], dict[str, Any]] = field(default=lambda _rng: {})


def _cloud_routes(rng: random.Random) -> dict[str, Any]:
    return {"cloud": rng.choice(CLOUDS), "routes": rng.choice(ROUTE_SETS)}


def _5xx(rng: random.Random) -> dict[str, Any]:
    return {**_cloud_routes(rng), "status": rng.choice((500, 502, 503, 504)), "applied": rng.random() < 0.5}


def _429(rng: random.Random) -> dict[str, Any]:
    return {**_cloud_routes(rng), "retry_after": rng.choice((1, 2, 3))}


def _slow(rng: random.Random) -> dict[str, Any]:
    return {**_cloud_routes(rng), "delay": round(rng.uniform(0.5, 3.0), 2)}


def _writes_of(rng: random.Random) -> dict[str, Any]:
    return {"cloud": rng.choice(CLOUDS), "routes": "writes"}


def _signal(rng: random.Random) -> dict[str, Any]:
    return {"signal": rng.choice(("SIGKILL", "SIGTERM"))}


def _configmap(rng: random.Random) -> dict[str, Any]:
    return {"configmap": rng.choice(("journal", "templates"))}


def _api_delay(rng: random.Random) -> dict[str, Any]:
    return {"delay": round(rng.uniform(0.5, 3.0), 2)}


FAULT_KINDS: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind(
            "cloud-5xx",
            "a cloud answers 500/502/503/504 on its writes, reads or both; on writes, half the time after applying",
            4,
            (5, 30),
            _5xx,
        ),
        FaultKind("cloud-429", "a cloud answers 429 with Retry-After 1-3 s", 3, (5, 30), _429),
        FaultKind("cloud-slow", "a cloud holds each request 0.5-3 s before processing it", 3, (10, 40), _slow),
        FaultKind(
            "cloud-hang",
            "a cloud applies each write (or serves each read) and holds the answer 20 s, past every deadline",
            2,
            (5, 20),
            lambda rng: {**_cloud_routes(rng), "delay": 20.0},
        ),
        FaultKind(
            "cloud-drop-applied",
            "a cloud applies each write and drops the connection unanswered",
            2,
            (5, 20),
            _writes_of,
        ),
        FaultKind("leader-kill", "the leading replica killed (SIGKILL), started again after the downtime", 2, (2, 15)),
        FaultKind("leader-terminate", "the leading replica stopped (SIGTERM, drained), started again", 1, (2, 10)),
        FaultKind(
            "leader-partition",
            "the leading replica cut off from the API server (its requests hang), not from the clouds nor the CA",
            2,
            (5, 40),
        ),
        FaultKind("replica-restart", "the follower replica stopped (SIGTERM) and started again", 1, (1, 5)),
        FaultKind("apiserver-restart", "kube-apiserver stopped (SIGTERM) and started again on its address", 1, (1, 8)),
        FaultKind(
            "apiserver-slow",
            "every API request of both replicas held 0.5-3 s before it reaches the API server",
            2,
            (10, 40),
            _api_delay,
        ),
        FaultKind(
            "ca-restart",
            "the cluster-autoscaler killed or stopped, started again after the downtime",
            1,
            (1, 5),
            _signal,
        ),
        FaultKind("configmap-delete", "the journal or a learned-templates ConfigMap deleted", 1, (0, 0), _configmap),
        FaultKind(
            "configmap-conflict",
            "the journal or the learned-templates ConfigMaps changed by another writer 4 times a second",
            1,
            (5, 30),
            _configmap,
        ),
    )
}


@dataclass(frozen=True)
class FaultEvent:
    at: float  # seconds from the run's start
    kind: str
    duration: float
    params: dict[str, Any]

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.at:6.1f}s {self.kind} for {self.duration:.1f}s {extra}".rstrip()


@dataclass(frozen=True)
class PodEvent:
    at: float
    action: str  # "create" | "delete"
    pod: str
    shape: str


@dataclass(frozen=True)
class Schedule:
    seed: int
    seconds: float  # the chaos window: faults and workload changes happen in [0, seconds]
    faults: tuple[FaultEvent, ...]
    pods: tuple[PodEvent, ...]

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for event in self.faults:
            counts[event.kind] = counts.get(event.kind, 0) + 1
        return counts


def make_schedule(seed: int, seconds: float) -> Schedule:
    """The plan for ``seed`` over a chaos window of ``seconds``."""
    faults_rng = random.Random(f"faults-{seed}")
    kinds = list(FAULT_KINDS.values())
    weights = [kind.weight for kind in kinds]
    faults = []
    t = WARMUP + faults_rng.expovariate(1 / FAULT_GAP) / 2
    while t < seconds - 5:
        kind = faults_rng.choices(kinds, weights)[0]
        low, high = kind.duration
        at = round(t, 1)
        duration = min(round(faults_rng.uniform(low, high), 1), round(seconds - at, 1))
        faults.append(FaultEvent(at, kind.name, duration, kind.params(faults_rng)))
        t += faults_rng.expovariate(1 / FAULT_GAP)
    return Schedule(seed, seconds, tuple(faults), tuple(_workload(random.Random(f"pods-{seed}"), seconds)))


def _workload(rng: random.Random, seconds: float) -> list[PodEvent]:
    """Creations and deletions; the live pods are tracked here, so deletions pick among them and no shape
    ever has more pods than its pool holds."""
    live: dict[str, list[str]] = {name: [] for name in SHAPES}
    events: list[PodEvent] = []
    made = 0
    t = 1.0
    while t < seconds - 5:
        total = sum(len(pods) for pods in live.values())
        grow = total == 0 or rng.random() < 0.6
        if grow:
            shape = rng.choice([name for name in SHAPES if len(live[name]) < SHAPES[name].most] or [""])
            if shape:
                for _ in range(rng.randint(1, min(3, SHAPES[shape].most - len(live[shape])))):
                    name = f"w{made:03d}-{shape}"
                    made += 1
                    live[shape].append(name)
                    events.append(PodEvent(round(t, 1), "create", name, shape))
        else:
            shape = rng.choice([name for name in SHAPES if live[name]])
            for _ in range(rng.randint(1, len(live[shape]))):
                name = live[shape].pop(rng.randrange(len(live[shape])))
                events.append(PodEvent(round(t, 1), "delete", name, shape))
        t += rng.uniform(*WORKLOAD_GAP)
    return events
