"""Every shipped alert under promtool's rule unit tests: for each fault, which alerts fire and which do not.

Each case is the series a server exports while something goes wrong (a cloud that hangs, refuses
connections, rate-limits or refuses the credentials; errors the CA sees; a server gone or not called),
sampled every 10 s as a scrape would, and checks at given times: for every shipped alert, the exact
set of firing instances (none is a check too). promtool evaluates the real rule file
(deploy/monitoring/prometheusrule.yaml, its ``spec``) every 30 s, the Prometheus Operator's default.
The series' shapes follow what the server writes (tests/monitoring/test_prometheus.py scrapes it under
the same faults): a hanging cloud's breaker alternates between open (30 s) and half-open (its probe's
timeout), a failed sync sets ``backend_sync_failure`` for its reason, counters only grow.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.monitoring.tools import alert_names, render_annotations, rules, tool, write_rule_file

SCRAPE_SECONDS = 10
PER_MINUTE = 60 // SCRAPE_SECONDS
CLOUD_PROVIDER = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
POD = {"namespace": "kube-system", "pod": "ca-0"}
TARGET = {**POD, "job": "ca-externalgrpc", "instance": "10.0.0.5:8087"}
SCW = {**TARGET, "backend": "scaleway", "api": "scaleway"}


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def minutes(value: float | str, count: float) -> str:
    """``value`` for ``count`` minutes of scrapes."""
    return " ".join([str(value)] * round(count * PER_MINUTE))


def growing(per_minute: float, count: float, start: float = 0) -> str:
    """A counter growing by ``per_minute`` for ``count`` minutes."""
    step = per_minute / PER_MINUTE
    return " ".join(f"{start + step * i:g}" for i in range(round(count * PER_MINUTE)))


def flat_after(values: str, count: float) -> str:
    """``values``, then the last one for ``count`` more minutes (a counter that stopped)."""
    return f"{values} {minutes(values.split()[-1], count)}"


def breaker(states: str) -> dict[str, str]:
    """The three state series of a breaker, from one letter per scrape: c(losed), o(pen), h(alf-open)."""
    return {
        series("ca_externalgrpc_cloud_api_circuit_breaker_state", {**SCW, "state": state}): " ".join(
            "1" if letter == state[0] else "0" for letter in states
        )
        for state in ("closed", "half-open", "open")
    }


def healthy(length: float, pod: dict[str, str] = TARGET, calls_per_minute: float = 6) -> dict[str, str]:
    """A server the CA calls every 10 s, synced, every breaker closed."""
    return {
        series("up", pod): minutes(1, length),
        series("ca_externalgrpc_build_info", {**pod, "version": "0.2.0"}): minutes(1, length),
        series(
            "grpc_server_handled_total",
            {**pod, "grpc_service": CLOUD_PROVIDER, "grpc_method": "Refresh", "grpc_code": "OK"},
        ): growing(calls_per_minute, length),
    }


def cloud(length: float, failure: dict[str, str] | None = None, stale: str | None = None) -> dict[str, str]:
    """The backend's sync series: ``failure`` maps a reason to its values (else all 0), ``stale`` the
    snapshot_stale values (else 0); answers 200 to every request."""
    failure = failure or {}
    out = {
        series("ca_externalgrpc_backend_sync_failure", {**SCW, "reason": reason}): failure.get(
            reason, minutes(0, length)
        )
        for reason in ("credentials", "not_found", "rejected", "unreachable")
    }
    out[series("ca_externalgrpc_snapshot_stale", {**TARGET, "backend": "scaleway"})] = stale or minutes(0, length)
    out[series("ca_externalgrpc_cloud_api_requests_total", {**SCW, "status": "200"})] = growing(4, length)
    return out


def everything_fine(length: float) -> dict[str, str]:
    return {**healthy(length), **cloud(length), **breaker("c" * round(length * PER_MINUTE))}


@dataclass(frozen=True)
class Check:
    at: str  # eval_time
    firing: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # alert -> labels of each instance


@dataclass(frozen=True)
class Case:
    name: str
    input_series: dict[str, str]
    checks: tuple[Check, ...]


ONE_HANG_CYCLE = "ooo" + "h"  # open 30 s, then a probe that times out after 10 s
BREAKER = {**POD, "backend": "scaleway", "api": "scaleway"}
STALE = {**POD, "backend": "scaleway"}
INCREASE_METHOD = "NodeGroupIncreaseSize"
INCREASE = {**TARGET, "grpc_service": CLOUD_PROVIDER, "grpc_method": INCREASE_METHOD}
UNAVAILABLE_INCREASES = {**POD, "grpc_method": INCREASE_METHOD, "grpc_code": "Unavailable"}

CASES = (
    Case("a healthy server fires nothing", everything_fine(30), (Check("10m"), Check("29m"))),
    Case(
        "the cloud hangs: the breaker alternates open and half-open, the alert fires and stays firing",
        {
            **healthy(30),
            **cloud(
                30,
                failure={"unreachable": f"{minutes(0, 1)} {minutes(1, 29)}"},
                stale=f"{minutes(0, 11)} {minutes(1, 19)}",  # past max_staleness (10 min) from 11 min
            ),
            **breaker("c" * PER_MINUTE + ONE_HANG_CYCLE * (29 * PER_MINUTE // len(ONE_HANG_CYCLE))),
        },
        (
            Check("9m"),  # pending: 10 min of "not closed" are not over
            Check("12m", {"CaExternalGrpcCloudBreakerOpen": [BREAKER]}),
            Check("15m", {"CaExternalGrpcCloudBreakerOpen": [BREAKER]}),  # half-open probes do not reset it
            Check("17m", {"CaExternalGrpcCloudBreakerOpen": [BREAKER], "CaExternalGrpcSnapshotStale": [STALE]}),
        ),
    ),
    Case(
        "the cloud refuses connections, then comes back: the breaker alert fires, then resolves",
        {
            **healthy(30),
            **cloud(30, failure={"unreachable": f"{minutes(0, 1)} {minutes(1, 14)} {minutes(0, 15)}"}),
            # each probe fails at once: half-open for a moment, rarely caught by a scrape
            **breaker("c" * PER_MINUTE + ("o" * 11 + "h") * 7 + "c" * 15 * PER_MINUTE),
        },
        (
            Check("12m", {"CaExternalGrpcCloudBreakerOpen": [BREAKER]}),
            Check("14m", {"CaExternalGrpcCloudBreakerOpen": [BREAKER]}),
            Check("16m"),
        ),
    ),
    Case(
        "a brief outage trips the breaker for less than 10 minutes: nothing fires",
        {**healthy(20), **cloud(20), **breaker("c" * 6 + "o" * 18 + "h" + "c" * 95)},
        (Check("5m"), Check("15m")),
    ),
    Case(
        "a wrong key from the start: the refusal fires in 2 minutes, the stale snapshot in 5 (pages twice "
        "without the inhibition), both resolve after the fix",
        {
            **healthy(20),
            **cloud(
                20,
                failure={"credentials": f"{minutes(1, 8)} {minutes(0, 12)}"},
                stale=f"{minutes(1, 8)} {minutes(0, 12)}",
            ),
            **breaker("c" * 20 * PER_MINUTE),
        },
        (
            Check("1m"),
            Check("3m", {"CaExternalGrpcCloudRefusesConfig": [{**STALE, "reason": "credentials"}]}),
            Check(
                "6m",
                {
                    "CaExternalGrpcCloudRefusesConfig": [{**STALE, "reason": "credentials"}],
                    "CaExternalGrpcSnapshotStale": [STALE],
                },
            ),
            Check("9m"),
        ),
    ),
    Case(
        "the cloud rate-limits: 429s for 15 minutes fire after 10, resolve within 3 minutes of the last",
        {
            **everything_fine(30),
            series("ca_externalgrpc_cloud_api_requests_total", {**SCW, "status": "429"}): flat_after(
                growing(3, 16), 14
            ),
        },
        (
            Check("8m"),
            Check("12m", {"CaExternalGrpcCloudRateLimited": [BREAKER]}),
            Check("19m"),
        ),
    ),
    Case(
        "the CA's size changes answer Unavailable: the error alert fires; refused bad requests do not",
        {
            **everything_fine(30),
            series(
                "grpc_server_handled_total",
                {**INCREASE, "grpc_code": "Unavailable"},
            ): flat_after(growing(1, 16), 14),
            series(
                "grpc_server_handled_total",
                {**INCREASE, "grpc_code": "InvalidArgument"},
            ): growing(1, 30),
        },
        (
            Check("8m"),
            Check("12m", {"CaExternalGrpcRpcErrors": [UNAVAILABLE_INCREASES]}),
            Check("19m"),
        ),
    ),
    Case(
        "the only server is gone: its scrape fails and its series end; both alerts fire after 5 minutes",
        {
            series("up", TARGET): f"{minutes(1, 1)} {minutes(0, 14)}",
            series("ca_externalgrpc_build_info", {**TARGET, "version": "0.2.0"}): f"{minutes(1, 1)} stale",
        },
        (
            Check("4m"),
            Check("7m", {"CaExternalGrpcAbsent": [{}], "CaExternalGrpcTargetDown": [TARGET]}),
        ),
    ),
    Case(
        "one of two replicas is gone: its target is down; the server is not absent",
        {
            **everything_fine(15),
            series("up", {**TARGET, "pod": "ca-1", "instance": "10.0.0.6:8087"}): f"{minutes(1, 1)} {minutes(0, 14)}",
        },
        (Check("7m", {"CaExternalGrpcTargetDown": [{**TARGET, "pod": "ca-1", "instance": "10.0.0.6:8087"}]}),),
    ),
    Case(
        "the CA stops calling: fires 10 minutes after the last call, resolves when calls come back; "
        "a namespace whose CA still calls stays quiet",
        {
            **everything_fine(30),
            series(
                "grpc_server_handled_total",
                {**TARGET, "grpc_service": CLOUD_PROVIDER, "grpc_method": "Refresh", "grpc_code": "OK"},
            ): f"{flat_after(growing(6, 5), 12)} {growing(6, 13, start=30 + 6)}",
            **healthy(30, {**TARGET, "namespace": "other", "pod": "ca-other"}),
        },
        (
            Check("9m"),
            Check("14m"),
            Check("16m", {"CaExternalGrpcNoCalls": [{"namespace": "kube-system"}]}),
            Check("19m"),
        ),
    ),
    Case(
        "a server the CA never calls (its cloud-config names another address) fires after 5 minutes",
        {
            series("up", TARGET): minutes(1, 10),
            series("ca_externalgrpc_build_info", {**TARGET, "version": "0.2.0"}): minutes(1, 10),
            **cloud(10),
            **breaker("c" * 10 * PER_MINUTE),
        },
        (Check("4m"), Check("6m", {"CaExternalGrpcNoCalls": [{"namespace": "kube-system"}]})),
    ),
    Case(
        "two replicas, the CA calls one: the standby's silence fires nothing",
        {**everything_fine(15), **healthy(15, {**TARGET, "pod": "ca-1", "instance": "10.0.0.6:8087"}, 0)},
        (Check("14m"),),
    ),
)


def promtool_test(case: Case, rule_file: str) -> dict:
    by_name = {rule["alert"]: rule for rule in rules()}
    tests = []
    for check in case.checks:
        for name in alert_names():
            expected = []
            for labels in check.firing.get(name, []):
                full = {**labels, **by_name[name].get("labels", {})}
                annotations = render_annotations(by_name[name], {**full, "alertname": name})
                expected.append({"exp_labels": full, "exp_annotations": annotations})
            tests.append({"eval_time": check.at, "alertname": name, "exp_alerts": expected})
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "30s",
        "tests": [
            {
                "name": case.name,
                "interval": f"{SCRAPE_SECONDS}s",
                "input_series": [{"series": s, "values": v} for s, v in case.input_series.items()],
                "alert_rule_test": tests,
            }
        ],
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name.split(":")[0])
def test_alerts_under_promtool(case: Case, tmp_path: Path) -> None:
    write_rule_file(tmp_path / "rules.yaml")
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(promtool_test(case, "rules.yaml"), sort_keys=False, width=1000))
    done = subprocess.run([tool("promtool"), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rule_file_passes_promtools_check() -> None:
    path = write_rule_file(Path(__import__("tempfile").mkdtemp(prefix="rules-")) / "rules.yaml")
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_in_some_case_and_is_checked_quiet_in_another() -> None:
    fired = {name for case in CASES for check in case.checks for name, labels in check.firing.items() if labels}
    assert fired == set(alert_names()), f"no case fires {set(alert_names()) - fired}"
    # Every check lists every alert (promtool_test asserts the empty ones), so each is also checked quiet.
    assert any(not check.firing for case in CASES for check in case.checks)
