"""The Scaleway public mode (``scaleway.mode: public``) through the shared Backend, against the real simulator.

The pools the config names are the groups, with the config's bounds; a named pool whose Kapsule autoscaling
is on is left alone with one line; templates and prices come from the Instance product catalog; writes go to
the public endpoints only, and a deletion is the node DELETE alone (docs/reference/scaleway.md, "Public mode").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from providers.backend import Backend
from providers.errors import ChangeOutcomeUnknown, NodeGroupNotFound, SizeLimitExceeded
from providers.model import Taint
from providers.scaleway.templates import reserved_memory, reserved_millicores
from simulators.common.faults import Fault
from simulators.scaleway.simulator import ScalewaySimulator
from tests.integration.test_scaleway_backend import SECRET, deadline, make_backend, node_ref, wait_for

# The backend against the simulator, no server: the same on every serving engine.
pytestmark = pytest.mark.one_engine

CLUSTER = "11111111-0000-4000-8000-000000000002"
WORKERS, BATCH, MANAGED, OTHER = (f"00000000-0000-4000-8000-0000000000a{i}" for i in range(4))
GIB = 1024**3
TAGS = ["workload=batch", "taint=noprefix=dedicated=batch:NoSchedule", "noprefix=team=data"]
SCENARIO = {
    "clusters": [
        {
            "id": CLUSTER,
            "name": "public",
            "pools": [
                {"id": WORKERS, "name": "workers", "node_type": "DEV1-M", "size": 2, "autoscaling": False},
                {
                    "id": BATCH,
                    "name": "batch",
                    "node_type": "PRO2-XXS",
                    "size": 0,
                    "autoscaling": False,
                    "tags": TAGS,
                    "root_volume_size": 50_000_000_000,
                    "kubelet_args": {"maxPods": "60"},
                    "labels": {"owner": "data"},
                },
                # Kapsule's managed autoscaler acts on this one: named in the config, it must be left alone.
                {"id": MANAGED, "name": "managed", "node_type": "DEV1-M", "size": 1, "min_size": 1, "max_size": 3},
                {"id": OTHER, "name": "other", "node_type": "GP1-XS", "size": 1, "autoscaling": False},
            ],
        }
    ]
}
POOLS = {
    "workers": {"min_size": 1, "max_size": 5},
    BATCH: {"min_size": 0, "max_size": 3},
    "managed": {
        "min_size": 0,
        "max_size": 9,
    },
    "missing": {"min_size": 0, "max_size": 1},
}
PRIVATE_ROUTES = ("list_pools", "list_nodes", "update_pool", "delete_node")


@pytest.fixture
def sim() -> Iterator[ScalewaySimulator]:
    simulator = ScalewaySimulator(SCENARIO, secret_key=SECRET).start()
    yield simulator
    simulator.stop()


def public_backend(sim: ScalewaySimulator, backends: list[Backend], **config: Any) -> Backend:
    return make_backend(sim, backends, mode="public", pools=POOLS, **config)


def test_the_named_pools_are_the_groups_with_the_configs_bounds(sim, backends, caplog):
    with caplog.at_level(logging.WARNING, logger="providers.scaleway.adapter"):
        backend = public_backend(sim, backends)
        backend.sync(deadline())  # the same findings again: not logged again
    assert sorted(g.id for g in backend.groups()) == sorted([WORKERS, BATCH])  # by name and by id
    workers = backend.group(WORKERS)
    assert (workers.min_size, workers.max_size, workers.target_size) == (1, 5, 2)
    assert len(backend.instances(WORKERS)) == 2
    assert backend.group_id_for(sim.nodes_of(OTHER)[0].provider_id) is None  # a pool nobody named
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    refused = next(line for line in lines if "'managed'" in line)
    assert f"pool 'managed' ({MANAGED}) is left untouched: its Kapsule autoscaling is on" in refused
    assert f"scw k8s pool update {MANAGED} autoscaling=false region=fr-par" in refused
    assert any("no pool of that name or id" in line and "'missing'" in line for line in lines)
    # Only the public endpoints and the catalog are read; the private autoscaler endpoints never.
    assert not [r for r in sim.requests.filter() if r.route in PRIVATE_ROUTES]
    assert sim.requests.count(route="public_list_pools") == 2 and sim.requests.count(route="list_server_types") == 1
    assert "public mode" in backend.adapter.health_detail()


def test_templates_and_prices_come_from_the_catalog_and_the_pool_tags(sim, backends):
    backend = public_backend(sim, backends)
    template = backend.template(BATCH)
    assert template is not None
    # PRO2-XXS: 2 CPUs and 8 GiB in the catalog; allocatable after our reading of the reservations.
    assert template.capacity == {"cpu": "2", "memory": str(8 * GIB), "pods": "60", "ephemeral-storage": "50000000000"}
    assert template.allocatable == {
        "cpu": f"{2000 - reserved_millicores(2)}m",
        "memory": str(8 * GIB - reserved_memory(8 * GIB)),
        "pods": "60",
        "ephemeral-storage": "45000000000",
    }
    labels = template.labels
    assert labels["node.kubernetes.io/instance-type"] == "PRO2-XXS" and labels["kubernetes.io/arch"] == "amd64"
    assert (labels["k8s.scaleway.com/workload"], labels["team"], labels["owner"]) == ("batch", "data", "data")
    assert labels["topology.kubernetes.io/zone"] == "fr-par-1" and labels["k8s.scaleway.com/pool"] == BATCH
    assert template.taints == (Taint("dedicated", "batch", "NoSchedule"),)
    assert backend.group(BATCH).price_per_hour == pytest.approx(0.055)  # the catalog's hourly_price
    backend.sync(deadline())
    assert sim.requests.count(route="list_server_types") == 1  # the catalog is kept, not read every sync


def test_a_catalog_refused_to_the_key_leaves_groups_served_without_templates(sim, backends, caplog):
    sim.inject(Fault(route="list_server_types", status=403))
    with caplog.at_level(logging.ERROR, logger="providers.scaleway.adapter"):
        backend = public_backend(sim, backends)
    assert sorted(g.id for g in backend.groups()) == sorted([WORKERS, BATCH])
    assert backend.template(BATCH) is None
    assert backend.group(BATCH).price_per_hour is None
    assert any("InstancesReadOnly" in r.getMessage() for r in caplog.records)


def test_scale_up_and_down_write_the_public_pool_size(sim, backends):
    backend = public_backend(sim, backends)
    assert backend.increase_size(BATCH, 2, deadline()) == 2
    (patch,) = sim.requests.filter(route="public_update_pool")
    assert patch.body == {"size": 2} and patch.path == f"/k8s/v1/regions/fr-par/pools/{BATCH}"
    assert sim.pool(BATCH).size == 2
    with pytest.raises(SizeLimitExceeded):
        backend.increase_size(BATCH, 2, deadline())  # the config's max_size 3, not the pool's own
    assert sim.requests.count(route="public_update_pool") == 1


def test_a_deletion_is_the_node_delete_alone_and_kapsule_lowers_the_size_once(sim, backends):
    backend = public_backend(sim, backends)
    victim = sim.nodes_of(WORKERS)[0].id
    assert backend.delete_nodes(WORKERS, [node_ref(sim, victim)], deadline()) == 1
    (delete,) = sim.requests.filter(route="public_delete_node")
    assert delete.query == {"skip_drain": "false"}
    assert sim.node(victim).status == "deleting"
    assert sim.pool(WORKERS).size == 1 and backend.target_size(WORKERS) == 1
    assert sim.requests.count(route="public_update_pool") == 0  # never a PATCH after it: no second shrink
    with pytest.raises(SizeLimitExceeded):  # the config's min_size 1
        backend.delete_nodes(WORKERS, [node_ref(sim, sim.nodes_of(WORKERS)[1].id)], deadline())


def test_a_deletion_whose_answers_are_lost_is_read_back_and_never_shrinks_twice(sim, backends):
    backend = public_backend(sim, backends)
    victim = sim.nodes_of(WORKERS)[0].id
    sim.state.edit_pool(WORKERS, size=3)
    sim.advance(120)
    backend.sync(deadline())
    # Every attempt reaches Kapsule (the first deletes, the next find the node deleting) and every answer
    # is a 503: the outcome is unknown, and the listing read back shows the node leaving.
    sim.inject(Fault(route="public_delete_node", status=503, apply=True, times=3))
    assert backend.delete_nodes(WORKERS, [node_ref(sim, victim)], deadline()) == 1
    assert sim.requests.count(route="public_delete_node") == 3
    assert sim.pool(WORKERS).size == 2  # lowered once, by Kapsule
    # The CA's retry of the call: a DELETE of a node Kapsule is already deleting lowers nothing again.
    assert backend.delete_nodes(WORKERS, [node_ref(sim, victim)], deadline()) == 1
    assert sim.pool(WORKERS).size == 2
    assert sim.requests.count(route="public_update_pool") == 0
    backend.sync(deadline())
    assert backend.target_size(WORKERS) == 2


def test_a_lost_size_write_is_read_back_from_the_one_pool(sim, backends):
    backend = public_backend(sim, backends, request_timeout=0.3)
    sim.inject(Fault(route="public_update_pool", delay=1.0, times=1))
    with pytest.raises(ChangeOutcomeUnknown):
        backend.increase_size(BATCH, 1, deadline())
    wait_for(lambda: sim.pool(BATCH).size == 1, "the delayed PATCH to land")
    assert backend.increase_size(BATCH, 1, deadline()) == 1  # the CA's retry: read back, not applied twice
    assert sim.requests.count(route="public_update_pool") == 1
    assert sim.requests.count(route="public_get_pool") >= 1


def test_a_size_write_on_a_stale_view_reads_the_one_pool_and_stops_if_kapsule_took_it_over(sim, backends):
    backend = public_backend(sim, backends)
    backend.sync(deadline())
    sim.state.edit_pool(BATCH, autoscaling=True)  # someone switched Kapsule's autoscaling on in the console
    backend._snapshot = type(backend.snapshot)(  # make the view old enough to need a fresh read
        backend.snapshot.groups,
        backend.snapshot.by_provider_id,
        backend.snapshot.started_at - 60,
        backend.snapshot.finished_at - 60,
        backend.snapshot.version,
        backend.snapshot.instances_by_id,
    )
    with pytest.raises(NodeGroupNotFound):
        backend.increase_size(BATCH, 1, deadline())
    assert sim.requests.count(route="public_get_pool") == 1
    assert sim.requests.count(route="public_update_pool") == 0
    assert sim.pool(BATCH).size == 0
