"""The one build step for every Go program the suites run: ``python -m tests.support.gobuild [--group NAME ...]``.

``make build`` calls it, and ``make test``, ``make conformance``, ``make e2e`` and ``make bench`` depend
on ``make build``. Tests never compile anything: they ask :func:`binary_path` for a binary and get an
error telling them to run ``make build`` when it is missing or out of date.

Which binaries exist is declared next to the code. Every Go module directory under ``tests/`` or
``deploy/`` that produces programs has a ``build.toml`` beside its ``go.mod``::

    [[binary]]
    name = "ca-client-1.36.1"    # file name under the bin dir, unique across the repository
    package = "."                # or a full import path, e.g. "k8s.io/autoscaler/cluster-autoscaler"
    tags = ["externalgrpc"]      # optional build tags
    groups = ["conformance"]     # the suites that need it: conformance, e2e, bench, deploy, ...
    ldflags = ["-X k8s.io/component-base/version.gitVersion=v1.36.2"]   # optional linker flags
    default = false              # optional: left out of a build that names no group (see below)

A build that names no group (``make build``, and so ``make test`` and ``.ci/run``) builds every binary
except those declared ``default = false``: long builds only their own suite needs (the older CA
releases of ``make e2e-ca-matrix``), built when a group or name asks for them
(``make build GO_BUILD_GROUPS=ca-matrix``).

Binaries go to ``$GO_CACHE_DIR/bin`` (default ``~/.cache/ca-externalgrpc-go/bin``); Go's own build and
module caches stay where ``go env`` says. A binary is rebuilt only when its stamp changes: a hash of
every file of its module directory (go.mod and go.sum included) and of the directories its go.mod
replaces locally, its package, tags and linker flags, and ``go version``.

The cluster-autoscaler modules from 1.35 on are not on the public Go module proxy. ``CA_MODULE_PROXY``
names a Go module proxy directory that serves them (default: ``shared/goproxy`` beside the repository
root); it is put first in ``GOPROXY`` for every module whose go.mod mentions one of them, and those
module paths are exempted from the checksum database (the committed go.sum files pin their hashes).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import platform
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Only these trees are searched for build.toml files (keeps discovery fast and predictable).
SEARCH_ROOTS = ("tests", "deploy")
MANIFEST = "build.toml"
DEFAULT_GO_CACHE_DIR = Path.home() / ".cache" / "ca-externalgrpc-go"
DEFAULT_MODULE_PROXY = REPO.parent / "shared" / "goproxy"
# Modules served only by the CA_MODULE_PROXY directory (at the versions this repository pins).
PROXY_MODULES = ("k8s.io/autoscaler/cluster-autoscaler", "sigs.k8s.io/cluster-autoscaler")
# The checksum database has no record of those versions (nor of the nested apis module).
NOSUMDB_PATTERNS = ("k8s.io/autoscaler", "sigs.k8s.io/cluster-autoscaler")
PROGRESS_INTERVAL_SECONDS = 15.0
ERROR_TAIL_LINES = 40
# Where the official tarball and Debian put go when it is installed but not on PATH.
GO_FALLBACK_PATHS = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
# The release the go.mod files of this repository are tested with (the newest `go` directive is 1.26).
GO_INSTALL_VERSION = "1.26.8"
# Directories inside a module that are never part of its sources.
SKIPPED_DIRS = {"__pycache__", "node_modules", "testdata"}


class GoBuildError(Exception):
    """One line saying what is missing or failed and the command that fixes it; ``details`` holds go's output."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class GoToolchainMissing(GoBuildError):
    pass


class ModuleProxyMissing(GoBuildError):
    pass


class BuildManifestError(GoBuildError):
    """A build.toml that cannot be used as written."""


class BinaryNotBuilt(GoBuildError):
    """A test asked for a binary that ``make build`` has not produced (or that is out of date)."""


