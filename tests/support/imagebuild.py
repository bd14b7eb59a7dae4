"""The image build step, ``make image``: ``python -m tests.support.imagebuild [--bases debian|public]``.

Builds ``deploy/Dockerfile`` with podman and prints the image's name, size, the versions inside and
what takes the space. Two sets of base images, one Dockerfile:

- ``--bases debian`` (the default): no image registry is needed. The Python base is made from Debian's
  packages with mmdebstrap (Debian bookworm, python3 and python3-venv, the CA certificates) and
  imported with ``podman import``; the runtime base is the part of that same root the server runs on
  (python3 and the libraries it loads, the trust store, /etc; no shell tools, dpkg or pip), cut from
  the same tarball so the interpreter is the builder's. Debian bookworm's rustc is too old for the
  native engine, so its wheel is the one ``make wheels`` built on this machine with the cargo on
  PATH (``make image`` depends on it), handed to the build through the context: the host must be
  Debian bookworm or older (glibc <= 2.36), which pip in the builder checks against the wheel's tag.
- ``--bases public``: the Dockerfile's defaults, python:3.11-slim-bookworm and the Rust stage on
  rust:1.95-slim-bookworm, pulled from Docker Hub.

Before anything is built, the lock is checked against pyproject.toml (tests/support/lock.py): a lock
behind it stops ``make image`` with one line saying to run ``make lock``. The image is labelled with
the version, the commit (``-dirty`` with uncommitted changes) and the published source address
(org.opencontainers.image.*), carries a CycloneDX bill of materials of its Python, Rust and Debian
packages (deploy/sbom.py; copied to ``dist/image.cdx.json``), and its server's ``--version`` names the
commit. The runtime base keeps dpkg's status of the packages it keeps, for that bill and for scanners.

The bases' tarballs are cached in ``$IMAGE_CACHE_DIR`` (default ``~/.cache/ca-externalgrpc-image``),
keyed by what they hold; ``--refresh-bases`` makes them anew (Debian's latest packages). podman's
layer cache does the rest, so a build with nothing changed takes seconds. The image is labelled with
the digest of its sources (devstack/container.py), which the container tests compare.

A missing podman, runc or mmdebstrap stops it with one line naming the Debian package; a failed
stage of the Dockerfile is named (its output is above it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from deploy.sbom import summary as sbom_summary
from devstack.container import (
    DOCKERFILE,
    SOURCE_LABEL,
    PodmanError,
    default_image,
    podman,
    podman_env,
    qualified,
    source_digest,
)
from tests.support import lock

REPO = Path(__file__).resolve().parents[2]
#: where the image carries its bill of materials (deploy/Dockerfile)
SBOM_IN_IMAGE = "/opt/ca-externalgrpc/sbom.cdx.json"
OCI = "org.opencontainers.image."
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "ca-externalgrpc-image"
DIST = REPO / "dist"
NATIVE_WHEEL_GLOB = "ca_externalgrpc_native-*.whl"

#: this machine's trust store (Debian's place), which the builder's base takes over
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: the commands make image runs, and the Debian package each comes in
PREREQUISITES = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}

SUITE = "bookworm"
#: the Debian root of the builder: python3 with venv (ensurepip) for the build, the CA certificates for
#: HTTPS to PyPI and to the clouds, and the C++ runtime grpcio's and protobuf's extensions link.
#: "essential" is the smallest variant dpkg can configure (no apt).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "netbase", "libstdc++6")
MMDEBSTRAP_OPTIONS = (
    "--variant=essential",
    # /usr merged without the usrmerge package (which would pull in perl).
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    # Documentation (licences kept), manuals, translations; and glibc's character-set converters
    # (iconv modules): Python's codecs are its own.
    *(f"--dpkgopt=path-exclude=/usr/share/{part}/*" for part in ("doc", "man", "info", "locale", "lintian", "linda")),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/lib/*/gconv/*",
)
#: the runtime base keeps these packages with everything they depend on ...
RUNTIME_PACKAGES = ("python3", "dash", "libstdc++6", "openssl", "base-files", "netbase")
#: ... and the files of these without their dependencies (ca-certificates needs debconf and perl only
#: to configure itself: the trust store it generated is in /etc/ssl)
RUNTIME_FILES_ONLY = ("ca-certificates",)
#: kept whole (configuration and generated files: passwd, the trust store, ld.so.cache, mime types)
RUNTIME_WHOLE_TREES = ("etc",)
#: the interpreter's library, whose byte-code py3compile generated at install (in no package's list)
PYTHON_LIBRARY = re.compile(r"^usr/lib/python3(\.\d+)?/")
#: where dpkg keeps its status: the runtime base gets one of the packages it keeps (scanners and the
#: image's bill of materials read it there), though it has no dpkg to use it
DPKG_STATUS = "var/lib/dpkg/status"
#: version of the rules above, part of the cache key
RUNTIME_CUT_VERSION = "2"


class ImageBuildError(RuntimeError):
    """A step failed; the message is the one line to show."""


def log(message: str) -> None:
    print(f"make image: {message}", flush=True)


# ---------------------------------------------------------------------------------------------- checks
def check_prerequisites(commands: Sequence[str]) -> None:
    for command in commands:
        if shutil.which(command) is None:
            package = PREREQUISITES[command]
            raise ImageBuildError(
                f"{command} is not installed: apt-get install -y {package} (Debian package {package})"
            )


def native_wheel() -> Path:
    wheels = sorted(DIST.glob(NATIVE_WHEEL_GLOB))
    if not wheels:
        raise ImageBuildError(f"no native engine wheel in {DIST}: run make wheels")
    if len(wheels) > 1:
        raise ImageBuildError(f"several native engine wheels in {DIST} ({[w.name for w in wheels]}): run make wheels")
    return wheels[0]


# ---------------------------------------------------------------------------------------------- bases
def base_key(mirrors: Sequence[str]) -> str:
    spec = json.dumps([SUITE, BASE_PACKAGES, MMDEBSTRAP_OPTIONS, list(mirrors)])
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def runtime_key(base: str) -> str:
    spec = json.dumps([base, RUNTIME_PACKAGES, RUNTIME_FILES_ONLY, RUNTIME_WHOLE_TREES, RUNTIME_CUT_VERSION])
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One builder of the bases at a time (another make image waits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def make_base_tarball(target: Path, mirrors: Sequence[str]) -> None:
    log(f"making the Debian {SUITE} base with mmdebstrap ({', '.join(BASE_PACKAGES)}); progress below")
    partial = target.with_suffix(".partial")
    argv = [
        "mmdebstrap",
        "--format=tar",
        *MMDEBSTRAP_OPTIONS,
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(partial),
        *mirrors,
    ]
    started = time.monotonic()
    if subprocess.run(argv, check=False).returncode != 0:
        partial.unlink(missing_ok=True)
        raise ImageBuildError(f"mmdebstrap could not make the {SUITE} base (its output is above)")
    partial.replace(target)
    log(f"base made in {time.monotonic() - started:.0f} s: {target} ({target.stat().st_size / 1e6:.0f} MB)")


def installed_packages(root: tarfile.TarFile) -> dict[str, dict[str, str]]:
    """dpkg's status of the root: package name -> fields (multi-line fields joined)."""
    status = root.extractfile("./var/lib/dpkg/status")
    assert status is not None
    packages: dict[str, dict[str, str]] = {}
    for paragraph in status.read().decode().split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in paragraph.splitlines():
            if line.startswith((" ", "\t")) and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, _, value = line.partition(":")
                fields[last] = value.strip()
        if fields.get("Package") and "installed" in fields.get("Status", ""):
            packages[fields["Package"]] = fields
    return packages


