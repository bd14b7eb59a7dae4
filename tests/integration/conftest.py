"""Fixtures the Scaleway backend tests share (test_scaleway_backend.py, test_scaleway_public.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from providers.backend import Backend


@pytest.fixture
def backends() -> Iterator[list[Backend]]:
    """The backends a test made, stopped after it."""
    made: list[Backend] = []
    yield made
    for backend in made:
        backend.stop()
