"""Lines the end-to-end scenarios publish for the end-of-run summary (see conftest.py): each scenario's
timing, figures such as the steady state's loop count, and listings such as our server's Events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.e2e.environment import ScenarioTiming

SUMMARY: list[str] = []


def publish(line: str) -> None:
    """Keep one line for the summary, and print it (visible with ``-s`` and in a failure's output)."""
    SUMMARY.append(line)
    print(line)


def record_timing(timing: ScenarioTiming) -> None:
    publish(timing.line())


def event_listing(events: Iterable[Any], reporter: bool = False) -> str:
    """Kubernetes Events as ``kubectl get events`` lists them (the count as a column of its own); with
    ``reporter``, a REPORTER column (the Event's reportingInstance: which replica wrote it)."""
    head = ("LAST SEEN", "TYPE", "REASON", "OBJECT", "COUNT", *(("REPORTER",) if reporter else ()), "MESSAGE")
    rows = [head]
    for e in sorted(events, key=lambda e: (e.last_timestamp, e.metadata.name)):
        obj = f"{e.involved_object.kind.lower()}/{e.involved_object.name}"
        who = (str(e.reporting_instance or ""),) if reporter else ()
        rows.append((e.last_timestamp.strftime("%H:%M:%S"), e.type, e.reason, obj, str(e.count), *who, e.message))
    columns = len(head) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    return "\n".join("   ".join(row[i].ljust(widths[i]) for i in range(columns)) + "   " + row[-1] for row in rows)
