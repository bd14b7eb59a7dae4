"""Figures the reliability tests publish for the end-of-run summary (see conftest.py)."""

from __future__ import annotations

REPORT: list[str] = []


def publish(line: str) -> None:
    """Record one summary line and print it too (visible with ``-s``, and in captured output on failure)."""
    REPORT.append(line)
    print(line)
