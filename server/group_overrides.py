"""A warning for ``node_groups`` overrides that name no node group the cloud reports.

An override keyed by a mistyped or deleted pool id is otherwise silent: the group it was meant for
runs with the CA's defaults and no template. The ids can only be compared with the cloud's after a
sync, so this runs as a sync listener and speaks once, after the backend's first successful sync.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from providers.backend import Backend

log = logging.getLogger(__name__)


class UnmatchedOverrideCheck:
    """Sync listener: after the first successful sync, log the override ids that match no group."""

    def __init__(self, configured_ids: Iterable[str]) -> None:
        self.configured = frozenset(configured_ids)
        self.unmatched: tuple[str, ...] | None = None  # None until the first successful sync
        self._lock = threading.Lock()

    def __call__(self, backend: Backend) -> None:
        with self._lock:
            if self.unmatched is not None or not backend.health().synced:
                return
            known = sorted(group.id for group in backend.groups())
            self.unmatched = tuple(sorted(self.configured.difference(known)))
        if self.unmatched:
            log.warning(
                "node_groups override(s) %s of backend %s match no node group it serves (its groups: %s); "
                "they have no effect: fix the ids (ca-externalgrpc status lists them) or remove the overrides",
                ", ".join(self.unmatched),
                backend.name,
                ", ".join(known[:10]) + (", ..." if len(known) > 10 else "") or "none",
                extra={"backend": backend.name, "unmatched_overrides": list(self.unmatched)},
            )
