"""The PromQL of deploy/monitoring (alert rules and the Grafana dashboard) checked against a scrape.

Every expression is parsed with a real PromQL parser (the ``promql-parser`` package, bindings of the
Rust parser the GreptimeDB project maintains). Then, for a /metrics text of the real server:

* every selected metric name has samples;
* every label a selector matches on exists on that metric, and an equality or positive regex
  matcher matches at least one value the server really wrote;
* every ``by``/``on`` label exists on a metric the expression reads;
* every ``{{ $labels.x }}`` of an alert and ``{{x}}`` of a dashboard legend is a label the result keeps.

Labels Prometheus adds at scrape time (``namespace``, ``pod``, ``instance``, ``job``...) are allowed
everywhere without being in the scrape, and so are the series it writes for every target (``up``),
which carry those labels only.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
#: labels a Prometheus scrape adds to every series (Kubernetes service discovery, relabelling), and the
#: ``cluster`` label a multi-cluster setup adds (external labels, remote write)
TARGET_LABELS = frozenset({"namespace", "pod", "instance", "job", "container", "service", "endpoint", "cluster"})
#: series Prometheus itself writes for every target it scrapes (they carry the target labels only)
SCRAPE_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
#: Grafana variables, replaced by what Grafana would send for "All" and a typical range
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$backend": ".*", "$cluster": ".*", "$namespace": ".*", "$pod": ".*"}


@dataclass(frozen=True)
class Query:
    """One expression to check and where it comes from."""

    where: str
    expr: str
    result_labels: tuple[str, ...] = ()  # labels the text around it uses ({{ $labels.x }}, {{x}})


@dataclass
class Scrape:
    """Which labels and values each metric name carries in one /metrics text."""

    labels: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))

    @classmethod
    def parse(cls, text: str) -> Scrape:
        scrape = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values = scrape.labels[sample.name]
                for key, value in sample.labels.items():
                    values[key].add(value)
                values.setdefault("__name__", set()).add(sample.name)
        return scrape


def alert_queries(path: Path = MONITORING / "prometheusrule.yaml") -> list[Query]:
    rule_doc = yaml.safe_load(path.read_text())
    queries = []
    for group in rule_doc["spec"]["groups"]:
        for rule in group["rules"]:
            texts = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
            used = sorted({m for t in texts for m in re.findall(r"\$labels\.(\w+)", str(t))})
            queries.append(Query(f"alert {rule['alert']}", rule["expr"], tuple(used)))
    return queries


def dashboard_queries(
    path: Path = MONITORING / "grafana-dashboard.json", variables: dict[str, str] = GRAFANA_VARIABLES
) -> list[Query]:
    """Every panel's expression, with ``variables`` replaced as Grafana replaces them."""
    dashboard = json.loads(path.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in variables.items():
                expr = expr.replace(variable, value)
            used = tuple(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            queries.append(Query(f"panel {panel['title']!r} {target['refId']}", expr, used))
    return queries


def _nodes(expr: Any) -> Iterator[Any]:
    found: list[Any] = []
    promql_parser.walk(expr, pre_visit=lambda node: found.append(node) or True)
    yield from found


def _grouping(node: Any) -> list[str]:
    """``by (...)`` of an aggregation, ``on (...)`` of a binary operation; [] for ``without``/``ignoring``."""
    if (
        isinstance(node, promql_parser.AggregateExpr)
        and node.modifier is not None
        and node.modifier.type == promql_parser.AggModifierType.By
    ):
        return list(node.modifier.labels)
    if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
        matching = node.modifier.matching
        if matching is not None and matching.type == promql_parser.LabelModifierType.Include:
            return list(matching.labels)
    return []


def _kept_labels(expr: Any) -> set[str] | None:
    """Labels the result of ``expr`` keeps, when an outer ``by`` decides them; None when all are kept."""
    node = expr
    while True:
        if isinstance(node, promql_parser.ParenExpr):
            node = node.expr
        elif isinstance(node, promql_parser.BinaryExpr):
            # A comparison or `and` with a number keeps the vector side's labels.
            node = node.lhs if not isinstance(node.lhs, promql_parser.NumberLiteral) else node.rhs
        elif isinstance(node, promql_parser.Call) and node.func.name == "histogram_quantile":
            node = node.args[1]
        elif isinstance(node, promql_parser.AggregateExpr):
            by = _grouping(node)
            return set(by) - {"le"} if by else None
        else:
            return None


def problems(query: Query, scrape: Scrape) -> list[str]:
    """Everything in ``query`` that the scrape contradicts (empty when it checks out)."""
    try:
        expr = promql_parser.parse(query.expr)
    except Exception as err:  # the parser raises ValueError-like errors with a position
        return [f"{query.where}: does not parse: {err}"]
    found: list[str] = []
    read_labels: set[str] = set(TARGET_LABELS)
    for node in _nodes(expr):
        if not isinstance(node, promql_parser.VectorSelector):
            continue
        name = node.name
        if name in SCRAPE_SERIES:
            found.extend(m for m in _target_matcher_problems(query.where, name, node.matchers.matchers))
            continue
        if name not in scrape.labels:
            found.append(f"{query.where}: metric {name} is not in the scrape")
            continue
        present = scrape.labels[name]
        read_labels |= set(present)
        for matcher in node.matchers.matchers:
            found.extend(_matcher_problems(query.where, name, matcher, present))
    for node in _nodes(expr):
        for label in _grouping(node):
            if label not in read_labels:
                found.append(f"{query.where}: groups by {label!r}, which no metric it reads carries")
    kept = _kept_labels(expr)
    for label in query.result_labels:
        if label not in read_labels or (kept is not None and label not in kept):
            found.append(f"{query.where}: its text uses label {label!r}, which the result does not carry")
    return found


def _target_matcher_problems(where: str, metric: str, matchers: Any) -> Iterable[str]:
    for matcher in matchers:
        if matcher.name not in TARGET_LABELS:
            yield f"{where}: {metric} has only the target labels, not {matcher.name!r}"


def _matcher_problems(where: str, metric: str, matcher: Any, present: dict[str, set[str]]) -> Iterable[str]:
    label, value, op = matcher.name, matcher.value, matcher.op
    if label in TARGET_LABELS:
        return
    if label not in present:
        yield f"{where}: {metric} has no label {label!r} (it has {sorted(present)})"
        return
    values = present[label]
    if op == promql_parser.MatchOp.Equal and value not in values:
        yield f"{where}: {metric}{{{label}={value!r}}} matches nothing; values seen: {sorted(values)}"
    if op == promql_parser.MatchOp.Re and not any(re.fullmatch(value, v) for v in values):
        yield f"{where}: {metric}{{{label}=~{value!r}}} matches nothing; values seen: {sorted(values)}"


def all_queries() -> list[Query]:
    return alert_queries() + dashboard_queries()
