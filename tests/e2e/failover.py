"""Fail-over as the cluster-autoscaler lives it (issue 30): two replicas behind a Service, the real CA 1.36.1
scaling through it, the leader cut off one of three ways, and what the CA sees measured from its side.

``fail_over(env, replicas, how)`` is the scenario; it asks of the Service only what ``Service``
(tests/e2e/replicas.py) offers, so the same code runs through the readiness-gated stand-in or a real
Service, whichever ``replicas(service=...)`` put in front of the replicas. The cuts:

- ``kill``: kill -9 of the leader (a crash, node loss): nothing drained, the Lease not handed back;
- ``sigterm``: the leader stopped gracefully (a rolling update, a pod deletion): it hands the Lease back;
- ``partition``: the leader cut off from the API server, not from the clouds nor from the CA: it keeps
  running, stops leading at its renew deadline, and the other replica takes the Lease when it expires.

Demand comes from pods that each need a new machine, one every ``ARRIVALS_EVERY`` from the cut on, so the
CA asks for a scale-up whenever it can. Figures: the new leader Ready (in the Service), its first
IncreaseSize answered OK and that write's arrival at the cloud, from the cut; IncreaseSize calls any
replica refused once the new leader was Ready; the CA's failed scale-ups and the loops it ended on a
provider error.

The partition's safety is read from the clouds' request logs (``cloud_writes``, ``leadership_terms``,
``check_terms``): every write carries the Lease holder and term that sent it (``Ca-Externalgrpc-Writer``),
and no term may write after the next one's first write, nor after its own renew deadline; each pool's size
moved by what the calls answered OK asked, less the answers the server took for the retry of a change
whose answer was lost (``check_sizes``), so no change was applied twice.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from protos import externalgrpc_pb2 as pb
from providers.http_transport import WRITER_HEADER
from tests.e2e.environment import E2EEnvironment, Layout, bizfly_pool, scaleway_pool
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, machines, pool_size
from tests.e2e.replicas import ReplicatedServer
from tests.support.repeating import Repeating

CLOUD = "scaleway"
# The CA's pool: one busy machine (a filler pod), room for many more; a pod of APP_CPU needs a machine.
# The burst pool (Bizfly) is written to directly by ``Hammer``; its machines never finish booting, so
# they never become Nodes and the CA leaves it alone.
LAYOUT = Layout(
    scaleway_pools=[scaleway_pool("general", "DEV1-M", 1, 1, 200)],
    bizfly_pools=[bizfly_pool("burst", "nix.2c_4g", 0, 0, 1000)],
)
BURST_BOOT = 1e6
ARRIVALS_EVERY = 4.0
# How long the CA is watched once the new leader is Ready (to count refusals and failed scale-ups).
OBSERVED = 20.0
# The CA flags these scenarios add: the pool only grows (every size change is an IncreaseSize, so the
# pool's final size says whether one was applied twice); a failed scale-up backs the group off 5 s, not
# the default 5 minutes, so the CA keeps asking (each is counted all the same); machines that never boot
# are not given up on within a run.
CA_FLAGS = {
    "scale-down-enabled": "false",
    "initial-node-group-backoff-duration": "5s",
    "max-node-provision-time": "30m",
}


def prepare(env: E2EEnvironment) -> None:
    """The general pool's one machine busy, so each new pod needs a new machine; the burst pool's machines
    never boot."""
    (only,) = machines(env, CLOUD, "general")
    env.create_pod("filler", cpu=FILLER_CPU[CLOUD], node_name=only["name"])
    env.wait_pod_running("filler", 60)
    env.bz.state.timings = dataclasses.replace(env.bz.state.timings, provision_seconds=BURST_BOOT)


# ---------------------------------------------------------------------------------------------- demand
class Arrivals(Repeating):
    """Creates a pod that needs a new machine of the CA's pool every ``every`` seconds, until stopped."""

    def __init__(self, env: E2EEnvironment, every: float = ARRIVALS_EVERY, prefix: str = "arrival") -> None:
        super().__init__("arrivals", every, at_once=True)
        self.env, self.prefix = env, prefix
        self.created: list[float] = []

    def tick(self) -> None:
        name = f"{self.prefix}-{len(self.created)}"
        self.env.create_pod(name, cpu=APP_CPU[CLOUD], node_selector={POOL_LABEL[CLOUD]: "general"})
        self.created.append(time.time())


