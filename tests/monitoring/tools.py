"""Prometheus' own programs (Debian's ``prometheus`` and ``prometheus-alertmanager`` packages), and the
shipped monitoring files in the shape they read.

Tests find the programs on PATH and fail with the command that installs them when one is missing
(``.ci/run`` installs both on a fresh machine). The rules ship as a Prometheus Operator PrometheusRule;
Prometheus and promtool read a plain rule file, which is its ``spec`` (the same ``groups``), written by
``write_rule_file``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
SERVICE_MONITOR = MONITORING / "servicemonitor.yaml"
INHIBIT_RULES = MONITORING / "alertmanager-inhibit-rules.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

#: program -> the Debian package that installs it
PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
}


class ToolMissing(RuntimeError):
    """A program of Prometheus' is not installed."""


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ToolMissing(
            f"{name} is not on PATH: install Debian's {PACKAGES[name]} package "
            f"(apt-get install {PACKAGES[name]}; .ci/run does it on a fresh machine)"
        )
    return found


def rules() -> list[dict[str, Any]]:
    """Every alerting rule of the shipped PrometheusRule, in file order."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in rules()]


def write_rule_file(path: Path) -> Path:
    """The PrometheusRule's ``spec`` as a plain rule file (what Prometheus and promtool load)."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}, sort_keys=False))
    return path


_LABEL_REF = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def render_annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations for an alert with ``labels``: our annotations only use ``{{ $labels.x }}``."""
    rendered = {}
    for key, text in rule.get("annotations", {}).items():
        text = _LABEL_REF.sub(lambda m: labels.get(m.group(1), ""), text)
        if "{{" in text:
            raise ValueError(f"{rule['alert']}: annotation {key} uses a template beyond {{{{ $labels.x }}}}")
        rendered[key] = text
    return rendered


def scrape_job() -> dict[str, Any]:
    """The ServiceMonitor's one endpoint: interval, path and relabelings, as the Operator reads them."""
    (endpoint,) = yaml.safe_load(SERVICE_MONITOR.read_text())["spec"]["endpoints"]
    return dict(endpoint)


def relabel_configs(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceMonitor's ``relabelings`` as Prometheus ``relabel_configs`` (the Operator's translation:
    the same fields in snake case)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{keys.get(k, k): v for k, v in r.items()} for r in relabelings]
