"""The lock (uv.lock and its exports in requirements/) answers pyproject.toml, and a lock that does not
is one line saying to run make lock (tests/support/lock.py; README, "Dependencies and why")."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import lock

REPO = Path(__file__).resolve().parents[2]


def test_the_lock_and_its_exports_answer_pyproject_toml() -> None:
    try:
        lock.check(REPO, who="make test")
    except lock.LockError as err:
        pytest.fail(str(err), pytrace=False)  # the one line, with the fix


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of what the lock is made from and of the lock itself."""
    for name in ("pyproject.toml", "uv.lock", "native/pyproject.toml", "native/Cargo.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    return tmp_path


def check(root: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tests.support.lock", "--check", "--root", str(root)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_the_copy_passes_the_check(project: Path) -> None:
    done = check(project)
    assert (done.returncode, done.stderr) == (0, "")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"msgspec>=0.18,<1",', '"msgspec>=0.18,<1", "toolz>=0.12",'),  # a new dependency, in no lock
        ('"grpcio>=1.85,<2"', '"grpcio>=1.999,<2"'),  # a range the locked version is outside of
        ('"pytest>=8",\n', ""),  # a development tool dropped
    ],
    ids=["added", "range", "removed"],
)
def test_a_pyproject_the_lock_does_not_answer_is_one_line_saying_run_make_lock(
    project: Path, old: str, new: str
) -> None:
    edit(project / "pyproject.toml", old, new)
    done = check(project)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "uv.lock does not answer pyproject.toml" in line
    assert line.endswith("run make lock, then commit pyproject.toml, uv.lock and requirements/"), line


def test_an_export_edited_by_hand_is_named(project: Path) -> None:
    runtime = project / "requirements" / "runtime.txt"
    pin = re.search(r"^grpcio==(\S+)", runtime.read_text(), re.MULTILINE)
    assert pin
    edit(runtime, f"grpcio=={pin.group(1)}", "grpcio==1.85.0")
    done = check(project)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "requirements/runtime.txt is not uv.lock's export" in line and "run make lock" in line


def test_every_export_pins_every_package_with_hashes() -> None:
    """pip's --require-hashes accepts them: one exact version and at least one sha256 per package."""
    for name in lock.SETS:
        text = (REPO / "requirements" / f"{name}.txt").read_text()
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())
        assert entries, name
        for entry in entries:
            assert re.match(r"^[A-Za-z0-9._-]+==\S+", entry), entry.splitlines()[0]
            assert "--hash=sha256:" in entry, entry.splitlines()[0]


def test_the_locked_build_backend_is_the_one_pyproject_declares() -> None:
    """make install and the image build the project without build isolation, with the setuptools of the
    lock's build group: the group must ask for what [build-system] requires."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert set(pyproject["build-system"]["requires"]) <= set(pyproject["dependency-groups"]["build"])


def test_the_native_engine_and_the_project_are_never_taken_from_an_index() -> None:
    """Both are built here: the lock names native/ as the native engine's source, and no export holds
    either (they are installed after the export, with --no-deps)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["uv"]["sources"][lock.NATIVE] == {"path": "native"}
    for name in lock.SETS:
        text = (REPO / "requirements" / f"{name}.txt").read_text()
        assert not re.search(r"^ca-externalgrpc", text, re.MULTILINE), name