@dataclass
class HammerCall:
    at: float
    replica: str
    code: str
    details: str


class Hammer:
    """Sends IncreaseSize +1 for ``group`` to every replica directly (not through the Service: a client the
    partition does not cut off), each every ``every`` seconds, so a leader that has lost its Lease is asked
    to write right up to its renew deadline, and the next one from the moment it serves."""

    def __init__(self, replicas: ReplicatedServer, group: str, every: float = 0.5) -> None:
        self.replicas, self.group, self.every = replicas, group, every
        self.calls: list[HammerCall] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(name,), name=f"hammer-{name}", daemon=True)
            for name in replicas.replicas
            if name not in replicas.killed
        ]

    def start(self) -> Hammer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def ok(self) -> list[HammerCall]:
        with self._lock:
            return [c for c in self.calls if c.code == "OK"]

    def _run(self, name: str) -> None:
        stub = self.replicas.replicas[name].process.stub
        request = pb.NodeGroupIncreaseSizeRequest(id=self.group, delta=1)
        while not self._stop.wait(self.every):
            at = time.time()
            try:
                stub.NodeGroupIncreaseSize(request, timeout=8)
                call = HammerCall(at, name, "OK", "")
            except grpc.RpcError as err:
                call = HammerCall(at, name, err.code().name, err.details() or "")
            with self._lock:
                self.calls.append(call)


# ---------------------------------------------------------------------------------------------- what the logs say
def server_log(replicas: ReplicatedServer, name: str) -> list[dict[str, Any]]:
    records = []
    for line in replicas.replicas[name].log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def increase_calls(replicas: ReplicatedServer, since: float = 0.0, group: str = "") -> list[dict[str, Any]]:
    """Every NodeGroupIncreaseSize a replica answered (its log), with ``replica`` and ``at`` (seconds) added."""
    found = []
    for name in replicas.replicas:
        for record in server_log(replicas, name):
            if record.get("grpcMethod") != "NodeGroupIncreaseSize" or (group and record.get("nodeGroup") != group):
                continue
            at = float(record["ts"]) / 1000
            if at >= since:
                found.append({**record, "replica": name, "at": at})
    return sorted(found, key=lambda r: r["at"])


@dataclass(frozen=True)
class Term:
    """One leadership term, from the replica's log: its Lease holder name and the Lease's term number."""

    replica: str
    holder: str
    lease_term: int
    began: float
    ended: float | None  # when it stopped writing ("lost leadership": its renew deadline), None: still leads
    reason: str = ""


def leadership_terms(replicas: ReplicatedServer) -> list[Term]:
    terms: list[Term] = []
    for name in replicas.replicas:
        current: dict[str, Any] | None = None
        for record in server_log(replicas, name):
            message = str(record.get("msg", ""))
            if message == "became the leader":
                current = record
            elif message.startswith("lost leadership") and current is not None:
                terms.append(_term(name, current, record))
                current = None
        if current is not None:
            terms.append(_term(name, current, None))
    return sorted(terms, key=lambda t: t.lease_term)


def _term(replica: str, began: dict[str, Any], ended: dict[str, Any] | None) -> Term:
    return Term(
        replica,
        str(began["identity"]),
        int(began.get("leaseTerm", 0)),
        float(began["ts"]) / 1000,
        float(ended["ts"]) / 1000 if ended is not None else None,
        str(ended.get("reason", "")) if ended is not None else "",
    )


@dataclass(frozen=True)
class CloudWrite:
    at: float  # when the simulator applied and answered it
    cloud: str
    route: str
    holder: str
    lease_term: int | None  # None: the write named no term
    body: Any


def cloud_writes(env: E2EEnvironment, since: float = 0.0) -> list[CloudWrite]:
    """Every request that changed a cloud (not a GET, not a login), with the writer it named."""
    writes = []
    for cloud, sim in (("scaleway", env.scw), ("bizfly", env.bz)):
        for request in sim.requests.all():
            if request.method in ("GET", "HEAD") or request.at < since or "token" in request.route:
                continue
            writer = request.headers.get(WRITER_HEADER.lower(), "")
            holder, _, term = writer.partition("; term=")
            writes.append(
                CloudWrite(request.at, cloud, request.route, holder, int(term) if term else None, request.body)
            )
    return sorted(writes, key=lambda w: w.at)


