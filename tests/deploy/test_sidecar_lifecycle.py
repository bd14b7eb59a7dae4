"""In both sidecar layouts we ship, the server starts before the cluster-autoscaler and stops after it:
the kustomize overlays (deploy/kubernetes) and the official chart rendered with
deploy/helm/values-sidecar.yaml.

Both run the server as a native sidecar: an init container with ``restartPolicy: Always`` (Kubernetes
1.29 and later). The kubelet starts init containers one after the other before any regular container
and, for a sidecar, goes on only once its startup probe passes; at termination it stops the regular
containers first and the sidecars after them. So the order is decided by the pod spec, and this is
what is checked of every layout: the server is such an init container, with a startup probe on its
own health endpoint that answers as soon as it listens, the CA is a regular container, and the pod's
grace period leaves the server its drain after the CA has stopped.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from providers.config_values import parse_go_duration
from server.config import parse_address
from tests.deploy.chart import CHARTS
from tests.deploy.rendering import one, render
from tests.deploy.test_helm_chart import SIDECAR, rendered
from tests.deploy.test_manifests import SIDECAR_OVERLAYS

SERVER = "ca-externalgrpc"
#: a pod's terminationGracePeriodSeconds when its spec gives none (the chart's does not)
KUBERNETES_DEFAULT_GRACE_SECONDS = 30


def kustomize_pod(overlay: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = render(overlay)
    pod = one(docs, "Deployment", "cluster-autoscaler")["spec"]["template"]["spec"]
    return pod, _server_config(docs)


def helm_pod(label: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (source,) = [s for s in CHARTS if s.label == label]
    docs = rendered(source, SIDECAR)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"], _server_config(docs)


def _server_config(docs: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"]))


LAYOUTS = [pytest.param(lambda o=o: kustomize_pod(o), id=f"kustomize-{o}") for o in SIDECAR_OVERLAYS] + [
    pytest.param(lambda s=s.label: helm_pod(s), id=f"helm-{s.label}") for s in CHARTS
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_server_starts_before_the_ca_and_stops_after_it(layout: Any) -> None:
    pod, config = layout()
    sidecars = [c for c in pod.get("initContainers", []) if c["name"] == SERVER]
    assert len(sidecars) == 1, "the server is not an init container: it would start beside the CA, not before"
    (server,) = sidecars
    assert server.get("restartPolicy") == "Always", "an init container without restartPolicy Always must exit first"
    assert SERVER not in [c["name"] for c in pod["containers"]]
    assert "cluster-autoscaler" in pod["containers"][0]["image"], "the CA is the pod's regular container"
    # Init containers run in order: none before the server may wait for it.
    before = [c["name"] for c in pod["initContainers"][: pod["initContainers"].index(server)]]
    assert not before, before

    # The CA starts once the startup probe passes: /healthz on the server's HTTP port, which answers
    # from the moment the server listens (before its first sync, so a cloud outage cannot hold the CA).
    probe = server["startupProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert probe["path"] == "/healthz"
    assert ports.get(probe["port"], probe["port"]) == parse_address("http_listen", config["http_listen"])[1]
    budget = server["startupProbe"]["periodSeconds"] * server["startupProbe"]["failureThreshold"]
    assert budget >= 30, f"the startup probe gives the server only {budget}s to listen"

    # Stopping: the CA first, then the server, whose drain (shutdown_grace) fits in the pod's grace period.
    grace = parse_go_duration(str(config.get("shutdown_grace", "15s")))
    pod_grace = pod.get("terminationGracePeriodSeconds", KUBERNETES_DEFAULT_GRACE_SECONDS)
    assert pod_grace > grace, (pod_grace, grace)
