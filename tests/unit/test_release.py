"""make release's checks (tests/support/release.py): every place names the one version, CHANGELOG.md has
the release's entry, and each refusal is one line with its fix. The build itself is make wheels and
make image; the release was run from a fresh clone (docs/how-to/release.md)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from tests.support import release

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_every_place_that_names_the_version_names_pyprojects() -> None:
    assert release.version_mismatches(VERSION) == []


def test_the_changelog_has_an_entry_for_this_version() -> None:
    assert release.changelog_entry(VERSION, (REPO / "CHANGELOG.md").read_text())


def test_a_place_left_behind_is_named(tmp_path: Path) -> None:
    for path, _ in (*release.VERSION_PLACES, *release.MINOR_PLACES):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, tmp_path / path)
    helm = tmp_path / "deploy/helm/values-sidecar.yaml"
    helm.write_text(helm.read_text().replace(f"ca-externalgrpc-server:{VERSION}", "ca-externalgrpc-server:0.0.9"))
    assert release.version_mismatches(VERSION, tmp_path) == ["deploy/helm/values-sidecar.yaml says 0.0.9"]
    major, minor, _ = VERSION.split(".")
    assert f"providers/bizfly/client.py says {major}.{minor}" in release.version_mismatches("9.9.9", tmp_path)


def test_a_changelog_entry_is_the_text_up_to_the_next_entry() -> None:
    text = (
        "# Changelog\n\n## [Unreleased]\n\n## [1.2.0] - 2027-01-01\n\n- one\n- two\n\n"
        "## [1.1.0] - 2026-12-01\n\n- old\n"
    )
    assert release.changelog_entry("1.2.0", text) == "- one\n- two"
    assert release.changelog_entry("1.1.0", text) == "- old"
    assert release.changelog_entry("1.3.0", text) == ""
    assert release.changelog_entry("1.2.0", "## [1.2.0] - 2027-01-01\n\n## [1.1.0]\n- old\n") == ""  # empty


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert release.main(["--check-only", *argv]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_a_version_that_is_not_x_y_z_or_none_is_refused_with_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(capsys) == "make release: VERSION=(none) is not x.y.z: make release VERSION=0.2.0"
    assert refusal(capsys, "--version", "v1.0").startswith("make release: VERSION=v1.0 is not x.y.z")


def test_a_version_pyproject_does_not_name_is_refused_naming_every_place(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(capsys, "--version", "9.9.9")
    assert line.startswith(f"make release: not every place names 9.9.9 (pyproject.toml says {VERSION}; ")
    assert line.endswith("run make lock, add a CHANGELOG.md entry and commit")


def test_a_release_without_a_changelog_entry_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## [Unreleased]\n")
    monkeypatch.setattr(release, "CHANGELOG", changelog)
    assert refusal(capsys, "--version", VERSION) == (
        f"make release: CHANGELOG.md has no entry for {VERSION}: add '## [{VERSION}] - <date>' with what changed"
    )


def test_a_tree_with_uncommitted_changes_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release.lock, "problems", lambda root: [])
    monkeypatch.setattr(release, "git", lambda *args: " M server/cli.py\n M Makefile")
    assert refusal(capsys, "--version", VERSION) == (
        "make release: uncommitted changes (server/cli.py, Makefile): commit them, so the release names its commit"
    )
