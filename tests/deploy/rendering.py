"""Render the kustomize trees under deploy/kubernetes and read what they produce.

Kustomize comes from, in order: ``kubectl kustomize`` (kubectl embeds it), a ``kustomize`` binary on
PATH, or the ``kustomize`` that ``make build`` compiles from ``tests/deploy/kustomize`` (the go
toolchain is the only thing that needs to be installed for that). If none works the caller gets a
``KustomizeUnavailable`` naming what was tried and the command that fixes it, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.support import gobuild

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"

#: every directory a user is told to ``kubectl apply -k``
OVERLAYS = ("overlays/scaleway", "overlays/bizfly", "overlays/mtls-service", "server-mtls")

#: the build.toml name of the fallback kustomize CLI (tests/deploy/kustomize pins its version)
KUSTOMIZE_BINARY = "kustomize"


class KustomizeUnavailable(RuntimeError):
    """No way to run kustomize on this machine."""


@dataclass(frozen=True)
class Kustomize:
    """A command prefix that renders a kustomization directory to YAML on stdout."""

    argv: tuple[str, ...]

    def render(self, directory: Path) -> list[dict[str, Any]]:
        proc = subprocess.run([*self.argv, str(directory)], capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(self.argv)} {directory} failed:\n{proc.stderr}")
        return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def _works(argv: Sequence[str]) -> bool:
    try:
        proc = subprocess.run([*argv, "--help"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@cache
def find_kustomize() -> Kustomize:
    tried = []
    kubectl = shutil.which("kubectl")
    if kubectl and _works([kubectl, "kustomize"]):
        return Kustomize((kubectl, "kustomize"))
    tried.append(f"kubectl kustomize ({kubectl or 'kubectl not on PATH'})")
    kustomize = shutil.which("kustomize")
    if kustomize and _works([kustomize, "build"]):
        return Kustomize((kustomize, "build"))
    tried.append(f"kustomize build ({kustomize or 'kustomize not on PATH'})")
    try:
        return Kustomize((str(gobuild.binary_path(KUSTOMIZE_BINARY)), "build"))
    except gobuild.GoBuildError as err:
        tried.append(f"the kustomize of tests/deploy/kustomize ({err})")
    raise KustomizeUnavailable(
        "cannot render the manifests: install kubectl (>= 1.27) or kustomize v5, or run `make build`. Tried: "
        + "; ".join(tried)
    )


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects of one kustomization directory (relative to deploy/kubernetes), cached per run."""
    return tuple(find_kustomize().render(KUBERNETES / overlay))


def objects(docs: Sequence[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (doc for doc in docs if doc.get("kind") == kind)


def one(docs: Sequence[dict[str, Any]], kind: str, name_prefix: str) -> dict[str, Any]:
    """The single object of ``kind`` whose name is ``name_prefix`` (plus a generator hash suffix)."""
    found = [
        d
        for d in objects(docs, kind)
        if d["metadata"]["name"] == name_prefix or d["metadata"]["name"].startswith(name_prefix + "-")
    ]
    assert len(found) == 1, f"expected one {kind} {name_prefix!r}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's init containers (a native sidecar is one) and its containers."""
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """The container or init container ``name`` of the Deployment's pod."""
    containers = {c["name"]: c for c in pod_containers(deployment)}
    assert name in containers, f"{deployment['metadata']['name']} has no container {name!r}: {sorted(containers)}"
    return containers[name]


def volume(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    assert name in volumes, f"{deployment['metadata']['name']} has no volume {name!r}: {sorted(volumes)}"
    return volumes[name]


def mounted_volume(deployment: dict[str, Any], container_name: str, mount_path: str) -> dict[str, Any]:
    """The volume mounted at ``mount_path`` in the container (failing when nothing is mounted there)."""
    mounts = {m["mountPath"]: m for m in container(deployment, container_name).get("volumeMounts", [])}
    assert mount_path in mounts, f"{container_name} mounts nothing at {mount_path}: {sorted(mounts)}"
    return volume(deployment, mounts[mount_path]["name"])


@cache
def render_with_components(overlay: str, components: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    """An overlay with more kustomize components, as an operator adds them (paths relative to deploy/kubernetes)."""
    with tempfile.TemporaryDirectory(prefix="kustomize-") as directory:
        root = Path(directory)
        lines = [
            "apiVersion: kustomize.config.k8s.io/v1beta1",
            "kind: Kustomization",
            "resources:",
            f"  - {os.path.relpath(KUBERNETES / overlay, root)}",
            "components:",
            *(f"  - {os.path.relpath(KUBERNETES / component, root)}" for component in components),
        ]
        (root / "kustomization.yaml").write_text("\n".join(lines) + "\n")
        return tuple(find_kustomize().render(root))


#: one RBAC permission: (API group, resource, verb, object name or "*" for any)
Permission = tuple[str, str, str, str]


def permissions(rules: Sequence[dict[str, Any]]) -> set[Permission]:
    """The rules of a Role or ClusterRole flattened to single permissions."""
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or ["*"]
    }


def service_account_roles(
    docs: Sequence[dict[str, Any]], account: str, namespace: str = "kube-system"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rules of every Role and of every ClusterRole bound to a ServiceAccount, in that order."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    rules: dict[str, list[dict[str, Any]]] = {"Role": [], "ClusterRole": []}
    for binding_kind in ("RoleBinding", "ClusterRoleBinding"):
        for binding in objects(docs, binding_kind):
            if subject in binding.get("subjects", []):
                ref = binding["roleRef"]
                rules[ref["kind"]] += one(docs, ref["kind"], ref["name"])["rules"]
    return rules["Role"], rules["ClusterRole"]