@dataclass(frozen=True)
class Binary:
    name: str
    module_dir: Path
    package: str
    tags: tuple[str, ...]
    groups: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    default: bool = True  # built by a build that names no group

    @property
    def manifest(self) -> Path:
        return self.module_dir / MANIFEST

    @property
    def where(self) -> str:
        return _relative(self.module_dir)


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------ discovery
def discover(repo: Path | None = None) -> list[Binary]:
    """Every binary declared by a build.toml under the search roots, in a stable order."""
    repo = repo or REPO
    binaries: list[Binary] = []
    for root in SEARCH_ROOTS:
        if (repo / root).is_dir():
            for manifest in sorted((repo / root).glob(f"**/{MANIFEST}")):
                binaries.extend(_read_manifest(manifest))
    seen: dict[str, Binary] = {}
    for binary in binaries:
        if binary.name in seen:
            raise BuildManifestError(
                f"binary name {binary.name!r} is declared twice ({_relative(seen[binary.name].manifest)} and "
                f"{_relative(binary.manifest)}); names must be unique"
            )
        seen[binary.name] = binary
    return binaries


def _read_manifest(manifest: Path) -> list[Binary]:
    where = _relative(manifest)
    if not (manifest.parent / "go.mod").is_file():
        raise BuildManifestError(f"{where} has no go.mod beside it; a build.toml sits in a Go module directory")
    try:
        data = tomllib.loads(manifest.read_text())
    except tomllib.TOMLDecodeError as err:
        raise BuildManifestError(f"{where} is not valid TOML: {err}") from err
    entries = data.get("binary")
    if not isinstance(entries, list) or not entries:
        raise BuildManifestError(f"{where} declares no [[binary]] table")
    binaries = []
    for entry in entries:
        unknown = set(entry) - {"name", "package", "tags", "groups", "ldflags", "default"}
        name, package = entry.get("name"), entry.get("package")
        tags, groups, ldflags = entry.get("tags", []), entry.get("groups"), entry.get("ldflags", [])
        default = entry.get("default", True)
        if unknown:
            raise BuildManifestError(f"{where}: unknown key(s) {sorted(unknown)} in a [[binary]] table")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise BuildManifestError(f"{where}: every [[binary]] needs a file name (letters, digits, '.', '_', '-')")
        if not isinstance(package, str) or not package:
            raise BuildManifestError(f"{where}: binary {name!r} needs a package ('.' or an import path)")
        if not _strings(tags):
            raise BuildManifestError(f"{where}: binary {name!r}: tags must be a list of strings")
        if not _strings(groups) or not groups:
            raise BuildManifestError(f'{where}: binary {name!r} needs groups, e.g. groups = ["conformance"]')
        if not _strings(ldflags):
            raise BuildManifestError(f"{where}: binary {name!r}: ldflags must be a list of strings")
        if not isinstance(default, bool):
            raise BuildManifestError(f"{where}: binary {name!r}: default must be true or false")
        binaries.append(Binary(name, manifest.parent, package, tuple(tags), tuple(groups), tuple(ldflags), default))
    return binaries


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


def select(binaries: Sequence[Binary], groups: Sequence[str] = (), names: Sequence[str] = ()) -> list[Binary]:
    """The binaries in any of ``groups`` or named in ``names``; when both are empty, every binary but
    those declared ``default = false``."""
    known_groups = {group for binary in binaries for group in binary.groups}
    known_names = {binary.name for binary in binaries}
    if unknown := sorted(set(groups) - known_groups):
        raise BuildManifestError(f"unknown group(s) {unknown}; the build.toml files declare {sorted(known_groups)}")
    if unknown := sorted(set(names) - known_names):
        raise BuildManifestError(f"unknown binary name(s) {unknown}; the build.toml files name {sorted(known_names)}")
    if not groups and not names:
        return [b for b in binaries if b.default]
    return [b for b in binaries if b.name in names or set(b.groups) & set(groups)]


# ------------------------------------------------------------------------------- environment
def bin_dir() -> Path:
    return Path(os.environ.get("GO_CACHE_DIR") or DEFAULT_GO_CACHE_DIR) / "bin"


def module_proxy_dir() -> Path:
    return Path(os.environ.get("CA_MODULE_PROXY") or DEFAULT_MODULE_PROXY)


def go_install_hint() -> str:
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), platform.machine())
    system = "darwin" if sys.platform == "darwin" else "linux"
    return (
        f"curl -fsSL https://go.dev/dl/go{GO_INSTALL_VERSION}.{system}-{arch}.tar.gz | sudo tar -C /usr/local -xz "
        "&& export PATH=$PATH:/usr/local/go/bin"
    )


def go_binary() -> str:
    found = shutil.which("go") or next((p for p in GO_FALLBACK_PATHS if Path(p).is_file()), None)
    if found is None:
        raise GoToolchainMissing(
            f"the Go toolchain (go >= 1.26) is not installed (no `go` on PATH nor at {', '.join(GO_FALLBACK_PATHS)}); "
            f"install it with: {go_install_hint()}"
        )
    return found


