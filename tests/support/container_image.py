"""The server image the container tests run (tests/install, tests/e2e/test_image.py): the one ``make
image`` built from this checkout's sources. Building is a build step, never part of a test."""

from __future__ import annotations

import shutil

import pytest

from devstack.container import default_image, image_problem


def built_image() -> str:
    """The image's name; the test is skipped without podman, and fails with "run make image" when the
    image is missing or was built from other sources."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install -y podman runc mmdebstrap), so no image to run")
    name = default_image()
    problem = image_problem(name)
    if problem:
        pytest.fail(problem, pytrace=False)
    return name
