"""The official cluster-autoscaler Helm chart, taken from the CA module, rendered with the real Helm CLI.

The chart ships inside the ``k8s.io/autoscaler/cluster-autoscaler`` Go module (``charts/
cluster-autoscaler``). Its module zip comes from the Go module proxy directory that serves the CA
modules (``CA_MODULE_PROXY``; the same directory and default the Go build step,
tests/support/gobuild.py, uses). The zip is checked against the module hash Go itself records
(``h1:`` in go.sum) before the chart is unpacked, so what we render is byte for byte the chart of
that commit. Helm is built by ``make deploy-check`` from ``tests/deploy/helm`` (tests never build).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.support.gobuild import binary_path, module_proxy_dir

MODULE = "k8s.io/autoscaler/cluster-autoscaler"
CHART_DIR = "charts/cluster-autoscaler"


@dataclass(frozen=True)
class ChartSource:
    """One CA module version whose chart we render."""

    label: str  # for test ids
    version: str  # module version
    h1: str  # the module's go.sum hash (tests/conformance/*/go.sum pin the same)


#: the CA 1.36.1 tag (chart 9.58.0) and CA HEAD of 2026-08-22 (chart 9.59.0)
CA_1_36_1 = ChartSource(
    "ca-1.36.1", "v0.0.0-20260722070747-35e8a280425c", "h1:wBH/KOXxlX8HWHN7wPO2bs1HK3oWcFewen32zl8RDFw="
)
CA_HEAD = ChartSource(
    "ca-head", "v0.0.0-20260822084713-55c37cd5eb55", "h1:A9YNaehC6lmG4Prj2J23ciwQRiOnp600/MCGJM4oBrY="
)
CHARTS = (CA_1_36_1, CA_HEAD)


class ChartUnavailable(RuntimeError):
    """The module zip is missing or is not the pinned one."""


def module_hash(zip_path: Path) -> str:
    """Go's ``h1:`` hash of a module zip (golang.org/x/mod/sumdb/dirhash Hash1)."""
    with zipfile.ZipFile(zip_path) as archive:
        summary = "".join(
            f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n" for name in sorted(archive.namelist())
        )
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


@cache
def chart_dir(source: ChartSource) -> Path:
    """The chart of ``source`` unpacked into a temporary directory (once per test run)."""
    zip_path = module_proxy_dir() / MODULE / "@v" / f"{source.version}.zip"
    if not zip_path.is_file():
        raise ChartUnavailable(
            f"{zip_path} is missing: set CA_MODULE_PROXY to the Go module proxy directory that serves {MODULE}"
        )
    found = module_hash(zip_path)
    if found != source.h1:
        raise ChartUnavailable(f"{zip_path} hashes to {found}, not the pinned {source.h1}")
    prefix = f"{MODULE}@{source.version}/{CHART_DIR}/"
    target = Path(tempfile.mkdtemp(prefix=f"chart-{source.label}-")) / "cluster-autoscaler"
    with zipfile.ZipFile(zip_path) as archive:
        for name in archive.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                out = target / name[len(prefix) :]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(archive.read(name))
    if not (target / "Chart.yaml").is_file():
        shutil.rmtree(target.parent, ignore_errors=True)
        raise ChartUnavailable(f"{zip_path} has no {CHART_DIR}/Chart.yaml")
    return target


def chart_version(source: ChartSource) -> str:
    return str(yaml.safe_load((chart_dir(source) / "Chart.yaml").read_text())["version"])


def chart_values(source: ChartSource) -> dict[str, Any]:
    """The chart's own values.yaml (its defaults and the keys it knows)."""
    return yaml.safe_load((chart_dir(source) / "values.yaml").read_text())


@cache
def helm_template(
    source: ChartSource, values: tuple[Path, ...], kube_version: str, set_values: tuple[str, ...] = ()
) -> tuple[dict[str, Any], ...]:
    """``helm template`` of the chart with the values files; the rendered objects."""
    argv = [
        str(binary_path("helm")),
        "template",
        "cluster-autoscaler",
        str(chart_dir(source)),
        "--namespace",
        "kube-system",
        "--kube-version",
        kube_version,
    ]
    for path in values:
        argv += ["-f", str(path)]
    for item in set_values:
        argv += ["--set", item]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{proc.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


VALUES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "helm"
#: the sidecar layout, and the second values file that adds the RBAC of the server's Kubernetes features
SIDECAR_VALUES = VALUES_DIR / "values-sidecar.yaml"
SIDECAR_FEATURES_VALUES = VALUES_DIR / "values-sidecar-kubernetes-features.yaml"


def ca_roles(docs: tuple[dict[str, Any], ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rules of the chart's own Role and ClusterRole (the CA's service account; the sidecar's too)."""
    found = {d["kind"]: d["rules"] for d in docs if d["kind"] in ("Role", "ClusterRole")}
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert len(roles) == 2 and set(found) == {"Role", "ClusterRole"}, [
        (d["kind"], d["metadata"]["name"]) for d in roles
    ]
    return found["Role"], found["ClusterRole"]


def sidecar_roles(
    source: ChartSource, with_features: bool, kube_version: str = "1.34.0"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Role and ClusterRole rules the sidecar runs under: values-sidecar.yaml, plus the features file."""
    values = (SIDECAR_VALUES, SIDECAR_FEATURES_VALUES) if with_features else (SIDECAR_VALUES,)
    return ca_roles(helm_template(source, values, kube_version))
