"""The smoke's scale-up and scale-down with the real cluster-autoscaler 1.36.1 talking to our server in
its container: the image ``make image`` built, run by podman as UID 65532 with a read-only root
filesystem on host networking (devstack/container.py), in front of both simulated clouds.

``make e2e-image`` runs it alone (after ``make build`` and ``make image``); ``make test`` runs it
whenever podman is installed. Without podman it is skipped; without the image it fails with "run make
image".
"""

from __future__ import annotations

import json

import pytest

from devstack.container import ContainerServer
from tests.e2e.environment import StartEnvironment, in_container
from tests.e2e.test_smoke import scale_up_then_remove_the_empty_node, smoke_layout
from tests.support.container_image import built_image


@pytest.fixture(scope="session")
def server_image() -> str:
    return built_image()


@pytest.mark.timeout(300)
def test_the_ca_scales_scaleway_up_then_removes_the_empty_node_through_the_server_in_its_container(
    start_environment: StartEnvironment, server_image: str
) -> None:
    env = start_environment(smoke_layout(), serve=in_container(server_image))
    assert isinstance(env.ours.process, ContainerServer)
    scale_up_then_remove_the_empty_node(env, "image")
    # The image's server, on the engine the image ships (serving.engine: auto finds the native one).
    records = [json.loads(line) for line in env.ours.log_path.read_text().splitlines() if line.startswith("{")]
    (serving,) = [r for r in records if r["msg"] == "serving"]
    assert serving["engine"] == "native", serving
    assert [r["grpcCode"] for r in env.ours.rpc_log("NodeGroupIncreaseSize")] == ["OK"]
    assert [r["grpcCode"] for r in env.ours.rpc_log("NodeGroupDeleteNodes")] == ["OK"]
