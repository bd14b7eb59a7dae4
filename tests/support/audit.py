"""``make audit``: known vulnerabilities of the locked sets (``requirements/runtime.txt``, ``dev.txt``).

pip-audit reads each export as it is (``--require-hashes --disable-pip``: nothing is installed or
resolved, the exact pins are asked about) and asks an advisory source about each pinned version:
PyPI's JSON API first (``/pypi/<name>/<version>/json``, whose ``vulnerabilities`` come from the PyPA
advisory database through OSV), then OSV's own API. pip-audit counts a package whose version the
source does not answer as skipped, not as vulnerable, and says "No known vulnerabilities found"
all the same; this target counts what was actually audited:

- nothing audited by either source: the advisory data cannot be reached from here; one line says so
  and the target succeeds (CI runs it and must not fail for want of a network);
- a known vulnerability: each is listed with the versions that fix it, and the target fails with the
  fix (raise the range in pyproject.toml or ``make lock LOCK_ARGS=--upgrade-package=NAME``);
- packages left unaudited while others were: named, not a failure.

``--ignore-vuln ID`` (repeatable; ``make audit AUDIT_ARGS='--ignore-vuln GHSA-...'``) accepts an
advisory that does not apply, which is then said in the output.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SETS = ("runtime", "dev")
SOURCES = ("pypi", "osv")
FIX = "raise the range in pyproject.toml, or make lock LOCK_ARGS=--upgrade-package=NAME, then commit the lock"


@dataclass
class Audit:
    """What one source said about one set."""

    source: str
    audited: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    vulnerable: list[tuple[str, str, str, str]] = field(default_factory=list)  # name, version, id, fixed in
    error: str = ""


def pip_audit(requirements: Path, source: str, ignored: Sequence[str]) -> Audit:
    argv = [str(Path(sys.executable).parent / "pip-audit"), "-r", str(requirements), "--require-hashes"]
    argv += ["--disable-pip", "--progress-spinner", "off", "--format", "json", "--vulnerability-service", source]
    argv += [f"--ignore-vuln={vuln}" for vuln in ignored]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Audit(source, error=str(err))
    return parse(source, done.stdout, done.stderr)


def parse(source: str, stdout: str, stderr: str) -> Audit:
    """pip-audit's JSON report (it exits 1 when it found something, and still writes the report)."""
    try:
        report: dict[str, Any] = json.loads(stdout)
    except ValueError:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "no report"
        return Audit(source, error=last[:300])
    audit = Audit(source)
    for dependency in report.get("dependencies", []):
        name = dependency["name"]
        if "skip_reason" in dependency:
            audit.skipped.append((name, dependency["skip_reason"]))
            continue
        audit.audited.append((name, dependency.get("version", "")))
        for vuln in dependency.get("vulns", []):
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed version yet"
            audit.vulnerable.append((name, dependency.get("version", ""), vuln["id"], fixed))
    return audit


def audit_set(name: str, ignored: Sequence[str], root: Path = REPO) -> list[Audit]:
    """Each source's answer, up to the first that audits anything (the last one then)."""
    answers = []
    for source in SOURCES:
        answers.append(pip_audit(root / "requirements" / f"{name}.txt", source, ignored))
        if answers[-1].audited:
            break
    return answers


def why_not(answer: Audit) -> str:
    """One short clause on why a source audited nothing."""
    if answer.error:
        host = re.search(r"host='([^']+)'", answer.error)
        cause = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(timed out|refused|reset)", answer.error)
        reason = (cause.group(1) or cause.group(2)) if cause else answer.error[:80]
        return f"{answer.source}: {host.group(1) + ' ' if host else ''}{reason.strip()}"
    count = len(answer.skipped)
    example = answer.skipped[0][1] if answer.skipped else "no package listed"
    return f"{answer.source}: none of {count} versions answered ({example[:70]})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ignore-vuln", action="append", default=[], metavar="ID", help="accept this advisory")
    parser.add_argument("--set", action="append", choices=SETS, help="the locked sets to audit (default: both)")
    args = parser.parse_args(argv)
    failed = False
    for name in args.set or SETS:
        answers = audit_set(name, args.ignore_vuln)
        answer = answers[-1]
        if not answer.audited:
            reasons = "; ".join(why_not(a) for a in answers)
            print(
                f"make audit: {name} set not audited, no advisory source answers from here ({reasons}): not a failure"
            )
            continue
        summary = f"{len(answer.audited)} packages audited ({answer.source})"
        if answer.skipped:
            summary += f", {len(answer.skipped)} not answered: {', '.join(n for n, _ in answer.skipped)}"
        if not answer.vulnerable:
            print(f"make audit: {name} set: no known vulnerability; {summary}")
            continue
        failed = True
        print(f"make audit: {name} set: {len(answer.vulnerable)} known vulnerabilities; {summary}")
        for package, version, vuln, fixed in answer.vulnerable:
            print(f"  {package} {version}: {vuln} (fixed in {fixed})")
    if args.ignore_vuln:
        print(f"make audit: accepted as not applying: {', '.join(args.ignore_vuln)}")
    if failed:
        print(f"make audit: {FIX}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