@cache
def go_version(go: str) -> str:
    """``go version`` output, e.g. ``go version go1.26.8 linux/amd64`` (part of every stamp)."""
    proc = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise GoToolchainMissing(
            f"`{go} version` failed ({proc.stderr.strip() or proc.returncode}); reinstall Go with: {go_install_hint()}"
        )
    return proc.stdout.strip()


@cache
def _go_env(go: str) -> dict[str, str]:
    names = ("GOPROXY", "GONOSUMDB", "GOFLAGS")
    proc = subprocess.run([go, "env", *names], capture_output=True, text=True, timeout=60, check=False)
    values = proc.stdout.splitlines() if proc.returncode == 0 else []
    return dict(zip(names, values + [""] * (len(names) - len(values)), strict=True))


def needs_module_proxy(module_dir: Path) -> bool:
    """Does this module depend on a module that only the CA_MODULE_PROXY directory serves?"""
    text = (module_dir / "go.mod").read_text()
    return any(re.search(rf"^\s*(require\s+)?{re.escape(path)}\s+v", text, re.MULTILINE) for path in PROXY_MODULES)


def check_module_proxy() -> Path:
    proxy = module_proxy_dir()
    marker = proxy / PROXY_MODULES[0] / "@v"
    if not marker.is_dir():
        raise ModuleProxyMissing(
            f"CA_MODULE_PROXY={proxy} is not a Go module proxy directory: set CA_MODULE_PROXY to a directory that "
            f"serves {' and '.join(PROXY_MODULES)} at the versions the go.mod files name (<module>/@v/<version>.info, "
            ".mod, .zip; see tests/conformance/README.md)"
        )
    return proxy.resolve()


def build_env(go: str, with_module_proxy: bool) -> dict[str, str]:
    """The process environment for go: GOPROXY and GONOSUMDB extended for the CA modules when needed."""
    env = dict(os.environ)
    current = _go_env(go)
    flags = current["GOFLAGS"].split()
    if not any(flag.startswith("-buildvcs") for flag in flags):
        # The binaries are test tools: no VCS stamping (it also fails in some worktree layouts).
        flags.append("-buildvcs=false")
    env["GOFLAGS"] = " ".join(flags)
    if with_module_proxy:
        proxy_url = check_module_proxy().as_uri()
        upstream = current["GOPROXY"] or "https://proxy.golang.org,direct"
        env["GOPROXY"] = upstream if upstream.startswith(proxy_url) else f"{proxy_url},{upstream}"
        exempt = [item for item in current["GONOSUMDB"].split(",") if item]
        env["GONOSUMDB"] = ",".join(exempt + [p for p in NOSUMDB_PATTERNS if p not in exempt])
    return env


# ------------------------------------------------------------------------------------- stamps
def local_replace_dirs(module_dir: Path) -> list[Path]:
    """Directories this module's go.mod replaces a module with (``=> ../checks``), transitively."""
    found: list[Path] = []
    pending = [module_dir]
    while pending:
        current = pending.pop()
        text = (current / "go.mod").read_text() if (current / "go.mod").is_file() else ""
        for match in re.finditer(r"=>\s*(\.{1,2}/\S*)\s*$", text, re.MULTILINE):
            target = (current / match.group(1)).resolve()
            if target not in found and target != module_dir.resolve():
                found.append(target)
                pending.append(target)
    return found


def module_files(directory: Path) -> Iterator[Path]:
    """Every file of the module rooted at ``directory``, minus nested modules and caches."""
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not (here / d / "go.mod").exists()
        )
        for name in sorted(files):
            if not name.endswith((".pyc", ".swp")):
                yield here / name


