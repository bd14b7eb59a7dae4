"""The one error type for bad configuration: names the key, the problem and the fix."""

from __future__ import annotations


class ConfigError(Exception):
    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"config key {key!r}: {problem}. Fix: {fix}")
        self.key = key
        self.problem = problem
        self.fix = fix
