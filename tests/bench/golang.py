"""The Go programs the benchmark needs: the load client, the grpc-go baseline and the upstream example.

The load client and the baseline (``loadclient/build.toml``) are compiled by ``make build``
(tests/support/gobuild.py) and only looked up here. The upstream example server is built here, by
``make bench`` only, and only once ``upstream/go.mod`` pins the 1.36.1 release (see the README).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import gobuild

BENCH_DIR = Path(__file__).resolve().parent
UPSTREAM_DIR = BENCH_DIR / "upstream"
# The example server is package main inside the CA module; our module names it in a `tool` line.
UPSTREAM_PACKAGE = (
    "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc/examples/external-grpc-cloud-provider-service"
)
# Only the Scaleway provider is compiled in (the builder's per-provider build tag), as a Scaleway
# deployment of the example would be; the default tag set would link every in-tree cloud.
UPSTREAM_TAGS = "scaleway"
BUILD_TIMEOUT = 1800.0  # a cold build downloads and compiles the CA module graph
# The release the comparison is defined against (the issue: the cluster-autoscaler-1.36.1 commit).
UPSTREAM_RELEASE = "1.36.1"


# ``go`` is missing, a build failed or a binary is not built; the message says how to fix it.
GoBuildError = gobuild.GoBuildError


class WrongUpstreamRelease(RuntimeError):
    """tests/bench/upstream/go.mod pins a CA commit that is not the release the bench compares against."""


@dataclass(frozen=True)
class UpstreamPin:
    version: str  # pseudo-version of k8s.io/autoscaler/cluster-autoscaler in our go.mod
    commit: str  # its 12-hex commit prefix


def cache_dir() -> Path:
    base = os.environ.get("GO_CACHE_DIR") or str(Path.home() / ".cache" / "ca-externalgrpc-go")
    path = Path(base) / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def go_binary() -> str:
    return gobuild.go_binary()


def _fingerprint(directory: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.suffix in (".go", ".mod", ".sum"):
            digest.update(str(path.relative_to(directory)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _build(directory: Path, output: Path, package: str, tags: str = "") -> Path:
    if output.exists():
        return output
    tmp = output.with_name(output.name + ".tmp")
    argv = [go_binary(), "build", "-trimpath", "-o", str(tmp)]
    if tags:
        argv += ["-tags", tags]
    argv.append(package)
    env = dict(os.environ, GOFLAGS=os.environ.get("GOFLAGS", "-buildvcs=false"), CGO_ENABLED="0")
    try:
        done = subprocess.run(argv, cwd=directory, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise GoBuildError(f"`{' '.join(argv)}` in {directory} took over {BUILD_TIMEOUT:.0f}s") from exc
    if done.returncode != 0:
        raise GoBuildError(f"`{' '.join(argv)}` in {directory} failed:\n{done.stderr.strip()[-4000:]}")
    tmp.replace(output)
    return output


def load_client() -> Path:
    """The load client ``make build`` compiled (BinaryNotBuilt, saying so, when it has not)."""
    return gobuild.binary_path("loadclient")


def go_reference() -> Path:
    return gobuild.binary_path("goreference")


def upstream_pin() -> UpstreamPin:
    text = (UPSTREAM_DIR / "go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/autoscaler/cluster-autoscaler (v\S+)", text, re.MULTILINE)
    if match is None:
        raise GoBuildError(f"{UPSTREAM_DIR / 'go.mod'} does not require k8s.io/autoscaler/cluster-autoscaler")
    version = match.group(1)
    return UpstreamPin(version=version, commit=version.rsplit("-", 1)[-1])


def upstream_release() -> str:
    """``ClusterAutoscalerVersion`` of the pinned CA module (downloaded through the module proxy)."""
    argv = [go_binary(), "list", "-m", "-f", "{{.Dir}}", "k8s.io/autoscaler/cluster-autoscaler"]
    try:
        done = subprocess.run(argv, cwd=UPSTREAM_DIR, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise GoBuildError(f"`{' '.join(argv)}` took over {BUILD_TIMEOUT:.0f}s") from exc
    if done.returncode != 0 or not done.stdout.strip():
        raise GoBuildError(f"`{' '.join(argv)}` in {UPSTREAM_DIR} failed:\n{done.stderr.strip()[-4000:]}")
    version_go = Path(done.stdout.strip()) / "version" / "version.go"
    match = re.search(r'ClusterAutoscalerVersion = "([^"]+)"', version_go.read_text())
    if match is None:
        raise GoBuildError(f"no ClusterAutoscalerVersion in {version_go}")
    return match.group(1)


def build_upstream() -> Path:
    """Build the example server, refusing a pin that is not the release the comparison is defined for."""
    release = upstream_release()
    if release != UPSTREAM_RELEASE:
        raise WrongUpstreamRelease(
            f"tests/bench/upstream/go.mod pins {upstream_pin().version}, which is CA {release}, not "
            f"{UPSTREAM_RELEASE}; put the pseudo-version of the cluster-autoscaler-{UPSTREAM_RELEASE} commit there "
            "(tests/bench/README.md, 'Pinning the upstream server')"
        )
    output = cache_dir() / f"upstream-example-{_fingerprint(UPSTREAM_DIR, UPSTREAM_TAGS)}"
    return _build(UPSTREAM_DIR, output, UPSTREAM_PACKAGE, UPSTREAM_TAGS)
