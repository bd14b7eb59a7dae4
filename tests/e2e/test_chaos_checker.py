"""The chaos checker on a recorded history (pure logic, no process started): the history of a real run
(``chaos/recorded-history.json``, seed 2 of ``make chaos`` for 2.5 minutes: two fail-overs, cloud faults,
CA restarts) passes every invariant; the same history with one violation planted fails exactly where the
violation is. Also the schedule's promises: a seed decides everything, pods never outnumber what their pool
holds, and every fault kind is drawn; overlapping restarts of the one CA are not run twice."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos.checker import INVARIANTS, applied, check, pool_of, size_of, writer_term
from tests.e2e.chaos.nemesis import Applied, Nemesis, cloud_faults
from tests.e2e.chaos.schedule import FAULT_KINDS, SHAPES, make_schedule

RECORDED = Path(__file__).parent / "chaos" / "recorded-history.json"
History = dict[str, Any]


@pytest.fixture(scope="module")
def recorded() -> History:
    return dict(json.loads(RECORDED.read_text()))


def test_the_recorded_history_passes_every_invariant_and_checks_each(recorded: History) -> None:
    verdict = check(recorded)
    assert verdict.violations == []
    assert {name: result.checks > 0 for name, result in verdict.results.items()} == dict.fromkeys(INVARIANTS, True)
    terms = {writer_term(w) for w in recorded["writes"]}
    assert len(terms) >= 2, "the recorded run has writes of two terms at least (term-order is exercised)"


# ---------------------------------------------------------------------------------------------- planted violations
def _scale_ups(history: History) -> list[dict[str, Any]]:
    return [w for w in history["writes"] if size_of(w) is not None and applied(w)]


def applied_twice(history: History) -> None:
    """The last scale-up written again one delta higher a second later: the retry taken for a new change."""
    write = _scale_ups(history)[-1]
    again = copy.deepcopy(write)
    again["received"] += 1.0
    key = "size" if write["cloud"] == "scaleway" else "desired_size"
    again["body"][key] = size_of(write) + 1  # type: ignore[operator]
    history["writes"].append(again)


def unasked_size(history: History) -> None:
    """A size write long after any CA ask for that pool (the server acting on its own)."""
    write = copy.deepcopy(_scale_ups(history)[-1])
    write["received"] = write["at"] = float(history["times"]["settled"]) + 100.0
    _in_term(history, write)
    history["writes"].append(write)


def _in_term(history: History, write: dict[str, Any]) -> None:
    """Give ``write`` a Lease renewal of its term just before it, so that only the planted flaw shows."""
    holder, term = writer_term(write)  # type: ignore[misc]
    history["lease"].append(
        {
            "received": write["received"] - 1,
            "user": "",
            "verb": "update",
            "code": 200,
            "holder": holder,
            "transitions": term,
        }
    )


def unasked_delete(history: History) -> None:
    """A node DELETE for a live machine the CA never asked to remove."""
    template = next(w for w in history["writes"] if w["method"] == "DELETE" and applied(w))
    machine = next(m for m in history["final"]["machines"] if m["cloud"] == template["cloud"] and m["state"] == "live")
    write = copy.deepcopy(template)
    write["path"] = write["path"].rsplit("/", 1)[0] + "/" + machine["id"]
    history["writes"].append(write)


def above_max(history: History) -> None:
    pool = history["final"]["pools"][0]
    maximum = next(p["max"] for p in history["pools"] if p["id"] == pool["id"])
    history["sizes"].append(
        {"at": history["times"]["healed"], "cloud": pool["cloud"], "pool_id": pool["id"], "size": maximum + 1}
    )


def unnamed_writer(history: History) -> None:
    history["writes"][len(history["writes"]) // 2]["writer"] = ""


def after_deadline(history: History) -> None:
    """The Lease renewals of the last writing term stop 11 s before its last write (renew deadline 10 s)."""
    last = history["writes"][-1]
    holder, term = writer_term(last)  # type: ignore[misc]
    history["lease"] = [
        e
        for e in history["lease"]
        if not (e["holder"] == holder and e["transitions"] == term and e["received"] > last["received"] - 11)
    ]


def older_term_late(history: History) -> None:
    """A write of the first term that wrote, received after the next term's first write."""
    by_term: dict[Any, list[dict[str, Any]]] = {}
    for write in history["writes"]:
        by_term.setdefault(writer_term(write), []).append(write)
    first, second = sorted(by_term, key=lambda t: min(w["received"] for w in by_term[t]))[:2]
    late = copy.deepcopy(by_term[first][-1])
    late["received"] = min(w["received"] for w in by_term[second]) + 0.5
    late["handled"] = None  # refused by the cloud: sent all the same, which is what term-order forbids
    _in_term(history, late)
    history["writes"].append(late)


def pod_pending(history: History) -> None:
    pod = history["kubernetes"]["pods"][0]
    pod["phase"], pod["started"], pod["node"] = "Pending", None, None


def ca_target_differs(history: History) -> None:
    status = history["kubernetes"]["ca_status"]
    history["kubernetes"]["ca_status"] = status.replace("cloudProviderTarget: ", "cloudProviderTarget: 1", 1)


def orphan_machine(history: History) -> None:
    """A live machine its pool's size does not count (and so neither does the CA)."""
    machine = copy.deepcopy(next(m for m in history["final"]["machines"] if m["state"] == "live"))
    machine["id"], machine["provider_id"] = "orphan", machine["provider_id"] + "-orphan"
    history["final"]["machines"].append(machine)


