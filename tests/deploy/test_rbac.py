"""The RBAC of the server's Kubernetes features, per layout, against what each feature calls.

- Sidecar layouts (Helm values-sidecar.yaml, overlays/scaleway and overlays/bizfly): every feature off,
  nothing rendered beyond the cluster-autoscaler's own RBAC.
- values-sidecar-kubernetes-features.yaml (Helm) and components/kubernetes-features (kustomize): exactly
  the permissions the features use that the CA's roles lack, the same in both.
- server-mtls: the server's ServiceAccount gets exactly what its four features use.

What a feature uses is written down here from its calls to the API server (server/kube/*.py);
tests/kube/test_rbac_layouts.py runs the server bound to the rendered rules against a real API
server, which shows the list is enough.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.kube.settings import KubernetesConfig
from tests.deploy.chart import (
    CHARTS,
    SIDECAR_FEATURES_VALUES,
    SIDECAR_VALUES,
    ChartSource,
    ca_roles,
    helm_template,
    sidecar_roles,
)
from tests.deploy.rendering import (
    KUBERNETES,
    Permission,
    one,
    permissions,
    render,
    render_with_components,
    service_account_roles,
)
from tests.deploy.test_manifests import SIDECAR_OVERLAYS

FEATURES_COMPONENT = "components/kubernetes-features"
SERVER_ACCOUNT = "ca-externalgrpc-server"
#: namespaced permissions (in the server's namespace) and cluster-wide ones (only a ClusterRole gives them)
NAMESPACE, CLUSTER = "namespace", "cluster"
Need = tuple[str, Permission]


def shipped_backend_names() -> list[str]:
    """The backend names of the shipped configs (templates ConfigMaps are named after them)."""
    names = []
    for overlay in SIDECAR_OVERLAYS:
        config = yaml.safe_load((KUBERNETES / overlay / "config.yaml").read_text())
        names += [backend["name"] for backend in config["backends"]]
    return names


def feature_needs(settings: KubernetesConfig, backends: list[str]) -> dict[str, set[Need]]:
    """What each feature calls, as permissions: create cannot name an object, get/update always do."""

    def configmap(name: str) -> set[Need]:
        return {(NAMESPACE, ("", "configmaps", verb, name)) for verb in ("get", "update")}

    create_configmap = (NAMESPACE, ("", "configmaps", "create", "*"))
    lease = settings.leader_election.lease_name
    prefix = settings.learned_templates.configmap_prefix
    return {
        # GET, POST and PUT of the Lease
        "leader_election": {
            (NAMESPACE, ("coordination.k8s.io", "leases", "create", "*")),
            (NAMESPACE, ("coordination.k8s.io", "leases", "get", lease)),
            (NAMESPACE, ("coordination.k8s.io", "leases", "update", lease)),
        },
        # GET, POST and PUT of the journal's ConfigMap
        "journal": {create_configmap, *configmap(settings.journal.configmap)},
        # a list of the Nodes then a watch of them; GET, POST and PUT of each backend's ConfigMap
        "learned_templates": {
            (CLUSTER, ("", "nodes", "list", "*")),
            (CLUSTER, ("", "nodes", "watch", "*")),
            create_configmap,
            *(need for backend in backends for need in configmap(f"{prefix}-{backend}")),
        },
        # POST and PATCH of core/v1 Events; GET, POST and PUT of the status ConfigMap
        "events": {
            (NAMESPACE, ("", "events", "create", "*")),
            (NAMESPACE, ("", "events", "patch", "*")),
            create_configmap,
            *configmap(settings.events.object_name),
        },
    }


def granted(need: Need, role: set[Permission], cluster_role: set[Permission]) -> bool:
    """A Role grants in its namespace only; a ClusterRole (bound cluster-wide) grants everywhere."""
    scope, (group, resource, verb, name) = need
    candidates = {(group, resource, verb, name), (group, resource, verb, "*")}
    return bool(candidates & cluster_role) or (scope == NAMESPACE and bool(candidates & role))


def sidecar_needs() -> set[Need]:
    """Learned templates, the journal and Events with their default names (leader election is not for a sidecar)."""
    needs = feature_needs(KubernetesConfig(), shipped_backend_names())
    return needs["learned_templates"] | needs["journal"] | needs["events"]


def comment_above_every_rule(path: Path, rule_start: str) -> None:
    lines = path.read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if re.match(rule_start, line)]
    assert rules, f"{path} has no rule"
    for i in rules:
        assert lines[i - 1].lstrip().startswith("#"), f"{path.name}: the rule at line {i + 1} has no comment above it"


# ---------------------------------------------------------------------------------------------------
# Sidecar layouts: nothing of ours by default


def rbac_objects(docs: Any) -> list[tuple[str, str]]:
    kinds = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount")
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in kinds)


def names_in(rules: list[dict[str, Any]]) -> set[str]:
    return {name for rule in rules for name in rule.get("resourceNames", [])}


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_helm_sidecar_renders_only_the_charts_own_rbac(source: ChartSource) -> None:
    docs = helm_template(source, (SIDECAR_VALUES,), "1.34.0")
    assert yaml.safe_load(SIDECAR_VALUES.read_text()).get("rbac") is None, "no rbac values in the sidecar file"
    assert {name for _, name in rbac_objects(docs)} == {"cluster-autoscaler"}, rbac_objects(docs)
    role, cluster_role = ca_roles(docs)
    assert not {n for n in names_in(role + cluster_role) if n.startswith("ca-externalgrpc")}


@pytest.mark.parametrize("overlay", SIDECAR_OVERLAYS)
def test_kustomize_sidecar_renders_only_the_cas_own_rbac(overlay: str) -> None:
    docs = render(overlay)
    assert {name for _, name in rbac_objects(docs)} == {"cluster-autoscaler"}, rbac_objects(docs)
    role, cluster_role = service_account_roles(docs, "cluster-autoscaler")
    assert not {n for n in names_in(role + cluster_role) if n.startswith("ca-externalgrpc")}
    assert one(docs, "Deployment", "cluster-autoscaler")["spec"]["template"]["spec"]["serviceAccountName"] == (
        "cluster-autoscaler"
    )


# ---------------------------------------------------------------------------------------------------
# The sidecar's features file and kustomize component: exactly what is missing


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_the_features_file_adds_exactly_what_the_charts_roles_lack(source: ChartSource) -> None:
    role, cluster_role = (permissions(rules) for rules in sidecar_roles(source, with_features=False))
    missing = {need for need in sidecar_needs() if not granted(need, role, cluster_role)}
    assert missing, "the chart's roles alone are not enough (else the features file would be pointless)"
    added = permissions(yaml.safe_load(SIDECAR_FEATURES_VALUES.read_text())["rbac"]["additionalRules"])
    assert added == {permission for _, permission in missing}
    with_role, with_cluster_role = (permissions(rules) for rules in sidecar_roles(source, with_features=True))
    # The chart puts additionalRules in both of its roles: nothing else changes.
    assert with_role - role == added and with_cluster_role - cluster_role == added
    assert role <= with_role and cluster_role <= with_cluster_role
    assert all(granted(need, with_role, with_cluster_role) for need in sidecar_needs())
    assert all(name != "*" for _, _, _, name in added), "every added rule names its objects"


def test_the_features_file_sets_nothing_but_the_extra_rules() -> None:
    values = yaml.safe_load(SIDECAR_FEATURES_VALUES.read_text())
    assert values == {"rbac": {"additionalRules": values["rbac"]["additionalRules"]}}
    comment_above_every_rule(SIDECAR_FEATURES_VALUES, r"^    - apiGroups:")


@pytest.mark.parametrize("overlay", SIDECAR_OVERLAYS)
def test_the_kustomize_component_adds_the_same_rules_to_the_cas_role(overlay: str) -> None:
    before = service_account_roles(render(overlay), "cluster-autoscaler")
    docs = render_with_components(overlay, (FEATURES_COMPONENT,))
    after = service_account_roles(docs, "cluster-autoscaler")
    assert rbac_objects(docs) == rbac_objects(render(overlay)), "no object of its own: rules in the CA's Role"
    added = permissions(yaml.safe_load(SIDECAR_FEATURES_VALUES.read_text())["rbac"]["additionalRules"])
    assert permissions(after[0]) - permissions(before[0]) == added
    assert permissions(after[1]) == permissions(before[1]), "kustomize keeps them out of the ClusterRole"
    assert all(granted(need, permissions(after[0]), permissions(after[1])) for need in sidecar_needs())
    comment_above_every_rule(KUBERNETES / FEATURES_COMPONENT / "role-rules.yaml", r"^- op: add")


# ---------------------------------------------------------------------------------------------------
# server-mtls: the four features on, exactly their rights


def server_config(docs: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"]))


@pytest.mark.parametrize("layout", ("server-mtls", "overlays/mtls-service"))
def test_server_mtls_grants_its_four_features_exactly_what_they_use(layout: str) -> None:
    docs = render(layout)
    config = server_config(docs)
    settings = KubernetesConfig.model_validate(config["kubernetes"])
    assert [
        name
        for name in ("leader_election", "journal", "learned_templates", "events")
        if not getattr(settings, name).enabled
    ] == []
    deployment = one(docs, "Deployment", SERVER_ACCOUNT)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SERVER_ACCOUNT
    assert deployment["spec"]["replicas"] == 2
    one(docs, "PodDisruptionBudget", SERVER_ACCOUNT)
    backends = [backend["name"] for backend in config["backends"]]
    assert set(backends) <= set(shipped_backend_names())
    needs = set().union(*feature_needs(settings, shipped_backend_names()).values())
    role, cluster_role = (permissions(rules) for rules in service_account_roles(docs, SERVER_ACCOUNT))
    assert role == {permission for scope, permission in needs if scope == NAMESPACE}
    assert cluster_role == {permission for scope, permission in needs if scope == CLUSTER}
    comment_above_every_rule(KUBERNETES / "server-mtls" / "rbac.yaml", r"^  - apiGroups:")
