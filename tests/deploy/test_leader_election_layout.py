"""The mTLS Service layout runs two replicas with leader election; the sidecar layout has none of it.

The Role checked here is the one tests/kube/test_leader_election.py binds the server to against the
real API server, so these checks and that test together show the shipped RBAC is exactly enough.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.chart import CA_1_36_1, helm_template
from tests.deploy.rendering import container, objects, one, permissions, render
from tests.deploy.test_helm_chart import SIDECAR, sidecar
from tests.deploy.test_manifests import SIDECAR_OVERLAYS

MTLS_LAYOUTS = ("server-mtls", "overlays/mtls-service")
SERVER = "ca-externalgrpc-server"


def lease_role(docs: Any) -> dict[str, Any]:
    """The Role the server's ServiceAccount is bound to (in the rendered mTLS layout)."""
    deployment = one(docs, "Deployment", SERVER)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    bindings = [
        b
        for b in objects(docs, "RoleBinding")
        if {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"} in b["subjects"]
    ]
    assert len(bindings) == 1, f"the server's ServiceAccount {account} must have exactly one RoleBinding"
    assert bindings[0]["roleRef"]["kind"] == "Role"
    return one(docs, "Role", bindings[0]["roleRef"]["name"])


def _server_config(docs: Any) -> dict[str, Any]:
    return yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])


@pytest.mark.parametrize("layout", MTLS_LAYOUTS)
def test_mtls_layout_runs_two_replicas_with_leader_election_on(layout: str) -> None:
    docs = render(layout)
    deployment = one(docs, "Deployment", SERVER)
    assert deployment["spec"]["replicas"] == 2
    # A follower is never Ready: a rolling update would wait for it forever.
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    election = _server_config(docs)["kubernetes"]["leader_election"]
    assert election["enabled"] is True
    env = {e["name"]: e for e in container(deployment, "ca-externalgrpc").get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True, "in-cluster config reads the mounted token"


@pytest.mark.parametrize("layout", MTLS_LAYOUTS)
def test_mtls_layout_keeps_one_server_through_voluntary_disruptions(layout: str) -> None:
    docs = render(layout)
    budget = one(docs, "PodDisruptionBudget", SERVER)
    assert budget["spec"]["minAvailable"] == 1
    labels = one(docs, "Deployment", SERVER)["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The follower is unready on purpose: it must stay evictable, or a drain of its node would hang.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize("layout", MTLS_LAYOUTS)
def test_lease_rules_are_the_minimal_set_for_the_configured_lease(layout: str) -> None:
    docs = render(layout)
    lease_name = _server_config(docs)["kubernetes"]["leader_election"]["lease_name"]
    granted = {p for p in permissions(lease_role(docs)["rules"]) if p[1] == "leases"}
    assert granted == {
        # create cannot be limited by name: RBAC does not know the name of an object not yet created
        ("coordination.k8s.io", "leases", "create", "*"),
        ("coordination.k8s.io", "leases", "get", lease_name),
        ("coordination.k8s.io", "leases", "update", lease_name),
    }


@pytest.mark.parametrize("overlay", SIDECAR_OVERLAYS)
def test_sidecar_kustomize_layout_has_no_kubernetes_features(overlay: str) -> None:
    docs = render(overlay)
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    assert "kubernetes" not in config, "the sidecar layout runs with every Kubernetes feature off"
    assert not list(objects(docs, "PodDisruptionBudget"))
    deployment = one(docs, "Deployment", "cluster-autoscaler")
    server = container(deployment, "ca-externalgrpc")
    assert "POD_NAME" not in {e["name"] for e in server.get("env", [])}
    assert deployment["spec"]["replicas"] == 1
    for kind in ("Role", "ClusterRole"):
        for role in objects(docs, kind):
            # The CA's own Lease (its leader election) only; nothing for ca-externalgrpc's.
            for rule in role["rules"]:
                if "leases" in rule["resources"]:
                    assert rule.get("resourceNames", ["cluster-autoscaler"]) == ["cluster-autoscaler"]


def test_sidecar_helm_values_have_no_kubernetes_features() -> None:
    docs = helm_template(CA_1_36_1, (SIDECAR,), "1.34.0")
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    assert "kubernetes" not in config
    assert "POD_NAME" not in {e["name"] for e in sidecar(docs).get("env", [])}
    for kind in ("Role", "ClusterRole"):
        for role in objects(docs, kind):
            for rule in role["rules"]:
                if "leases" in rule["resources"]:  # the CA's own leader election, never ours
                    assert "ca-externalgrpc" not in rule.get("resourceNames", [])
