"""The one error type for bad configuration: every problem found, each with its key and its fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One mistake (or, for ``validate --offline``, one thing left unchecked) at one key."""

    key: str  # the key path, e.g. backends[0].scaleway.region, or the environment variable it came from
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}. Fix: {self.fix}"


class ConfigError(Exception):
    """Raised with every problem of a config at once (never a secret value in the text)."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        if not problems:
            raise ValueError("a ConfigError needs at least one problem")
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            text = str(self.problems[0])
        else:
            text = f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)

    @classmethod
    def single(cls, key: str, problem: str, fix: str) -> ConfigError:
        return cls([ConfigProblem(key, problem, fix)])

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.problems)
