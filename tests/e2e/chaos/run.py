"""The randomized fault campaign (``make chaos``): for each seed, the e2e environment with two replicas of our
server behind the Service stand-in, every Kubernetes feature on, both simulated clouds, the real CA 1.36.1;
a workload and a nemesis played from the seed's schedule; healing; settling; the history gathered and
checked. One line per seed, then the summary line (``chaos: ...``).

    python -m tests.e2e.chaos.run --seeds 20 --minutes 5     # seeds 1..20
    python -m tests.e2e.chaos.run --seed 7 --minutes 5       # seed 7 again: the same schedule
    python -m tests.e2e.chaos.run --check <run folder>/history.json   # check a recorded history again

Each seed's folder (logs of every program, history.json, schedule.txt) is kept under ``--workdir``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.chaos import history as hist
from tests.e2e.chaos.checker import INVARIANTS, Result, Verdict, check, settle_problems
from tests.e2e.chaos.nemesis import Applied, Nemesis, Workload
from tests.e2e.chaos.schedule import Schedule, make_schedule
from tests.e2e.environment import AutoscalerPrograms, E2EEnvironment, Layout, bizfly_pool, find_programs, scaleway_pool
from tests.e2e.replicas import ReplicatedServer, replicas, stand_in

# Two pools per cloud: one with a machine from the start, one empty (scale from zero), as schedule.SHAPES
# needs them.
LAYOUT = Layout(
    scaleway_pools=[scaleway_pool("general", "DEV1-M", 1, 1, 6), scaleway_pool("big", "POP2-4C-16G", 0, 0, 3)],
    bizfly_pools=[bizfly_pool("general", "nix.2c_4g", 1, 1, 6), bizfly_pool("big", "nix.4c_16g", 0, 0, 3)],
)
# The e2e suite's CA flags, and a group backoff after a failed scale-up of 10 s doubling up to 60 s (the
# defaults, 5 and 30 minutes, would leave a pool backed off past any run).
CA_FLAGS = {"initial-node-group-backoff-duration": "10s", "max-node-group-backoff-duration": "60s"}
CA_GRPC_TIMEOUT = 5.0  # write_cloud_config's default
PROBE_INTERVAL = 2.0  # the shipped readiness probe's period
#: After healing: how long every pod may take to run, and how long the run waits for the cluster to settle.
SETTLE_BOUND = 180.0
#: Settled: the settle checks pass this many times in a row, every SETTLE_POLL seconds.
SETTLE_POLLS = 3
SETTLE_POLL = 2.0
MEMORY_BOUND_MIB = 300.0


@dataclass
class SeedRun:
    seed: int
    schedule: Schedule
    record: list[Applied]
    verdict: Verdict
    workdir: Path
    wall_seconds: float
    load: tuple[float, float]  # the machine's 1-minute load average at the start and at the end

    def injected(self) -> Counter[str]:
        return Counter(a.kind for a in self.record if a.injected)

    def line(self) -> str:
        feel = self.verdict.feel
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.injected().items()))
        skipped = sum(1 for a in self.record if not a.injected)
        settled = f"{feel.settle_seconds:.1f}s" if feel.settle_seconds is not None else "not within the bound"
        violations = self.verdict.violations
        return (
            f"seed {self.seed} ({self.schedule.seconds / 60:.1f} min): faults {sum(self.injected().values())} "
            f"({kinds}{'; ' + str(skipped) + ' skipped' if skipped else ''}); checks {self.verdict.checks}; "
            f"violations {len(violations)}; CA failed scale-ups {feel.failed_scale_ups}, loops ended on an error "
            f"{feel.failed_loops} of {feel.loops} ({feel.unreachable_while_ready} unable to connect while a replica "
            f"was Ready); settled {settled} after healing; "
            f"run {self.wall_seconds / 60:.1f} min, "
            f"load {self.load[0]:.1f}->{self.load[1]:.1f}"
        )


def load_average() -> float:
    return os.getloadavg()[0]


def run_seed(programs: AutoscalerPrograms, seed: int, seconds: float, workdir: Path) -> SeedRun:
    began, load = time.monotonic(), load_average()
    schedule = make_schedule(seed, seconds)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "schedule.txt").write_text(describe(schedule))
    serve = replicas(service=stand_in(PROBE_INTERVAL), api_proxies=True)
    env = E2EEnvironment(programs, workdir, LAYOUT, ca_flags=CA_FLAGS, serve=serve, audit=hist.LEASE_AUDIT)
    env.start()
    try:
        group: ReplicatedServer = env.ours
        pools = hist.pools_of(env)
        observer = hist.CloudObserver(env).start()
        sampler = hist.MemorySampler(group).start()
        nemesis, workload = Nemesis(env, group, schedule), Workload(env, schedule)
        start = time.monotonic()
        times: dict[str, float | None] = {"started": time.time()}
        workload.start(start)
        nemesis.play(start)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        workload.stop()
        nemesis.heal()
        times["healed"] = time.time()
        times["settled"], settled = settle(env, SETTLE_BOUND)
        observer.stop()
        sampler.stop()
        machines, sizes = observer.record()
        history = {
            "seed": seed,
            "seconds": seconds,
            "config": {
                "renew_deadline": group.renew_deadline,
                "lease_duration": group.lease_duration,
                "ca_grpc_timeout": CA_GRPC_TIMEOUT,
                "settle_bound": SETTLE_BOUND,
                "memory_bound_mib": MEMORY_BOUND_MIB,
            },
            "times": times,
            "pools": pools,
            "writes": hist.cloud_writes(env),
            "machines": machines,
            "sizes": sizes,
            "final": settled["final"],
            "lease": hist.lease_writes(env, group.lease_name),
            "ca_log": hist.ca_log(env),
            "kubernetes": settled["kubernetes"],
            "memory": sampler.samples,
            "nemesis": [vars(a) for a in nemesis.record],
            "service": {"readiness": group.proxy.record.readiness, "refused": group.proxy.record.refused},
            "workload": workload.done,
        }
    finally:
        env.stop()
    hist.save(history, workdir / "history.json")
    return SeedRun(
        seed, schedule, nemesis.record, check(history), workdir, time.monotonic() - began, (load, load_average())
    )


def settle(env: E2EEnvironment, bound: float) -> tuple[float | None, dict[str, Any]]:
    """Wait until every pod runs, the CA's status equals the clouds and no machine is outside a pool's
    count (the checker's own ``settle_problems``), SETTLE_POLLS times in a row. Returns when it first held
    and the snapshot (clouds and API server) of the poll that made it settled, which the checker judges: the
    CA goes on working after that (a scale-down it started may be half done at any later instant, seed 4).
    After ``bound`` seconds unsettled: None and the last snapshot."""
    deadline = time.monotonic() + bound
    streak: list[float] = []
    while True:
        at = time.time()
        snapshot = {
            "final": {"pools": hist.pools_of(env), "machines": hist.machines_of(env)},
            "kubernetes": hist.kubernetes_objects(env),
        }
        streak = [*streak, at] if not settle_problems(snapshot) else []
        if len(streak) >= SETTLE_POLLS:
            return streak[0], snapshot
        if time.monotonic() >= deadline:
            return None, snapshot
        time.sleep(SETTLE_POLL)


def describe(schedule: Schedule) -> str:
    lines = [f"seed {schedule.seed}, {schedule.seconds:.0f} s", "faults:"]
    lines += [f"  {event.describe()}" for event in schedule.faults]
    lines.append("pods:")
    lines += [f"  {event.at:6.1f}s {event.action} {event.pod}" for event in schedule.pods]
    return "\n".join(lines) + "\n"


def summary(runs: list[SeedRun]) -> str:
    injected: Counter[str] = Counter()
    for run in runs:
        injected.update(run.injected())
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(injected.items()))
    checks = sum(run.verdict.checks for run in runs)
    violations = sum(len(run.verdict.violations) for run in runs)
    minutes = {run.schedule.seconds / 60 for run in runs}
    length = f"{minutes.pop():.1f} min each" if len(minutes) == 1 else "mixed lengths"
    return (
        f"chaos: seeds {len(runs)} ({length}), faults {sum(injected.values())} of {len(injected)} kinds "
        f"({kinds}), checks {checks} of {len(INVARIANTS)} invariants, violations {violations}"
    )


def invariant_table(runs: list[SeedRun]) -> list[str]:
    totals: dict[str, Result] = {name: Result(name) for name in INVARIANTS}
    for run in runs:
        for name, result in run.verdict.results.items():
            totals[name].checks += result.checks
            totals[name].violations += result.violations
    return [f"  {name:16} checks {r.checks:6}  violations {len(r.violations)}" for name, r in totals.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="run seeds 1..N (default 3)")
    parser.add_argument("--seed", type=int, help="run this one seed (the same schedule as in any campaign)")
    parser.add_argument("--first", type=int, default=1, help="with --seeds: the first seed (default 1)")
    parser.add_argument("--minutes", type=float, default=3.0, help="chaos window per seed (default 3)")
    parser.add_argument("--workdir", type=Path, help="where each seed's folder goes (default: a new temporary one)")
    parser.add_argument("--check", type=Path, help="check a recorded history.json again, and nothing else")
    args = parser.parse_args(argv)
    if args.check is not None:
        verdict = check(hist.load(args.check))
        for violation in verdict.violations:
            print(f"  {violation}")
        print(f"checks {verdict.checks}, violations {len(verdict.violations)}")
        return 1 if verdict.violations else 0
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ca-externalgrpc-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # The harness's own warnings (the node agent's passes while the API server restarts, a few a second)
    # go to a file, so the console keeps one line per seed.
    logging.basicConfig(
        filename=workdir / "harness.log", level=logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    print(f"chaos campaign: seeds {seeds[0]}..{seeds[-1]}, {args.minutes:g} min each; folders in {workdir}", flush=True)
    programs = find_programs()
    runs = []
    for seed in seeds:
        run = run_seed(programs, seed, args.minutes * 60, workdir / f"seed-{seed}")
        runs.append(run)
        print(run.line(), flush=True)
        for violation in run.verdict.violations:
            print(f"  {violation}  (rerun: make chaos SEED={seed} MINUTES={args.minutes:g}; {run.workdir})", flush=True)
    for line in invariant_table(runs):
        print(line)
    print(summary(runs), flush=True)
    return 1 if any(run.verdict.violations for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
