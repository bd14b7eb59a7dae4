"""The Go programs the benchmark runs: the load client and the upstream example server.

Both are declared in a ``build.toml`` (``loadclient/`` and ``upstream/``, group ``bench``), compiled by
``make build`` (tests/support/gobuild.py) and only looked up here: the benchmark never compiles. The
upstream example is also built with the in-tree Bizfly provider instead of Scaleway's, for the in-tree
differential (tests/integration/test_in_tree_differential.py), which finds both here.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import gobuild

BENCH_DIR = Path(__file__).resolve().parent
UPSTREAM_DIR = BENCH_DIR / "upstream"
# The upstream example server built per in-tree provider (upstream/build.toml), by --cloud-provider name.
UPSTREAM_BINARIES = {"scaleway": "upstream-example-1.36.1", "bizflycloud": "upstream-example-1.36.1-bizflycloud"}
# The release the comparison is defined against.
UPSTREAM_RELEASE = "1.36.1"
CA_MODULE = "k8s.io/autoscaler/cluster-autoscaler"

# ``go`` is missing, the module proxy is missing, or a binary is not built; the message says how to fix it.
GoBuildError = gobuild.GoBuildError


class WrongUpstreamRelease(gobuild.GoBuildError):
    """tests/bench/upstream/go.mod pins a CA commit that is not the release the bench compares against."""


@dataclass(frozen=True)
class UpstreamPin:
    version: str  # pseudo-version of k8s.io/autoscaler/cluster-autoscaler in upstream/go.mod
    commit: str  # its 12-hex commit prefix
    release: str  # ClusterAutoscalerVersion of that commit

    def describe(self) -> str:
        return f"{CA_MODULE} {self.version} (CA {self.release}, commit {self.commit}), -tags scaleway"


def load_client() -> Path:
    """The load client ``make build`` compiled (BinaryNotBuilt, saying so, when it has not)."""
    return gobuild.binary_path("loadclient")


def upstream_example(cloud_provider: str = "scaleway") -> Path:
    """The upstream example server with the in-tree ``cloud_provider`` that ``make build`` compiled, after
    checking that it pins the release."""
    binary = gobuild.binary_path(UPSTREAM_BINARIES[cloud_provider])
    pin = upstream_pin()
    if pin.release != UPSTREAM_RELEASE:
        raise WrongUpstreamRelease(
            f"tests/bench/upstream/go.mod pins {pin.version}, which is CA {pin.release}, not {UPSTREAM_RELEASE}; "
            f"put the pseudo-version of the cluster-autoscaler-{UPSTREAM_RELEASE} commit there"
        )
    return binary


def upstream_pin() -> UpstreamPin:
    """The CA version upstream/go.mod requires, and the release its ``version/version.go`` names.

    The module is in Go's module cache once ``make build`` has compiled the example from it.
    """
    text = (UPSTREAM_DIR / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(CA_MODULE)} (v\S+)", text, re.MULTILINE)
    if match is None:
        raise GoBuildError(f"{UPSTREAM_DIR / 'go.mod'} does not require {CA_MODULE}")
    version = match.group(1)
    version_go = _module_cache() / f"{CA_MODULE}@{version}" / "version" / "version.go"
    try:
        found = re.search(r'ClusterAutoscalerVersion = "([^"]+)"', version_go.read_text())
    except OSError as exc:
        raise GoBuildError(f"{version_go} is missing ({exc.strerror}): run `make build`") from exc
    if found is None:
        raise GoBuildError(f"no ClusterAutoscalerVersion in {version_go}")
    return UpstreamPin(version=version, commit=version.rsplit("-", 1)[-1], release=found.group(1))


def _module_cache() -> Path:
    argv = [gobuild.go_binary(), "env", "GOMODCACHE"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise GoBuildError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return Path(done.stdout.strip())
