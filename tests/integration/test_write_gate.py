"""Every cloud wires the leader-election write gate into the transports it writes through: with the
gate closed a size write reaches no simulator, with it open the same write lands. The backends are
built from a server config exactly as the server builds them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.harness import server_config
from providers.backend import Backend
from providers.deadline import Deadline
from providers.errors import NotLeader
from server.app import build_backends
from server.config import parse
from simulators.bizfly import BizflySimulator
from simulators.bizfly.scenario import demo_scenario as bizfly_demo
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.scenarios import demo_scenario as scaleway_demo


class Gate:
    def __init__(self) -> None:
        self.open = False
        self.asked: list[str] = []

    def __call__(self, what: str) -> None:
        self.asked.append(what)
        if not self.open:
            raise NotLeader(f"{what} not sent: this replica is not the leader")


@pytest.fixture(params=["scaleway", "bizfly"])
def cloud(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Backend]]:
    if request.param == "scaleway":
        sim: Any = ScalewaySimulator(scenario=scaleway_demo()).start()
        entry = scaleway_backend(sim)
    else:
        sim = BizflySimulator(bizfly_demo()).start()
        entry = bizfly_backend(sim)
    (backend,) = build_backends(parse(server_config([entry]), env={}))
    try:
        yield sim, backend
    finally:
        backend.adapter.close()
        sim.stop()


def test_a_closed_gate_keeps_a_size_write_from_the_cloud_and_an_open_one_lets_it_through(
    cloud: tuple[Any, Backend],
) -> None:
    sim, backend = cloud
    gate = Gate()
    backend.adapter.guard_writes(gate)
    backend.sync(Deadline.after(10))
    group = next(g for g in backend.groups() if g.target_size < g.max_size)

    with pytest.raises(NotLeader):
        backend.increase_size(group.id, 1, Deadline.after(10))
    assert gate.asked, "the write asked the gate"
    assert sim.requests.count(route="update_pool") == 0, "nothing reached the cloud"

    gate.open = True
    backend.sync(Deadline.after(10))
    assert backend.increase_size(group.id, 1, Deadline.after(10)) == group.target_size + 1
    assert sim.requests.count(route="update_pool") == 1
