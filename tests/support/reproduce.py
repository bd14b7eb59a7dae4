"""``make reproduce``: two image builds from fresh clones of HEAD, minutes apart, install the same packages.

Each build clones the repository into the same folder and checks out the commit HEAD was at the
start (a clean clone: nothing of this checkout's .venv, dist/ or caches), runs ``make image`` there
with podman's layer cache off (``--no-cache``: every pip download of the builder happens again), and
the next one starts ``--gap`` seconds after the first ended. Then, for each image:

- the bill of materials it carries: every component's ecosystem, name, version and hashes (the
  SHA-256 of each wheel installed, each crate's crates.io checksum; Debian packages by version);
- what is installed, read inside the image without the bill of materials' tools: each Python
  distribution's name, version and the SHA-256 of its RECORD (the hash of every file it installed).

Both sets are compared; any difference is listed and the command fails. The Debian bases come from
make image's cache (``--refresh-bases`` would take Debian's newest packages, by design not locked).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devstack.container import podman

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = Path("/tmp/ca-externalgrpc-reproduce")

#: run in the image: every installed distribution with the SHA-256 of its RECORD's lines (the hash of
#: every file it installed) but for the SBOMs the wheel carries and RECORD itself, and those SBOMs' paths
INSTALLED_SCRIPT = r"""
import hashlib, json
from importlib import metadata
found = {}
for dist in metadata.distributions():
    lines = (dist.read_text("RECORD") or "").splitlines()
    sboms = sorted(l.split(",")[0] for l in lines if ".dist-info/sboms/" in l)
    kept = [l for l in lines if ".dist-info/sboms/" not in l and not l.split(",")[0].endswith(".dist-info/RECORD")]
    digest = hashlib.sha256("\n".join(sorted(kept)).encode()).hexdigest()
    found[dist.metadata["Name"]] = {"version": dist.version, "files": digest, "sboms": sboms}
print(json.dumps(found, sort_keys=True))
"""
#: this repository's own distributions (they are built in each clone, the others downloaded)
LOCAL = ("ca-externalgrpc-server", "ca-externalgrpc-native")
#: why a wheel that maturin built differs when nothing else of it does
MATURIN_SBOM = (
    "maturin writes a build timestamp and a random serial number into the SBOM it puts in the wheel "
    "(.dist-info/sboms/), so the wheel's hash differs between two builds"
)


def log(message: str) -> None:
    print(f"make reproduce: {message}", flush=True)


def package_set(bom: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """``ecosystem:name`` (with the bom-ref when a name repeats) -> version and hashes."""
    found: dict[str, tuple[str, ...]] = {}
    for component in bom.get("components", []):
        purl = str(component.get("purl") or "")
        ecosystem = purl[4:].split("/", 1)[0] if purl.startswith("pkg:") else component.get("type", "?")
        key = f"{ecosystem}:{component['name']}@{component.get('version', '')}"
        hashes = sorted(f"{h['alg']}:{h['content']}" for h in component.get("hashes", []))
        found[key] = (component.get("version", ""), *hashes)
    root = bom.get("metadata", {}).get("component", {})
    found[f"root:{root.get('name')}"] = (
        root.get("version", ""),
        *sorted(f"{h['alg']}:{h['content']}" for h in root.get("hashes", [])),
    )
    return found


def differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(first) | set(second)):
        if first.get(key) != second.get(key):
            lines.append(f"  {key}: {first.get(key, 'absent')} / {second.get(key, 'absent')}")
    return lines


def build(number: int, workdir: Path, commit: str) -> tuple[dict[str, Any], dict[str, Any], float]:
    source = workdir / "src"
    shutil.rmtree(source, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(source)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=source, check=True)
    image = f"localhost/ca-externalgrpc-server:reproduce-{number}"
    sbom = workdir / f"sbom-{number}.cdx.json"
    log(f"build {number}: a fresh clone of {commit} in {source}; make image --no-cache into {image}")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CA_EXTERNALGRPC_IMAGE")}
    started = time.monotonic()
    argv = ["make", "--no-print-directory", "-C", str(source), "image", f"IMAGE={image}"]
    argv.append(f"IMAGE_ARGS=--no-cache --sbom-out {sbom}")
    if subprocess.run(argv, env=env, check=False).returncode != 0:
        raise SystemExit(f"make reproduce: build {number} failed (its output is above)")
    seconds = time.monotonic() - started
    installed = json.loads(
        podman(
            "run", "--rm", "--pull=never", "--entrypoint=/opt/ca-externalgrpc/bin/python", image,
            "-c", INSTALLED_SCRIPT,
        ).stdout
    )  # fmt: skip
    podman("rmi", image, check=False)
    shutil.rmtree(source, ignore_errors=True)
    return json.loads(sbom.read_text()), installed, seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gap", type=float, default=180, help="seconds between the end of one build and the next")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="where the clones are made")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    # One commit for both builds, whatever is committed in between.
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    first_bom, first_installed, first_seconds = build(1, args.workdir, commit.stdout.strip())
    ended = time.strftime("%H:%M:%S")
    log(f"build 1 took {first_seconds:.0f} s, ended {ended}; the next starts in {args.gap:.0f} s")
    time.sleep(args.gap)
    second_bom, second_installed, second_seconds = build(2, args.workdir, commit.stdout.strip())
    log(f"build 2 took {second_seconds:.0f} s, ended {time.strftime('%H:%M:%S')}")
    sets = package_set(first_bom), package_set(second_bom)
    by_ecosystem: dict[str, int] = {}
    for key in sets[0]:
        by_ecosystem[key.split(":", 1)[0]] = by_ecosystem.get(key.split(":", 1)[0], 0) + 1
    counts = ", ".join(f"{count} {name}" for name, count in sorted(by_ecosystem.items()))
    installed_diff = differences(first_installed, second_installed)
    same_files = {name for name in first_installed if first_installed[name] == second_installed.get(name)}
    explained: list[str] = []
    unexplained: list[str] = []
    for key in sorted(set(sets[0]) | set(sets[1])):
        if sets[0].get(key) == sets[1].get(key):
            continue
        name = key.split(":", 1)[1].split("@", 1)[0]
        maturin_built = name in LOCAL and name in same_files and first_installed[name]["sboms"]
        (explained if maturin_built else unexplained).append(f"  {key}: {sets[0].get(key)} / {sets[1].get(key)}")
    total = len(set(sets[0]) | set(sets[1]))
    if unexplained:
        log(f"the bills of materials differ in {len(unexplained)} of {total} packages:")
        print("\n".join(unexplained))
    else:
        log(f"the bills of materials list the same {total - len(explained)} of {total} packages, versions and hashes")
        log(f"  ({counts})")
    if explained:
        log(f"the wheel hash differs for {len(explained)} of this repository's distributions: {MATURIN_SBOM}")
        print("\n".join(explained))
        log("  every other file of it, the extension module included, is the same in both images (below)")
    if installed_diff:
        log(f"the installed Python distributions differ in {len(installed_diff)}:")
        print("\n".join(installed_diff))
    else:
        log(
            f"the same {len(first_installed)} Python distributions are installed in both, each with the same "
            "version and the same SHA-256 of every file it installed (RECORD), the SBOM a wheel carries aside"
        )
    return 1 if unexplained or installed_diff else 0


if __name__ == "__main__":
    sys.exit(main())
