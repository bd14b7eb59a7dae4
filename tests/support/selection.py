"""Leaving tests out of a run as pytest's own ``-m`` and ``-k`` do: deselected, counted in the summary as
such, never reported as skipped (a skip reads as something the machine could not run). The conftests of
tests/e2e (the end-to-end suite without ``--e2e``), tests/integration (the grpcio engine's second pass)
and tests/reliability (the long soak outside ``make soak``) use it from ``pytest_collection_modifyitems``."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def deselect(config: pytest.Config, items: list[pytest.Item], leave_out: Callable[[pytest.Item], bool]) -> None:
    """Remove from ``items``, in place, every item ``leave_out`` names, and report them as deselected."""
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        (left_out if leave_out(item) else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
