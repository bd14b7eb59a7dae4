"""The images the real node runs besides ours, built with podman: ``python -m tests.support.nodeimages``.

``make node-images`` (part of ``make test`` when podman is installed) builds two images from binaries of
the Go build step (``make build``), since no image registry is reachable:

- the cluster-autoscaler: the e2e module's CA 1.36.1 (tests/e2e/gomod), built with the externalgrpc and
  the in-tree Scaleway and Bizfly providers as the official image holds every provider, at
  ``/cluster-autoscaler`` as the official image has it (the chart runs ``./cluster-autoscaler`` from
  ``/``), on the Debian runtime base ``make image`` made for our server (the binary is linked against
  glibc; the official image is a static build on distroless). The node scenarios give it the name the
  chart and the manifests use, ``registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.1``, inside the node.
- the pod sandbox ("pause") image: the static ``node-pause`` program alone (tests/e2e/nodegomod/pause).

Each image is labelled with the SHA-256 of the binary it holds; ``image_problem`` tells a test that an
image is missing or holds another build ("run make node-images"). Building is a build step, never a
test's.

It also fetches what the mTLS layout needs of cert-manager: the CustomResourceDefinitions of its
``Issuer`` and ``Certificate``, from the cert-manager Go module at ``CERT_MANAGER_VERSION`` (``go mod
download``, its hash checked against ``CERT_MANAGER_SUM``), into ``cert_manager_crds()``. (cert-manager's
controller itself is not on the Go module proxy: its main packages are separate modules whose paths the
proxy refuses; the node scenarios issue the layout's Certificates themselves, tests/e2e/node_certificates.py.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from devstack.container import PodmanError, podman
from tests.support.gobuild import GoBuildError, binary_path, build_env, go_binary
from tests.support.imagebuild import DEFAULT_CACHE_DIR, ImageBuildError, check_prerequisites, debian_bases

#: the image label holding the SHA-256 of the binary inside
BINARY_LABEL = "io.github.ca-externalgrpc.binary-sha256"


@dataclass(frozen=True)
class NodeImage:
    name: str  # podman's name
    binary: str  # the build.toml name of the program inside
    path: str  # where the program is in the image
    user: str
    on_runtime_base: bool  # else FROM scratch (a static program)


CLUSTER_AUTOSCALER = NodeImage(
    name="localhost/ca-externalgrpc-e2e/cluster-autoscaler:1.36.1-node",
    binary="cluster-autoscaler-1.36.1-node",
    path="/cluster-autoscaler",
    user="65532:65532",
    on_runtime_base=True,
)
PAUSE = NodeImage(
    name="localhost/ca-externalgrpc-e2e/pause:1",
    binary="node-pause",
    path="/pause",
    user="65535:65535",
    on_runtime_base=False,
)
NODE_IMAGES = (CLUSTER_AUTOSCALER, PAUSE)


@cache
def _sha256(path: Path, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager"
CERT_MANAGER_VERSION = "v1.21.2"
CERT_MANAGER_SUM = "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68="
#: the kinds the mTLS layout uses (deploy/kubernetes/server-mtls/certificates.yaml)
CERT_MANAGER_CRDS = ("cert-manager.io_issuers.yaml", "cert-manager.io_certificates.yaml")


def cert_manager_crds(cache_dir: Path | None = None) -> Path:
    """Where ``make node-images`` keeps cert-manager's CRDs (the files of ``CERT_MANAGER_CRDS``)."""
    base = cache_dir or Path(os.environ.get("IMAGE_CACHE_DIR") or DEFAULT_CACHE_DIR)
    return base / f"cert-manager-{CERT_MANAGER_VERSION}-crds"


def crds_problem() -> str | None:
    missing = [name for name in CERT_MANAGER_CRDS if not (cert_manager_crds() / name).is_file()]
    return f"cert-manager's CRDs are not in {cert_manager_crds()}: run make node-images" if missing else None


def fetch_cert_manager_crds(cache_dir: Path) -> None:
    target = cert_manager_crds(cache_dir)
    if all((target / name).is_file() for name in CERT_MANAGER_CRDS):
        print(f"make node-images: cert-manager {CERT_MANAGER_VERSION} CRDs are in {target}", flush=True)
        return
    go = go_binary()
    with tempfile.TemporaryDirectory(prefix="ca-externalgrpc-cert-manager-") as directory:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION}"],
            cwd=directory,
            env=build_env(go, with_module_proxy=False),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if done.returncode != 0:
        raise ImageBuildError(
            f"go mod download {CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION} failed: {done.stdout}{done.stderr}"
        )
    module = json.loads(done.stdout)
    if module.get("Sum") != CERT_MANAGER_SUM:
        raise ImageBuildError(
            f"{CERT_MANAGER_MODULE}@{CERT_MANAGER_VERSION} hashes to {module.get('Sum')}, not {CERT_MANAGER_SUM}"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in CERT_MANAGER_CRDS:
        shutil.copyfile(Path(module["Dir"]) / "deploy" / "crds" / name, target / name)
    print(f"make node-images: cert-manager {CERT_MANAGER_VERSION} CRDs copied to {target}", flush=True)


def binary_digest(image: NodeImage) -> str:
    path = binary_path(image.binary)
    return _sha256(path, path.stat().st_mtime)


def image_problem(image: NodeImage) -> str | None:
    """Why ``image`` cannot be used (missing, or built from another binary than the current one), or None."""
    try:
        wanted = binary_digest(image)
    except GoBuildError as err:
        return str(err)
    found = podman("image", "inspect", "--format", f'{{{{index .Labels "{BINARY_LABEL}"}}}}', image.name, check=False)
    if found.returncode != 0:
        return f"there is no image {image.name}: run make node-images"
    if found.stdout.strip() != wanted:
        return f"the image {image.name} holds another build of {image.binary}: run make node-images"
    return None


def build(image: NodeImage, runtime_base: str | None) -> None:
    source = binary_path(image.binary)
    with tempfile.TemporaryDirectory(prefix="ca-externalgrpc-node-image-") as directory:
        context = Path(directory)
        shutil.copy2(source, context / "program")
        base = runtime_base if image.on_runtime_base else "scratch"
        (context / "Containerfile").write_text(
            f'FROM {base}\nCOPY program {image.path}\nWORKDIR /\nUSER {image.user}\nENTRYPOINT ["{image.path}"]\n'
        )
        podman(
            "build",
            "--quiet",
            "--tag",
            image.name,
            f"--label={BINARY_LABEL}={binary_digest(image)}",
            str(context),
            timeout=600,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("IMAGE_CACHE_DIR") or DEFAULT_CACHE_DIR),
        help="where make image keeps its bases",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        check_prerequisites(("podman", "runc", "mmdebstrap"))
        todo = [image for image in NODE_IMAGES if image_problem(image)]
        runtime = debian_bases(args.cache_dir, (), refresh=False)[1] if todo else None
        for image in NODE_IMAGES:
            if image in todo:
                build(image, runtime)
                print(f"make node-images: built {image.name} ({image.binary})", flush=True)
            else:
                print(f"make node-images: {image.name} is up to date", flush=True)
        fetch_cert_manager_crds(args.cache_dir)
    except (GoBuildError, ImageBuildError, PodmanError) as err:
        print(f"make node-images: {err}", file=sys.stderr)
        return 1
    print(f"make node-images: done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
