"""A real kube-apiserver and etcd (no scheduler, no kubelet) shared by the tests of the Kubernetes features.

The programs come from the Go build step (``make build``, the e2e group). The API server authorizes by
RBAC, so a test can give our server a user of its own (``control_plane.user_kubeconfig``), bind it to
exactly the rules the deployment ships, and see the feature work with those and no more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.e2e.conftest import resolve_programs
from tests.e2e.control_plane import ControlPlane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("kube")
    plane = ControlPlane(resolve_programs().control_plane, workdir, scheduler=False, audit=True).start()
    try:
        yield plane
    finally:
        plane.stop()


def admin_api(plane: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(plane.kubeconfig))


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = admin_api(control_plane)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(admin: client.ApiClient, request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own, so tests never see each other's Leases, ConfigMaps or Events."""
    full = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())
    # Cut to fit a name; parametrized tests differ at the end, which a short hash of the whole name keeps.
    cut = full if len(full) <= 50 else full[:41].strip("-") + "-" + hashlib.sha256(full.encode()).hexdigest()[:8]
    name = "t-" + cut.strip("-")
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def nodes(admin: client.ApiClient) -> Iterator[list[str]]:
    """Names of the Nodes a test creates; Nodes are cluster-wide, so they are deleted after the test."""
    created: list[str] = []
    yield created
    core = client.CoreV1Api(admin)
    for name in created:
        try:
            core.delete_node(name)
        except ApiException as err:
            if err.status != 404:
                raise
