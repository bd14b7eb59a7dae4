"""Bind a user of the test API server to rendered RBAC rules, the way the shipped bindings bind a ServiceAccount."""

from __future__ import annotations

import time
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
    wait_until_effective(admin, namespace, user, [*role_rules, *cluster_role_rules])


def wait_until_effective(
    admin: client.ApiClient, namespace: str, user: str, rules: Sequence[dict[str, Any]], timeout: float = 10.0
) -> None:
    """Return once the API server's authorizer grants ``user`` one permission of every rule.

    The authorizer learns of new bindings through its informers, a moment after they are created; a server
    started at once could see its first calls refused, which is not what a test of the shipped rules means.
    """
    authorization = client.AuthorizationV1Api(admin)
    deadline = time.monotonic() + timeout
    for rule in rules:
        resource, _, subresource = rule["resources"][0].partition("/")
        attributes = {
            "namespace": namespace,
            "group": rule["apiGroups"][0],
            "resource": resource,
            "subresource": subresource or None,
            "verb": rule["verbs"][0],
            "name": (rule.get("resourceNames") or [None])[0],
        }
        review = {"spec": {"user": user, "resourceAttributes": attributes}}
        while not authorization.create_subject_access_review(review).status.allowed:
            if time.monotonic() > deadline:
                raise AssertionError(f"{user} is still refused {attributes} {timeout:.0f}s after its binding")
            time.sleep(0.05)
