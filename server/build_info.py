"""What this installation is: ``ca-externalgrpc --version``.

The version of the distribution; the commit it was built from; the serving engine ``serving.engine:
auto`` serves with; the versions of grpcio, protobuf (and its backend) and the native engine.

Where the commit comes from, in this order:

- a git checkout (``make install``'s editable install): git's ``HEAD`` now, marked ``-dirty`` when
  tracked files differ from it;
- a wheel or the image: ``server/_build.json``, which the build wrote (``setup.py``: from git, or from
  ``CA_EXTERNALGRPC_COMMIT`` where the build has no git, as in the image's builder);
- otherwise ``unknown``, said as such.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from importlib import metadata, resources
from pathlib import Path

DISTRIBUTION = "ca-externalgrpc-server"
NATIVE_DISTRIBUTION = "ca-externalgrpc-native"
#: the file setup.py writes into the built package (the name is repeated there; a test compares them)
BUILD_FILE = "_build.json"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run make install)"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def checkout_commit() -> str | None:
    """HEAD of the git checkout the package is imported from, ``-dirty`` with changes; None elsewhere."""
    if not (PACKAGE_ROOT / ".git").exists():
        return None
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if changed else head


def baked_commit() -> str | None:
    """The commit the build wrote into the package, or None when it wrote none."""
    try:
        text = (resources.files("server") / BUILD_FILE).read_text()
    except (OSError, ValueError):
        return None
    try:
        commit = json.loads(text).get("commit")
    except (ValueError, AttributeError):
        return None
    return str(commit) if commit else None


def commit() -> str:
    """The commit and where it was read: ``<sha> (git checkout)``, ``<sha> (recorded at build)``, or
    ``unknown (...)``."""
    if found := checkout_commit():
        return f"{found} (git checkout)"
    baked = baked_commit()
    if baked and baked != "unknown":
        return f"{baked} (recorded at build)"
    if baked == "unknown":
        return "unknown (the build had neither git nor CA_EXTERNALGRPC_COMMIT)"
    return "unknown (no git checkout, and the build recorded none)"


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def engine() -> str:
    """What ``serving.engine: auto`` serves with here (the check of server.app.choose_engine, silent)."""
    try:
        importlib.import_module("ca_externalgrpc_native")
    except ImportError as err:
        return f"grpcio (serving.engine: auto; the native engine does not load: {err})"
    return "native (serving.engine: auto)"


def protobuf_backend() -> str:
    try:
        from google.protobuf.internal import api_implementation
    except ImportError:
        return "?"
    return str(api_implementation.Type())


def report(prog: str = "ca-externalgrpc") -> str:
    """The text of ``--version``: the first line is ``<prog> <version>``, as it always was."""
    libraries = ", ".join(
        [
            f"grpcio {_distribution_version('grpcio')}",
            f"protobuf {_distribution_version('protobuf')} ({protobuf_backend()})",
            f"{NATIVE_DISTRIBUTION} {_distribution_version(NATIVE_DISTRIBUTION)}",
        ]
    )
    return "\n".join([f"{prog} {version()}", f"commit: {commit()}", f"engine: {engine()}", f"libraries: {libraries}"])