def dependency_closure(packages: dict[str, dict[str, str]], roots: Sequence[str]) -> set[str]:
    """``roots`` and every installed package they depend on (Depends and Pre-Depends; of alternatives,
    the installed one, a virtual package by its installed provider)."""
    provides: dict[str, str] = {}
    for name, fields in packages.items():
        for entry in fields.get("Provides", "").split(","):
            if entry.strip():
                provides.setdefault(entry.split()[0].split(":")[0], name)
    wanted, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        if name not in packages:
            raise ImageBuildError(f"the runtime base needs {name}, which the {SUITE} base does not have")
        wanted.add(name)
        relations = ", ".join(v for k in ("Depends", "Pre-Depends") if (v := packages[name].get(k)))
        for relation in filter(None, (r.strip() for r in relations.split(","))):
            for alternative in relation.split("|"):
                candidate = alternative.split()[0].split(":")[0]
                installed = candidate if candidate in packages else provides.get(candidate)
                if installed:
                    todo.append(installed)
                    break
    return wanted


def kept_status(status: str, kept: set[str]) -> str:
    """dpkg's status with only the paragraphs of the ``kept`` packages, as dpkg wrote them."""
    paragraphs = [p for p in status.split("\n\n") if p.strip()]
    named = {re.search(r"^Package: (\S+)$", p, re.MULTILINE): p for p in paragraphs}
    return "".join(p.strip("\n") + "\n\n" for match, p in named.items() if match and match.group(1) in kept)


