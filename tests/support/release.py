"""``make release VERSION=x.y.z``: the artefacts a user installs, from a clean commit, with checksums.

Checks first, each a one-line stop with its fix, before anything is built:

- ``VERSION`` is ``x.y.z`` and every place that names the version says it (``VERSION_PLACES``: the two
  distributions, the native crate and its lock, the ``[native]`` extra's pin, the manifests' image
  tags, the User-Agents, the image ``config from-in-tree`` writes);
- ``CHANGELOG.md`` has an entry ``## [x.y.z]`` with something under it;
- the lock agrees with ``pyproject.toml`` (tests/support/lock.py);
- the git tree has no uncommitted change to a tracked file (the image's revision label and every
  ``--version`` name the commit: a dirty tree would make them lie).

Then ``make wheels`` and ``make image`` (the image of the commit, tagged
``ca-externalgrpc-server:x.y.z``), and into ``dist/release/x.y.z/``: the two wheels, the image as a
``docker load``/``podman load`` archive, its CycloneDX bill of materials, and ``SHA256SUMS``
(``sha256sum -c SHA256SUMS`` checks them). Prints each file with its size and checksum.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.container import podman, qualified
from tests.support import imagebuild, lock

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
#: every place that names the release's version: (file, pattern whose first group is the version)
VERSION_PLACES: tuple[tuple[str, str], ...] = (
    ("pyproject.toml", r'(?m)^version = "([^"]+)"'),
    ("pyproject.toml", r'native = \["ca-externalgrpc-native==([^"]+)"\]'),
    ("native/pyproject.toml", r'(?m)^version = "([^"]+)"'),
    ("native/Cargo.toml", r'(?m)^version = "([^"]+)"'),
    ("native/Cargo.lock", r'name = "ca-externalgrpc-native"\nversion = "([^"]+)"'),
    ("server/from_in_tree.py", r'SIDECAR_IMAGE = "ca-externalgrpc-server:([^"]+)"'),
    ("providers/scaleway/client.py", r'PROJECT_USER_AGENT = "ca-externalgrpc-server/([^"]+)"'),
    ("deploy/kubernetes/components/images/kustomization.yaml", r"name: ca-externalgrpc-server\n.*\n\s+newTag: (\S+)"),
    ("deploy/helm/values-sidecar.yaml", r"image: ca-externalgrpc-server:(\S+)"),
)
#: the Bizfly client's User-Agent names the major and minor version only
MINOR_PLACES: tuple[tuple[str, str], ...] = (
    ("providers/bizfly/client.py", r'USER_AGENT = "ca-externalgrpc-server/([^ "]+) \(bizfly\)"'),
)


class ReleaseError(RuntimeError):
    """The one line to show."""


def log(message: str) -> None:
    print(f"make release: {message}", flush=True)


def version_mismatches(version: str, root: Path = REPO) -> list[str]:
    """``file: says X`` for every place that does not name ``version``."""
    minor = ".".join(version.split(".")[:2])
    found = []
    for places, expected in ((VERSION_PLACES, version), (MINOR_PLACES, minor)):
        for path, pattern in places:
            match = re.search(pattern, (root / path).read_text())
            said = match.group(1) if match else "nothing"
            if said != expected:
                found.append(f"{path} says {said}")
    return found


def changelog_entry(version: str, text: str) -> str:
    """The text under ``## [version]`` up to the next entry, or "" when there is none."""
    heading = re.search(rf"(?m)^## \[{re.escape(version)}\][^\n]*\n", text)
    if heading is None:
        return ""
    rest = text[heading.end() :]
    following = re.search(r"(?m)^## ", rest)
    return rest[: following.start() if following else len(rest)].strip()


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.rstrip()  # porcelain lines start with a space


