"""The image's bill of materials as deploy/sbom.py assembles it: the Python components with their wheels'
hashes, the crates of the SBOMs wheels carry (PEP 770), the Debian packages of dpkg's status with the
Package URLs scanners match, this repository's own distributions without a registry's Package URL, one
dependency entry per component, and a document valid against the CycloneDX 1.6 schema."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy import sbom

STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u14
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6+deb12u6
Description: Interactive high-level object-oriented language (version 3.11)

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""
RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'


def python_bom() -> dict[str, Any]:
    """What cyclonedx-py environment writes, cut down to what sbom.py reads."""
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "component": {"bom-ref": "root-component", "type": "application", "name": "ca-externalgrpc-server",
                          "version": "0.2.0"},
            "tools": {"components": [{"type": "application", "name": "cyclonedx-py", "version": "7.5.0"}]},
        },
        "components": [
            {"bom-ref": "grpcio==1.85.3", "type": "library", "name": "grpcio", "version": "1.85.3",
             "purl": "pkg:pypi/grpcio@1.85.3"},
            {"bom-ref": "ca-externalgrpc-native==0.2.0", "type": "library", "name": "ca-externalgrpc-native",
             "version": "0.2.0", "purl": "pkg:pypi/ca-externalgrpc-native@0.2.0"},
        ],
        "dependencies": [
            {"ref": "root-component", "dependsOn": ["grpcio==1.85.3", "ca-externalgrpc-native==0.2.0"]},
            {"ref": "grpcio==1.85.3"},
        ],
    }  # fmt: skip


def crate_sbom(crate: str, version: str, deps: list[str]) -> dict[str, Any]:
    """A maturin-written SBOM of a crate and its dependencies (cargo-cyclonedx, CycloneDX 1.5)."""
    ref = f"path+file:///build/{crate}#{crate}@{version}"

    def registry(name: str) -> str:
        return f"registry+https://github.com/rust-lang/crates.io-index#{name}@1.0.0"

    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "metadata": {
            "tools": [{"vendor": "CycloneDX", "name": "cargo-cyclonedx", "version": "0.5.9"}],
            "component": {"type": "library", "bom-ref": ref, "name": crate, "version": version,
                          "purl": f"pkg:cargo/{crate}@{version}?download_url=file://.",
                          "components": [{"type": "library", "bom-ref": f"{ref} bin-target-0", "name": crate}]},
        },
        "components": [
            {"type": "library", "bom-ref": registry(name), "name": name, "version": "1.0.0",
             "purl": f"pkg:cargo/{name}@1.0.0", "scope": "required",
             "hashes": [{"alg": "SHA-256", "content": "ab" * 32}]}
            for name in deps
        ],
        "dependencies": [{"ref": ref, "dependsOn": [registry(n) for n in deps]}]
        + [{"ref": registry(n), "dependsOn": []} for n in deps],
    }  # fmt: skip


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Path, Path]:
    """A site-packages whose native engine carries a crate SBOM, and the wheels it was installed from."""
    site = tmp_path / "site-packages"
    sboms = site / "ca_externalgrpc_native-0.2.0.dist-info" / "sboms"
    sboms.mkdir(parents=True)
    (sboms / "ca-externalgrpc-native.cyclonedx.json").write_text(
        json.dumps(crate_sbom("ca-externalgrpc-native", "0.2.0", ["tokio", "hyper"]))
    )
    other = site / "pydantic_core-2.50.5.dist-info" / "sboms"
    other.mkdir(parents=True)
    (other / "pydantic-core.cyclonedx.json").write_text(json.dumps(crate_sbom("pydantic-core", "2.50.5", ["tokio"])))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("grpcio-1.85.3-cp311-cp311-manylinux_2_17_x86_64.whl", "ca_externalgrpc_native-0.2.0-cp311-abi3-x.whl",
                 "ca_externalgrpc_server-0.2.0-py3-none-any.whl"):  # fmt: skip
        (wheels / name).write_bytes(name.encode())
    return site, wheels


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def test_the_assembled_document_holds_every_ecosystem_and_validates(installed: tuple[Path, Path]) -> None:
    site, wheels = installed
    bom = sbom.assemble(python_bom(), wheels, site, STATUS, sbom.os_release(RELEASE), "f" * 40)
    sbom.validate(bom)
    assert sbom.summary(bom) == "1 pypi, 1 local, 4 cargo, 2 deb, 1 operating-system"
    by_name = {c["name"]: c for c in bom["components"]}
    # Python: the hash of the very wheel installed.
    assert by_name["grpcio"]["hashes"] == [
        {"alg": "SHA-256", "content": digest(wheels.glob("grpcio-*").__next__().name)}
    ]
    assert bom["metadata"]["component"]["hashes"][0]["content"] == digest(
        "ca_externalgrpc_server-0.2.0-py3-none-any.whl"
    )
    revision = bom["metadata"]["component"]["properties"]
    assert {"name": "org.opencontainers.image.revision", "value": "f" * 40} in revision
    # This repository's own distributions: no Package URL naming PyPI.
    native = next(c for c in bom["components"] if c["bom-ref"] == "ca-externalgrpc-native==0.2.0")
    assert "purl" not in native and native["hashes"]
    # Rust: the crates of both wheels' SBOMs once each, the native engine's crate under its distribution.
    cargo = sorted(c["name"] for c in bom["components"] if c.get("purl", "").startswith("pkg:cargo/"))
    assert cargo == ["ca-externalgrpc-native", "hyper", "pydantic-core", "tokio"]
    graph = {d["ref"]: d["dependsOn"] for d in bom["dependencies"]}
    assert len(graph) == len(bom["dependencies"])
    assert graph["ca-externalgrpc-native==0.2.0"] == [
        "path+file:///build/ca-externalgrpc-native#ca-externalgrpc-native@0.2.0"
    ]
    # Debian: installed packages only, their source package as the upstream qualifier.
    assert (
        by_name["libc6"]["purl"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=debian-12&upstream=glibc"
    )
    assert by_name["python3.11"]["purl"] == "pkg:deb/debian/python3.11@3.11.2-6%2Bdeb12u6?arch=amd64&distro=debian-12"
    assert "gone" not in by_name
    tools = {t["name"] for t in bom["metadata"]["tools"]["components"]}
    assert {"cyclonedx-py", "cargo-cyclonedx", "deploy/sbom.py"} <= tools


def test_an_installed_distribution_without_its_wheel_stops_the_assembly(installed: tuple[Path, Path]) -> None:
    site, wheels = installed
    (next(wheels.glob("grpcio-*"))).unlink()
    with pytest.raises(SystemExit, match="no wheel for the installed grpcio"):
        sbom.assemble(python_bom(), wheels, site, STATUS, sbom.os_release(RELEASE), "unknown")


def test_a_document_the_schema_refuses_is_not_written() -> None:
    bom = python_bom()
    bom["components"][0]["type"] = "not-a-type"
    with pytest.raises(SystemExit, match="not valid CycloneDX 1.6"):
        sbom.validate(bom)


def test_the_sboms_the_development_virtualenvs_wheels_carry_are_all_taken_in() -> None:
    """The real variety: a dozen wheels of this virtualenv carry SBOMs of their own (maturin's, python-sbom's,
    cryptography's; CycloneDX 1.5 and 1.6; some without a root component, tools as a list or as
    components). Each crate once, every dependency edge between known components. (The schema check of
    a document this size takes minutes; the image's, a few hundred components, is checked as it is built.)"""
    (site,) = Path(sys.prefix).glob("lib/python3*/site-packages")
    carried = list(sbom.embedded_sboms(site))
    assert len(carried) >= 5, carried
    bom = sbom.assemble(python_bom(), None, site, STATUS, sbom.os_release(RELEASE), "unknown")
    refs = [c["bom-ref"] for c in bom["components"]]
    assert len(set(refs)) == len(refs)
    identities = [sbom.identity(c) for c in bom["components"]]
    assert len(set(identities)) == len(identities)
    known = set(refs) | {"root-component"}
    for entry in bom["dependencies"]:
        assert entry["ref"] in known and set(entry["dependsOn"]) <= known, entry["ref"]
    assert sbom.counts(bom)["cargo"] > 300