def cut_runtime(base: Path, target: Path) -> None:
    """The runtime base: the files of ``RUNTIME_PACKAGES`` with their dependencies and of
    ``RUNTIME_FILES_ONLY``, ``RUNTIME_WHOLE_TREES``, the interpreter's byte-code, and the top-level
    directories and /usr links, each with the ownership and mode the installed root has."""
    with tarfile.open(base) as root:
        ordered = root.getmembers()  # a hard link must follow its target: keep the tarball's order
        members = {m.name.removeprefix("./").rstrip("/"): m for m in ordered}
        packages = installed_packages(root)
        # merged /usr: dpkg lists /bin/dash, the root holds usr/bin/dash under the link bin -> usr/bin
        links = {name: m.linkname.strip("/") for name, m in members.items() if "/" not in name and m.issym()}

        def canonical(path: str) -> str:
            first, _, rest = path.strip("/").partition("/")
            return f"{links[first]}/{rest}" if first in links and rest else path.strip("/")

        keep: set[str] = {name for name in members if "/" not in name}  # /bin, /tmp, /proc, ...
        kept_packages = dependency_closure(packages, RUNTIME_PACKAGES) | set(RUNTIME_FILES_ONLY)
        for name in sorted(kept_packages):
            arch = packages[name].get("Architecture", "all")
            lists = (f"var/lib/dpkg/info/{name}:{arch}.list", f"var/lib/dpkg/info/{name}.list")
            listing = next((members[f] for f in lists if f in members), None)
            if listing is None:
                raise ImageBuildError(f"no file list of {name} in the {SUITE} base")
            handle = root.extractfile(listing)
            assert handle is not None
            keep.update(canonical(line) for line in handle.read().decode().splitlines() if line.strip("/."))
        kept_sources = {n for n in keep if n.endswith(".py")}
        for name in members:
            path = PurePosixPath(name)
            if name.split("/", 1)[0] in RUNTIME_WHOLE_TREES:
                keep.add(name)
            elif PYTHON_LIBRARY.match(name) and path.parent.name == "__pycache__":
                source = path.parent.parent / (path.name.split(".", 1)[0] + ".py")
                if str(source) in kept_sources:
                    keep.add(name)
        # The target of a kept hard link, and every directory above a kept file (its owner and mode).
        keep.update(members[n].linkname.removeprefix("./") for n in list(keep) if n in members and members[n].islnk())
        keep.update(str(parent) for parent in PurePosixPath(DPKG_STATUS).parents)
        keep.update(str(parent) for name in list(keep) for parent in PurePosixPath(name).parents)
        status_member = members[DPKG_STATUS]
        status_file = root.extractfile(status_member)
        assert status_file is not None
        status = kept_status(status_file.read().decode(), kept_packages).encode()
        partial = target.with_suffix(".partial")
        with tarfile.open(partial, "w") as out:
            for member in ordered:
                name = member.name.removeprefix("./").rstrip("/")
                if name == DPKG_STATUS:
                    continue
                if name in keep:
                    out.addfile(member, root.extractfile(member) if member.isfile() else None)
            status_member.size = len(status)
            out.addfile(status_member, io.BytesIO(status))
        partial.replace(target)
    log(f"runtime base cut from it: {target} ({target.stat().st_size / 1e6:.0f} MB)")


def import_image(tarball: Path, image: str) -> None:
    if podman("image", "exists", image, check=False).returncode == 0:
        return
    log(f"importing {tarball.name} as {image}")
    podman("import", str(tarball), image, timeout=600)


def trusting_the_host(base_image: str, bundle: Path) -> str:
    """``base_image`` with this machine's CA bundle as its trust store, for the builder only: pip in the
    builder then reaches PyPI wherever this machine does, a TLS-intercepting proxy included. The
    runtime base keeps Debian's own trust store."""
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()[:12]
    image = f"{base_image}-host-ca-{digest}"
    if podman("image", "exists", image, check=False).returncode != 0:
        log(f"the builder's base trusts {bundle} (this machine's CA bundle): {image}")
        with tempfile.TemporaryDirectory(prefix="ca-externalgrpc-base-") as context:
            shutil.copyfile(bundle, Path(context) / "ca-certificates.crt")
            (Path(context) / "Containerfile").write_text(
                f"FROM {base_image}\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
            )
            podman("build", "--quiet", "--tag", image, context, timeout=600)
    return image


