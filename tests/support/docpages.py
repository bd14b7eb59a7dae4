"""The commands and outputs a page of the docs shows, read from the page itself, for the tests that run
them: tests/integration/test_docs_walk.py (what runs offline, in ``make test``) and
tests/e2e/test_node_tutorials.py (the tutorials' cluster commands on a real node, ``make node-e2e``).

A tutorial (docs/tutorials/*.md) starts with a ``## 1. Your values`` block: one ``NAME=value`` line per
value the reader fills in, and ``read`` lines for the secrets. Every later block uses those variables, so
a test runs a block as the reader's shell would: that values block first, with the test's values in
place of the examples (and the secrets on standard input), then the block. Which values a test gives is
checked against the page: a value the page adds or drops fails the test rather than running with a
stale name.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FENCE = "```sh\n"
VALUES_HEADING = "## 1. Your values"
ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S*)")
READ = re.compile(r"^read -rsp '[^']*' ([A-Z][A-Z0-9_]*) && echo$")


def blocks(doc: Path, after: str, fence: str = FENCE) -> list[str]:
    """The fenced blocks (``fence``) of ``doc`` after the heading or text ``after``."""
    text = doc.read_text().split(after, 1)[1]
    return [part.split("```", 1)[0] for part in text.split(fence)[1:]]


def plain_block(doc: Path, after: str) -> list[str]:
    """The lines of the first unlabelled fenced block after ``after`` (an output the doc shows)."""
    text = doc.read_text().split(after, 1)[1]
    return text.split("```\n", 1)[1].split("```", 1)[0].splitlines()


def commands(block: str) -> list[str]:
    """The commands of a shell block, one per logical line (continuation lines joined, comments and
    heredoc bodies kept with their command)."""
    out: list[str] = []
    heredoc = ""
    for line in block.replace("\\\n", " ").splitlines():
        if heredoc:
            out[-1] += "\n" + line
            if line.strip() == heredoc:
                heredoc = ""
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        out.append(re.sub(r"\s+", " ", line.strip()))
        if match := re.search(r"<<-?'?(\w+)'?\s*$", line):
            heredoc = match.group(1)
    return out


def words(text: str) -> int:
    """Words as ``wc -w`` counts them: runs of non-blank characters, code included."""
    return len(text.split())


def section(doc: Path, heading: str) -> str:
    """The text of the section of ``doc`` whose heading (``## `` or ``### ``...) starts with ``heading``,
    up to the next heading of its level or above."""
    text = doc.read_text()
    start = text.index("\n" + heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    following = re.compile(rf"(?m)^#{{1,{level}}} ")
    end = following.search(text, text.index("\n", start))
    return text[start : end.start() if end else len(text)]


@dataclass(frozen=True)
class Tutorial:
    """One tutorial page and the shell that runs its blocks."""

    path: Path

    def all_blocks(self) -> list[str]:
        """Every ``sh`` block of the page, in order."""
        return [part.split("```", 1)[0] for part in self.path.read_text().split(FENCE)[1:]]

    def inline_commands(self) -> set[str]:
        """The ``kubectl`` and ``helm`` commands the page's text shows inline (not a bare tool or flag)."""
        prose = re.sub(r"(?ms)^```.*?^```", "", self.path.read_text())
        spans = re.findall(r"`((?:kubectl|helm) [^`]+)`", prose)
        return {s for s in spans if len(s.split()) >= 3 and not re.fullmatch(r"-{1,2}[\w-]+", s.split()[-1])}

    def heading_of(self, block: str) -> str:
        """The ``## `` heading of the section that holds ``block``."""
        before = self.path.read_text().split(FENCE + block, 1)[0]
        return before.rsplit("\n## ", 1)[1].split("\n", 1)[0]

    def blocks(self, heading: str) -> list[str]:
        """The ``sh`` blocks of the section whose heading starts with ``heading``."""
        return [part.split("```", 1)[0] for part in section(self.path, heading).split(FENCE)[1:]]

    def block(self, heading: str, containing: str = "") -> str:
        """The one ``sh`` block of that section that contains ``containing``."""
        (found,) = [b for b in self.blocks(heading) if containing in b]
        return found

    def values(self) -> dict[str, str]:
        """The page's values (the examples it shows), then its secrets (``read`` lines) as empty strings."""
        found: dict[str, str] = {}
        for line in self.block(VALUES_HEADING).splitlines():
            if match := ASSIGNMENT.match(line):
                found[match.group(1)] = match.group(2)
            elif match := READ.match(line):
                found[match.group(1)] = ""
            elif line.strip():
                raise AssertionError(
                    f"{self.path.name}: a line of the values block is neither NAME=value nor read: {line}"
                )
        return found

    def secrets(self) -> list[str]:
        return [m.group(1) for line in self.block(VALUES_HEADING).splitlines() if (m := READ.match(line))]

    def prelude(self, values: Mapping[str, str]) -> str:
        """The values block with ``values`` in place of the page's examples (every name given, none more)."""
        assert sorted(values) == sorted(self.values()), (
            f"{self.path.name} asks for {sorted(self.values())}, the test gives {sorted(values)}"
        )
        lines = []
        for line in self.block(VALUES_HEADING).splitlines():
            if match := ASSIGNMENT.match(line):
                lines.append(f"{match.group(1)}={shlex.quote(values[match.group(1)])}")
            else:
                lines.append(line)
        return "\n".join(lines)

    def run(
        self,
        block: str,
        values: Mapping[str, str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """``block`` run by bash after the values block, as the reader's shell runs it (stops at the first
        failing command); the secrets typed at ``read`` come from ``values``."""
        script = "set -euo pipefail\n" + self.prelude(values) + "\n" + block
        typed = "".join(values[name] + "\n" for name in self.secrets())
        return subprocess.run(
            ["bash", "-c", script],
            input=typed,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def checked(done: subprocess.CompletedProcess[str], what: str) -> str:
    """``done``'s output, or AssertionError with everything it printed."""
    assert done.returncode == 0, f"{what} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout
