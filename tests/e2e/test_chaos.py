"""The chaos campaign's smoke in ``make test``: one seed of ``make chaos`` (tests/e2e/chaos), short. The real
CA 1.36.1, two replicas of our server with every Kubernetes feature on behind the Service stand-in, both
simulated clouds, the seed's workload and nemesis, healing, settling, and every invariant of the checker
decided from the run's history. It fails on any violation, naming it and the run's folder."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.chaos.run import run_seed
from tests.e2e.environment import AutoscalerPrograms
from tests.e2e.report import publish

# A seed whose first 45 s hold both kinds of fault: the API server slow for the replicas, the leader
# killed, the follower restarted, a Bizfly outage (5xx, then writes applied and dropped), a Scaleway 502
# storm after applying.
SMOKE_SEED = 78
SMOKE_SECONDS = 45.0


def test_chaos_smoke(programs: AutoscalerPrograms, tmp_path: Path) -> None:
    run = run_seed(programs, SMOKE_SEED, SMOKE_SECONDS, tmp_path / f"seed-{SMOKE_SEED}")
    publish(f"  chaos smoke: {run.line()}")
    assert not run.verdict.violations, "\n".join([*run.verdict.violations, f"history and logs: {run.workdir}"])
    # The run did what the schedule says: a fault of each planned kind was injected, and the checks ran.
    assert set(run.injected()) == set(run.schedule.kinds()), [vars(a) for a in run.record]
    assert run.verdict.checks > 0
