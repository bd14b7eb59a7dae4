"""The smoke of ``make alerts``: a real Prometheus scraping real servers with the shipped rules and
dashboard, in about a minute (scrapes every 2 s, evaluations and a CA loop every second, short
cloud timeouts; ``make alerts`` runs every fault with the shipped intervals and measures the times).

Three clusters (tests/monitoring/clusters.py), each a namespace of its own: one healthy, one whose
cloud refuses the server's key from the start, one whose cloud starts to hang once Prometheus scrapes
it. Checked:

- every rule loads and evaluates without error against the real series;
- every dashboard query, with the dashboard's variables as Grafana sends them (all, or one namespace
  and pod), returns data for the healthy server (no "No data": zeros where nothing happened) and no NaN;
  the variables list what the scrape carries;
- the wrong key makes CaExternalGrpcCloudRefusesConfig (and the stale snapshot) pending for that
  namespace only;
- the hanging cloud makes CaExternalGrpcCloudBreakerOpen pending and keeps it pending while the breaker
  goes open, half-open (a probe that times out) and open again; with a rule on ``state="open"`` the
  half-open scrape ended it every cycle, and it never fired;
- the healthy server has no alert pending.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy import promql
from tests.monitoring.clusters import Cluster
from tests.monitoring.prometheus import AlertLog, Prometheus
from tests.monitoring.tools import DASHBOARD

FAST_SYNC = {"interval": "2s", "min_interval": "1s"}
# A probe (the breaker's half-open call) that times out after 3 s (one or two scrapes see it), one attempt per call:
# the breaker opens after five failed syncs, about 20 s, then probes every 30 s.
HANGING_CLOUD = {"request_timeout": "3s", "max_attempts": 1}
CLUSTER_LABEL = "smoke"
RATE_INTERVAL = "15s"  # at least Grafana's $__rate_interval for a 2 s scrape (4 scrapes) and a short range


@dataclass
class Lab:
    prometheus: Prometheus
    healthy: Cluster
    wrong_key: Cluster
    hanging: Cluster
    hang_started: float  # time.time() when the cloud started to hang
    log: AlertLog


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    workdir = Path(tmp_path_factory.mktemp("prometheus-smoke"))
    clusters: list[Cluster] = []
    prometheus = None

    def cluster(name: str, **extra: Any) -> Cluster:
        clusters.append(Cluster(name, workdir / name, scan_interval=1.0, sync=FAST_SYNC, **extra))
        return clusters[-1]

    try:
        # The hanging cloud first: its breaker takes about 20 s to open, while the others start.
        hanging = cluster("hanging", cloud=HANGING_CLOUD)
        _wait(f"{hanging.name}: a good sync, the breaker closed", lambda: _closed(hanging), 30)
        hanging.network.set("hang")
        hang_started = time.time()
        healthy, wrong_key = cluster("healthy"), cluster("wrong-key", key_refused=True)
        targets = [c.target for c in clusters]
        targets = [type(t)(t.address, t.namespace, t.pod, {"cluster": CLUSTER_LABEL}) for t in targets]
        # Scrapes every 2 s: a scrape may take as long (its timeout), and one that fails makes every series
        # of the target stale, which ends a pending alert; on a loaded machine 1 s was too short for that.
        prometheus = Prometheus(workdir / "prometheus", targets, scrape_interval="2s", evaluation_interval="1s")
        yield Lab(prometheus, healthy, wrong_key, hanging, hang_started, AlertLog(prometheus))
    finally:
        if prometheus is not None:
            prometheus.stop()
        for each in clusters:
            each.stop()


BREAKER_STATE = 'ca_externalgrpc_cloud_api_circuit_breaker_state{{namespace="hanging", state="{}"}}'


def _closed(cluster: Cluster) -> bool:
    """The server's own /metrics: a good sync done (not stale) and the breaker closed."""
    status, text = cluster.server.http_get("/metrics")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    stale = [v for (name, _), v in samples.items() if name == "ca_externalgrpc_snapshot_stale"]
    closed = [
        v
        for (name, labels), v in samples.items()
        if name == "ca_externalgrpc_cloud_api_circuit_breaker_state" and ("state", "closed") in labels
    ]
    return status == 200 and stale == [0.0] and closed == [1.0]


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.5)


def _alerts(prometheus: Prometheus, name: str, namespace: str) -> list[dict]:
    return [
        a for a in prometheus.alerts() if a["labels"]["alertname"] == name and a["labels"].get("namespace") == namespace
    ]


