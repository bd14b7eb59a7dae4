"""``ca-externalgrpc --version``: the version, the commit (from git in a checkout, recorded at build in a
wheel, "unknown" said as such), the engine and the library versions (server/build_info.py, setup.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from server import build_info
from server.cli import main

REPO = Path(__file__).resolve().parents[2]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_version_prints_the_version_the_checkouts_commit_the_engine_and_the_libraries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert lines[0] == f"ca-externalgrpc {version}"
    dirty = "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    assert lines[1] == f"commit: {git('rev-parse', 'HEAD')}{dirty} (git checkout)"
    assert lines[2] == "engine: native (serving.engine: auto)"  # make install builds it
    from importlib import metadata

    expected = (
        f"libraries: grpcio {metadata.version('grpcio')}, protobuf {metadata.version('protobuf')} (upb), "
        f"ca-externalgrpc-native {metadata.version('ca-externalgrpc-native')}"
    )
    assert lines[3] == expected
    assert len(lines) == 4


def test_without_a_checkout_the_commit_is_the_recorded_one_or_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_info, "checkout_commit", lambda: None)
    monkeypatch.setattr(build_info, "baked_commit", lambda: "0123abc")
    assert build_info.commit() == "0123abc (recorded at build)"
    monkeypatch.setattr(build_info, "baked_commit", lambda: "unknown")
    assert build_info.commit() == "unknown (the build had neither git nor CA_EXTERNALGRPC_COMMIT)"
    monkeypatch.setattr(build_info, "baked_commit", lambda: None)
    assert build_info.commit() == "unknown (no git checkout, and the build recorded none)"


def test_setup_py_writes_the_file_build_info_reads() -> None:
    setup = (REPO / "setup.py").read_text()
    assert f'BUILD_FILE = "{build_info.BUILD_FILE}"' in setup


def built_commit(source: Path, out: Path, **env: str) -> str:
    """Build the server's wheel from ``source`` and return the commit recorded in it."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), "."],
        cwd=source,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("ca_externalgrpc_server-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return str(json.loads(archive.read(f"server/{build_info.BUILD_FILE}"))["commit"])


@pytest.mark.timeout(300)
def test_a_wheel_records_the_commit_given_or_unknown_without_git(tmp_path: Path) -> None:
    """The image's builder has no git and passes the commit in CA_EXTERNALGRPC_COMMIT; a build from a
    plain copy of the sources, with neither, records "unknown" rather than guessing."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copyfile(REPO / name, source / name)
    for package in ("protos", "server", "providers"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert built_commit(source, tmp_path / "given", CA_EXTERNALGRPC_COMMIT="f" * 40) == "f" * 40
    assert built_commit(source, tmp_path / "none") == "unknown"


@pytest.mark.timeout(300)
def test_a_wheel_built_in_the_checkout_records_its_head(tmp_path: Path) -> None:
    commit = built_commit(REPO, tmp_path)
    # What an in-tree build leaves: an egg-info with the version would shadow the installed metadata.
    shutil.rmtree(REPO / "build", ignore_errors=True)
    shutil.rmtree(REPO / "ca_externalgrpc_server.egg-info", ignore_errors=True)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    assert commit.removesuffix("-dirty") == git("rev-parse", "HEAD")
