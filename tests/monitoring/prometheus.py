"""A real Prometheus (and Alertmanager) on loopback, scraping real servers with the shipped rules loaded.

``Prometheus`` runs Debian's ``prometheus`` binary with a configuration written here: one scrape job
shaped by the shipped ServiceMonitor (its path, its interval unless a test asks for a shorter one, its
relabelings translated as the Operator translates them), one static target per server with the labels
Kubernetes service discovery would add (``namespace``, ``pod``), the shipped rule file
(tools.write_rule_file), and optionally an Alertmanager. ``Alertmanager`` runs Debian's
``prometheus-alertmanager`` with the shipped inhibition rules and a receiver that drops everything: the
tests read its API to see which alerts would notify and which are inhibited.

Both listen on 127.0.0.1 port 0 (the bound port is read from /proc) and keep their data in a
temporary directory. ``AlertLog`` polls Prometheus' alerts and records when each alert became pending,
firing and resolved.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devstack.harness import ChildProcess
from tests.monitoring.tools import INHIBIT_RULES, relabel_configs, scrape_job, tool, write_rule_file

START_SECONDS = 60.0


@dataclass(frozen=True)
class Target:
    """One server's metrics endpoint and the labels a Kubernetes scrape would give it."""

    address: str  # host:port of /metrics
    namespace: str = "kube-system"
    pod: str = "ca-externalgrpc-0"
    extra: Mapping[str, str] = field(default_factory=dict)

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, **self.extra}


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def _serving(process: ChildProcess, ready_path: str, what: str) -> str:
    """``host:port`` once the process answers ``ready_path`` there."""
    address = process.wait_listening(START_SECONDS)
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}{ready_path}", timeout=2) as answer:
                if answer.status == 200:
                    return address
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"{what} not ready after {START_SECONDS:.0f}s:\n{process.log_tail()}")
        time.sleep(0.2)


class Alertmanager:
    """Alertmanager with the shipped inhibition rules; every alert goes to a receiver that drops it."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        inhibit = yaml.safe_load(INHIBIT_RULES.read_text())["inhibit_rules"]
        config = {
            "route": {"receiver": "drop", "group_by": ["..."]},
            "receivers": [{"name": "drop"}],
            "inhibit_rules": inhibit,
        }
        path = workdir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            tool("prometheus-alertmanager"),
            f"--config.file={path}",
            f"--storage.path={workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--cluster.listen-address=",  # no gossip port
            "--log.level=warn",
        ]
        self.process = ChildProcess(argv, log_path=workdir / "alertmanager.log", name="alertmanager")
        self.address = _serving(self.process, "/-/ready", "alertmanager")

    def post(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Send alerts as Prometheus does (``labels``, ``annotations``, ``startsAt``...)."""
        request = urllib.request.Request(
            f"http://{self.address}/api/v2/alerts",
            data=json.dumps(list(alerts)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert it holds, each with ``status.state`` (active, suppressed) and ``status.inhibitedBy``."""
        return list(_get(f"http://{self.address}/api/v2/alerts"))

    def stop(self) -> None:
        self.process.stop()


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: Sequence[Target],
        *,
        scrape_interval: str | None = None,
        evaluation_interval: str = "30s",
        external_labels: Mapping[str, str] | None = None,
        alertmanager: str | None = None,
    ) -> None:
        """``scrape_interval`` defaults to the ServiceMonitor's; 30 s evaluation is the Operator's default."""
        workdir.mkdir(parents=True, exist_ok=True)
        endpoint = scrape_job()
        job: dict[str, Any] = {
            # The Operator names the job after the Service; the ServiceMonitor's relabeling renames it.
            "job_name": "ca-externalgrpc-metrics",
            "metrics_path": endpoint["path"],
            "scrape_interval": scrape_interval or endpoint["interval"],
            "static_configs": [{"targets": [t.address], "labels": t.labels()} for t in targets],
            "relabel_configs": relabel_configs(endpoint.get("relabelings", [])),
        }
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": job["scrape_interval"],
                "evaluation_interval": evaluation_interval,
                "external_labels": dict(external_labels or {}),
            },
            "rule_files": [str(write_rule_file(workdir / "rules.yaml"))],
            "scrape_configs": [job],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            tool("prometheus"),
            f"--config.file={path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--log.level=warn",
        ]
        self.process = ChildProcess(argv, log_path=workdir / "prometheus.log", name="prometheus")
        self.address = _serving(self.process, "/-/ready", "prometheus")

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        answer = _get(f"http://{self.address}/api/v1/{path}{query}")
        if answer.get("status") != "success":
            raise RuntimeError(f"{path}: {answer}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: ``[{"metric": {...}, "value": [time, "text"]}, ...]``."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr}: a {data['resultType']}, not a vector")
        return list(data["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` lists."""
        return list(self.api(f"label/{label}/values", **{"match[]": match}))

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts: ``labels``, ``state``, ``activeAt``."""
        return list(self.api("alerts")["alerts"])

    def rule_health(self) -> list[tuple[str, str, str]]:
        """(rule, health, last error) of every loaded rule."""
        groups = self.api("rules")["groups"]
        return [(r["name"], r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]]

    def wait(self, what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f}s; alerts now: {self.alerts()}")
            time.sleep(every)

    def stop(self) -> None:
        self.process.stop()


@dataclass
class AlertTimes:
    """When one alert (by name and labels) was first seen pending and firing, and seen gone after firing."""

    pending: float | None = None
    firing: float | None = None
    resolved: float | None = None


class AlertLog:
    """Polls ``Prometheus.alerts()`` and keeps, per alert name, the times its states were first seen."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.prometheus = prometheus
        self.times: dict[str, AlertTimes] = {}
        self.resets: dict[str, int] = {}  # pending alerts that went away before firing

    def poll(self, now: float) -> None:
        seen: dict[str, str] = {}
        for alert in self.prometheus.alerts():
            name = alert["labels"]["alertname"]
            seen[name] = "firing" if "firing" in (alert["state"], seen.get(name)) else alert["state"]
        for name, state in seen.items():
            times = self.times.setdefault(name, AlertTimes())
            if times.resolved is not None:
                continue  # the first episode is the one measured
            if times.pending is None:
                times.pending = now
            if state == "firing" and times.firing is None:
                times.firing = now
        for name, times in self.times.items():
            if name in seen or times.resolved is not None:
                continue
            if times.firing is not None:
                times.resolved = now
            elif times.pending is not None:
                self.resets[name] = self.resets.get(name, 0) + 1
                times.pending = None
