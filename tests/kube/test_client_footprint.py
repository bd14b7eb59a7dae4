"""A server with its four Kubernetes features at work loads none of the client's generated API or model classes,
nor the validator the client's dynamic module loads when it is installed.

Importing one generated API class (``CoreV1Api``, ``CoordinationV1Api``) loads about 250 model modules,
about 21 MiB of RSS (docs/evidence/kubernetes-features.md, "Memory and CPU"); the features go through the
connection's raw JSON calls instead (server/kube/client.py). The server runs as a child process with
``PYTHONPROFILEIMPORTTIME=1``, so the interpreter itself names every module it imports, from any thread.
Each feature makes its calls before the list is read: the replica takes the Lease, learns a Node's
template, journals and reports a scale-up, and at its stop writes its last status and releases the Lease.
This environment has ``kubernetes_validate`` (the manifests' tests use it) with jsonschema's format
checkers, which the client would import with its dynamic module: 20 MiB the image never pays
(server/kube/client.py, ``_import_client``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.e2e.control_plane import ControlPlane
from tests.kube.polling import wait_for
from tests.kube.test_rbac_layouts import (
    SCENARIO,
    lease_holder,
    scale_up_and_see_every_feature_work,
    start_server_mtls_replica,
)
from tests.support.container_image import built_image

# One line per module imported for the first time: "import time: <self us> | <cumulative us> | <module>".
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$", re.MULTILINE)
GENERATED = ("kubernetes.client.api.", "kubernetes.client.models.")
# What kubernetes_validate would load: jsonschema, its schema registry and the format checkers' parsers. (Its
# own name is listed all the same: the interpreter times the attempt the client makes, which fails at once.)
VALIDATOR = ("jsonschema", "referencing", "lark", "rfc3987_syntax")


@pytest.fixture
def cloud() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()) as sim:
        yield sim


def test_a_server_with_its_four_kubernetes_features_at_work_loads_no_generated_api_or_model_class_nor_validator(
    control_plane: ControlPlane,
    admin: client.ApiClient,
    namespace: str,
    cloud: ScalewaySimulator,
    nodes: list[str],
    tmp_path: Path,
) -> None:
    env = {"PYTHONPROFILEIMPORTTIME": "1"}
    server, lease = start_server_mtls_replica(control_plane, admin, namespace, cloud, tmp_path, env=env)
    try:
        wait_for("leader and Ready", lambda: server.http_get("/readyz")[0] == 200)
        scale_up_and_see_every_feature_work(server, cloud, admin, namespace, nodes)
    finally:
        server.stop()  # SIGTERM: the last status write and the Lease's release run too
    assert lease_holder(admin, namespace, lease) == "", "the Lease was not released at the stop"
    imported = IMPORTED.findall(server.output)
    assert "kubernetes.client.rest" in imported, "no import list in the output:\n" + server.log_tail()
    generated = [module for module in imported if module.startswith(GENERATED)]
    assert generated == [], f"{len(generated)} generated modules loaded, among them {generated[:5]}"
    validator = [module for module in imported if module.split(".")[0] in VALIDATOR]
    assert validator == [], f"{len(validator)} modules of the manifest validator loaded, among them {validator[:5]}"


def test_the_image_serves_the_four_kubernetes_features_without_the_files_it_leaves_out(
    control_plane: ControlPlane,
    admin: client.ApiClient,
    namespace: str,
    cloud: ScalewaySimulator,
    nodes: list[str],
    tmp_path: Path,
) -> None:
    """The image leaves the client's asyncio copy and aiohttp out and its generated classes uncompiled
    (docs/reference/image.md, "What the image leaves out"): the same four features at work there, as the
    read-only, non-root container of the manifests, against the real API server."""
    image = built_image()  # skipped without podman; "run make image" when missing or stale
    server, lease = start_server_mtls_replica(control_plane, admin, namespace, cloud, tmp_path, image=image)
    try:
        wait_for("leader and Ready", lambda: server.http_get("/readyz")[0] == 200)
        scale_up_and_see_every_feature_work(server, cloud, admin, namespace, nodes)
    finally:
        assert server.stop() == 0, server.log_tail()
    assert lease_holder(admin, namespace, lease) == "", "the Lease was not released at the stop"
