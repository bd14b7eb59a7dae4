"""Bind a user of the test API server to rendered RBAC rules, the way the shipped bindings bind a ServiceAccount."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client

RBAC_GROUP = "rbac.authorization.k8s.io"


def bind_user(
    admin: client.ApiClient,
    namespace: str,
    user: str,
    role_rules: Sequence[dict[str, Any]],
    cluster_role_rules: Sequence[dict[str, Any]] = (),
) -> None:
    """A Role with ``role_rules`` in ``namespace`` and, if any, a ClusterRole with ``cluster_role_rules``
    bound cluster-wide, both to ``user`` alone. Cluster-wide names carry the namespace: tests share the API
    server, never a namespace."""
    rbac = client.RbacAuthorizationV1Api(admin)
    subjects = [{"kind": "User", "name": user, "apiGroup": RBAC_GROUP}]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": list(role_rules)})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": user},
            "subjects": subjects,
        },
    )
    if cluster_role_rules:
        name = f"{namespace}.{user}"
        rbac.create_cluster_role({"metadata": {"name": name}, "rules": list(cluster_role_rules)})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                "subjects": subjects,
            }
        )
