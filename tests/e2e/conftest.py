"""Fixtures and reporting for the end-to-end scenarios (the real cluster-autoscaler binary).

The smoke scenarios (one scale-up, one scale-down, a short steady state) run with ``make test``;
every scenario marked ``e2e`` runs only with ``make e2e`` (``pytest tests/e2e --e2e``). The programs
come from the Go build step (``make build``); a missing one fails the scenario with one line naming
it and the command that builds it. Each scenario prints, at the end of the run, the time from its
pending pod to the cloud call and to the pod running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.environment import (
    CA_1_36_1,
    AutoscalerPrograms,
    CaRelease,
    E2EEnvironment,
    Layout,
    ServeBackends,
    StartEnvironment,
    find_programs,
)
from tests.e2e.report import SUMMARY
from tests.support.gobuild import GoBuildError
from tests.support.selection import deselect

DEFAULT_STEADY_SECONDS = 20.0
DEFAULT_PARTITION_ROUNDS = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", default=False, help="also run the scenarios marked e2e")
    parser.addoption(
        "--steady-seconds",
        type=float,
        default=None,
        help=f"length of the steady-state scenario (default {DEFAULT_STEADY_SECONDS:.0f}s; make e2e passes 180)",
    )
    parser.addoption(
        "--partition-rounds",
        type=int,
        default=None,
        help=f"rounds of the split-brain scenario (default {DEFAULT_PARTITION_ROUNDS}; make e2e passes 10)",
    )


def _option(config: pytest.Config, name: str) -> object:
    # Registered only when this folder is on the command line; under ``pytest tests`` read it defensively.
    try:
        return config.getoption(name)
    except ValueError:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    steady = _steady_seconds(config)
    for item in items:
        if "steady_seconds" in getattr(item, "fixturenames", ()):
            # Its own length plus start-up and checks; no fixed per-test timeout fits every length.
            item.add_marker(pytest.mark.timeout(steady + 180))
    if _option(config, "--e2e"):
        return
    deselect(config, items, lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def programs() -> AutoscalerPrograms:
    return resolve_programs()


def resolve_programs(release: CaRelease = CA_1_36_1) -> AutoscalerPrograms:
    """The binaries ``make build`` produced; one line naming what is missing and how to build it."""
    missing = ""
    try:
        return find_programs(release)
    except GoBuildError as err:
        missing = str(err)
    # failed outside the except block, so the report is this one line and no traceback
    pytest.fail(missing, pytrace=False)


def _steady_seconds(config: pytest.Config) -> float:
    value = _option(config, "--steady-seconds")
    return float(value) if isinstance(value, int | float) else DEFAULT_STEADY_SECONDS


@pytest.fixture
def steady_seconds(request: pytest.FixtureRequest) -> float:
    return _steady_seconds(request.config)


@pytest.fixture
def partition_rounds_option(request: pytest.FixtureRequest) -> int:
    value = _option(request.config, "--partition-rounds")
    return int(value) if isinstance(value, int) else DEFAULT_PARTITION_ROUNDS


@pytest.fixture
def start_environment(programs: AutoscalerPrograms, tmp_path: Path) -> Iterator[StartEnvironment]:
    """A factory: ``start_environment(layout, ca_flags=None, prepare=None, serve=None)`` -> a running
    ``E2EEnvironment``."""
    started: list[E2EEnvironment] = []

    def start(
        layout: Layout,
        ca_flags: dict[str, str] | None = None,
        prepare: Callable[[E2EEnvironment], None] | None = None,
        serve: ServeBackends | None = None,
    ) -> E2EEnvironment:
        env = E2EEnvironment(programs, tmp_path / f"run{len(started)}", layout, ca_flags, prepare, serve)
        started.append(env)
        return env.start()

    yield start
    for env in started:
        env.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not SUMMARY:
        return
    terminalreporter.section("e2e timings and figures (real cluster-autoscaler 1.36.1 unless a line names another)")
    for line in SUMMARY:
        terminalreporter.write_line(line)
