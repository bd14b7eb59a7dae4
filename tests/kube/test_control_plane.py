"""The shared control plane authorizes by RBAC: a new user can do nothing until a Role allows it."""

from __future__ import annotations

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.e2e.control_plane import ControlPlane


def test_a_new_user_gets_only_what_its_role_grants(
    control_plane: ControlPlane, admin: client.ApiClient, namespace: str
) -> None:
    user = config.new_client_from_config(config_file=str(control_plane.user_kubeconfig("rbac-probe")))
    try:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(user).list_namespaced_config_map(namespace)
        assert refused.value.status == 403
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-configmaps"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="read-configmaps"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"),
                subjects=[client.RbacV1Subject(kind="User", name="rbac-probe", api_group="rbac.authorization.k8s.io")],
            ),
        )
        client.CoreV1Api(user).list_namespaced_config_map(namespace)  # allowed now
        with pytest.raises(ApiException) as still_refused:
            client.CoreV1Api(user).list_namespaced_secret(namespace)
        assert still_refused.value.status == 403
    finally:
        user.close()