def node_without_machine(history: History) -> None:
    history["kubernetes"]["nodes"].append({"name": "ghost", "provider_id": "scaleway://instance/fr-par-1/ghost"})


def memory_grows(history: History) -> None:
    sample = dict(history["memory"][-1])
    sample["rss_mib"] = float(history["config"]["memory_bound_mib"]) + 1
    history["memory"].append(sample)


# planted violation -> (the invariants that must catch it, and only they; how to plant it)
PLANTED: dict[str, tuple[set[str], Callable[[History], None]]] = {
    "a size change applied twice": ({"asked-size"}, applied_twice),
    "a size write no CA ask explains": ({"asked-size"}, unasked_size),
    "a node deleted the CA did not ask to delete": ({"asked-delete"}, unasked_delete),
    "a pool above its max": ({"bounds"}, above_max),
    "a write naming no term": ({"term-named"}, unnamed_writer),
    "a write after its term's renew deadline": ({"term-deadline"}, after_deadline),
    "an older term writing after the newer term's first write": ({"term-order"}, older_term_late),
    "a pod still pending after healing": ({"pods-run"}, pod_pending),
    "the CA's target not the cloud's": ({"ca-equals-cloud"}, ca_target_differs),
    "a machine outside its pool's count": ({"no-orphans", "ca-equals-cloud"}, orphan_machine),
    "a Node whose machine is gone": ({"no-orphans"}, node_without_machine),
    "a replica above the memory bound": ({"memory"}, memory_grows),
}


@pytest.mark.parametrize("planted", list(PLANTED))
def test_each_invariant_catches_a_violation_planted_in_the_recorded_history(recorded: History, planted: str) -> None:
    invariants, plant = PLANTED[planted]
    history = copy.deepcopy(recorded)
    plant(history)
    verdict = check(history)
    broken = {name for name, result in verdict.results.items() if result.violations}
    assert broken == invariants, verdict.violations


def test_every_invariant_has_a_planted_violation() -> None:
    assert set().union(*(invariants for invariants, _ in PLANTED.values())) == set(INVARIANTS)


# ---------------------------------------------------------------------------------------------- reading writes
def test_a_write_names_its_pool_size_and_term_as_each_cloud_sends_them() -> None:
    scaleway = {
        "cloud": "scaleway",
        "route": "update_pool",
        "method": "PATCH",
        "path": "/k8s/v1/regions/fr-par/pools/p-1",
        "body": {"size": 3},
        "writer": "replica-a_0a1b2c3d; term=4",
    }
    bizfly = {
        "cloud": "bizfly",
        "route": "update_pool",
        "method": "PATCH",
        "path": "/api/_/c-1/p-2",
        "body": {},
        "writer": "",
    }
    assert (pool_of(scaleway), size_of(scaleway), writer_term(scaleway)) == ("p-1", 3, ("replica-a_0a1b2c3d", 4))
    assert (pool_of(bizfly), size_of(bizfly), writer_term(bizfly)) == ("p-2", 0, None)


# ---------------------------------------------------------------------------------------------- the schedule
def test_a_seed_decides_the_whole_schedule() -> None:
    assert make_schedule(7, 300) == make_schedule(7, 300)
    assert make_schedule(7, 300) != make_schedule(8, 300)


@pytest.mark.parametrize("seed", range(1, 21))
def test_the_workload_never_asks_more_than_a_pool_holds_and_faults_end_in_the_window(seed: int) -> None:
    schedule = make_schedule(seed, 300)
    live: dict[str, set[str]] = {name: set() for name in SHAPES}
    for event in schedule.pods:
        (live[event.shape].add if event.action == "create" else live[event.shape].remove)(event.pod)
        assert len(live[event.shape]) <= SHAPES[event.shape].most
    assert all(f.at >= 0 and f.at + f.duration <= schedule.seconds for f in schedule.faults)


def test_twenty_seeds_draw_every_kind_of_fault_and_each_cloud_fault_becomes_simulator_faults() -> None:
    drawn = [event for seed in range(1, 21) for event in make_schedule(seed, 300).faults]
    assert {event.kind for event in drawn} == set(FAULT_KINDS)
    for event in drawn:
        if event.kind.startswith("cloud-"):
            faults = cloud_faults(event)
            assert faults and all(f.route != "*" for f in faults), event


# ---------------------------------------------------------------------------------------------- the nemesis
def test_a_restart_of_the_ca_while_its_last_restart_is_under_way_is_skipped() -> None:
    """Seed 11's first campaign: two overlapping ca-restart faults each started a CA, and two CAs ran side
    by side. The second restart is now skipped and recorded; a later one runs again."""
    nemesis = Nemesis(None, None, make_schedule(11, 300))  # type: ignore[arg-type]  # restarts touch neither
    began, release, restarts = threading.Event(), threading.Event(), []

    def slow_restart() -> None:
        restarts.append("slow")
        began.set()
        release.wait(5)

    first, second, third = Applied("ca-restart", 1.0), Applied("ca-restart", 2.0), Applied("ca-restart", 3.0)
    thread = threading.Thread(target=nemesis._restart_once, args=("cluster-autoscaler", first, slow_restart))
    thread.start()
    assert began.wait(5)
    nemesis._restart_once("cluster-autoscaler", second, lambda: restarts.append("overlapping"))
    release.set()
    thread.join(5)
    nemesis._restart_once("cluster-autoscaler", third, lambda: restarts.append("later"))
    assert restarts == ["slow", "later"]
    assert (first.injected, second.injected, third.injected) == (True, False, True), second.note