@dataclass
class TermCheck:
    """The partition result: writes per term, the gap between terms, and what broke the rules."""

    writes_per_term: list[tuple[int, str, int]] = field(default_factory=list)  # (term, replica, writes)
    gaps: list[float] = field(default_factory=list)  # next term's first write - this term's last, seconds
    before_deadline: list[float] = field(default_factory=list)  # its renew deadline - its last write, seconds
    unnamed: list[CloudWrite] = field(default_factory=list)  # writes naming no term
    overlaps: list[str] = field(default_factory=list)  # an older term writing after a newer term's first write
    after_deadline: list[str] = field(default_factory=list)  # a term writing after its renew deadline


def check_terms(writes: Iterable[CloudWrite], terms: list[Term]) -> TermCheck:
    result = TermCheck()
    by_term: dict[int, list[CloudWrite]] = {}
    for write in writes:
        if write.lease_term is None:
            result.unnamed.append(write)
        else:
            by_term.setdefault(write.lease_term, []).append(write)
    known = {t.lease_term: t for t in terms}
    for number, found in sorted(by_term.items()):
        term = known.get(number)
        result.writes_per_term.append((number, term.replica if term else "?", len(found)))
        if term is not None and {w.holder for w in found} != {term.holder}:
            result.overlaps.append(f"term {number} writes name holders {sorted({w.holder for w in found})}")
        last = max(w.at for w in found)
        if term is not None and term.ended is not None:
            result.before_deadline.append(term.ended - last)
            late = [w for w in found if w.at > term.ended]
            result.after_deadline += [
                f"term {number} ({term.replica}) wrote {w.route} {w.at - term.ended:.3f}s after its end" for w in late
            ]
        newer = [w for n, ws in by_term.items() if n > number for w in ws]
        if newer:
            first_newer = min(w.at for w in newer)
            result.gaps.append(first_newer - last)
            if last >= first_newer:
                result.overlaps.append(
                    f"term {number} wrote {last - first_newer:.3f}s after a newer term's first write"
                )
    return result


def group_of(env: E2EEnvironment, cloud: str, pool: str) -> str:
    return str(env.scaleway_pool(pool)["id"] if cloud == "scaleway" else env.bizfly_pool(pool)["id"])


def settle(env: E2EEnvironment, replicas: ReplicatedServer, pools: Iterable[tuple[str, str]]) -> None:
    """One more IncreaseSize +1 per pool, to the leader: if the last change of a pool ended with an unknown
    outcome, this is its retry (recognised when it was applied, as the CA's next call would be), so every
    change that reached the cloud was answered OK once (``check_sizes``)."""
    stub = replicas.leader().process.stub
    for cloud, pool in pools:
        stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group_of(env, cloud, pool), delta=1), timeout=10)


ABSORBED = "increase already applied by an earlier call whose answer was lost"


@dataclass(frozen=True)
class PoolGrowth:
    """How a pool grew against what the IncreaseSize calls answered OK asked for (the pools only grow in
    these scenarios). ``absorbed``: OK answers the server gave without writing, taking the call for the retry
    of a change whose answer was lost (its own, or one adopted from the journal: providers/backend.py).
    No change was applied twice when ``grew == asked - absorbed``."""

    pool: str
    grew: int
    asked: int
    absorbed: int
    unknown: int  # calls answered "not confirmed" (outcome unknown)

    @property
    def once(self) -> bool:
        return self.grew == self.asked - self.absorbed


def check_sizes(
    env: E2EEnvironment, replicas: ReplicatedServer, initial: dict[tuple[str, str], int]
) -> list[PoolGrowth]:
    out = []
    for (cloud, pool), before in initial.items():
        group = group_of(env, cloud, pool)
        calls = increase_calls(replicas, group=group)
        asked = sum(int(r.get("delta", 0)) for r in calls if r.get("grpcCode") == "OK")
        unknown = sum(1 for r in calls if "not confirmed" in str(r.get("msg", "")))
        absorbed = sum(
            int(r.get("delta", 0))
            for name in replicas.replicas
            for r in server_log(replicas, name)
            if r.get("msg") == ABSORBED and r.get("nodeGroup") == group
        )
        out.append(PoolGrowth(f"{cloud}/{pool}", pool_size(env, cloud, pool) - before, asked, absorbed, unknown))
    return out


def pool_sizes(env: E2EEnvironment) -> dict[tuple[str, str], int]:
    return {
        (CLOUD, "general"): pool_size(env, CLOUD, "general"),
        ("bizfly", "burst"): pool_size(env, "bizfly", "burst"),
    }


# ---------------------------------------------------------------------------------------------- the scenario
@dataclass
class FailoverFigures:
    how: str
    old: str
    new: str
    new_ready: float = float("nan")  # seconds from the cut: the new leader an endpoint of the Service
    first_write: float = float("nan")  # its first IncreaseSize answered OK
    first_cloud_write: float = float("nan")  # the cloud write of the new term that came first
    refused_after_ready: int = 0  # IncreaseSize calls any replica refused once the new leader was Ready
    increases_after_ready: int = 0
    failed_scale_ups: int = 0  # the CA's own count over the run
    failed_loops: int = 0  # CA loops ended by a provider error (Refresh refused, no connection) after the cut
    refused_details: list[str] = field(default_factory=list)

    def row(self) -> str:
        return (
            f"{self.how:10} new leader Ready {self.new_ready:5.1f}s, first accepted write {self.first_write:5.1f}s "
            f"(at the cloud {self.first_cloud_write:5.1f}s); IncreaseSize refused after Ready "
            f"{self.refused_after_ready} of {self.increases_after_ready}; CA failed scale-ups "
            f"{self.failed_scale_ups}, loops ended on a provider error {self.failed_loops}"
        )


CUTS: dict[str, Callable[[ReplicatedServer, str], None]] = {
    "kill": ReplicatedServer.kill,
    "sigterm": ReplicatedServer.terminate,
    "partition": ReplicatedServer.cut_api,
}


def fail_over(env: E2EEnvironment, replicas: ReplicatedServer, how: str) -> FailoverFigures:
    """Cut the leader off (``how``: a key of CUTS) while pods keep arriving, and measure from the CA's side."""
    old = replicas.leader().name
    (new,) = [name for name in replicas.replicas if name != old]
    figures = FailoverFigures(how, old, new)
    failed_before = env.ca.metric("failed_scale_ups_total")
    arrivals = Arrivals(env, prefix=f"{how}-pod")
    cut = time.time()
    # The cut first (a kill is instant; SIGTERM waits for the drain), then the pods.
    cutter = threading.Thread(target=CUTS[how], args=(replicas, old), daemon=True)
    cutter.start()
    arrivals.start()
    try:
        env.wait_for(
            lambda: replicas.service.ready() == new, replicas.lease_duration + 40, "the new leader Ready", 0.05
        )
        ready_at = replicas.service.ready_since(new)
        assert ready_at is not None
        figures.new_ready = ready_at - cut
        accepted = env.wait_for(
            lambda: [r for r in increase_calls(replicas, cut) if r["replica"] == new and r.get("grpcCode") == "OK"],
            90,
            "an IncreaseSize from the CA answered OK by the new leader",
        )
        figures.first_write = accepted[0]["at"] - cut
        time.sleep(max(0.0, ready_at + OBSERVED - time.time()))
    finally:
        arrivals.stop()
        cutter.join(timeout=60)
    after = increase_calls(replicas, ready_at)
    figures.increases_after_ready = len(after)
    refused = [r for r in after if r.get("grpcCode") != "OK"]
    figures.refused_after_ready = len(refused)
    figures.refused_details = [f"{r['at'] - cut:.1f}s {r['replica']} {r.get('msg', '')}" for r in refused]
    new_holders = {t.holder for t in leadership_terms(replicas) if t.replica == new}
    new_writes = [w for w in cloud_writes(env, cut) if w.holder in new_holders]
    figures.first_cloud_write = new_writes[0].at - cut if new_writes else float("nan")
    figures.failed_scale_ups = round(env.ca.metric("failed_scale_ups_total") - failed_before)
    figures.failed_loops = len(env.ca.log.matching(r"Failed to refresh cloud provider", cut))
    return figures
