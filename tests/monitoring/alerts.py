"""``make alerts``: every fault an alert exists for, made for real, timed by a real Prometheus.

Each scenario is a cluster of its own (tests/monitoring/clusters.py: the Scaleway simulator, the network
path to it, ``ca-externalgrpc serve``, a CA loop every 10 s) with a Prometheus of its own, configured as
the Prometheus Operator configures one from the shipped ServiceMonitor (30 s scrapes, its relabelings)
and with its defaults (30 s rule evaluation), the shipped rules loaded and a ``cluster`` external label.
All send their alerts to one Alertmanager holding the shipped inhibition rules. The server runs with
its shipped defaults (30 s sync interval, 30 s request timeout, 4 attempts, 10 min max_staleness).

For each scenario: a healthy start (no alert pending), the fault, until every alert it must fire has
fired; then the fix, until every alert has resolved. Measured from the fault: when each alert went
pending and firing; from the fix: when it resolved. Checked: each alert fires and resolves within the
time ``must_fire`` and ``RESOLVES_WITHIN`` give (the times docs/how-to/monitoring.md states), no alert
outside the scenario's lists fires, and Alertmanager suppresses exactly the alerts the inhibition rules
should (one cause, one page).

    make alerts                                            # every scenario, about 22 minutes
    python -m tests.monitoring.alerts --scenarios wrong-key server-gone

Prints the table of docs/evidence/alerts.md and writes the figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simulators.common.faults import Fault
from tests.monitoring.clusters import SECRET, Cluster
from tests.monitoring.prometheus import AlertLog, Alertmanager, AlertTimes, Prometheus

POLL_SECONDS = 5.0
HEALTHY_TIMEOUT = 300.0
MINUTE = 60.0


@dataclass(frozen=True)
class Scenario:
    slug: str
    fault: str  # what breaks (for the table)
    fix: str
    must_fire: dict[str, float]  # alert -> fires within (seconds from the fault)
    may_fire: tuple[str, ...] = ()  # a consequence that may or may not reach firing in the scenario's time
    suppressed: tuple[str, ...] = ()  # Alertmanager must hold these as inhibited whenever they fire
    key_refused: bool = False  # the fault is there from the start
    breaks: Callable[[Cluster], None] = lambda cluster: None
    repairs: Callable[[Cluster], None] = lambda cluster: None


def _increase_refused(cluster: Cluster) -> None:
    cluster.simulator.faults.add(Fault(route="update_pool", status=503))
    cluster.ca.scale_up = cluster.groups()[0]


def _increase_accepted(cluster: Cluster) -> None:
    cluster.ca.scale_up = None
    cluster.simulator.faults.clear()


def _rate_limited(cluster: Cluster) -> None:
    cluster.simulator.server.rate_limit(per_second=0.1, burst=1)


def _server_killed(cluster: Cluster) -> None:
    cluster.server.stop(signal.SIGKILL)


def _server_restarted(cluster: Cluster) -> None:
    cluster.server.respawn(same_addresses=True)


def _key_accepted(cluster: Cluster) -> None:
    cluster.simulator.api.secret_key = SECRET


STALE = "CaExternalGrpcSnapshotStale"
BREAKER = "CaExternalGrpcCloudBreakerOpen"
RPC_ERRORS = "CaExternalGrpcRpcErrors"
RATE_LIMITED = "CaExternalGrpcCloudRateLimited"

#: The times docs/how-to/monitoring.md states ("How soon the alerts fire and resolve"), with the shipped
#: settings: how soon each alert resolves after the fix, and (SCENARIOS) how soon it fires after each fault.
RESOLVES_WITHIN = {
    "CaExternalGrpcAbsent": 2 * MINUTE,
    "CaExternalGrpcTargetDown": 2 * MINUTE,
    "CaExternalGrpcNoCalls": 2 * MINUTE,
    STALE: 2 * MINUTE,
    "CaExternalGrpcCloudRefusesConfig": 2 * MINUTE,
    BREAKER: 2 * MINUTE,
    RPC_ERRORS: 3 * MINUTE,
    RATE_LIMITED: 3 * MINUTE,
}
SCENARIOS = (
    Scenario(
        "wrong-key",
        "the cloud refuses the server's key from the start (401)",
        "the cloud accepts the key",
        {"CaExternalGrpcCloudRefusesConfig": 4 * MINUTE, STALE: 7 * MINUTE},
        may_fire=(RPC_ERRORS,),
        suppressed=(STALE, RPC_ERRORS),
        key_refused=True,
        repairs=_key_accepted,
    ),
    Scenario(
        "cloud-hangs",
        "the cloud's port accepts connections and never answers",
        "the cloud answers again",
        {STALE: 17 * MINUTE, BREAKER: 20 * MINUTE},
        may_fire=(RPC_ERRORS,),
        suppressed=(RPC_ERRORS,),
        breaks=lambda cluster: cluster.network.set("hang"),
        repairs=lambda cluster: cluster.network.set("forward"),
    ),
    Scenario(
        "cloud-refuses-connections",
        "nothing listens on the cloud's port",
        "the cloud listens again",
        {BREAKER: 16 * MINUTE},
        may_fire=(STALE, RPC_ERRORS),
        suppressed=(RPC_ERRORS,),
        breaks=lambda cluster: cluster.network.set("refuse"),
        repairs=lambda cluster: cluster.network.set("forward"),
    ),
    Scenario(
        "cloud-rate-limits",
        "the cloud answers 429 beyond 1 request per 10 s",
        "the rate limit is lifted",
        {RATE_LIMITED: 13 * MINUTE},
        may_fire=(BREAKER, STALE, RPC_ERRORS),
        suppressed=(BREAKER, RPC_ERRORS),
        breaks=_rate_limited,
        repairs=lambda cluster: cluster.simulator.server.rate_limit(None),
    ),
    Scenario(
        "ca-errors",
        "every size increase the CA asks for meets a cloud answering 503",
        "the cloud accepts size changes",
        {RPC_ERRORS: 12 * MINUTE},
        may_fire=(BREAKER,),
        breaks=_increase_refused,
        repairs=_increase_accepted,
    ),
    Scenario(
        "server-gone",
        "the server is killed (SIGKILL) and not restarted",
        "the server starts again on the same address",
        {"CaExternalGrpcAbsent": 7 * MINUTE, "CaExternalGrpcTargetDown": 7 * MINUTE},
        suppressed=("CaExternalGrpcTargetDown",),
        breaks=_server_killed,
        repairs=_server_restarted,
    ),
    Scenario(
        "ca-stopped",
        "the cluster-autoscaler stops calling the server",
        "the cluster-autoscaler calls again",
        {"CaExternalGrpcNoCalls": 12 * MINUTE},
        breaks=lambda cluster: cluster.ca.pause(),
        repairs=lambda cluster: cluster.ca.resume(),
    ),
)


@dataclass
class Outcome:
    scenario: str
    fault: str
    fix: str
    times: dict[str, AlertTimes] = field(default_factory=dict)  # seconds: pending/firing from the fault,
    # resolved from the fix
    suppressed: list[str] = field(default_factory=list)  # held as inhibited by Alertmanager
    notified: list[str] = field(default_factory=list)  # held as active: they notify
    problems: list[str] = field(default_factory=list)


def run_scenario(scenario: Scenario, workdir: Path, alertmanager: Alertmanager) -> Outcome:
    outcome = Outcome(scenario.slug, scenario.fault, scenario.fix)
    started_at = time.time()
    cluster = Cluster(scenario.slug, workdir / "cluster", key_refused=scenario.key_refused)
    prometheus = None
    try:
        prometheus = Prometheus(
            workdir / "prometheus",
            [cluster.target],
            external_labels={"cluster": scenario.slug},
            alertmanager=alertmanager.address,
        )
        if not scenario.key_refused:
            time.sleep(2 * MINUTE)  # two scrapes or more: every rate has its window
            prometheus.wait("a healthy start", lambda: not prometheus.alerts(), HEALTHY_TIMEOUT, POLL_SECONDS)
        log = AlertLog(prometheus)
        fault_at = started_at if scenario.key_refused else time.time()
        scenario.breaks(cluster)
        deadline = fault_at + max(scenario.must_fire.values()) + 2 * MINUTE
        while not all((log.times.get(a) or AlertTimes()).firing for a in scenario.must_fire):
            if time.time() > deadline:
                outcome.problems.append(f"not every alert fired: {_seen(log)}")
                break
            time.sleep(POLL_SECONDS)
            log.poll(time.time())
        time.sleep(POLL_SECONDS * 3)  # Prometheus sends each evaluation's alerts; let Alertmanager hold them
        log.poll(time.time())
        held = [a for a in alertmanager.alerts() if a["labels"].get("cluster") == scenario.slug]
        outcome.suppressed = sorted({a["labels"]["alertname"] for a in held if a["status"]["state"] == "suppressed"})
        outcome.notified = sorted({a["labels"]["alertname"] for a in held if a["status"]["state"] == "active"})
        fixed_at = time.time()
        scenario.repairs(cluster)
        deadline = fixed_at + max(RESOLVES_WITHIN.values()) + 2 * MINUTE
        while prometheus.alerts():
            if time.time() > deadline:
                outcome.problems.append(f"not every alert resolved: {prometheus.alerts()}")
                break
            time.sleep(POLL_SECONDS)
            log.poll(time.time())
        log.poll(time.time())
        outcome.times = {name: _relative(t, fault_at, fixed_at) for name, t in log.times.items()}
        outcome.problems += _judge(scenario, outcome, log)
    except Exception:
        outcome.problems.append(traceback.format_exc())
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()
    return outcome


def _seen(log: AlertLog) -> dict[str, Any]:
    return {name: asdict(t) for name, t in log.times.items()}


def _relative(times: AlertTimes, fault_at: float, fixed_at: float) -> AlertTimes:
    return AlertTimes(
        None if times.pending is None else max(times.pending - fault_at, 0.0),
        None if times.firing is None else times.firing - fault_at,
        None if times.resolved is None else times.resolved - fixed_at,
    )


def _judge(scenario: Scenario, outcome: Outcome, log: AlertLog) -> list[str]:
    problems = []
    for name, fires in scenario.must_fire.items():
        times = outcome.times.get(name)
        if times is None or times.firing is None:
            problems.append(f"{name} never fired")
        elif times.firing > fires:
            problems.append(f"{name} fired after {_clock(times.firing)}, later than the stated {_clock(fires)}")
    for name, times in outcome.times.items():
        resolves = RESOLVES_WITHIN[name]
        if times.firing is not None and (times.resolved is None or times.resolved > resolves):
            problems.append(f"{name} resolved after {_clock(times.resolved)}, not within {_clock(resolves)}")
    allowed = {*scenario.must_fire, *scenario.may_fire}
    for name, times in outcome.times.items():
        if times.firing is not None and name not in allowed:
            problems.append(f"{name} fired, which this fault must not make fire")
    for name in outcome.notified:
        if name in scenario.suppressed:
            problems.append(f"{name} notified although its cause fires (inhibition rules)")
    for name in outcome.suppressed:
        if name not in scenario.suppressed:
            problems.append(f"{name} was inhibited, but nothing else pages for this fault")
    for name, count in log.resets.items():
        if name in scenario.must_fire:
            problems.append(f"{name} went from pending to inactive {count} time(s) while the fault lasted")
    return problems


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def table(outcomes: Sequence[Outcome]) -> list[str]:
    by_slug = {s.slug: s for s in SCENARIOS}
    lines = [
        "| fault | alert | pending | firing | stated | resolved after the fix | stated | notifies |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for outcome in outcomes:
        scenario = by_slug[outcome.scenario]
        for name, times in sorted(outcome.times.items(), key=lambda item: item[1].firing or 1e9):
            if times.pending is None:
                continue  # a consequence it allows that never came
            fires, resolves = scenario.must_fire.get(name), RESOLVES_WITHIN[name]
            notifies = "inhibited" if name in outcome.suppressed else "yes" if name in outcome.notified else "-"
            lines.append(
                f"| {scenario.fault} | `{name}` | {_clock(times.pending)} | {_clock(times.firing)} | "
                f"{_clock(fires)} | {_clock(times.resolved)} | {_clock(resolves)} | {notifies} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=[s.slug for s in SCENARIOS], default=None)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "ca-externalgrpc-alerts")
    args = parser.parse_args(argv)
    chosen = [s for s in SCENARIOS if args.scenarios is None or s.slug in args.scenarios]
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="alerts-", dir=args.out))
    started = time.monotonic()
    alertmanager = Alertmanager(workdir / "alertmanager")
    outcomes: dict[str, Outcome] = {}
    try:
        threads = []
        for scenario in chosen:

            def run(scenario: Scenario = scenario) -> None:
                outcomes[scenario.slug] = run_scenario(scenario, workdir / scenario.slug, alertmanager)

            threads.append(threading.Thread(target=run, name=scenario.slug))
            threads[-1].start()
            time.sleep(5)  # one start-up at a time
        for thread in threads:
            thread.join()
    finally:
        alertmanager.stop()
    ordered = [outcomes[s.slug] for s in chosen]
    print("\n".join(table(ordered)))
    results = args.out / "alerts-results.json"
    results.write_text(json.dumps([asdict(o) for o in ordered], indent=2))
    took = _clock(time.monotonic() - started)
    print(f"\n{len(ordered)} scenarios in {took}; figures in {results}; logs in {workdir}")
    failed = [o for o in ordered if o.problems]
    for outcome in failed:
        print(f"\n{outcome.scenario}:\n  " + "\n  ".join(outcome.problems), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