def stamp(binary: Binary, version: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"{binary.package}\0{','.join(binary.tags)}\0{version}\0".encode())
    if binary.ldflags:  # (a binary without them keeps the stamp it had before ldflags existed)
        digest.update(f"ldflags\0{' '.join(binary.ldflags)}\0".encode())
    for directory in [binary.module_dir, *local_replace_dirs(binary.module_dir)]:
        for path in module_files(directory):
            digest.update(_relative(path).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _stamp_file(output: Path) -> Path:
    return output.with_name(output.name + ".stamp")


def is_up_to_date(output: Path, current_stamp: str) -> bool:
    stamp_file = _stamp_file(output)
    return output.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == current_stamp


# -------------------------------------------------------------------------------------- build
def _reproduce_command(binary: Binary, output: str = "/dev/null") -> str:
    argv = ["go", "build", "-o", output]
    if binary.tags:
        argv += ["-tags", ",".join(binary.tags)]
    if binary.ldflags:
        argv += ["-ldflags", " ".join(binary.ldflags)]
    argv.append(binary.package)
    return f"cd {binary.where} && {shlex.join(argv)}"


def _failure_hint(binary: Binary, output: str) -> str:
    """The command most likely to fix a failed build, from go's own words."""
    env_prefix = 'eval "$(.venv/bin/python -m tests.support.gobuild --print-env)" && '
    if re.search(r"requires go >= |go: downloading go1\.|toolchain not available", output):
        return f"install a newer Go: {go_install_hint()}"
    if any(module in output for module in PROXY_MODULES) and re.search(r"not found|unknown revision|404", output):
        return (
            f"the module proxy directory CA_MODULE_PROXY={module_proxy_dir()} lacks a version named in "
            f"{binary.where}/go.mod; add it there (Go module zip of the upstream tag) or repin go.mod"
        )
    if re.search(r"missing go\.sum entry|updates to go\.mod needed|no required module provides", output):
        return f"update the module files: {env_prefix}(cd {binary.where} && go mod tidy), then run `make build`"
    if re.search(r"dial tcp|proxyconnect|no such host|i/o timeout|TLS handshake", output):
        return "the Go module proxy could not be reached: check network access and GOPROXY, then run `make build`"
    return f"fix the error below, then run `make build` (to reproduce: {env_prefix}{_reproduce_command(binary)})"


class _Progress:
    """Condenses ``go build -v`` output: compiled packages and downloaded modules, printed periodically."""

    def __init__(self, name: str, say: Callable[[str], None]) -> None:
        self.name = name
        self.say = say
        self.packages = 0
        self.downloads = 0
        self.last_package = ""
        self.tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)

    def feed(self, line: str) -> None:
        line = line.rstrip()
        if not line:
            return
        self.tail.append(line)
        if line.startswith("go: downloading "):
            self.downloads += 1
        elif " " not in line and not line.startswith("#"):
            # `go build -v` names each package as it compiles it (cached ones are not printed).
            self.packages += 1
            self.last_package = line

    def report(self, elapsed: float) -> None:
        what = f"{self.packages} packages compiled"
        if self.downloads:
            what += f", {self.downloads} modules downloaded"
        last = f" (last: {self.last_package})" if self.last_package else ""
        self.say(f"  {self.name}: {what} after {elapsed:.0f}s{last}")


