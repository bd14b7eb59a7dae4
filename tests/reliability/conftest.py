"""Options and reporting for the reliability campaign (property test, fuzz, soak, security).

``--soak-seconds`` sets the length of the long soak (``make soak``). The long soak only runs when it
is asked for (``-m soak`` or ``--soak-seconds``; otherwise it is deselected), so ``make test`` stays fast;
the short soak always runs.
Every test here may add lines to ``REPORT``; they are printed at the end of the run so the figures the
campaign must show (examples, steps, faults, RPCs, RSS) appear in the pytest output.
"""

from __future__ import annotations

import pytest

from tests.reliability.report import REPORT
from tests.support.selection import deselect


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="duration of the long soak run in seconds (make soak passes 600); enables the soak test",
    )


def _long_soak_requested(config: pytest.Config) -> bool:
    markexpr = getattr(config.option, "markexpr", "") or ""
    return "soak" in markexpr.replace("not soak", "") or _soak_seconds(config) is not None


def _soak_seconds(config: pytest.Config) -> float | None:
    # The option exists only when this conftest was loaded at start-up (tests/reliability on the
    # command line); under ``pytest tests`` it may be registered late, so read it defensively.
    try:
        return config.getoption("--soak-seconds")
    except ValueError:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _long_soak_requested(config):
        return
    # Deselected, not skipped, like the end-to-end suite without --e2e; make soak runs it.
    deselect(config, items, lambda item: "soak" in item.keywords)


@pytest.fixture
def soak_seconds(request: pytest.FixtureRequest) -> float:
    return _soak_seconds(request.config) or 600.0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    terminalreporter.section("reliability figures")
    for line in REPORT:
        terminalreporter.write_line(line)
