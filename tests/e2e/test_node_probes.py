"""The kubelet's probes over the pod's own address, IPv4 and IPv6: deploy/helm/values-sidecar.yaml on a
real node whose first address is IPv4, and on one whose first address is IPv6 (the kubelet then reports
and probes each pod's IPv6 address), with the probe port as shipped (``http_listen: "[::]:8087"``), and
on the IPv4 node also as ``0.0.0.0:8087`` (IPv4 only, which an IPv6-first node's probes cannot reach).

The kubelet probes ``http://<pod IP>:8087/healthz`` and ``/readyz`` (never loopback): a listener that
does not answer on the pod's first address keeps the pod unready, and after the startup probe's 30
failures (60 s) the kubelet restarts the server, again and again. The scenario waits up to
``READY_WITHIN`` for the pod to be Ready and, when it is not, fails with what the kubelet's probes got
(its ``Unhealthy`` Events). IPv6 cases run where the machine has IPv6 (the node's own namespace needs
the kernel's IPv6). ``make node-e2e`` runs them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import CA_1_36_1, SIDECAR_VALUES, chart_dir
from tests.e2e.node import NodeNetwork
from tests.e2e.node_cluster import NAMESPACE, NodeEnvironment, node_environments
from tests.e2e.node_layouts import CA_SELECTOR
from tests.e2e.report import publish
from tests.e2e.test_smoke import smoke_layout

#: the startup probe gives up after 30 x 2 s; Ready comes in seconds when the probes reach the server
READY_WITHIN = 45.0
SHIPPED = "[::]:8087"


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


def machine_has_ipv6() -> bool:
    try:
        return Path("/proc/sys/net/ipv6/conf/all/disable_ipv6").read_text().strip() == "0"
    except OSError:
        return False


def values_with_probe_listener(env: NodeEnvironment, listen: str) -> Path:
    """values-sidecar.yaml with the server's ``http_listen`` set to ``listen`` (the shipped file when it
    already is)."""
    text = SIDECAR_VALUES.read_text()
    assert f'http_listen: "{SHIPPED}"' in text
    if listen == SHIPPED:
        return SIDECAR_VALUES
    target = env.workdir / "values-sidecar-probe-listener.yaml"
    target.write_text(text.replace(f'http_listen: "{SHIPPED}"', f'http_listen: "{listen}"'))
    return target


CASES = [("ipv4", SHIPPED), ("ipv6", SHIPPED), ("ipv4", "0.0.0.0:8087")]


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "listen"), CASES, ids=[f"{f}-node-{lis}" for f, lis in CASES])
def test_the_kubelet_probes_the_sidecar_over_the_pods_address(start_node: Any, family: str, listen: str) -> None:
    if family == "ipv6" and not machine_has_ipv6():
        pytest.skip("this machine's kernel has IPv6 off (net.ipv6.conf.all.disable_ipv6=1)")
    env: NodeEnvironment = start_node(smoke_layout(), NodeNetwork(ipv6_primary=family == "ipv6"))
    env.create_credentials_secret()
    values = values_with_probe_listener(env, listen)
    started = time.time()
    env.helm("install", "cluster-autoscaler", str(chart_dir(CA_1_36_1)), "--namespace", NAMESPACE, "-f", str(values))
    ready = False
    pod: Any = None
    while time.time() - started < READY_WITHIN:
        pods = env.pods(CA_SELECTOR)
        pod = pods[0] if pods else None
        if pod is not None and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            ready = True
            break
        time.sleep(1)
    assert pod is not None, "no CA pod"
    events: Any = env.core.list_namespaced_event(NAMESPACE).items
    probes = sorted({str(e.message) for e in events if e.reason == "Unhealthy"})
    address = pod.status.pod_ip
    outcome = f"Ready in {time.time() - started:.1f} s" if ready else f"not Ready after {READY_WITHIN:.0f} s"
    publish(f"| {family} first ({address}) | http_listen {listen} | {outcome} | {probes[0] if probes else ''} |")
    assert (":" in address) == (family == "ipv6"), address
    assert ready, f"the kubelet's probes of {address}:8087 failed: {probes}"
