"""The real-node smoke that ``make test`` runs: the official cluster-autoscaler chart with
deploy/helm/values-sidecar.yaml on a real kubelet (tests/e2e/node.py), our server as the CA's native
sidecar, driven by the real CA 1.36.1 on the simulated Scaleway cloud; then the pod deleted as a
rollout would, and the node torn down with nothing left on the machine.

It runs as root where runc, podman, iptables and the CNI plugins are installed (``.ci/run`` installs
them), and is skipped elsewhere with one line saying why. ``make node-e2e`` runs every layout and the
other real-node scenarios (tests/e2e/test_node_*.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.node_cluster import NodeEnvironment, node_environments
from tests.e2e.node_layouts import (
    ca_pod,
    delete_pod_and_watch,
    deploy_sidecar_chart,
    rbac_refusals,
    scale_up_and_down,
)
from tests.e2e.report import publish, record_timing
from tests.e2e.test_smoke import smoke_layout


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


@pytest.mark.node
@pytest.mark.timeout(420)
def test_sidecar_values_run_on_a_real_node_and_leave_nothing_behind(start_node: Any) -> None:
    env: NodeEnvironment = start_node(smoke_layout())
    deployed = deploy_sidecar_chart(env)
    pod = ca_pod(env)

    # The native sidecar: started (its startup probe passed over the pod's address) before the CA, Ready
    # by its readiness probe, restarted never; the CA's container started after it.
    (sidecar,) = pod.status.init_container_statuses
    (ca,) = pod.status.container_statuses
    assert sidecar.name == "ca-externalgrpc" and sidecar.ready and sidecar.started and sidecar.restart_count == 0
    assert ca.ready and ca.restart_count == 0
    assert sidecar.state.running.started_at <= ca.state.running.started_at
    assert pod.status.pod_ip.startswith("10.244."), pod.status.pod_ip

    up, down = scale_up_and_down(env, deployed)
    record_timing(up)
    record_timing(down)
    assert rbac_refusals(env, deployed) == []

    # Deleted as a rollout or a drain deletes it: the kubelet stops the CA first and the sidecar only
    # once the CA has exited, so the CA's last calls find the server still serving.
    order, last_lines = delete_pod_and_watch(env, pod)
    assert order.stop_requested["ca-externalgrpc"] >= order.exited["cluster-autoscaler"], order
    assert any("signal received; draining" in line for line in last_lines["ca-externalgrpc"]), last_lines
    publish(
        f"real node, {deployed.layout}: pods Ready {deployed.ready_seconds:.1f}s after helm install; "
        f"stop order on delete: {order.line()}"
    )

    env.stop()
    assert env.real_node.leftovers == [], env.real_node.leftovers
    publish(f"real node torn down: nothing left ({env.real_node.name}, {env.workdir})")
