"""The lock of the Python dependencies: ``make lock`` (``--write``) and its check (``--check``).

``pyproject.toml`` keeps ranges, for whoever installs the wheel into an environment of their own.
Everything this repository installs comes from the lock instead, with every file's hash checked:
``uv.lock`` holds one resolution of every set (the runtime dependencies, the ``dev`` extra, the
``build`` group) for every platform and Python ``requires-python`` allows, with the hash of every
wheel and source archive; ``requirements/*.txt`` are its exports in pip's format, for the tools that
install without uv (``make install``, the image's builder, ``tests/install``):

- ``runtime.txt``: what the server runs with (the image's virtualenv);
- ``build.txt``: what builds the wheels and the image's bill of materials (the image's builder);
- ``dev.txt``: the runtime set, the ``dev`` extra and the ``build`` group (``make install``).

``pip install --require-hashes --no-deps -r requirements/<set>.txt`` installs exactly those files.
Neither this project nor its native engine (``native/``, built here) is in the exports: they are
installed after them, with ``--no-deps``.

``--check`` (``make test`` runs it in ``tests/unit/test_lock.py``; ``make install`` and ``make image``
before they install anything from the lock) needs no network: ``uv lock --check --offline`` says
whether ``uv.lock`` still answers ``pyproject.toml``, and each export is compared with what
``uv export --frozen`` makes of ``uv.lock``. A disagreement is one line that says to run ``make lock``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = "uv.lock"
REQUIREMENTS = "requirements"
NATIVE = "ca-externalgrpc-native"
#: each export of uv.lock: the arguments of ``uv export`` that select its set
SETS: dict[str, tuple[str, ...]] = {
    "runtime": ("--no-default-groups", "--no-emit-project", "--no-emit-package", NATIVE),
    "build": ("--only-group", "build", "--no-emit-project"),
    "dev": ("--extra", "dev", "--group", "build", "--no-emit-project", "--no-emit-package", NATIVE),
}
HEADER = (
    "# The {name} set, exported from uv.lock by make lock (tests/support/lock.py): do not edit.\n"
    "# Install with: pip install --require-hashes --no-deps -r requirements/{name}.txt\n"
)
FIX = "run make lock, then commit pyproject.toml, uv.lock and requirements/"


class LockError(RuntimeError):
    """The one line to show."""


def uv_binary() -> str:
    """The uv of this interpreter's environment (make install puts it in .venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise LockError("uv is not installed: run make install (it installs uv from requirements/dev.txt)")
    return found


def uv(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "UV_NO_PROGRESS": "1",
        # The interpreter running this, never one uv would download.
        "UV_PYTHON": sys.executable,
        "UV_PYTHON_DOWNLOADS": "never",
    }
    env.pop("VIRTUAL_ENV", None)  # uv would otherwise warn that it does not match the project's .venv
    return subprocess.run(
        [uv_binary(), *args], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def export(root: Path, name: str) -> str:
    """What ``requirements/<name>.txt`` must hold: uv.lock's export of the set, with its header."""
    done = uv(root, "export", "--frozen", "--format", "requirements-txt", "--no-header", "--quiet", *SETS[name])
    if done.returncode != 0:
        raise LockError(f"uv export of the {name} set failed: {done.stderr.strip()}")
    return HEADER.format(name=name) + done.stdout


def problems(root: Path = REPO) -> list[str]:
    """What disagrees: uv.lock with pyproject.toml, or an export with uv.lock; empty when all agree."""
    if not (root / LOCK).is_file():
        return [f"there is no {LOCK}"]
    found: list[str] = []
    if uv(root, "lock", "--check", "--offline", "--quiet").returncode != 0:
        found.append(f"{LOCK} does not answer pyproject.toml")
    else:
        for name in SETS:
            path = root / REQUIREMENTS / f"{name}.txt"
            if not path.is_file():
                found.append(f"{REQUIREMENTS}/{name}.txt is missing")
            elif path.read_text() != export(root, name):
                found.append(f"{REQUIREMENTS}/{name}.txt is not {LOCK}'s export")
    return found


def check(root: Path = REPO, who: str = "make") -> None:
    found = problems(root)
    if found:
        raise LockError(f"{who}: the lock disagrees with pyproject.toml ({'; '.join(found)}): {FIX}")


def write(root: Path = REPO, upgrade: Sequence[str] = ()) -> None:
    """``uv lock`` (keeps every locked version pyproject.toml still allows, but for ``upgrade``, uv's
    ``--upgrade`` or ``--upgrade-package NAME`` arguments), then the exports."""
    done = uv(root, "lock", *upgrade)
    if done.returncode != 0:
        raise LockError(f"make lock: uv lock failed: {done.stderr.strip()}")
    print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "uv lock: done")
    (root / REQUIREMENTS).mkdir(exist_ok=True)
    for name in SETS:
        path = root / REQUIREMENTS / f"{name}.txt"
        path.write_text(export(root, name))
        count = sum(1 for line in path.read_text().splitlines() if line[:1].isalnum())
        print(f"{path.relative_to(root)}: {count} packages")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="update uv.lock and write requirements/ (make lock)")
    action.add_argument("--check", action="store_true", help="fail when they disagree with pyproject.toml")
    parser.add_argument("--root", type=Path, default=REPO, help="the project's folder")
    parser.add_argument("--who", default="make", help="the command named in the message")
    parser.add_argument("--upgrade", action="store_true", help="with --write: the newest versions the ranges allow")
    parser.add_argument("--upgrade-package", action="append", default=[], metavar="NAME", help="with --write: this one")
    args = parser.parse_args(argv)
    upgrade = ["--upgrade"] if args.upgrade else []
    upgrade += [f"--upgrade-package={name}" for name in args.upgrade_package]
    try:
        if args.write:
            write(args.root, upgrade)
        else:
            check(args.root, args.who)
    except LockError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
