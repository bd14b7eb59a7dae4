"""The chaos campaign's smoke in ``make test``: one seed of ``make chaos`` (tests/e2e/chaos), short. The real
CA 1.36.1, two replicas of our server with every Kubernetes feature on behind the Service stand-in, both
simulated clouds, the seed's workload and nemesis, healing, settling, and every invariant of the checker
decided from the run's history. It fails on any violation, naming it and the run's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.chaos import history as hist
from tests.e2e.chaos.checker import applied
from tests.e2e.chaos.run import run_seed
from tests.e2e.environment import AutoscalerPrograms
from tests.e2e.report import publish

# A seed whose first 20 s hold two overlapping faults while Bizfly scales (one pool from zero): Bizfly applying
# each write and dropping its connection, then the leader cut off from the API server. About 55 s
# in all (15 s of start-up, the window, settling, the teardown); under a minute on the loaded 2-core machine.
SMOKE_SEED = 218
SMOKE_SECONDS = 20.0

# The window, start-up, and at most SETTLE_BOUND (180 s) of settling, with room for a loaded machine.
pytestmark = pytest.mark.timeout(420)


def test_chaos_smoke(programs: AutoscalerPrograms, tmp_path: Path) -> None:
    run = run_seed(programs, SMOKE_SEED, SMOKE_SECONDS, tmp_path / f"seed-{SMOKE_SEED}")
    publish(f"  chaos smoke: {run.line()}")
    assert not run.verdict.violations, "\n".join([*run.verdict.violations, f"history and logs: {run.workdir}"])
    # The run did what the schedule says: a fault of each planned kind was injected, and the checks ran.
    assert set(run.injected()) == set(run.schedule.kinds()), [vars(a) for a in run.record]
    assert run.verdict.checks > 0
    # The drop bit: a write the cloud applied whose answer never came (the scale-from-zero resize the CA asks
    # for 1-3 s after the pods at 10.1 s), an unknown outcome the checker then found applied once.
    writes = hist.load(run.workdir / "history.json")["writes"]
    assert any(applied(w) and w["status"] == 0 for w in writes), writes
