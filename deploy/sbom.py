"""The image's bill of materials: one CycloneDX 1.6 JSON document of the Python, Rust and Debian packages
inside, assembled in the Dockerfile's ``sbom`` stage from what each ecosystem's own tools recorded.

- Python: ``cyclonedx-py environment`` of the server's virtualenv (the CycloneDX project's generator),
  as given by ``--python``; each component gets the SHA-256 of the wheel it was installed from
  (``--wheels``: the files pip installed with ``--require-hashes``, so the hashes uv.lock holds).
- Rust: the SBOMs the installed wheels carry in ``*.dist-info/sboms/`` (PEP 770). The native engine's is
  written by maturin with cargo-cyclonedx at ``make wheels``: its crates, with their crates.io hashes,
  for every target (cargo-cyclonedx's ``all_targets``), and build-time crates marked ``excluded``.
- Debian: the dpkg status database of the runtime base (``--dpkg-status``; ``make image`` writes one
  for the packages its runtime base keeps), with ``/etc/os-release``; a ``pkg:deb`` Package URL each,
  its source package as the ``upstream`` qualifier, as vulnerability scanners match them.

The document is checked against the CycloneDX 1.6 JSON schema (cyclonedx-python-lib) before it is
written. ``--summary FILE`` prints the package count per ecosystem of a written document.

Runs with the Python of the image's builder (the ``build`` group of the lock installed), or in the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SPEC_VERSION = "1.6"
#: this repository's own distributions: built here and published on no index, so no Package URL (which
#: would name PyPI and match whatever someone else publishes under the name there)
LOCAL_DISTRIBUTIONS = ("ca-externalgrpc-server", "ca-externalgrpc-native")
#: the property of the root component that names the source revision (also an OCI label of the image)
REVISION_PROPERTY = "org.opencontainers.image.revision"


# ---------------------------------------------------------------------------------------------- Python
def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-").split("-") if part)


def wheel_hashes(wheels: Path) -> dict[tuple[str, str], str]:
    """(normalized name, version) -> the SHA-256 of each wheel in ``wheels``."""
    found: dict[tuple[str, str], str] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        found[(normalized(name), version)] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return found


def with_wheel_hashes(components: list[dict[str, Any]], hashes: dict[tuple[str, str], str]) -> list[str]:
    """Set each Python component's hash from its wheel; the names of those with no wheel."""
    missing = []
    for component in components:
        digest = hashes.get((normalized(component["name"]), component.get("version", "")))
        if digest is None:
            missing.append(component["name"])
            continue
        component["hashes"] = [{"alg": "SHA-256", "content": digest}]
    return missing


# ---------------------------------------------------------------------------------------------- Rust (PEP 770)
def embedded_sboms(site_packages: Path) -> Iterable[tuple[str, Path]]:
    """(distribution name, SBOM file) for each CycloneDX JSON SBOM an installed wheel carries."""
    for sbom in sorted(site_packages.glob("*.dist-info/sboms/*.json")):
        distribution = sbom.parent.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        yield normalized(distribution), sbom


def flattened(components: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for component in components:
        nested = component.pop("components", [])
        yield component
        yield from flattened(nested)


def identity(component: dict[str, Any]) -> str:
    """What makes two records one package: the Package URL without qualifiers, else the bom-ref."""
    purl = str(component.get("purl") or "")
    if purl:
        return purl.split("?", 1)[0].split("#", 1)[0]
    return str(component.get("bom-ref") or component.get("name"))


def tool_entries(tools: Any) -> list[dict[str, Any]]:
    """The tools of an SBOM's metadata: a list (CycloneDX 1.4, 1.5) or components and services (1.5+)."""
    if isinstance(tools, list):
        return [t for t in tools if isinstance(t, dict)]
    if isinstance(tools, dict):
        return [t for key in ("components", "services") for t in tools.get(key, []) if isinstance(t, dict)]
    return []


# ---------------------------------------------------------------------------------------------- Debian
def paragraphs(text: str) -> Iterable[dict[str, str]]:
    """The paragraphs of a Debian control file (dpkg's status), continuation lines joined."""
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, _, value = line.partition(":")
                fields[last] = value.strip()
        if fields.get("Package"):
            yield fields


def os_release(text: str) -> dict[str, str]:
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key: value.strip().strip('"') for key, _, value in pairs}


