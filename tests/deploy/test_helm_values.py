"""deploy/helm/values-*.yaml: only keys the cluster-autoscaler chart knows, Kubernetes-valid volume
snippets, and names that match what deploy/kubernetes/server-mtls creates.

The chart itself cannot be downloaded here, so the known keys are the ones of its values table (the
release for CA 1.31) and of a later templates/deployment.yaml, as read from the chart sources; a key
the chart renamed since would not be caught.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.rendering import DEPLOY, objects, one, render

#: dotted paths of the chart values these files may set (subset of the chart's values table)
CHART_KEYS = {
    "affinity",
    "autoDiscovery.clusterName",
    "autoDiscovery.labels",
    "autoDiscovery.namespace",
    "cloudConfigPath",
    "cloudProvider",
    "containerSecurityContext",
    "extraArgs",
    "extraEnv",
    "extraEnvSecrets",
    "extraVolumeMounts",
    "extraVolumes",
    "fullnameOverride",
    "image.pullPolicy",
    "image.repository",
    "image.tag",
    "nameOverride",
    "nodeSelector",
    "podAnnotations",
    "podLabels",
    "priorityClassName",
    "replicaCount",
    "resources",
    "securityContext",
    "tolerations",
}
#: values whose content is free-form (maps/lists passed through toYaml), so not walked further
OPAQUE = {k for k in CHART_KEYS if "." not in k}
VALUES_FILES = sorted((DEPLOY / "helm").glob("values-*.yaml"))


def _paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in OPAQUE:
            out |= _paths(value, path + ".")
        else:
            out.add(path)
    return out


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_there_is_a_values_file() -> None:
    assert VALUES_FILES, "deploy/helm/values-*.yaml is missing"


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_use_only_known_chart_keys(path: Path) -> None:
    unknown = _paths(_load(path)) - CHART_KEYS
    assert not unknown, f"{path.name}: keys the chart does not have: {sorted(unknown)}"


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_select_externalgrpc_and_open_the_charts_render_gate(path: Path) -> None:
    values = _load(path)
    assert values["cloudProvider"] == "externalgrpc"
    gate = values.get("autoDiscovery", {})
    assert gate.get("clusterName") or gate.get("namespace") or gate.get("labels") or values.get("autoscalingGroups")
    assert values["image"]["repository"] == "registry.k8s.io/autoscaling/cluster-autoscaler"
    assert values["image"]["tag"] in ("v1.34.1", "v1.36.1")


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_volumes_are_valid_in_a_pod(path: Path) -> None:
    values = _load(path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "values-check", "labels": values.get("podLabels", {})},
        "spec": {
            "securityContext": values.get("securityContext", {}),
            "containers": [
                {
                    "name": "cluster-autoscaler",
                    "image": f"{values['image']['repository']}:{values['image']['tag']}",
                    "volumeMounts": values["extraVolumeMounts"],
                    "securityContext": values.get("containerSecurityContext", {}),
                    "resources": values.get("resources", {}),
                }
            ],
            "volumes": values["extraVolumes"],
        },
    }
    kubernetes_validate.validate(pod, "1.34.0", strict=True)
    mounted = {m["name"] for m in values["extraVolumeMounts"]}
    assert mounted == {v["name"] for v in values["extraVolumes"]}


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_mount_what_server_mtls_creates(path: Path) -> None:
    values = _load(path)
    docs = render("server-mtls")
    volumes = {v["name"]: v for v in values["extraVolumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in values["extraVolumeMounts"]}
    directory, key = values["extraArgs"]["cloud-config"].rsplit("/", 1)
    configmap = mounts[directory]["configMap"]["name"]
    # A chart cannot follow kustomize's hash suffixes: the name must be exact.
    cloud_config = yaml.safe_load(one(docs, "ConfigMap", configmap)["data"][key])
    assert one(docs, "ConfigMap", configmap)["metadata"]["name"] == configmap
    client_directory = cloud_config["cert"].rsplit("/", 1)[0]
    secret = mounts[client_directory]["secret"]["secretName"]
    certificates = [c for c in objects(docs, "Certificate") if c["spec"]["secretName"] == secret]
    assert len(certificates) == 1 and "client auth" in certificates[0]["spec"]["usages"]
    policy = one(docs, "NetworkPolicy", "ca-externalgrpc-server")
    allowed = [r["from"][0]["podSelector"]["matchLabels"] for r in policy["spec"]["ingress"] if r.get("from")]
    assert any(labels.items() <= values["podLabels"].items() for labels in allowed)
