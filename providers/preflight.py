"""Read-only checks of one backend against its cloud: what ``ca-externalgrpc validate --online`` runs.

A cloud package says how to check itself with ``CloudType.preflight(adapter, run)``
(``providers/<cloud>/preflight.py``). It reads through the backend's own adapter and client, so the calls
it proves are the ones the server makes, and it reports into ``run`` (a ``Preflight``): what it proved,
the pools that become node groups with their bounds and whoever else scales them, and each problem as
the setting to change and how. The server side (``server/online.py``) builds the adapter, shuts every
write out of it (its write gate refuses them all), runs the checks and prints the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from providers.config_errors import ConfigProblem
from providers.deadline import Deadline

# What a preflight may spend on one backend, retries and all (the longest a cloud call may take).
PREFLIGHT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One pool that becomes a node group, as the CA will see it."""

    id: str
    name: str
    min_size: int
    max_size: int
    target_size: int
    # Who else changes this pool's size ("" when nothing known does): a cloud's managed autoscaler.
    also_scaled_by: str = ""

    def __str__(self) -> str:
        line = f"group {self.id} ({self.name}): min {self.min_size}, max {self.max_size}, target {self.target_size}"
        return line + (f"; also scaled by {self.also_scaled_by}" if self.also_scaled_by else "")


@dataclass
class Preflight:
    """One backend's run: the checks report into it; ``problems`` decide the exit code.

    ``setting(key)`` names a key of the backend's cloud mapping the way ``validate`` names it (the file's
    key, the ``*_env`` key and its variable, or the upstream variable that set it), so a problem points at
    what the operator must edit.
    """

    setting: Callable[[str], str]
    deadline: Deadline = field(default_factory=lambda: Deadline.after(PREFLIGHT_SECONDS))
    proven: list[str] = field(default_factory=list)
    groups: list[GroupSummary] = field(default_factory=list)
    problems: list[ConfigProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    def proved(self, line: str) -> None:
        """Something the cloud answered that shows a setting is right (``proved: ...``)."""
        self.proven.append(line)

    def problem(self, key: str, problem: str, fix: str) -> None:
        """A setting that is wrong: one line naming it, what the cloud said, and what to do."""
        self.problems.append(ConfigProblem(self.setting(key), problem, fix))

    def warn(self, line: str) -> None:
        """Something the operator should know that does not stop the server (the exit code stays 0)."""
        self.warnings.append(line)

    def not_checked(self, line: str) -> None:
        """What a read-only check cannot prove (the writes), said so rather than implied."""
        self.unchecked.append(line)

    def group(self, summary: GroupSummary) -> None:
        self.groups.append(summary)

    @property
    def ok(self) -> bool:
        return not self.problems