def debian_bases(cache_dir: Path, mirrors: Sequence[str], refresh: bool) -> tuple[str, str]:
    """The builder's and the runtime's base images, made (or reused) from Debian packages."""
    key = base_key(mirrors)
    rkey = runtime_key(key)
    base_tar = cache_dir / f"debian-{SUITE}-python3-{key}.tar"
    runtime_tar = cache_dir / f"debian-{SUITE}-python3-runtime-{rkey}.tar"
    base_image = f"localhost/ca-externalgrpc-base:{SUITE}-python3-{key}"
    runtime_image = f"localhost/ca-externalgrpc-base:{SUITE}-python3-runtime-{rkey}"
    with locked(cache_dir / "bases.lock"):
        if refresh:
            for tar in (base_tar, runtime_tar):
                tar.unlink(missing_ok=True)
            for image in (base_image, runtime_image):
                podman("rmi", "--force", image, check=False)
        if not base_tar.exists():
            make_base_tarball(base_tar, mirrors)
            podman("rmi", "--force", base_image, runtime_image, check=False)
        if not runtime_tar.exists():
            cut_runtime(base_tar, runtime_tar)
            podman("rmi", "--force", runtime_image, check=False)
        import_image(base_tar, base_image)
        import_image(runtime_tar, runtime_image)
        if HOST_CA_BUNDLE.is_file():
            base_image = trusting_the_host(base_image, HOST_CA_BUNDLE)
    return base_image, runtime_image


# ---------------------------------------------------------------------------------------------- build
#: a podman build progress line that starts a stage: "[2/5] STEP 1/9: FROM image AS builder"
STAGE_START = re.compile(r"^\[(\d+)/\d+\] STEP 1/\d+: FROM \S+(?: AS (\S+))?", re.IGNORECASE)
STEP_LINE = re.compile(r"^\[(\d+)/\d+\] STEP ")