def _stream(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def build(binary: Binary, go: str, output: Path, say: Callable[[str], None] = print) -> float:
    """Compile one binary into ``output`` with periodic progress; raises GoBuildError on failure."""
    env = build_env(go, needs_module_proxy(binary.module_dir))
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    argv = [go, "build", "-v", "-o", str(tmp)]
    if binary.tags:
        argv += ["-tags", ",".join(binary.tags)]
    if binary.ldflags:
        argv += ["-ldflags", " ".join(binary.ldflags)]
    argv.append(binary.package)
    started = time.monotonic()
    progress = _Progress(binary.name, say)
    proc = subprocess.Popen(
        argv, cwd=binary.module_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_stream, args=(proc, lines), daemon=True).start()
    next_report = started + PROGRESS_INTERVAL_SECONDS
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, next_report - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                break
            progress.feed(line)
            if time.monotonic() >= next_report:
                progress.report(time.monotonic() - started)
                next_report += PROGRESS_INTERVAL_SECONDS
        returncode = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        tmp.unlink(missing_ok=True)
        raise
    if returncode != 0:
        tmp.unlink(missing_ok=True)
        output_text = "\n".join(progress.tail)
        raise GoBuildError(
            f"building {binary.name} ({binary.package} in {binary.where}) failed: {_failure_hint(binary, output_text)}",
            details=output_text,
        )
    tmp.replace(output)
    elapsed = time.monotonic() - started
    say(f"built {binary.name} in {elapsed:.1f}s ({progress.packages} packages compiled)")
    return elapsed


@contextlib.contextmanager
def _locked(output: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One builder per binary at a time (two `make` runs sharing the bin dir must not interleave)."""
    with open(output.with_name(f".{output.name}.lock"), "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"  {output.name}: waiting for another build of it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_all(binaries: Sequence[Binary], say: Callable[[str], None] = print) -> None:
    """Bring every binary up to date, one after the other (go parallelises within a build)."""
    go = go_binary()
    version = go_version(go)
    # Without the CA module proxy, build every binary that does not need it (grpcurl, helm, kustomize,
    # the control plane ...), then say which were left out and why.
    left_out: list[Binary] = []
    if any(needs_module_proxy(b.module_dir) for b in binaries):
        try:
            check_module_proxy()
        except ModuleProxyMissing as missing:
            left_out = [b for b in binaries if needs_module_proxy(b.module_dir)]
            binaries = [b for b in binaries if b not in left_out]
            proxy_problem = str(missing)
    out_dir = bin_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for binary in binaries:
        output = out_dir / binary.name
        current = stamp(binary, version)
        if is_up_to_date(output, current):
            say(f"{binary.name}: up to date")
            continue
        with _locked(output, say):
            if is_up_to_date(output, current):  # built by the run we waited for
                say(f"{binary.name}: up to date")
                continue
            tags = f" -tags {','.join(binary.tags)}" if binary.tags else ""
            say(f"building {binary.name}: {binary.package}{tags} in {binary.where}")
            build(binary, go, output, say)
            _stamp_file(output).write_text(current + "\n")
    say(f"go build step: {len(binaries)} binaries ready in {bin_dir()} ({time.monotonic() - started:.1f}s)")
    if left_out:
        names = ", ".join(b.name for b in left_out)
        raise ModuleProxyMissing(
            f"{len(left_out)} binaries need the cluster-autoscaler modules of the CA module proxy and were not built: "
            f"{names}. {proxy_problem}; the {len(binaries)} others are built"
        )


# ------------------------------------------------------------------------------- for the tests
def binary_path(name: str, repo: Path | None = None) -> Path:
    """The built binary ``name``; raises BinaryNotBuilt when it is missing or its sources changed since."""
    binaries = {b.name: b for b in discover(repo)}
    if name not in binaries:
        raise BuildManifestError(f"no build.toml declares a binary named {name!r}; known: {sorted(binaries)}")
    binary = binaries[name]
    output = bin_dir() / name
    groups = " ".join(f"--group {g}" for g in binary.groups)
    how = f"run `make build` (or `python -m tests.support.gobuild {groups}`)"
    if not output.is_file():
        raise BinaryNotBuilt(f"{name} is not built in {output.parent}: {how}")
    if not is_up_to_date(output, stamp(binary, go_version(go_binary()))):
        raise BinaryNotBuilt(f"{name} in {output.parent} is out of date (its sources or Go changed): {how}")
    return output


# ----------------------------------------------------------------------------------------- CLI
def print_env() -> str:
    """Shell ``export`` lines that give a developer's go command the environment the build uses."""
    env = build_env(go_binary(), with_module_proxy=True)
    return "\n".join(f"export {key}={shlex.quote(env[key])}" for key in ("GOPROXY", "GONOSUMDB", "GOFLAGS"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--group", action="append", default=[], help="build only this group (repeatable)")
    parser.add_argument("--name", action="append", default=[], help="build only this binary (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the declared binaries and exit")
    parser.add_argument("--print-env", action="store_true", help="print the GOPROXY/GONOSUMDB/GOFLAGS exports")
    args = parser.parse_args(argv)
    try:
        if args.print_env:
            print(print_env())
            return 0
        declared = discover()
        binaries = select(declared, args.group, args.name)
        if args.list:
            for b in binaries:
                tags = f" -tags {','.join(b.tags)}" if b.tags else ""
                print(f"{b.name:28} {'/'.join(b.groups):14} {b.where}: {b.package}{tags}")
            if not args.group and not args.name and (left := [b for b in declared if not b.default]):
                groups = sorted({g for b in left for g in b.groups})
                print(
                    f"({len(left)} more declared default = false, built only when asked for: "
                    f"--group {' / --group '.join(groups)})"
                )
            return 0
        build_all(binaries)
    except GoBuildError as err:
        print(f"gobuild: {err}", file=sys.stderr)
        if err.details:
            print(err.details, file=sys.stderr)
        return 2 if isinstance(err, GoToolchainMissing | ModuleProxyMissing | BuildManifestError) else 1
    except KeyboardInterrupt:
        print("gobuild: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
