"""Fixtures shared by the simulator tests: a manual clock and an HTTP session to loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from simulators.common.clock import ManualClock


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def http() -> Iterator[requests.Session]:
    session = requests.Session()
    session.trust_env = False  # never route loopback test traffic through a proxy from the environment
    yield session
    session.close()