def debian_components(status: str, release: dict[str, str]) -> list[dict[str, Any]]:
    from packageurl import PackageURL

    distro = f"{release.get('ID', 'debian')}-{release.get('VERSION_ID', 'unknown')}"
    components = []
    for fields in paragraphs(status):
        if not fields.get("Status", "").endswith(" installed"):
            continue
        name, version, arch = fields["Package"], fields.get("Version", ""), fields.get("Architecture", "")
        qualifiers = {"arch": arch, "distro": distro}
        source = fields.get("Source", "").split(" ")[0]
        if source and source != name:
            qualifiers["upstream"] = source
        purl = PackageURL(
            type="deb", namespace=release.get("ID", "debian"), name=name, version=version, qualifiers=qualifiers
        ).to_string()
        component: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": name, "version": version}
        component["purl"] = purl
        if fields.get("Description"):
            component["description"] = fields["Description"].splitlines()[0]
        if fields.get("Maintainer"):
            component["supplier"] = {"name": fields["Maintainer"]}
        components.append(component)
    return components


def operating_system(release: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "operating-system",
        "bom-ref": f"os:{release.get('ID', 'unknown')}@{release.get('VERSION_ID', 'unknown')}",
        "name": release.get("ID", "unknown"),
        "version": release.get("VERSION_ID", "unknown"),
        "description": release.get("PRETTY_NAME", ""),
    }


# ---------------------------------------------------------------------------------------------- assembly
def assemble(
    python_bom: dict[str, Any],
    wheels: Path | None,
    site_packages: Path,
    dpkg_status: str,
    release: dict[str, str],
    revision: str,
) -> dict[str, Any]:
    """One document: the Python BOM's metadata and components, the embedded SBOMs' crates, the Debian
    packages, each with the tools that recorded them."""
    bom = dict(python_bom)
    bom["specVersion"] = SPEC_VERSION
    metadata = bom.setdefault("metadata", {})
    root = metadata.setdefault("component", {"type": "application", "name": "ca-externalgrpc-server"})
    root.setdefault("properties", []).append({"name": REVISION_PROPERTY, "value": revision})
    tools = metadata.setdefault("tools", {}).setdefault("components", [])
    components: list[dict[str, Any]] = list(bom.get("components", []))
    dependencies: list[dict[str, Any]] = list(bom.get("dependencies", []))
    by_name = {normalized(c["name"]): c for c in components}
    for name in LOCAL_DISTRIBUTIONS:
        if name in by_name:
            by_name[name].pop("purl", None)
            by_name[name]["description"] = "built from this repository; on no package index"
    if wheels is not None:
        python = [c for c in components if ecosystem(c) == "pypi" or normalized(c["name"]) in LOCAL_DISTRIBUTIONS]
        missing = with_wheel_hashes(python, wheel_hashes(wheels))
        with_wheel_hashes([root], wheel_hashes(wheels))
        if missing:
            raise SystemExit(f"sbom.py: no wheel for the installed {', '.join(sorted(missing))} in {wheels}")
    known = {identity(c) for c in components} | {identity(root)}
    for distribution, path in embedded_sboms(site_packages):
        embedded = json.loads(path.read_text())
        inner_root = dict(embedded.get("metadata", {}).get("component") or {})
        inner_root.pop("components", None)  # a crate's own build targets
        added = []
        for component in flattened([*([inner_root] if inner_root else []), *embedded.get("components", [])]):
            if component.get("bom-ref") and identity(component) not in known:
                components.append(component)
                known.add(identity(component))
                added.append(component["bom-ref"])
        dependencies += embedded.get("dependencies", [])
        owner = by_name.get(distribution)
        if owner is not None and added:
            top = inner_root.get("bom-ref") if inner_root.get("bom-ref") in added else None
            dependencies.append({"ref": owner["bom-ref"], "dependsOn": [top] if top else added})
        for tool in tool_entries(embedded.get("metadata", {}).get("tools")):
            recorded = {"type": "application", "name": tool.get("name", "?"), "version": tool.get("version", "")}
            if tool.get("vendor") or tool.get("group"):
                recorded["group"] = tool.get("vendor") or tool.get("group")
            if all((t.get("name"), t.get("version")) != (recorded["name"], recorded["version"]) for t in tools):
                tools.append(recorded)
    debian = debian_components(dpkg_status, release)
    components += [operating_system(release), *debian]
    tools.append(
        {
            "type": "application",
            "name": "deploy/sbom.py",
            "description": "ca-externalgrpc-server's assembly of the Python, Rust (PEP 770) and dpkg records",
        }
    )
    components.sort(key=lambda c: (c.get("purl", "").split("/")[0], c["name"].lower(), c.get("version", "")))
    bom["components"] = components
    refs = {c["bom-ref"] for c in components} | {root.get("bom-ref")}
    graph: dict[str, set[str]] = {}
    for entry in dependencies:  # one entry per component: SBOMs of two wheels may list the same crate
        if entry["ref"] in refs:
            graph.setdefault(entry["ref"], set()).update(r for r in entry.get("dependsOn", []) if r in refs)
    bom["dependencies"] = [{"ref": ref, "dependsOn": sorted(graph[ref])} for ref in sorted(graph)]
    return bom


