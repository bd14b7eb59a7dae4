"""Per-scenario timings the end-to-end scenarios publish for the end-of-run summary (see conftest.py)."""

from __future__ import annotations

from tests.e2e.environment import ScenarioTiming

TIMINGS: list[ScenarioTiming] = []


def record_timing(timing: ScenarioTiming) -> None:
    """Keep one scenario's timing for the summary, and print it (visible with ``-s`` and on failure)."""
    TIMINGS.append(timing)
    print(timing.line())
