"""The nemesis and the workload: they play a schedule (schedule.py) against a running environment.

Each fault starts at its planned second in a thread of its own and ends after its duration, so faults
overlap freely. "The leader" and "the follower" are resolved when the fault starts (the replica the
Service routes to, else the Lease holder); a fault whose target is already down (another fault killed it)
is skipped and recorded as such. ``heal`` waits for every fault to end, then makes sure nothing is left:
no cloud fault, both replicas running and reaching the API server at full speed, the API server and the
CA running, no other writer on the ConfigMaps.

Every action is recorded with its wall-clock times (``Applied``), for the run's report: the checker reads
the record of what was injected but decides nothing from it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes.client.rest import ApiException

from devstack.harness import ServerStartError
from simulators.common.faults import Fault
from tests.e2e.chaos.history import KITS
from tests.e2e.chaos.schedule import SHAPES, FaultEvent, PodEvent, Schedule
from tests.e2e.environment import E2EEnvironment
from tests.e2e.pools import POOL_LABEL
from tests.e2e.processes import ProcessFailed
from tests.e2e.replicas import BACKEND_NAMES, JOURNAL_CONFIGMAP, NAMESPACE, TEMPLATES_PREFIX, ReplicatedServer

#: How often a conflicting writer changes the ConfigMaps, and how long an action that fails (the API server
#: is down, a replica will not start) is retried before it is recorded as failed.
CONFLICT_EVERY = 0.25
RETRY_FOR = 60.0


@dataclass
class Applied:
    kind: str
    planned: float  # seconds from the run's start
    began: float = 0.0  # wall clock
    ended: float = 0.0
    target: str = ""
    note: str = ""  # "skipped: ..." when it did nothing; errors met on the way

    @property
    def injected(self) -> bool:
        return not self.note.startswith("skipped")


def _routes(cloud: str, which: str) -> list[tuple[str, str]]:
    """(route, method) pairs of a cloud's writes, reads or both."""
    kit = KITS[cloud]
    writes = [(kit.update_route, "PATCH"), (kit.delete_route, "DELETE")]
    reads = [(route, "GET") for route in kit.read_routes]
    return {"writes": writes, "reads": reads, "all": writes + reads}[which]


def cloud_faults(event: FaultEvent) -> list[Fault]:
    """The simulator faults of a cloud fault event."""
    p = event.params
    found = []
    for route, method in _routes(p["cloud"], p["routes"]):
        write = method != "GET"
        if event.kind == "cloud-5xx":
            found.append(Fault(route=route, method=method, status=p["status"], apply=write and p["applied"]))
        elif event.kind == "cloud-429":
            found.append(Fault(route=route, method=method, status=429, retry_after=p["retry_after"]))
        elif event.kind == "cloud-slow":
            found.append(Fault(route=route, method=method, delay=p["delay"]))
        elif event.kind == "cloud-hang":
            found.append(Fault(route=route, method=method, delay=p["delay"], apply=True))
        elif event.kind == "cloud-drop-applied":
            found.append(Fault(route=route, method=method, drop=True, apply=True))
    return found