def test_every_rule_loads_and_evaluates_without_error(lab: Lab) -> None:
    def evaluated() -> list[tuple[str, str, str]]:
        health = lab.prometheus.rule_health()
        return health if all(h != "unknown" for _, h, _ in health) else []

    health = lab.prometheus.wait("every rule evaluated", evaluated, 30)
    assert [(name, h, error) for name, h, error in health if h != "ok"] == []


def _dashboard_variables(namespace: str, pod: str) -> dict[str, str]:
    return {
        "$__rate_interval": RATE_INTERVAL,
        "$cluster": ".*",
        "$namespace": namespace,
        "$pod": pod,
        "$backend": ".*",
    }


@pytest.mark.parametrize(("namespace", "pod"), [(".*", ".*"), ("healthy", "healthy-0")], ids=["all", "one pod"])
def test_every_dashboard_query_shows_data_and_no_nan(lab: Lab, namespace: str, pod: str) -> None:
    queries = promql.dashboard_queries(DASHBOARD, _dashboard_variables(namespace, pod))

    def empty_or_nan() -> list[str]:
        problems = []
        for query in queries:
            result = lab.prometheus.query(query.expr)
            if not result:
                problems.append(f"{query.where}: No data")
            problems += [f"{query.where}: NaN for {r['metric']}" for r in result if math.isnan(float(r["value"][1]))]
        return problems

    # Rates need two scrapes in their window; wait for them, then every query must have data.
    deadline = time.monotonic() + 30
    while (problems := empty_or_nan()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not problems, "\n".join(problems)


def test_the_dashboard_variables_list_what_the_scrape_carries(lab: Lab) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}
    assert list(variables) == ["cluster", "namespace", "pod", "backend"]
    chosen = {"$cluster": CLUSTER_LABEL, "$namespace": "healthy", "$pod": "healthy-0"}

    def values(name: str) -> list[str]:
        definition = variables[name]["definition"]
        for variable, value in chosen.items():
            definition = definition.replace(variable, value)
        match, label = definition.removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
        return lab.prometheus.label_values(label.strip(), match.strip())

    assert values("cluster") == [CLUSTER_LABEL]
    assert values("namespace") == ["hanging", "healthy", "wrong-key"]
    assert values("pod") == ["healthy-0"]
    assert values("backend") == ["scaleway"]


def test_a_wrong_key_makes_the_refusal_alert_pending_for_its_backend_only(lab: Lab) -> None:
    refused = lab.prometheus.wait(
        "CaExternalGrpcCloudRefusesConfig pending",
        lambda: _alerts(lab.prometheus, "CaExternalGrpcCloudRefusesConfig", "wrong-key"),
        30,
    )
    assert [(a["labels"]["backend"], a["labels"]["reason"]) for a in refused] == [("scaleway", "credentials")]
    lab.prometheus.wait(
        "CaExternalGrpcSnapshotStale pending",
        lambda: _alerts(lab.prometheus, "CaExternalGrpcSnapshotStale", "wrong-key"),
        30,
    )
    for namespace in ("healthy", "hanging"):
        assert not _alerts(lab.prometheus, "CaExternalGrpcCloudRefusesConfig", namespace)


def test_a_hanging_cloud_keeps_the_breaker_alert_pending_through_its_probes(lab: Lab) -> None:
    prometheus = lab.prometheus
    name = "CaExternalGrpcCloudBreakerOpen"
    opened = prometheus.wait("the breaker alert pending", lambda: _alerts(prometheus, name, "hanging"), 60, 0.5)
    active_at = opened[0]["activeAt"]
    probed = f"max_over_time({BREAKER_STATE.format('half-open')}[2m])"

    def after_a_probe() -> bool:
        lab.log.poll(time.time())
        open_again = prometheus.query(f"{BREAKER_STATE.format('open')} == 1")
        return bool(prometheus.query(f"{probed} == 1")) and bool(open_again)

    prometheus.wait("a half-open probe scraped, then open again", after_a_probe, 75, 0.5)
    lab.log.poll(time.time())
    still = _alerts(prometheus, name, "hanging")
    scrapes = prometheus.query('min_over_time(up{namespace="hanging"}[3m])')
    slowest = prometheus.query('max_over_time(scrape_duration_seconds{namespace="hanging"}[3m])')
    restarted = f"the alert restarted its pending time (lowest up {scrapes}, slowest scrape {slowest})"
    assert still and still[0]["activeAt"] == active_at, restarted
    assert lab.log.resets.get(name, 0) == 0


def test_the_healthy_server_has_no_alert_pending(lab: Lab) -> None:
    assert [a["labels"] for a in lab.prometheus.alerts() if a["labels"].get("namespace") == "healthy"] == []
