"""Lint, format and type checks run with the tests, so CI refuses what `make lint typecheck` would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_no_problem():
    result = run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_formatted():
    result = run(str(BIN / "ruff"), "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_no_type_error():
    result = run(sys.executable, "-m", "mypy", "server", "providers", "simulators", "devstack", "deploy/sbom.py")
    assert result.returncode == 0, result.stdout + result.stderr