class Nemesis:
    def __init__(self, env: E2EEnvironment, replicas: ReplicatedServer, schedule: Schedule) -> None:
        self.env, self.replicas, self.schedule = env, replicas, schedule
        self.record: list[Applied] = []
        self._lock = threading.Lock()  # one replica action at a time: kills, restarts, who is down
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Faults that overlap on one target end one by one: a replica stays cut off while any partition of it
        # lasts, and the API requests are held back by the longest delay of the slow faults under way.
        self._cuts: dict[str, int] = {}
        self._delays: list[float] = []
        # The CA and the API server are one process each: a restart of one while its last restart is under
        # way is skipped (two overlapping restarts started two CAs side by side, seed 11).
        self._restarting: set[str] = set()

    # ------------------------------------------------------------------ playing the schedule
    def play(self, start: float) -> None:
        """Start each fault at ``start`` (time.monotonic) + its planned second; returns once all have started."""
        for event in self.schedule.faults:
            if self._stop.wait(max(0.0, start + event.at - time.monotonic())):
                return
            applied = Applied(event.kind, event.at, began=time.time())
            self.record.append(applied)
            thread = threading.Thread(
                target=self._run, args=(event, applied), name=f"nemesis-{event.kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _run(self, event: FaultEvent, applied: Applied) -> None:
        try:
            action = getattr(self, "_" + event.kind.replace("-", "_"))
            action(event, applied)
        except Exception as err:  # recorded: the run goes on, and heal() puts things right
            applied.note += f" error: {type(err).__name__}: {err}"
        applied.ended = time.time()

    def _wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    # ------------------------------------------------------------------ clouds
    def _cloud(self, event: FaultEvent, applied: Applied) -> None:
        sim = self.env.scw if event.params["cloud"] == "scaleway" else self.env.bz
        faults = cloud_faults(event)
        applied.target = f"{event.params['cloud']} {event.params['routes']}"
        for fault in faults:
            sim.faults.add(fault)
        self._wait(event.duration)
        for fault in faults:
            sim.faults.remove(fault)

    _cloud_5xx = _cloud_429 = _cloud_slow = _cloud_hang = _cloud_drop_applied = _cloud

    # ------------------------------------------------------------------ replicas
    def _pick(self, role: str) -> str | None:
        """The replica playing ``role`` now ("leader" or "follower"), None when it is down."""
        alive = [name for name in self.replicas.replicas if name not in self.replicas.killed]
        leader = self.replicas.service.ready()
        if leader is None:
            with contextlib.suppress(Exception):
                holder = self.replicas.holder()
                leader = holder if holder in alive else None
        if role == "leader":
            return leader if leader in alive else None
        others = [name for name in alive if name != leader]
        return others[0] if others else None

    def _down_and_up(self, role: str, event: FaultEvent, applied: Applied, stop: Callable[[str], None]) -> None:
        with self._lock:
            name = self._pick(role)
            if name is None:
                applied.note = f"skipped: no {role} running"
                return
            applied.target = name
            stop(name)
        self._wait(event.duration)
        self._start_again(name, applied)

    def _start_again(self, name: str, applied: Applied) -> None:
        deadline = time.monotonic() + RETRY_FOR
        while True:
            with self._lock:
                if name not in self.replicas.killed:
                    return
                try:
                    self.replicas.start_again(name)
                    return
                except (ServerStartError, RuntimeError) as err:
                    if time.monotonic() > deadline:
                        applied.note += f" {name} would not start again: {err}"
                        return
            time.sleep(2)

    def _leader_kill(self, event: FaultEvent, applied: Applied) -> None:
        self._down_and_up("leader", event, applied, self.replicas.kill)

    def _leader_terminate(self, event: FaultEvent, applied: Applied) -> None:
        self._down_and_up("leader", event, applied, self.replicas.terminate)

    def _replica_restart(self, event: FaultEvent, applied: Applied) -> None:
        self._down_and_up("follower", event, applied, self.replicas.terminate)

    def _leader_partition(self, event: FaultEvent, applied: Applied) -> None:
        with self._lock:
            name = self._pick("leader")
            if name is None:
                applied.note = "skipped: no leader running"
                return
            applied.target = name
            self._cuts[name] = self._cuts.get(name, 0) + 1
            self.replicas.cut_api(name)
        self._wait(event.duration)
        with self._lock:
            self._cuts[name] -= 1
            if not self._cuts[name]:
                self.replicas.heal_api(name)

    def _apiserver_slow(self, event: FaultEvent, applied: Applied) -> None:
        applied.target = "both replicas"
        with self._lock:
            self._delays.append(event.params["delay"])
            self._slow(max(self._delays))
        self._wait(event.duration)
        with self._lock:
            self._delays.remove(event.params["delay"])
            self._slow(max(self._delays, default=0.0))

    def _slow(self, delay: float) -> None:
        for name in self.replicas.replicas:
            self.replicas.slow_api(name, delay)

    # ------------------------------------------------------------------ the control plane and the CA
    def _apiserver_restart(self, event: FaultEvent, applied: Applied) -> None:
        control_plane = self.env.control_plane
        assert control_plane is not None
        applied.target = "kube-apiserver"
        self._restart_once("kube-apiserver", applied, lambda: control_plane.restart_apiserver(down=event.duration))

    def _ca_restart(self, event: FaultEvent, applied: Applied) -> None:
        applied.target = f"cluster-autoscaler {event.params['signal']}"
        sig = signal.Signals[event.params["signal"]]
        self._restart_once("cluster-autoscaler", applied, lambda: self.env.ca.restart(sig, down=event.duration))

    def _restart_once(self, target: str, applied: Applied, restart: Callable[[], None]) -> None:
        with self._lock:
            if target in self._restarting:
                applied.note = f"skipped: {target} is restarting already"
                return
            self._restarting.add(target)
        try:
            restart()
        finally:
            with self._lock:
                self._restarting.discard(target)

    # ------------------------------------------------------------------ the features' ConfigMaps
    def _configmaps(self, which: str) -> list[str]:
        if which == "journal":
            return [JOURNAL_CONFIGMAP]
        return [f"{TEMPLATES_PREFIX}-{backend}" for backend in BACKEND_NAMES.values()]

    def _configmap_delete(self, event: FaultEvent, applied: Applied) -> None:
        names = self._configmaps(event.params["configmap"])
        applied.target = ", ".join(names)
        gone = 0
        for name in names:
            try:
                self.env.core.delete_namespaced_config_map(name, NAMESPACE)
                gone += 1
            except ApiException as err:
                if err.status != 404:
                    raise
        if not gone:
            applied.note = "skipped: none of them existed yet"

    def _configmap_conflict(self, event: FaultEvent, applied: Applied) -> None:
        names = self._configmaps(event.params["configmap"])
        applied.target = ", ".join(names)
        end = time.monotonic() + event.duration
        changes = 0
        while time.monotonic() < end and not self._stop.is_set():
            for name in names:
                patch = {"metadata": {"annotations": {"chaos.example/other-writer": str(changes)}}}
                with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError):  # absent, API down
                    self.env.core.patch_namespaced_config_map(name, NAMESPACE, patch)
                    changes += 1
            time.sleep(CONFLICT_EVERY)
        applied.note = f"{changes} changes"

    # ------------------------------------------------------------------ healing
    def heal(self) -> None:
        """Wait for every fault to end, then leave nothing broken."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=RETRY_FOR + 60)
        for sim in (self.env.scw, self.env.bz):
            sim.faults.clear()
        for name in self.replicas.replicas:
            self.replicas.heal_api(name)
            self.replicas.slow_api(name, 0.0)
            if name in self.replicas.killed:
                self._start_again(name, Applied("heal", 0.0))
        assert self.env.control_plane is not None
        self.env.control_plane.check_running()
        with contextlib.suppress(ProcessFailed):
            self.env.ca.check_running()
            return
        self.env.ca.start()


@dataclass
class Workload:
    """Creates and deletes the schedule's pods at their planned seconds; retries while the API server is
    down. ``done`` records when each action took effect."""

    env: E2EEnvironment
    schedule: Schedule
    done: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, start: float) -> Workload:
        self._thread = threading.Thread(target=self._run, args=(start,), name="chaos-workload", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RETRY_FOR + 10)

    def _run(self, start: float) -> None:
        for event in self.schedule.pods:
            if self._stop.wait(max(0.0, start + event.at - time.monotonic())):
                return
            self._apply(event)

    def _apply(self, event: PodEvent) -> None:
        shape = SHAPES[event.shape]
        deadline = time.monotonic() + RETRY_FOR
        while True:
            try:
                if event.action == "create":
                    self.env.create_pod(
                        event.pod,
                        cpu=shape.cpu,
                        memory=shape.memory,
                        node_selector={POOL_LABEL[shape.cloud]: shape.pool},
                    )
                else:
                    self.env.core.delete_namespaced_pod(event.pod, "default", grace_period_seconds=0)
                break
            except ApiException as err:
                if err.status in (404, 409):  # already gone, or created by an attempt whose answer was lost
                    break
                if time.monotonic() > deadline:
                    raise
            except (OSError, urllib3.exceptions.HTTPError):  # the API server is down
                if time.monotonic() > deadline:
                    raise
            time.sleep(1)
        self.done.append({"at": time.time(), "action": event.action, "pod": event.pod, "shape": event.shape})
