"""deploy/monitoring: the kustomize tree renders, its ConfigMap is valid Kubernetes, the Prometheus
Operator objects are well formed (no schema for CRDs in kubernetes-validate), the ServiceMonitor
finds the metrics Service of every layout, and the PromQL checker (tests/deploy/promql.py) catches
what it is there to catch. The PromQL itself is checked against a real scrape in
tests/integration/test_operations.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest

from tests.deploy import promql
from tests.deploy.chart import CHARTS, ChartSource, helm_template
from tests.deploy.rendering import DEPLOY, find_kustomize, objects, one, render
from tests.deploy.test_manifests import KUBERNETES_VERSIONS

MONITORING = "../monitoring"  # relative to deploy/kubernetes, like the other trees
OPERATOR_API = "monitoring.coreos.com/v1"
_DURATION = r"^\d+(ms|s|m|h)$"


def test_monitoring_tree_renders_the_operator_objects_and_the_dashboard() -> None:
    docs = render(MONITORING)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
    assert all(d["metadata"]["namespace"] == "kube-system" for d in docs)
    dashboard = one(docs, "ConfigMap", "ca-externalgrpc-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["grafana-dashboard.json"])["uid"] == "ca-externalgrpc"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_monitoring_core_objects_are_valid_kubernetes_objects(version: str) -> None:
    for doc in render(MONITORING):
        if doc["apiVersion"] != OPERATOR_API:
            kubernetes_validate.validate(doc, version, strict=True)


def test_prometheus_rules_are_well_formed_and_parse() -> None:
    (rule_doc,) = list(objects(render(MONITORING), "PrometheusRule"))
    assert rule_doc["apiVersion"] == OPERATOR_API
    rules = [r for g in rule_doc["spec"]["groups"] for r in g["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 8
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"])
        assert re.match(_DURATION, rule["for"])
        promql_parser.parse(rule["expr"])
    metrics = " ".join(r["expr"] for r in rules)
    for needed in (
        "ca_externalgrpc_snapshot_stale",
        "ca_externalgrpc_backend_sync_failure",
        'circuit_breaker_state{state!="closed"}',  # open or half-open: a hanging cloud alternates them
        "grpc_server_handled_total",
        'status="429"',
        "absent(ca_externalgrpc_build_info)",
        'up{job="ca-externalgrpc"}',
    ):
        assert needed in metrics, f"no alert reads {needed}"


def test_dashboard_queries_all_parse_and_panels_do_not_overlap() -> None:
    queries = promql.dashboard_queries()
    assert len(queries) >= 12
    for query in queries:
        promql_parser.parse(query.expr)
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & area, f"panel {panel['title']!r} overlaps another"
        cells |= area


def _service_monitor() -> dict[str, Any]:
    (monitor,) = list(objects(render(MONITORING), "ServiceMonitor"))
    return monitor


def _selects(service: dict[str, Any]) -> bool:
    monitor = _service_monitor()["spec"]
    labels = service["metadata"].get("labels", {})
    ports = {p["name"] for p in service["spec"]["ports"]}
    return (
        monitor["selector"]["matchLabels"].items() <= labels.items()
        and service["metadata"]["namespace"] in monitor["namespaceSelector"]["matchNames"]
        and any(endpoint["port"] in ports for endpoint in monitor["endpoints"])
    )


@pytest.mark.parametrize(
    ("tree", "service"),
    [
        ("overlays/scaleway", "ca-externalgrpc-metrics"),
        ("overlays/bizfly", "ca-externalgrpc-metrics"),
        ("overlays/mtls-service", "ca-externalgrpc-server"),
        ("server-mtls", "ca-externalgrpc-server"),
    ],
)
def test_service_monitor_finds_the_servers_metrics_service_in_every_kustomize_layout(tree: str, service: str) -> None:
    docs = render(tree)
    assert _selects(one(docs, "Service", service))
    assert not any(_selects(s) for s in objects(docs, "Service") if s["metadata"]["name"] != service)


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_service_monitor_finds_the_helm_sidecars_metrics_service_and_not_the_cas(source: ChartSource) -> None:
    docs = helm_template(source, (DEPLOY / "helm" / "values-sidecar.yaml",), "1.34.0")
    assert _selects(one(docs, "Service", "ca-externalgrpc-metrics"))
    assert not _selects(one(docs, "Service", "cluster-autoscaler"))


# ---------------------------------------------------------------------------------------------------
# The checker can fail: each kind of mistake it exists to catch, against a small scrape

SCRAPE = promql.Scrape.parse(
    """# TYPE ca_externalgrpc_cloud_api_requests_total counter
