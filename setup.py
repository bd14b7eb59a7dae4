"""setuptools' build of the server's wheel: all of it is in pyproject.toml but one step.

The built package gets ``server/_build.json``, the commit the wheel is built from, which
``ca-externalgrpc --version`` prints where there is no git (server/build_info.py): from
``CA_EXTERNALGRPC_COMMIT`` when set (the image's builder has no git: make image passes the commit),
else from git (``-dirty`` when tracked files differ from HEAD), else ``unknown``. An editable install
gets none: it reads git itself.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COMMIT_ENV = "CA_EXTERNALGRPC_COMMIT"
BUILD_FILE = "_build.json"  # server/build_info.py reads it under this name


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit() -> str:
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    return f"{head}-dirty" if git("status", "--porcelain", "--untracked-files=no") else head


class BuildPyRecordingTheCommit(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "server" / BUILD_FILE
        target.write_text(json.dumps({"commit": source_commit()}) + "\n")


setup(cmdclass={"build_py": BuildPyRecordingTheCommit})
