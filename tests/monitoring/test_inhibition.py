"""The shipped inhibition rules (deploy/monitoring/alertmanager-inhibit-rules.yaml) in a real Alertmanager:
one cause pages once, and an alert of another backend, pod or cluster is never silenced by it.

Alerts are posted as Prometheus posts them, with the labels the shipped rules give them (the wrong key
that paged twice is tests/monitoring/test_rules.py's "a wrong key from the start" case: both fire).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.monitoring.prometheus import Alertmanager

POD = {"cluster": "kapsule-1", "namespace": "kube-system", "pod": "ca-0"}
BACKEND = {**POD, "backend": "scaleway"}
SETTLE_SECONDS = 10.0
SCRAPE = {"job": "ca-externalgrpc", "instance": "10.0.0.5:8087"}


def alert(name: str, **labels: str) -> dict[str, str]:
    return {"alertname": name, **labels}


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    manager = Alertmanager(Path(tmp_path_factory.mktemp("alertmanager")))
    try:
        yield manager
    finally:
        manager.stop()


CASES = {
    "a wrong key": (
        [
            alert("CaExternalGrpcCloudRefusesConfig", **BACKEND, reason="credentials", severity="critical"),
            alert("CaExternalGrpcSnapshotStale", **BACKEND, severity="critical"),
            alert("CaExternalGrpcSnapshotStale", **POD, backend="bizfly", severity="critical"),  # another backend
            alert("CaExternalGrpcSnapshotStale", **{**BACKEND, "cluster": "kapsule-2"}, severity="critical"),
        ],
        {"CaExternalGrpcSnapshotStale/scaleway/kapsule-1"},
    ),
    "a stale view makes the CA's calls fail": (
        [
            alert("CaExternalGrpcSnapshotStale", **BACKEND, severity="critical"),
            alert("CaExternalGrpcRpcErrors", **POD, grpc_method="Refresh", grpc_code="Unavailable", severity="warning"),
            alert("CaExternalGrpcRpcErrors", **POD, grpc_method="NodeGroups", grpc_code="Internal", severity="warning"),
        ],
        {"CaExternalGrpcRpcErrors/Refresh/kapsule-1"},
    ),
    "the cloud rate-limits": (
        [
            alert("CaExternalGrpcCloudRateLimited", **BACKEND, api="scaleway", severity="warning"),
            alert("CaExternalGrpcCloudBreakerOpen", **BACKEND, api="scaleway", severity="warning"),
            alert("CaExternalGrpcCloudBreakerOpen", **POD, backend="bizfly", api="bizfly", severity="warning"),
        ],
        {"CaExternalGrpcCloudBreakerOpen/scaleway/kapsule-1"},
    ),
    "no server is scraped": (
        [
            alert("CaExternalGrpcAbsent", cluster="kapsule-1", severity="critical"),
            alert("CaExternalGrpcTargetDown", **POD, **SCRAPE, severity="warning"),
            alert("CaExternalGrpcTargetDown", **{**POD, "cluster": "kapsule-2"}, **SCRAPE, severity="warning"),
        ],
        {"CaExternalGrpcTargetDown/-/kapsule-1"},
    ),
}


def key(labels: dict[str, str]) -> str:
    detail = labels.get("backend") or labels.get("grpc_method") or "-"
    return f"{labels['alertname']}/{detail}/{labels['cluster']}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_one_cause_pages_once(alertmanager: Alertmanager, case: str) -> None:
    posted, inhibited = CASES[case]
    # Each case in clusters of its own, so the cases sent to this one Alertmanager never meet.
    tag = case.replace(" ", "-")
    sent = [{**labels, "cluster": f"{tag}/{labels['cluster']}"} for labels in posted]
    alertmanager.post([{"labels": labels, "annotations": {"summary": case}} for labels in sent])

    def held() -> dict[str, dict]:
        return {
            key({**a["labels"], "cluster": a["labels"]["cluster"].split("/")[1]}): a["status"]
            for a in alertmanager.alerts()
            if a["labels"]["cluster"].startswith(f"{tag}/")
        }

    def suppressed_in(alerts: dict[str, dict]) -> set[str]:
        return {name for name, status in alerts.items() if status["state"] == "suppressed"}

    # Alertmanager's inhibitor learns of a posted alert from its alert stream, a moment after the POST is
    # answered (an inhibiting alert read at once may not inhibit yet): read again for up to SETTLE_SECONDS.
    now, deadline = held(), time.monotonic() + SETTLE_SECONDS
    while suppressed_in(now) != inhibited and time.monotonic() < deadline:
        time.sleep(0.2)
        now = held()
    assert set(now) == {key(labels) for labels in posted}
    assert suppressed_in(now) == inhibited
    for name in inhibited:
        assert now[name]["inhibitedBy"], name
