"""Fixtures the Scaleway backend tests share (test_scaleway_backend.py, test_scaleway_public.py), and the
rule for the suite's second pass on another serving engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.harness import ENGINE_ENV
from providers.backend import Backend
from tests.support.selection import deselect


@pytest.fixture
def backends() -> Iterator[list[Backend]]:
    """The backends a test made, stopped after it."""
    made: list[Backend] = []
    yield made
    for backend in made:
        backend.stop()


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pass with $CA_EXTERNALGRPC_TEST_ENGINE set (``make test`` runs tests/integration again on grpcio),
    leave out the tests that would run there exactly as in the first pass: those marked ``one_engine`` (no
    server, or one whose engine the test names) and those parametrised by ``engine`` (they start both engines
    themselves); the pass is for the tests that take the engine from the environment."""
    if not os.environ.get(ENGINE_ENV):
        return

    def same_on_both_passes(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        same = (callspec is not None and "engine" in callspec.params) or item.get_closest_marker("one_engine")
        return bool(same) and item.path.is_relative_to(HERE)

    deselect(config, items, same_on_both_passes)
