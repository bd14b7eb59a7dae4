"""The pure parts of ``make image`` (tests/support/imagebuild.py): the one-line stop when a tool is
missing, the failed stage named from podman's progress lines, and the package closure the runtime
base keeps. The build itself is run by ``make image`` and proven by tests/install."""

from __future__ import annotations

import pytest

from tests.support import imagebuild

# podman build's progress lines, as podman 4.3 prints them for deploy/Dockerfile.
PROGRESS = """\
[2/5] STEP 1/2: FROM scratch AS native-context
[2/5] STEP 2/2: COPY dist/ca_externalgrpc_native-*.whl /wheels/
--> aba35323511
[3/5] STEP 1/1: FROM aba3532351176af63e2b74d81ba895ab9330aa63370ed2115600eac6fde74f3f AS native
--> 45d7cfa9ea5
[4/5] STEP 1/12: FROM localhost/ca-externalgrpc-base:bookworm-python3-309655aa830a AS builder
[4/5] STEP 2/12: ENV PIP_NO_CACHE_DIR=1
[4/5] STEP 6/12: RUN mkdir protos server providers  && /opt/build/bin/pip wheel --wheel-dir /wheels .
  Installing build dependencies: finished with status 'error'
Error: building at STEP "RUN mkdir protos server providers": while running runtime: exit status 1
"""


def test_a_missing_tool_stops_make_image_with_one_line_naming_the_debian_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(imagebuild.shutil, "which", lambda tool: None if tool == "mmdebstrap" else f"/usr/bin/{tool}")
    assert imagebuild.main(["--bases", "debian"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "make image: mmdebstrap is not installed: apt-get install -y mmdebstrap (Debian package mmdebstrap)"


def test_the_failed_stage_is_named_from_the_progress_lines() -> None:
    stages = imagebuild.StageTracker()
    for line in PROGRESS.splitlines():
        stages.feed(line)
    assert stages.stage == "builder"
    assert stages.names == {"2": "native-context", "3": "native", "4": "builder"}


def test_the_runtime_keeps_the_closure_of_its_packages_by_installed_alternatives_and_providers() -> None:
    packages = {
        "python3": {"Depends": "python3.11 (>= 3.11.2), libpython3-stdlib (= 3.11.2-1+b1)"},
        "python3.11": {"Depends": "media-types | mime-support, libc6"},
        "libpython3-stdlib": {"Pre-Depends": "libc6 (>= 2.36)"},
        "media-types": {},
        "libc6": {"Depends": "libgcc-s1"},
        "libgcc-s1": {},
        "ca-certificates": {"Depends": "openssl (>= 1.1.1), debconf (>= 0.5) | debconf-2.0"},
        "cdebconf": {"Provides": "debconf-2.0"},
        "perl-base": {},
    }
    assert imagebuild.dependency_closure(packages, ["python3"]) == {
        "python3", "python3.11", "libpython3-stdlib", "media-types", "libc6", "libgcc-s1",
    }  # fmt: skip
    packages["openssl"] = {}
    assert imagebuild.dependency_closure(packages, ["ca-certificates"]) == {"ca-certificates", "openssl", "cdebconf"}
    with pytest.raises(imagebuild.ImageBuildError, match="needs libssl3, which the bookworm base does not have"):
        imagebuild.dependency_closure(packages, ["python3", "libssl3"])


def test_the_runtime_base_keeps_dpkgs_status_of_exactly_the_packages_it_keeps() -> None:
    """Scanners and the image's bill of materials read the runtime's Debian packages from dpkg's status."""
    status = (
        "Package: libc6\nStatus: install ok installed\nVersion: 2.36\n\n"
        "Package: perl-base\nStatus: install ok installed\nVersion: 5.36\nDescription: cut\n continued\n\n"
        "Package: python3.11\nStatus: install ok installed\nVersion: 3.11.2\n"
    )
    kept = imagebuild.kept_status(status, {"libc6", "python3.11"})
    assert kept == (
        "Package: libc6\nStatus: install ok installed\nVersion: 2.36\n\n"
        "Package: python3.11\nStatus: install ok installed\nVersion: 3.11.2\n\n"
    )


@pytest.mark.parametrize(
    ("remote", "label"),
    [
        ("https://example.org/team/ca-externalgrpc-server.git", "https://example.org/team/ca-externalgrpc-server.git"),
        ("git@example.org:team/ca-externalgrpc-server.git", "git@example.org:team/ca-externalgrpc-server.git"),
        ("/work/main", "unknown"),  # a local clone's path means nothing to whoever runs the image
        (None, "unknown"),
    ],
)
def test_the_source_label_is_a_published_address_or_unknown(
    monkeypatch: pytest.MonkeyPatch, remote: str | None, label: str
) -> None:
    monkeypatch.setattr(imagebuild, "git", lambda *args: remote)
    assert imagebuild.source_url() == label


def test_the_revision_is_the_commit_marked_dirty_with_changes_or_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {("rev-parse", "HEAD"): "a" * 40, ("status", "--porcelain", "--untracked-files=no"): None}
    monkeypatch.setattr(imagebuild, "git", lambda *args: answers[args])
    assert imagebuild.source_revision() == "a" * 40
    answers[("status", "--porcelain", "--untracked-files=no")] = " M server/cli.py"
    assert imagebuild.source_revision() == "a" * 40 + "-dirty"
    answers[("rev-parse", "HEAD")] = None
    assert imagebuild.source_revision() == "unknown"


def test_a_lock_behind_pyproject_stops_make_image_with_one_line_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(imagebuild.lock, "problems", lambda root: ["uv.lock does not answer pyproject.toml"])
    monkeypatch.setattr(imagebuild, "build", lambda *args, **kwargs: pytest.fail("built despite the lock"))
    assert imagebuild.main(["--bases", "public"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "make image: the lock disagrees with pyproject.toml (uv.lock does not answer pyproject.toml): "
        "run make lock, then commit pyproject.toml, uv.lock and requirements/"
    )
