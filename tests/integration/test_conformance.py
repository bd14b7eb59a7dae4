"""The conformance suite (tests/conformance) as part of ``make test``: one test per client.

Each test takes the Go client that ``make build`` compiled (tests never compile: a cold build of a
CA client takes minutes), starts a fresh lab of simulators + server per transport, and requires
every check to pass. A binary that is missing or out of date fails the test with the command that
builds it; Go is part of the development and CI setup, so nothing here is ever skipped.
"""

from __future__ import annotations

import pytest

from tests.conformance import run as conformance
from tests.support import gobuild

CLIENTS = [pytest.param(m.key, m.binary_name, id=f"ca-{m.key}") for m in conformance.CA_MODULES] + [
    pytest.param("grpcurl", conformance.GRPCURL_BINARY, id="grpcurl")
]


@pytest.mark.parametrize(("client", "binary_name"), CLIENTS)
def test_client_passes_every_check(client: str, binary_name: str) -> None:
    try:
        gobuild.binary_path(binary_name)
        not_built = ""
    except gobuild.GoBuildError as err:
        not_built = str(err)
    if not_built:
        pytest.fail(not_built, pytrace=False)
    results = conformance.run([client])
    ok = conformance.print_summary(results)
    problems = [
        r.error if r.error is not None else f"{r.name}: {r.failed} failed ({', '.join(r.failures)})"
        for r in results
        if not r.ok
    ]
    assert ok, "conformance checks failed:\n" + "\n".join(str(p) for p in problems)
    assert len(results) == 2, [r.name for r in results]  # plaintext and mTLS, each with results


def test_every_client_generation_is_declared_for_the_build() -> None:
    declared = {b.name: b for b in gobuild.discover()}
    for module in conformance.CA_MODULES:
        assert module.binary_name in declared, f"no build.toml declares {module.binary_name}"
        assert "conformance" in declared[module.binary_name].groups
    assert "conformance" in declared[conformance.GRPCURL_BINARY].groups


def test_missing_go_is_one_line_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Pure lookup logic: no go on PATH and none at the usual install places.
    monkeypatch.setattr(gobuild.shutil, "which", lambda _name: None)
    monkeypatch.setattr(gobuild, "GO_FALLBACK_PATHS", ("/nonexistent/go/bin/go",))
    assert gobuild.main(["--group", "conformance"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Go toolchain" in err and "is not installed" in err
    assert f"https://go.dev/dl/go{gobuild.GO_INSTALL_VERSION}." in err and "tar -C /usr/local" in err
    assert "Traceback" not in err
