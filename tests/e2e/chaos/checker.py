"""The chaos campaign's checker: every invariant decided from the run's history (history.py) alone, never
from what our server logged or answered. Pure functions of that JSON document.

Words: a *write* is a request the cloud received that asks for a change (a pool's size, a node's
deletion); it was *applied* when the cloud's own handler answered it 2xx (``handled``), whatever answer the
sender got (a fault may have dropped or spoiled it); its time is when the cloud had *received* it in full.
A *term* is a Lease holder and the Lease's ``leaseTransitions`` it holds the Lease with, as the API server
returned them to a successful create or update of the Lease by a replica (the audit log); a write names
its term in the ``Ca-Externalgrpc-Writer`` header (``<holder>; term=<n>``). A *CA ask* is a decision in
the cluster-autoscaler's own log: ``Scale-up: setting group G size to N``, ``Decreasing size of G,
expected=E current=C delta=D`` (asks for C+D), ``Scale-down: removing [empty] node X``, ``Marking
unregistered node X for removal``, ``Deleting K from G node group because of create errors``.

The invariants (``INVARIANTS``), each checked once per item it names:

``asked-size`` (each applied size write): it was received within ``ASK_WINDOW`` (the CA's gRPC timeout and
  1 s) after a CA ask for its pool, and sets no more than the largest size those asks named. A change
  applied twice (a retry taken for a new change, a journal entry replayed) sets more than the CA asked.
``asked-delete`` (each applied node deletion): the machine it names (by any of its ids) is one the cloud
  showed, and the CA asked, within ``DELETE_ASK_WINDOW`` before, to remove it (by its Node name, any case,
  or its providerID), or to delete that many machines with create errors from its pool while the cloud
  showed it failed.
``bounds`` (each applied size write, each observed size, each final size): within the pool's min and max.
``term-named`` (each write): it names a term, and that term held the Lease: the API server answered a
  replica's write of the Lease with that holder and transitions at or before the write was received.
``term-deadline`` (each write): received no later than ``renew_deadline`` after the API server received
  the last successful Lease write of its term before it. (The server counts its deadline from when it
  *sent* that write, which is earlier: this bound is the looser one; a write past it is past the server's.)
``term-order`` (each pair of consecutive terms that wrote): no write of the older term was received after
  the first write of the newer one (terms ordered by their Lease transitions, then by when they began).
``pods-run`` (each workload pod at the end; every one fits a pool by construction, schedule.SHAPES): it
  is Running, started no later than ``settle_bound`` seconds after the healing, or after its creation if
  that came later.
``ca-equals-cloud`` (each pool, after settling): the CA's last status names the pool's node group with a
  cloudProviderTarget equal to the pool's size and as many registered nodes as the pool has live machines.
``no-orphans`` (each pool and each machine, after settling): a pool's live machines are as many as its
  size, every live machine has a Node with its providerID, and every Node with a providerID of these
  clouds has a live machine.
``memory`` (each replica process): every sample of its resident memory is at most ``memory_bound_mib``.

Also counted, for what a user feels (not invariants): the CA's failed scale-ups (``Failed to scale up``),
its loops that ended on an error (a ``Failed to ...`` line from static_autoscaler.go in a loop), and the
seconds from the healing to a settled cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.e2e.environment import status_groups

#: Seconds after a CA ask in which the size write it causes reaches the cloud: the CA's gRPC timeout
#: (every write our server sends for a call goes out within the call's deadline) and a second for the
#: processes' scheduling; and how old an ask to remove a node may be when its deletion arrives.
ASK_SLACK = 1.0
DELETE_ASK_WINDOW = 120.0
#: A log line and a request are timed by two processes' clocks read a few instructions apart.
CLOCK_SLACK = 0.2
CLOUD_PROVIDER_PREFIXES = ("scaleway://", "bizflycloud://")

INVARIANTS = (
    "asked-size",
    "asked-delete",
    "bounds",
    "term-named",
    "term-deadline",
    "term-order",
    "pods-run",
    "ca-equals-cloud",
    "no-orphans",
    "memory",
)


@dataclass
class Result:
    invariant: str
    checks: int = 0
    violations: list[str] = field(default_factory=list)

    def check(self, ok: bool, violation: str) -> None:
        """One check of this invariant; ``violation`` says what broke when ``ok`` is false."""
        self.checks += 1
        if not ok:
            self.violations.append(violation)


@dataclass
class Feel:
    failed_scale_ups: int
    failed_loops: int
    loops: int
    settle_seconds: float | None
    # Loops whose Refresh failed to connect although a replica had been Ready in the Service for
    # READY_LONG_ENOUGH seconds: the CA's gRPC channel waiting out its reconnection backoff.
    unreachable_while_ready: int = 0


@dataclass
class Verdict:
    results: dict[str, Result]
    feel: Feel

    @property
    def checks(self) -> int:
        return sum(r.checks for r in self.results.values())

    @property
    def violations(self) -> list[str]:
        return [f"{r.invariant}: {v}" for r in self.results.values() for v in r.violations]


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Ask:
    at: float
    kind: str  # "size" | "delete" | "create-errors"
    group: str = ""
    size: int = 0
    node: str = ""
    count: int = 0


_ASKS: list[tuple[re.Pattern[str], Callable[[re.Match[str], float], Ask]]] = [
    (re.compile(r"^Scale-up: setting group (\S+) size to (\d+)"), lambda m, t: Ask(t, "size", m[1], int(m[2]))),
    (
        re.compile(r"^Decreasing size of (\S+), expected=(-?\d+) current=(-?\d+) delta=(-?\d+)"),
        lambda m, t: Ask(t, "size", m[1], int(m[3]) + int(m[4])),
    ),
    (re.compile(r'^Scale-down: removing (?:empty )?node "?([^",\s]+)"?'), lambda m, t: Ask(t, "delete", node=m[1])),
    (re.compile(r"^Marking unregistered node (\S+) for removal"), lambda m, t: Ask(t, "delete", node=m[1])),
    (
        re.compile(r"^Deleting (\d+) from (\S+) node group because of create errors"),
        lambda m, t: Ask(t, "create-errors", m[2], count=int(m[1])),
    ),
]


def ca_asks(lines: Iterable[dict[str, Any]]) -> list[Ask]:
    asks = []
    for line in lines:
        for pattern, make in _ASKS:
            match = pattern.search(line["msg"])
            if match:
                asks.append(make(match, float(line["at"])))
                break
    return asks


def size_of(write: dict[str, Any]) -> int | None:
    """The size a pool write asks for (Scaleway ``size``, Bizfly ``desired_size``; Bizfly's client omits a
    0), None for a write that is not a size change."""
    if write["method"] != "PATCH" or "pool" not in write["route"]:
        return None
    body = write.get("body") or {}
    if write["cloud"] == "scaleway":
        return int(body["size"]) if "size" in body else None
    return int(body.get("desired_size") or 0)


def pool_of(write: dict[str, Any]) -> str:
    """The pool id a size write names: the path segment after ``pools/`` (Scaleway) or the last (Bizfly)."""
    parts = write["path"].rstrip("/").split("/")
    return parts[parts.index("pools") + 1] if "pools" in parts else parts[-1]


def node_ref(write: dict[str, Any]) -> str:
    return str(write["path"].rstrip("/").split("/")[-1])


def is_delete(write: dict[str, Any]) -> bool:
    return bool(write["method"] == "DELETE" and "node" in write["route"])


def applied(write: dict[str, Any]) -> bool:
    return write.get("handled") is not None and 200 <= int(write["handled"]) < 300


def writer_term(write: dict[str, Any]) -> tuple[str, int] | None:
    holder, sep, term = str(write.get("writer") or "").partition("; term=")
    if not sep or not holder or not term.isdigit():
        return None
    return holder, int(term)


# ---------------------------------------------------------------------------------------------- the checks
def check(history: dict[str, Any]) -> Verdict:
    results = {name: Result(name) for name in INVARIANTS}
    config = history["config"]
    asks = ca_asks(history["ca_log"])
    pools = {p["id"]: p for p in history["pools"]}
    writes = history["writes"]
    machines = history["machines"]
    _asked_size(results["asked-size"], writes, asks, float(config["ca_grpc_timeout"]) + ASK_SLACK)
    _asked_delete(results["asked-delete"], writes, asks, machines)
    _bounds(results["bounds"], writes, pools, history["sizes"], history["final"]["pools"])
    _terms(results, writes, history["lease"], float(config["renew_deadline"]))
    _pods_run(results["pods-run"], history, float(config["settle_bound"]))
    _ca_equals_cloud(results["ca-equals-cloud"], history)
    _no_orphans(results["no-orphans"], history)
    _memory(results["memory"], history["memory"], float(config["memory_bound_mib"]))
    return Verdict(results, feel(history))


def _asked_size(result: Result, writes: list[dict[str, Any]], asks: list[Ask], window: float) -> None:
    for write in writes:
        size = size_of(write)
        if size is None or not applied(write):
            continue
        pool, received = pool_of(write), float(write["received"])
        near = [
            a
            for a in asks
            if a.kind == "size" and a.group == pool and received - window <= a.at <= received + CLOCK_SLACK
        ]
        result.check(
            bool(near) and size <= max(a.size for a in near),
            (
                f"{write['cloud']} pool {pool} set to {size} at {received:.3f}: "
                + (
                    f"the CA asked for at most {max(a.size for a in near)}"
                    if near
                    else f"no CA ask in the {window:g} s before"
                )
            ),
        )


def _asked_delete(
    result: Result, writes: list[dict[str, Any]], asks: list[Ask], machines: list[dict[str, Any]]
) -> None:
    by_ref = {ref: m for m in machines for ref in m["refs"] if ref}
    for write in writes:
        if not is_delete(write) or not applied(write):
            continue
        ref, received = node_ref(write), float(write["received"])
        machine = by_ref.get(ref)
        recent = [a for a in asks if received - DELETE_ASK_WINDOW <= a.at <= received + CLOCK_SLACK]
        result.check(
            machine is not None and _asked_to_remove(machine, recent),
            (
                f"{write['cloud']} deleted {ref} at {received:.3f}, "
                + (
                    "a machine the cloud never showed"
                    if machine is None
                    else f"node {machine['name']}: the CA never asked"
                )
            ),
        )


def _asked_to_remove(machine: dict[str, Any], asks: list[Ask]) -> bool:
    names = {machine["name"].lower(), machine["provider_id"].lower()}
    if any(a.kind == "delete" and a.node.lower() in names for a in asks):
        return True
    failed = "failed" in machine["states"]
    return failed and any(a.kind == "create-errors" and a.group == machine["pool_id"] for a in asks)


def _bounds(
    result: Result,
    writes: list[dict[str, Any]],
    pools: dict[str, dict[str, Any]],
    sizes: list[dict[str, Any]],
    final: list[dict[str, Any]],
) -> None:
    def within(pool_id: str, size: int, what: str) -> None:
        pool = pools.get(pool_id)
        result.check(
            pool is not None and pool["min"] <= size <= pool["max"],
            (
                f"{what}: pool {pool_id} at {size}, outside "
                + (f"[{pool['min']}, {pool['max']}]" if pool else "every known pool")
            ),
        )

    for write in writes:
        size = size_of(write)
        if size is not None and applied(write):
            within(pool_of(write), size, f"size write received at {float(write['received']):.3f}")
    for seen in sizes:
        within(seen["pool_id"], int(seen["size"]), f"observed at {float(seen['at']):.3f}")
    for pool in final:
        within(pool["id"], int(pool["size"]), "final state")


def _terms(
    results: dict[str, Result], writes: list[dict[str, Any]], lease: list[dict[str, Any]], deadline: float
) -> None:
    held: dict[tuple[str, int], list[float]] = {}  # term -> when the API server received its successful writes
    for entry in lease:
        if 200 <= int(entry["code"]) < 300 and entry["holder"]:
            held.setdefault((entry["holder"], int(entry["transitions"])), []).append(float(entry["received"]))
    by_term: dict[tuple[str, int], list[float]] = {}
    for write in writes:
        received, term = float(write["received"]), writer_term(write)
        renewals = [at for at in held.get(term, []) if at <= received + CLOCK_SLACK] if term else []
        results["term-named"].check(
            bool(renewals),
            (
                f"{write['cloud']} {write['method']} {write['path']} at {received:.3f} names "
                + (f"term {term}, which had not taken the Lease by then" if term else "no term")
            ),
        )
        if not renewals or term is None:
            continue
        by_term.setdefault(term, []).append(received)
        last = max(renewals)
        results["term-deadline"].check(
            received <= last + deadline,
            (
                f"term {term} wrote {write['method']} {write['path']} {received - last - deadline:.3f}s after "
                f"its renew deadline (last renewal received {last:.3f})"
            ),
        )
    order = sorted(by_term, key=lambda t: (t[1], min(held[t])))
    for older, newer in zip(order, order[1:], strict=False):
        first_newer = min(by_term[newer])
        late = [at for at in by_term[older] if at > first_newer]
        results["term-order"].check(
            not late,
            (
                f"term {older} wrote {len(late)} time(s) after term {newer}'s first write at {first_newer:.3f}, "
                f"the last {max(late, default=first_newer) - first_newer:.3f}s after"
            ),
        )


def _pods_run(result: Result, history: dict[str, Any], bound: float) -> None:
    healed = float(history["times"]["healed"])
    for pod in history["kubernetes"]["pods"]:
        due = max(healed, float(pod["created"])) + bound
        started = pod.get("started")
        result.check(
            pod["phase"] == "Running" and started is not None and float(started) <= due,
            (
                f"pod {pod['name']} is {pod['phase']}"
                + (f", started {float(started) - due:.1f}s after its bound" if started else ", never started")
            ),
        )


def _live(history: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    live: dict[str, list[dict[str, Any]]] = {}
    for machine in history["final"]["machines"]:
        if machine["state"] == "live":
            live.setdefault(machine["pool_id"], []).append(machine)
    return live


def _ca_equals_cloud(result: Result, history: dict[str, Any]) -> None:
    _, groups = status_groups(yaml.safe_load(history["kubernetes"]["ca_status"] or "") or {})
    live = _live(history)
    for pool in history["final"]["pools"]:
        group = groups.get(pool["id"])
        count = len(live.get(pool["id"], []))
        result.check(
            group is not None and group.target == pool["size"] and group.registered == count,
            (
                f"pool {pool['cloud']}/{pool['name']}: the cloud holds size {pool['size']} with {count} live "
                + (
                    f"machines, the CA's status target {group.target} with {group.registered} registered"
                    if group
                    else "machines, and the CA's status has no such group"
                )
            ),
        )


def _no_orphans(result: Result, history: dict[str, Any]) -> None:
    live = _live(history)
    nodes = {n["provider_id"]: n["name"] for n in history["kubernetes"]["nodes"]}
    for pool in history["final"]["pools"]:
        count = len(live.get(pool["id"], []))
        result.check(
            count == pool["size"],
            f"pool {pool['cloud']}/{pool['name']} holds {count} live machines for a size of {pool['size']}",
        )
    live_ids = {m["provider_id"] for machines in live.values() for m in machines}
    for machines in live.values():
        for machine in machines:
            result.check(
                machine["provider_id"] in nodes,
                f"machine {machine['name']} ({machine['provider_id']}) has no Node",
            )
    for provider_id, name in nodes.items():
        if provider_id.startswith(CLOUD_PROVIDER_PREFIXES):
            result.check(provider_id in live_ids, f"Node {name} ({provider_id}) has no live machine")


def settle_problems(snapshot: dict[str, Any]) -> list[str]:
    """What keeps a cluster from being settled now (``final`` and ``kubernetes`` of a history): a pod not
    Running, the CA's status not equal to the clouds, a machine outside its pool's count."""
    running = Result("pods-run")
    for pod in snapshot["kubernetes"]["pods"]:
        running.check(pod["phase"] == "Running", f"pod {pod['name']} is {pod['phase']}")
    equal, orphans = Result("ca-equals-cloud"), Result("no-orphans")
    _ca_equals_cloud(equal, snapshot)
    _no_orphans(orphans, snapshot)
    return running.violations + equal.violations + orphans.violations


def _memory(result: Result, samples: list[dict[str, Any]], bound: float) -> None:
    peaks: dict[tuple[str, int], float] = {}
    for sample in samples:
        key = (sample["replica"], int(sample["pid"]))
        peaks[key] = max(peaks.get(key, 0.0), float(sample["rss_mib"]))
    for (replica, pid), peak in sorted(peaks.items()):
        result.check(peak <= bound, f"{replica} (pid {pid}) reached {peak:.0f} MiB, above {bound:.0f} MiB")


def feel(history: dict[str, Any]) -> Feel:
    lines = history["ca_log"]
    loops = [float(line["at"]) for line in lines if line["msg"].startswith("Starting main loop")]
    failed = {
        max((at for at in loops if at <= float(line["at"])), default=0.0)
        for line in lines
        if line["msg"].startswith("Failed to") and "static_autoscaler.go" in line.get("caller", "")
    }
    times = history["times"]
    settled = times.get("settled")
    ready_since = _ready_since(history.get("service", {}).get("readiness", []))
    unreachable = [
        float(line["at"])
        for line in lines
        if line["msg"].startswith("Failed to refresh cloud provider config") and "connection" in line["msg"]
    ]
    return Feel(
        failed_scale_ups=sum(1 for line in lines if line["msg"].startswith("Failed to scale up")),
        failed_loops=len(failed),
        loops=len(loops),
        settle_seconds=float(settled) - float(times["healed"]) if settled is not None else None,
        unreachable_while_ready=sum(
            1 for at in unreachable if (since := ready_since(at)) and at - since > READY_LONG_ENOUGH
        ),
    )


#: Two periods of the readiness probe: by then the Service sends new connections to the Ready replica.
READY_LONG_ENOUGH = 4.0


def _ready_since(changes: list[Any]) -> Callable[[float], float | None]:
    """From the Service's readiness changes ``(time, endpoint, ready)``: when some endpoint had been Ready
    without a break up to a given time (None: none was Ready then)."""

    def since(at: float) -> float | None:
        state: dict[str, float | None] = {}
        for when, name, ready in changes:
            if float(when) > at:
                break
            state[name] = (state.get(name) or float(when)) if ready else None
        begun = [t for t in state.values() if t is not None]
        return min(begun) if begun else None

    return since
