"""Production apart from the test doubles: what ships (wheel, image) never needs the simulators.

The distribution is ``protos``, ``server`` and ``providers``. ``simulators``, ``devstack`` (the
harness and the demo) and ``tests`` are development tools: production code must not import them,
the wheel must not package them and the image must not copy them.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("protos", "server", "providers")
DEVELOPMENT_ONLY = ("simulators", "devstack", "tests")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", SHIPPED)
def test_shipped_code_imports_no_development_package(package: str) -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        for name in _imported_modules(path)
        if name.split(".")[0] in DEVELOPMENT_ONLY
    ]
    assert not offenders, offenders


def test_the_wheel_packages_only_the_shipped_packages() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(pattern.rstrip("*") for pattern in include) == sorted(SHIPPED)


def test_the_image_copies_no_development_package() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    dockerignore = (REPO / ".dockerignore").read_text().split()
    for name in DEVELOPMENT_ONLY:
        assert f"COPY {name}" not in dockerfile
        assert f"!{name}/" not in dockerignore


def test_the_native_extra_is_exactly_this_checkouts_native_engine() -> None:
    """``pip install 'ca-externalgrpc-server[native]'`` installs the native wheel built from native/, at
    the version native/pyproject.toml and native/Cargo.toml give it (make wheels builds both wheels)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    native = tomllib.loads((REPO / "native" / "pyproject.toml").read_text())["project"]
    cargo = tomllib.loads((REPO / "native" / "Cargo.toml").read_text())["package"]
    assert native["version"] == cargo["version"]
    assert extras["native"] == [f"{native['name']}=={native['version']}"]
