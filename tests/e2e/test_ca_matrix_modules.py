"""The short check of the compatibility matrix that ``make test`` runs (the matrix itself,
tests/e2e/test_ca_matrix.py, is ``make e2e-ca-matrix``; its binaries are never built by ``make build``).

Each release's Go module (tests/e2e/camatrix/*) pins in its go.sum the CA module versions that only the
project's module proxy directory serves (``CA_MODULE_PROXY``): the CA release and its nested ``apis``
module, and for HEAD the sigs.k8s.io core. If that directory stops serving one of them, or serves other
bytes (a zip made again), the release's next build fails on a missing module or a checksum mismatch;
this check fails first, without Go or the network: every such pin must be served with the pinned hash.
The modules every release takes from the public Go proxy are not checked here (that needs the network
and a download of each module); the matrix build checks them.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from tests.deploy.chart import module_hash
from tests.support.gobuild import NOSUMDB_PATTERNS, REPO, module_proxy_dir, needs_module_proxy

# The release modules (etcd3524, the 1.33 row's etcd, takes nothing from the proxy directory).
MATRIX_DIR = REPO / "tests/e2e/camatrix"
MATRIX_MODULES = sorted(m.parent for m in MATRIX_DIR.glob("*/go.mod") if needs_module_proxy(m.parent))


def go_mod_hash(go_mod: Path) -> str:
    """Go's ``h1:`` hash of a module's go.mod (dirhash Hash1 over the one file named ``go.mod``)."""
    summary = f"{hashlib.sha256(go_mod.read_bytes()).hexdigest()}  go.mod\n"
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def proxy_pins(go_sum: Path) -> list[tuple[str, str, str]]:
    """(module, version or version/go.mod, hash) for every go.sum line of a module the proxy directory serves."""
    pins = []
    for line in go_sum.read_text().splitlines():
        module, version, h1 = line.split()
        if any(module == p or module.startswith(p + "/") for p in NOSUMDB_PATTERNS):
            pins.append((module, version, h1))
    return pins


def test_ca_matrix_modules_are_found() -> None:
    assert [p.name for p in MATRIX_MODULES] == ["ca1336", "ca1345", "ca1352", "cahead"]


@pytest.mark.parametrize("module_dir", MATRIX_MODULES, ids=[p.name for p in MATRIX_MODULES])
def test_ca_matrix_module_pins_are_served_by_the_module_proxy(module_dir: Path) -> None:
    proxy = module_proxy_dir()
    pins = proxy_pins(module_dir / "go.sum")
    assert pins, f"{module_dir.relative_to(REPO)}/go.sum pins no module of the proxy directory"
    wrong = []
    for module, version, pinned in pins:
        if version.endswith("/go.mod"):
            served = proxy / module / "@v" / f"{version.removesuffix('/go.mod')}.mod"
            found = go_mod_hash(served) if served.is_file() else "missing"
        else:
            served = proxy / module / "@v" / f"{version}.zip"
            found = module_hash(served) if served.is_file() else "missing"
        if found != pinned:
            wrong.append(f"{module} {version}: {served} is {found}, go.sum pins {pinned}")
    where = module_dir.relative_to(REPO)
    assert not wrong, f"{where} would not build from CA_MODULE_PROXY={proxy}:\n" + "\n".join(wrong)