class StageTracker:
    """Which stage of the Dockerfile podman build is in, from its progress lines."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.current = ""

    def feed(self, line: str) -> None:
        if started := STAGE_START.match(line):
            self.names[started.group(1)] = started.group(2) or f"#{started.group(1)}"
        if step := STEP_LINE.match(line):
            self.current = step.group(1)

    @property
    def stage(self) -> str:
        return self.names.get(self.current, "?")


def git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def source_revision() -> str:
    """The commit the image is built from, ``-dirty`` when tracked files differ from it; or unknown."""
    head = git("rev-parse", "HEAD")
    if head is None:
        return "unknown"
    return f"{head}-dirty" if git("status", "--porcelain", "--untracked-files=no") else head


def source_url() -> str:
    """Where the sources are published: the git remote ``origin`` when it is a network address (a local
    clone's path means nothing to whoever runs the image), else unknown."""
    url = git("remote", "get-url", "origin") or ""
    return url if re.match(r"^(https?|ssh|git)://|^[\w.-]+@[\w.-]+:", url) else "unknown"


def project_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def provenance() -> dict[str, str]:
    """The build arguments that label the image and record the commit (deploy/Dockerfile)."""
    return {
        "VERSION": project_version(),
        "REVISION": source_revision(),
        "SOURCE": source_url(),
        "BUILD_EPOCH": git("log", "-1", "--format=%ct") or "",
    }


def build(image: str, build_args: dict[str, str], no_cache: bool = False) -> None:
    argv = ["podman", "build", "--file", str(DOCKERFILE), "--tag", image, "--layers"]
    if no_cache:
        argv.append("--no-cache")
    argv += [f"--build-arg={k}={v}" for k, v in build_args.items()]
    argv += [f"--label={SOURCE_LABEL}={source_digest()}", str(REPO)]
    log(f"podman build of {DOCKERFILE.relative_to(REPO)} into {image}; progress below")
    stages = StageTracker()
    with subprocess.Popen(
        argv, env=podman_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            stages.feed(line)
        code = proc.wait()
    if code != 0:
        raise ImageBuildError(
            f"the Dockerfile's stage {stages.stage!r} failed (podman build exited with {code}; output above)"
        )


#: run in the image: the versions, the engine `serving.engine: auto` picks, and where the bytes are
REPORT_SCRIPT = r"""
import json, os, sys
from importlib import metadata
from server.app import choose_engine

def size(top):
    total = 0
    for base, dirs, files in os.walk(top):
        total += sum(os.lstat(os.path.join(base, f)).st_size for f in files)
    return total

site = next(p for p in sys.path if p.endswith("site-packages"))
folders = [n for n in os.listdir(site) if os.path.isdir(os.path.join(site, n))]
packages = sorted(((size(os.path.join(site, n)), n) for n in folders), reverse=True)
print(json.dumps({
    "python": sys.version.split()[0],
    "server": metadata.version("ca-externalgrpc-server"),
    "native": metadata.version("ca-externalgrpc-native"),
    "engine": choose_engine("auto"),
    "usr": size("/usr"), "venv": size("/opt/ca-externalgrpc"), "etc": size("/etc"),
    "largest": packages[:6],
}))
"""


def image_sbom(image: str) -> str:
    """The bill of materials the image carries (deploy/Dockerfile's sbom stage)."""
    printed = podman(
        "run", "--rm", "--pull=never", "--entrypoint=/opt/ca-externalgrpc/bin/python", image,
        "-c", f"import sys; sys.stdout.write(open({SBOM_IN_IMAGE!r}).read())",
    )  # fmt: skip
    return printed.stdout


def labels(image: str) -> dict[str, str]:
    found = podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout
    return dict(json.loads(found) or {})


def report(image: str, seconds: float, sbom_out: Path | None) -> None:
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())
    found = podman(
        "run", "--rm", "--pull=never", "--entrypoint=/opt/ca-externalgrpc/bin/python", image, "-c", REPORT_SCRIPT
    )
    inside = json.loads(found.stdout)
    version = podman("run", "--rm", "--pull=never", image, "--version").stdout.strip()
    mb = 1e6
    largest = ", ".join(f"{name} {bytes_ / mb:.1f}" for bytes_, name in inside["largest"])
    engine = inside["engine"]
    oci = {k.removeprefix(OCI): v for k, v in labels(image).items() if k.startswith(OCI)}
    sbom = image_sbom(image)
    if sbom_out is not None:
        sbom_out.parent.mkdir(parents=True, exist_ok=True)
        sbom_out.write_text(sbom)
    counts = sbom_summary(json.loads(sbom))
    print(f"image     {image}  ({size / mb:.1f} MB, make image took {seconds:.0f} s)")
    print(f"labels    version {oci.get('version')}, revision {oci.get('revision')}, source {oci.get('source')}")
    print(
        f"versions  Python {inside['python']}, ca-externalgrpc-server {inside['server']}, "
        f"ca-externalgrpc-native {inside['native']}; serving.engine auto serves with: {engine}"
    )
    print("--version " + "\n          ".join(version.splitlines()))
    where = (
        f"; a copy in {sbom_out.relative_to(REPO) if sbom_out.is_relative_to(REPO) else sbom_out}" if sbom_out else ""
    )
    print(f"SBOM      {SBOM_IN_IMAGE} (CycloneDX): {counts}{where}")
    print(
        f"space MB  /usr {inside['usr'] / mb:.1f} (Python and the libraries it loads), /opt/ca-externalgrpc "
        f"{inside['venv'] / mb:.1f} (the server's virtualenv; largest: {largest}), /etc {inside['etc'] / mb:.1f}"
    )
    if inside["engine"] != "native":
        raise ImageBuildError(f"the image would serve with {inside['engine']}, not the native engine")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--image", default=default_image(), help="name:tag of the image")
    parser.add_argument(
        "--bases", choices=("debian", "public"), default="debian", help="where the base images come from"
    )
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        help="a Debian mirror for mmdebstrap, repeatable (default: deb.debian.org with updates and security)",
    )
    parser.add_argument("--refresh-bases", action="store_true", help="make the Debian bases anew")
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("IMAGE_CACHE_DIR") or DEFAULT_CACHE_DIR))
    parser.add_argument("--no-cache", action="store_true", help="build every layer anew (podman build --no-cache)")
    parser.add_argument(
        "--sbom-out", type=Path, default=DIST / "image.cdx.json", help="where to copy the image's bill of materials"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    image = qualified(args.image)
    try:
        try:
            lock.check(REPO, who="make image")
        except lock.LockError as err:
            raise ImageBuildError(str(err).removeprefix("make image: ")) from None
        if args.bases == "debian":
            check_prerequisites(("podman", "runc", "mmdebstrap"))
            wheel = native_wheel()
            base, runtime = debian_bases(args.cache_dir, args.mirror, args.refresh_bases)
            log(f"native engine: {wheel.relative_to(REPO)} (make wheels)")
            build_args = {"PYTHON_IMAGE": base, "RUNTIME_IMAGE": runtime, "NATIVE_WHEEL": "context"}
        else:
            check_prerequisites(("podman", "runc"))
            build_args = {}
        build(image, {**build_args, **provenance()}, no_cache=args.no_cache)
        report(image, time.monotonic() - started, args.sbom_out)
    except ImageBuildError as err:
        print(f"make image: {err}", file=sys.stderr)
        return 1
    except PodmanError as err:
        print(f"make image: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