def check(version: str) -> None:
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ReleaseError(f"VERSION={version or '(none)'} is not x.y.z: make release VERSION=0.2.0")
    if mismatches := version_mismatches(version):
        raise ReleaseError(
            f"not every place names {version} ({'; '.join(mismatches)}): set it there (VERSION_PLACES in "
            "tests/support/release.py lists them), run make lock, add a CHANGELOG.md entry and commit"
        )
    if not CHANGELOG.is_file() or not changelog_entry(version, CHANGELOG.read_text()):
        raise ReleaseError(f"CHANGELOG.md has no entry for {version}: add '## [{version}] - <date>' with what changed")
    try:
        lock.check(REPO, who="make release")
    except lock.LockError as err:
        raise ReleaseError(str(err).removeprefix("make release: ")) from None
    if changed := git("status", "--porcelain", "--untracked-files=no"):
        files = ", ".join(line[3:] for line in changed.splitlines()[:5])
        raise ReleaseError(f"uncommitted changes ({files}): commit them, so the release names its commit")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make(*targets: str, **variables: str) -> None:
    argv = ["make", "--no-print-directory", "-C", str(REPO), *targets, *(f"{k}={v}" for k, v in variables.items())]
    if subprocess.run(argv, check=False).returncode != 0:
        raise ReleaseError(f"make {' '.join(targets)} failed (its output is above)")


def save_image(image: str, target: Path) -> None:
    """``podman save`` as a docker-archive, which ``docker load -i`` and ``podman load -i`` both read (podman
    4.3 reads no compressed archive, so it stays a plain tar)."""
    podman("save", "--format", "docker-archive", "--output", str(target), image, timeout=900)


def release(version: str, image: str, bases: str) -> Path:
    started = time.monotonic()
    check(version)
    commit = git("rev-parse", "HEAD")
    log(f"{version} from commit {commit}: checks passed (versions, CHANGELOG.md, lock, clean tree)")
    out = REPO / "dist" / "release" / version
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    make("wheels")
    for wheel in sorted((REPO / "dist").glob(f"ca_externalgrpc_*-{version}-*.whl")):
        shutil.copy2(wheel, out / wheel.name)
    if len(list(out.glob("*.whl"))) != 2:
        raise ReleaseError(f"expected the server's and the native engine's {version} wheels in dist/")
    sbom = out / f"ca-externalgrpc-server-{version}.cdx.json"
    code = imagebuild.main(["--image", image, "--bases", bases, "--sbom-out", str(sbom)])
    if code != 0:
        raise ReleaseError("make image failed (its output is above)")
    archive = out / f"ca-externalgrpc-server-{version}-image.tar"
    log(f"saving {qualified(image)} as {archive.relative_to(REPO)}")
    save_image(qualified(image), archive)
    sums = "".join(f"{sha256(f)}  {f.name}\n" for f in sorted(out.iterdir()) if f.name != "SHA256SUMS")
    (out / "SHA256SUMS").write_text(sums)
    log(f"done in {time.monotonic() - started:.0f} s: {out.relative_to(REPO)}/")
    for path in sorted(out.iterdir()):
        digest = sha256(path)[:16] + "…" if path.name != "SHA256SUMS" else "(the checksums; sha256sum -c SHA256SUMS)"
        print(f"  {path.name:<64} {path.stat().st_size / 1e6:>8.1f} MB  {digest}")
    print(f"  image {qualified(image)} (revision {commit}); CHANGELOG.md entry for {version} present")
    print(f"  then: git tag -a v{version} -m 'ca-externalgrpc-server {version}' {commit[:12]} && git push --tags")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", default="", help="the release's version, x.y.z (make release VERSION=...)")
    parser.add_argument("--image", help="the image's name (default: ca-externalgrpc-server:VERSION)")
    parser.add_argument("--bases", choices=("debian", "public"), default="debian", help="as make image's")
    parser.add_argument("--check-only", action="store_true", help="the checks alone")
    args = parser.parse_args(argv)
    try:
        if args.check_only:
            check(args.version)
        else:
            release(args.version, args.image or f"ca-externalgrpc-server:{args.version}", args.bases)
    except ReleaseError as err:
        print(f"make release: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
