"""Every layout we ship on a real node (tests/e2e/node.py), deployed as an operator deploys it
(tests/e2e/node_layouts.py) and driven by the real cluster-autoscaler 1.36.1 on a simulated cloud.

For each layout: its pods Ready (the time from ``helm install`` or ``kubectl apply -k`` is reported),
a rolling restart of the server (``kubectl rollout restart``) after which the CA is served again, a
scale-up and a scale-down through our server, the layout's own RBAC refusing nothing (the API server's
audit log: no 403 for the layout's service accounts), and where the server's Kubernetes features are on,
their objects written with the pod's projected token. Sidecar layouts: the CA stopped before the sidecar
when the pod is deleted. Every scenario ends with the node torn down and nothing left on the machine.

``make node-e2e`` runs them (the smoke of values-sidecar.yaml is in ``make test``:
test_node_smoke.py); the figures go to the run's summary and to the table of docs/evidence/real-node.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from server.kube.leader import holder_name
from tests.e2e.node_cluster import NAMESPACE, NodeEnvironment, node_environments
from tests.e2e.node_layouts import (
    MTLS_SERVER_ACCOUNT,
    Deployed,
    ca_pod,
    delete_pod_and_watch,
    deploy_mtls_chart,
    deploy_mtls_overlay,
    deploy_sidecar_chart,
    deploy_sidecar_overlay,
    leader_pod,
    rbac_refusals,
    rolling_restart,
    scale_up_and_down,
)
from tests.e2e.pools import SCALE_UP
from tests.e2e.report import publish


@dataclass(frozen=True)
class Layout:
    name: str
    deploy: Callable[[NodeEnvironment], Deployed]
    cloud: str = "scaleway"


LAYOUTS = (
    Layout("helm-sidecar", lambda env: deploy_sidecar_chart(env)),
    Layout("helm-sidecar-features", lambda env: deploy_sidecar_chart(env, features=True)),
    Layout("helm-mtls-service", deploy_mtls_chart),
    Layout("kustomize-scaleway", lambda env: deploy_sidecar_overlay(env)),
    Layout("kustomize-scaleway-features", lambda env: deploy_sidecar_overlay(env, features=True)),
    Layout("kustomize-bizfly", lambda env: deploy_sidecar_overlay(env, cloud="bizfly"), cloud="bizfly"),
    Layout("kustomize-mtls-service", deploy_mtls_overlay),
)


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


def features_at_work(env: NodeEnvironment, deployed: Deployed) -> list[str]:
    """What the server's Kubernetes features wrote with its projected token, as the API server saw it (the
    sidecar shares the CA's service account: the server's requests are the ones of its Python client)."""
    assert env.control_plane is not None
    theirs = [
        e
        for e in env.control_plane.audit_events(deployed.server_account)
        if 200 <= e.get("responseStatus", {}).get("code", 0) < 300
        and e.get("verb") in ("create", "update", "patch")
        and not e.get("userAgent", "").startswith("cluster-autoscaler/")
    ]
    written = sorted({f"{e['objectRef'].get('resource')}/{e['objectRef'].get('name', '')}" for e in theirs})
    events = {e.reason for e in env.our_events()}
    assert {"ScaledUpGroup", "DeletedNodes"} <= events, events
    configmaps: Any = env.core.list_namespaced_config_map(NAMESPACE).items
    names = {str(c.metadata.name) for c in configmaps}
    assert {"ca-externalgrpc-journal", "ca-externalgrpc-status"} <= names, names
    assert any(n.startswith("ca-externalgrpc-templates-") for n in names), names
    if deployed.server_account == MTLS_SERVER_ACCOUNT:
        held: Any = k8s.CoordinationV1Api(env.api).read_namespaced_lease("ca-externalgrpc", NAMESPACE)
        assert holder_name(held.spec.holder_identity) == leader_pod(env).metadata.name, held.spec.holder_identity
    return written


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_layout_on_a_real_node(start_node: Any, layout: Layout) -> None:
    env: NodeEnvironment = start_node(SCALE_UP)
    deployed = layout.deploy(env)
    pod = ca_pod(env)
    if deployed.sidecar:
        (sidecar,) = pod.status.init_container_statuses
        assert sidecar.name == "ca-externalgrpc" and sidecar.ready and sidecar.restart_count == 0
    restart = rolling_restart(env, deployed)
    up, down = scale_up_and_down(env, deployed, layout.cloud)
    refused = rbac_refusals(env, deployed)
    assert refused == [], refused
    written = features_at_work(env, deployed) if deployed.features else []
    order = ""
    if deployed.sidecar:
        stop, last_lines = delete_pod_and_watch(env, ca_pod(env))
        assert stop.stop_requested["ca-externalgrpc"] >= stop.exited["cluster-autoscaler"], stop
        assert any("signal received; draining" in line for line in last_lines["ca-externalgrpc"]), last_lines
        order = f"; on delete: {stop.line()}"
    env.stop()
    assert env.real_node.leftovers == [], env.real_node.leftovers
    publish(
        f"| {deployed.layout} | {deployed.ready_seconds:.1f} s | {restart:.1f} s | {up.to_cloud_call:.1f} s / "
        f"{up.to_done:.1f} s | {down.to_cloud_call:.1f} s / {down.to_done:.1f} s | {len(refused)} |"
    )
    if written:
        publish(f"  {deployed.layout}: the server wrote with its token: {', '.join(written)}")
    if order:
        publish(f"  {deployed.layout}{order}")