def validate(bom: dict[str, Any]) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom))
    if error is not None:
        raise SystemExit(f"sbom.py: the bill of materials is not valid CycloneDX {SPEC_VERSION}: {str(error)[-500:]}")


def ecosystem(component: dict[str, Any]) -> str:
    """The Package URL's type (pypi, cargo, deb); ``local`` for a library on no index (the native engine's
    distribution, built here: no Package URL claims a registry for it); else the component's type."""
    purl = str(component.get("purl") or "")
    if purl.startswith("pkg:"):
        return purl[4:].split("/", 1)[0]
    return "local" if component.get("type") == "library" else str(component.get("type", "other"))


def counts(bom: dict[str, Any]) -> Counter[str]:
    """Components per ecosystem (the Package URL's type: pypi, cargo, deb; else the component type)."""
    return Counter(ecosystem(c) for c in bom.get("components", []))


def summary(bom: dict[str, Any]) -> str:
    found = counts(bom)
    parts = [f"{found.pop(name, 0)} {name}" for name in ("pypi", "local", "cargo", "deb")]
    parts += [f"{count} {name}" for name, count in sorted(found.items())]
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--summary", type=Path, metavar="FILE", help="print the package counts of FILE and exit")
    parser.add_argument("--python", type=Path, help="cyclonedx-py environment's JSON document")
    parser.add_argument("--site-packages", type=Path, help="the virtualenv's site-packages (embedded SBOMs)")
    parser.add_argument("--wheels", type=Path, help="the folder of the wheels pip installed")
    parser.add_argument("--dpkg-status", type=Path, help="the runtime's /var/lib/dpkg/status")
    parser.add_argument("--os-release", type=Path, help="the runtime's os-release")
    parser.add_argument("--revision", default="unknown", help="the source revision")
    parser.add_argument("--output", type=Path, help="where to write the document")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary(json.loads(args.summary.read_text())))
        return 0
    needed = ("python", "site_packages", "dpkg_status", "os_release", "output")
    if missing := [f"--{n.replace('_', '-')}" for n in needed if getattr(args, n) is None]:
        parser.error(f"missing {', '.join(missing)}")
    bom = assemble(
        json.loads(args.python.read_text()),
        args.wheels,
        args.site_packages,
        args.dpkg_status.read_text(),
        os_release(args.os_release.read_text()),
        args.revision,
    )
    validate(bom)
    args.output.write_text(json.dumps(bom, indent=2, sort_keys=True) + "\n")
    print(f"bill of materials: {summary(bom)} ({args.output})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