ca_externalgrpc_cloud_api_requests_total{backend="scw",api="scaleway",endpoint="pools",method="GET",status="200"} 3
ca_externalgrpc_cloud_api_requests_total{backend="scw",api="scaleway",endpoint="pools",method="GET",status="429"} 1
"""
)


@pytest.mark.parametrize(
    ("expr", "labels", "complaint"),
    [
        ("rate(ca_externalgrpc_cloud_api_request_total[5m])", (), "is not in the scrape"),
        ('rate(ca_externalgrpc_cloud_api_requests_total{provider="scaleway"}[5m])', (), "has no label 'provider'"),
        ('rate(ca_externalgrpc_cloud_api_requests_total{status="503"}[5m])', (), "matches nothing"),
        ('rate(ca_externalgrpc_cloud_api_requests_total{status=~"5.."}[5m])', (), "matches nothing"),
        ("sum by (cloud) (ca_externalgrpc_cloud_api_requests_total)", (), "groups by 'cloud'"),
        ("sum by (backend) (ca_externalgrpc_cloud_api_requests_total)", ("api",), "label 'api'"),
        ("sum by (backend (", (), "does not parse"),
    ],
)
def test_promql_checker_reports_each_kind_of_mismatch(expr: str, labels: tuple[str, ...], complaint: str) -> None:
    found = promql.problems(promql.Query("q", expr, labels), SCRAPE)
    assert found and complaint in found[0], found


def test_promql_checker_accepts_what_the_scrape_has_and_target_labels() -> None:
    expr = (
        'sum by (namespace, pod, backend, api) (rate(ca_externalgrpc_cloud_api_requests_total{status="429",'
        'job=~".+"}[10m])) > 0'
    )
    assert promql.problems(promql.Query("q", expr, ("backend", "api")), SCRAPE) == []


# ---------------------------------------------------------------------------------------------------
# Selection by the Prometheus Operator: kube-prometheus-stack's Prometheus, with its default values
# (serviceMonitorSelectorNilUsesHelmValues and ruleSelectorNilUsesHelmValues true), selects
# ServiceMonitors and PrometheusRules labelled `release: <its Helm release name>`, in every namespace
# (its templates/prometheus/prometheus.yaml). Without the label both are silently ignored.

KUBE_PROMETHEUS_STACK = "kube-prometheus-stack"


def _selected_by_default(obj: dict[str, Any], release: str = KUBE_PROMETHEUS_STACK) -> bool:
    return obj["metadata"].get("labels", {}).get("release") == release


def test_kube_prometheus_stacks_default_selectors_pick_up_the_service_monitor_and_the_rules() -> None:
    docs = render(MONITORING)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = list(objects(docs, kind))
        assert _selected_by_default(obj), f"the {kind} carries {obj['metadata'].get('labels')}"


def test_the_release_label_is_set_in_an_overlay_for_another_release_name(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(DEPLOY / 'monitoring', tmp_path)}\n"
        "labels:\n  - pairs:\n      release: prometheus\n"
    )
    docs = find_kustomize().render(tmp_path)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = list(objects(docs, kind))
        assert _selected_by_default(obj, "prometheus")
        assert obj["spec"] == next(objects(render(MONITORING), kind))["spec"]


@pytest.mark.parametrize("values", ["values-sidecar.yaml", "values-mtls-service.yaml"])
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_the_charts_service_monitor_for_the_ca_carries_the_release_label(source: ChartSource, values: str) -> None:
    docs = helm_template(source, (DEPLOY / "helm" / values,), "1.34.0", ("serviceMonitor.enabled=true",))
    (monitor,) = list(objects(docs, "ServiceMonitor"))
    assert _selected_by_default(monitor), monitor["metadata"]
    other = helm_template(
        source,
        (DEPLOY / "helm" / values,),
        "1.34.0",
        ("serviceMonitor.enabled=true", "serviceMonitor.selector.release=prom"),
    )
    assert _selected_by_default(next(objects(other, "ServiceMonitor")), "prom")
