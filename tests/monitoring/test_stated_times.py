"""The times the docs state for each alert are the ones ``make alerts`` checks (tests/monitoring/alerts.py).

The how-to's table "How soon the alerts fire and resolve" names each fault by its ``make alerts`` scenario; every
(scenario, alert, minutes) row must be a ``must_fire`` entry of that scenario and the reverse, and the
resolve times the text gives must be ``RESOLVES_WITHIN``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.monitoring.alerts import MINUTE, RESOLVES_WITHIN, SCENARIOS

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "monitoring.md"
HEADING = "### How soon the alerts fire and resolve"


def section() -> str:
    text = DOC.read_text().split(HEADING, 1)[1]
    return text.split("\n#", 1)[0]


def test_the_docs_state_the_fire_times_make_alerts_checks() -> None:
    stated: dict[tuple[str, str], float] = {}
    scenario = ""
    for line in section().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`CaExternalGrpc"):
            continue
        if cells[0]:
            (scenario,) = re.findall(r"\(`([a-z-]+)`\)", cells[0])
        alert = re.match(r"`(\w+)`", cells[1]).group(1)  # type: ignore[union-attr]
        stated[(scenario, alert)] = float(cells[2].removesuffix(" min")) * MINUTE
    checked = {(s.slug, alert): seconds for s in SCENARIOS for alert, seconds in s.must_fire.items()}
    assert stated == checked


def test_the_docs_state_the_resolve_times_make_alerts_checks() -> None:
    text = " ".join(section().split())
    longer = {alert for alert, seconds in RESOLVES_WITHIN.items() if seconds != 2 * MINUTE}
    assert "each alert resolves within 2 min" in text
    named = re.search(r"\(([^)]*) within 3 min", text)
    assert named is not None and set(re.findall(r"`(\w+)`", named.group(1))) == longer
    assert all(RESOLVES_WITHIN[alert] == 3 * MINUTE for alert in longer)
