"""Waiting for what the server does in the background (a ConfigMap written, an Event, a Lease taken)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: how long a feature gets to show its work on the shared, often busy, test machine
WAIT = 20.0


def wait_for(what: str, probe: Callable[[], T], timeout: float = WAIT) -> T:
    """Poll ``probe`` every 50 ms until it returns something true, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)
    return found
