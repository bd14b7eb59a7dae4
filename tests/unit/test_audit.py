"""make audit (tests/support/audit.py): pip-audit's report counted for what was really audited. Nothing
audited (no advisory source answers here) is one line and a success; a known vulnerability fails with
the fix; pip-audit's own "No known vulnerabilities found" over skipped packages is not taken as a pass."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support import audit

#: what pip-audit 2.10 writes when PyPI answers no version (the version-level JSON API answers 404)
ALL_SKIPPED = json.dumps(
    {
        "dependencies": [
            {"name": "grpcio", "skip_reason": "Dependency not found on PyPI and could not be audited: grpcio (1.85.3)"},
            {
                "name": "urllib3",
                "skip_reason": "Dependency not found on PyPI and could not be audited: urllib3 (2.8.0)",
            },
        ],
        "fixes": [],
    }
)
NO_DNS = (
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.osv.dev', port=443): Max retries exceeded "
    "with url: /v1/query (Caused by NameResolutionError(\"HTTPSConnection(host='api.osv.dev', port=443): Failed to "
    "resolve 'api.osv.dev' ([Errno -2] Name or service not known)\"))"
)
ONE_FOUND = json.dumps(
    {
        "dependencies": [
            {"name": "grpcio", "version": "1.85.3", "vulns": []},
            {"name": "urllib3", "version": "2.8.0",
             "vulns": [{"id": "GHSA-xxxx-yyyy-zzzz", "fix_versions": ["2.8.1"], "aliases": [], "description": "."}]},
            {"name": "kubernetes", "skip_reason": "Dependency not found on PyPI and could not be audited"},
        ],
        "fixes": [],
    }
)  # fmt: skip


def test_a_report_of_skipped_packages_audited_nothing() -> None:
    answer = audit.parse("pypi", ALL_SKIPPED, "No known vulnerabilities found\n")
    assert answer.audited == [] and len(answer.skipped) == 2 and answer.vulnerable == []


def test_no_report_is_the_last_line_of_the_error() -> None:
    answer = audit.parse("osv", "", "Traceback (most recent call last):\n  ...\n" + NO_DNS + "\n")
    assert answer.error.startswith("requests.exceptions.ConnectionError")
    assert audit.why_not(answer) == "osv: api.osv.dev Name or service not known"


def fake_sources(monkeypatch: pytest.MonkeyPatch, reports: dict[str, tuple[str, str]]) -> list[str]:
    asked: list[str] = []

    def pip_audit(requirements: Path, source: str, ignored: Sequence[str]) -> audit.Audit:
        asked.append(f"{requirements.name}:{source}")
        return audit.parse(source, *reports[source])

    monkeypatch.setattr(audit, "pip_audit", pip_audit)
    return asked


def test_no_source_answering_is_one_line_per_set_and_a_success(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = fake_sources(monkeypatch, {"pypi": (ALL_SKIPPED, ""), "osv": ("", NO_DNS)})
    assert audit.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"make audit: {name} set not audited, no advisory source answers from here (pypi: none of 2 versions "
        "answered (Dependency not found on PyPI and could not be audited: grpcio (1.85.3)); "
        "osv: api.osv.dev Name or service not known): not a failure"
        for name in ("runtime", "dev")
    ]
    assert asked == ["runtime.txt:pypi", "runtime.txt:osv", "dev.txt:pypi", "dev.txt:osv"]


def test_a_known_vulnerability_fails_with_its_fixed_version_and_how_to_move(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = fake_sources(monkeypatch, {"pypi": (ONE_FOUND, ""), "osv": ("", NO_DNS)})
    assert audit.main(["--set", "runtime"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "make audit: runtime set: 1 known vulnerabilities; 2 packages audited (pypi), 1 not answered: kubernetes",
        "  urllib3 2.8.0: GHSA-xxxx-yyyy-zzzz (fixed in 2.8.1)",
    ]
    assert err.strip() == f"make audit: {audit.FIX}"
    assert asked == ["runtime.txt:pypi"]  # the first source that audits something is the answer


def test_the_command_reads_the_locked_exports_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class Done:
        stdout, stderr = ALL_SKIPPED, ""

    def run(argv: list[str], **kwargs: object) -> Done:
        seen.append(argv)
        return Done()

    monkeypatch.setattr(audit.subprocess, "run", run)
    audit.pip_audit(audit.REPO / "requirements" / "runtime.txt", "pypi", ["GHSA-1"])
    (argv,) = seen
    assert argv[0].endswith("/pip-audit")
    for flag in ("--require-hashes", "--disable-pip", "--ignore-vuln=GHSA-1"):
        assert flag in argv
    assert argv[argv.index("-r") + 1].endswith("requirements/runtime.txt")
    assert argv[argv.index("--vulnerability-service") + 1] == "pypi"
