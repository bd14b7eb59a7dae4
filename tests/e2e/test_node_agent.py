"""The node agent's view of the machines agrees with our server's: same providerIDs, the pool labels
the templates use, capacity of the machine type. Runs without the Kubernetes programs (in make test)."""

from __future__ import annotations

from pathlib import Path

from devstack.clouds import bizfly_cluster_uid
from devstack.harness import running_stack
from simulators.bizfly.state import PoolUpdate
from tests.e2e.environment import BIZFLY_TIMINGS, SCALEWAY_TIMINGS, bizfly_pool, scaleway_pool
from tests.e2e.node_agent import bizfly_machines, fetch_state, scaleway_machines, scaleway_taints
from tests.e2e.pools import SCALE_UP


def test_machines_carry_the_provider_ids_our_server_reports(tmp_path: Path) -> None:
    scaleway = {
        "timings": SCALEWAY_TIMINGS,
        "clusters": [
            {"name": "e2e", "pools": [scaleway_pool("general", "DEV1-M", 2, 0, 3, taints={"team": "a:NoSchedule"})]}
        ],
    }
    bizfly = {
        "timings": BIZFLY_TIMINGS,
        "clusters": [{"name": "e2e", "pools": [bizfly_pool("general", "nix.2c_4g", 2, 0, 3)]}],
    }
    with running_stack(tmp_path, scaleway=scaleway, bizfly=bizfly) as stack:
        assert stack.scaleway is not None and stack.bizfly is not None
        scw = scaleway_machines(fetch_state(stack.scaleway.url))
        bz = bizfly_machines(fetch_state(stack.bizfly.url))
        reported = {i.id for group in stack.groups() for i in stack.instances(group)}

        assert {m.provider_id for m in scw + bz} == reported
        assert len(scw) == 2 and len(bz) == 2
        for machine in scw:
            assert machine.running and machine.labels["k8s.scaleway.com/pool-name"] == "general"
            assert machine.labels["kubernetes.io/hostname"] == machine.name
            # The pools API answers "dev1_m"; the node carries the machine's commercial type.
            assert machine.labels["node.kubernetes.io/instance-type"] == "DEV1-M"
            assert machine.capacity["cpu"] == "3" and machine.taints == [
                {"key": "team", "value": "a", "effect": "NoSchedule"}
            ]
        for machine in bz:
            assert machine.running and machine.labels["bke.bizflycloud.vn/pool-name"] == "general"
            assert machine.labels["node.kubernetes.io/instance-type"] == "nix.2c_4g"
            assert machine.capacity == {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "40Gi", "pods": "110"}
            assert machine.allocatable["cpu"] == "1900m"


def test_a_machine_gets_a_node_once_it_has_joined_and_is_ready_once_it_runs(tmp_path: Path) -> None:
    # A Kapsule node registers with Kubernetes while still not_ready (one simulated second here).
    scaleway = {**SCALE_UP.scaleway_scenario(), "timings": {**SCALEWAY_TIMINGS, "not_ready": 1}}
    with running_stack(tmp_path, scaleway=scaleway, bizfly=SCALE_UP.bizfly_scenario()) as stack:
        assert stack.scaleway is not None and stack.bizfly is not None
        pool = stack.scaleway.state.snapshot()["pools"][0]["id"]
        stack.scaleway.state.update_pool_size(stack.scaleway.region, pool, 2)
        stack.bizfly.state.update_pool(  # the Bizfly API's PATCH, as our server sends it
            bizfly_cluster_uid(stack.bizfly),
            stack.bizfly.snapshot()["clusters"][0]["worker_pools"][0]["id"],
            PoolUpdate(desired_size=2),
        )

        scw_url, bz_url = stack.scaleway.url, stack.bizfly.url

        def joined() -> tuple[list[bool], list[bool]]:
            scw = scaleway_machines(fetch_state(scw_url))
            bz = bizfly_machines(fetch_state(bz_url))
            return [m.running for m in scw], [m.running for m in bz]

        assert joined() == ([True], [True])  # the new machines are still booting
        boot = SCALEWAY_TIMINGS["creating"] + SCALEWAY_TIMINGS["starting"] + SCALEWAY_TIMINGS["registering"]
        stack.advance(boot + 0.5, sync=False)
        # Bizfly's has joined, running (it provisions in 5 s); Scaleway's has registered, not yet Ready.
        assert BIZFLY_TIMINGS["provision_seconds"] < boot + 0.5
        assert joined() == ([True, False], [True, True])
        stack.advance(1, sync=False)
        assert joined() == ([True, True], [True, True])


def test_kapsule_taint_map_becomes_node_taints() -> None:
    assert scaleway_taints({"b": "NoExecute", "a": "x:NoSchedule"}) == [
        {"key": "a", "value": "x", "effect": "NoSchedule"},
        {"key": "b", "effect": "NoExecute"},
    ]
