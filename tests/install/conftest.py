"""Fixtures of the install tests: the image ``make image`` built, the wheels ``make wheels`` built.

Building is a build step, never part of a test: a missing or stale image fails with "run make image",
missing wheels with "run make wheels". Without podman on the machine the image tests are skipped
(``make test`` builds and runs them whenever podman is there; ``.ci/run`` installs it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from simulators.bizfly import BizflySimulator
from simulators.common import WallClock
from simulators.scaleway import ScalewaySimulator
from tests.support.container_image import built_image

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"

#: one autoscaled pool per cloud with a running node; a pool at zero on Scaleway
SCALEWAY_SCENARIO = {
    "clusters": [
        {
            "name": "install",
            "pools": [
                {"name": "general", "node_type": "DEV1-M", "size": 1, "min_size": 1, "max_size": 3},
                {"name": "big", "node_type": "POP2-4C-16G", "size": 0, "min_size": 0, "max_size": 2},
            ],
        }
    ]
}
BIZFLY_SCENARIO = {
    "clusters": [
        {
            "name": "install",
            "pools": [
                {"name": "general", "flavor": "nix.2c_4g", "desired_size": 1, "min_size": 1, "max_size": 3,
                 "enable_autoscaling": True},
            ],
        }
    ]
}  # fmt: skip


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this checkout's sources, as ``make image`` tagged it."""
    return built_image()


@pytest.fixture
def clouds() -> Iterator[tuple[ScalewaySimulator, BizflySimulator]]:
    """Both simulated clouds on the wall clock, listening on 127.0.0.1."""
    clock = WallClock()
    with (
        ScalewaySimulator(scenario=SCALEWAY_SCENARIO, clock=clock) as scaleway,
        BizflySimulator(scenario=BIZFLY_SCENARIO, clock=clock) as bizfly,
    ):
        yield scaleway, bizfly


def autoscaled_pool_ids(scaleway: ScalewaySimulator, bizfly: BizflySimulator) -> set[str]:
    """The node group ids the server must list: every pool of both clouds (all are autoscaled)."""
    pools = [p["id"] for p in scaleway.state.snapshot()["pools"]]
    pools += [p["id"] for p in bizfly.snapshot()["clusters"][0]["worker_pools"]]
    return {str(p) for p in pools}
