"""The deploy files and the docs say the same (issue 32): one place sets the image of every layout, the
strategies the docs name are the ones rendered, the Helm commands pin the chart version we render."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.deploy.chart import CA_1_36_1, chart_version
from tests.deploy.rendering import DEPLOY, KUBERNETES, find_kustomize, objects, pod_containers, render

REPO = DEPLOY.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: every tree an operator applies (the overlays, and server-mtls alone beside the Helm chart)
APPLIED = ("overlays/scaleway", "overlays/bizfly", "overlays/mtls-service", "server-mtls")
SERVER_IMAGE = "ca-externalgrpc-server"


def server_images(docs: tuple[dict, ...]) -> set[str]:
    return {
        c["image"]
        for d in objects(docs, "Deployment")
        for c in pod_containers(d)
        if c["name"] in ("ca-externalgrpc", "server", "ca-externalgrpc-server") or SERVER_IMAGE in c["image"]
    }


def test_the_place_the_docs_name_for_the_image_sets_it_in_every_layout() -> None:
    # The upgrading guide names the one place that sets the image (relative to the repository root).
    upgrading = (REPO / "docs" / "how-to" / "upgrading.md").read_text()
    named = re.search(r"the `images:` entry of `deploy/kubernetes/(\S+)`, which every\s+layout uses", upgrading)
    assert named, upgrading[:600]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "kubernetes"
        shutil.copytree(KUBERNETES, copy)
        place = copy / named.group(1) / "kustomization.yaml"
        text = place.read_text()
        edited = re.sub(
            r"(- name: ca-externalgrpc-server\n\s+newName: )\S+(\n\s+newTag: )\S+",
            r"\1registry.example.com/team/ca-externalgrpc-server\g<2>9.9.9",
            text,
        )
        assert edited != text, f"{place} has no ca-externalgrpc-server entry under images:"
        place.write_text(edited)
        for tree in APPLIED:
            images = server_images(tuple(find_kustomize().render(copy / tree)))
            assert images == {"registry.example.com/team/ca-externalgrpc-server:9.9.9"}, (tree, images)
    # No other kustomization sets the server image: the one place is the only one.
    setters = [
        p.relative_to(KUBERNETES)
        for p in KUBERNETES.rglob("kustomization.yaml")
        if re.search(r"- name: ca-externalgrpc-server\b", p.read_text())
    ]
    assert setters == [Path("components/images/kustomization.yaml")]


@pytest.mark.parametrize("tree", APPLIED)
def test_every_deployment_uses_the_strategy_the_docs_name(tree: str) -> None:
    assert "The Deployments use the `Recreate` strategy" in (REPO / "docs" / "how-to" / "upgrading.md").read_text()
    for deployment in objects(render(tree), "Deployment"):
        assert deployment["spec"].get("strategy") == {"type": "Recreate"}, deployment["metadata"]["name"]


def test_every_helm_command_of_the_docs_pins_the_chart_version_we_render() -> None:
    version = chart_version(CA_1_36_1)
    commands = []
    for doc in DOCS:
        text = doc.read_text().replace("\\\n", " ")
        commands += [
            (doc.name, line.strip())
            for line in text.splitlines()
            if re.search(r"\bhelm (install|upgrade)\b", line) and "autoscaler/cluster-autoscaler" in line
        ]
    assert len(commands) >= 4, commands
    for where, command in commands:
        assert f"--version {version}" in command, f"{where}: {command}"
    offline = (REPO / "docs" / "reference" / "layouts.md").read_text()
    assert f"helm\npull autoscaler/cluster-autoscaler --version {version}" in offline or (
        f"helm pull autoscaler/cluster-autoscaler --version {version}" in offline.replace("\n", " ")
    )
