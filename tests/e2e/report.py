"""Lines the end-to-end scenarios publish for the end-of-run summary (see conftest.py): each scenario's
timing, and figures such as the steady state's loop count."""

from __future__ import annotations

from tests.e2e.environment import ScenarioTiming

SUMMARY: list[str] = []


def publish(line: str) -> None:
    """Keep one line for the summary, and print it (visible with ``-s`` and in a failure's output)."""
    SUMMARY.append(line)
    print(line)


def record_timing(timing: ScenarioTiming) -> None:
    publish(timing.line())
