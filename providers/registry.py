"""Which backend owns a node group or a providerID (several clouds may be served at once)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from providers.backend import REFRESH_MARGIN, REFRESH_WAIT, Backend
from providers.deadline import Deadline
from providers.errors import CloudUnavailable, NodeGroupNotFound
from providers.model import GroupState


class Registry:
    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = tuple(backends)

    def backend_for_group(self, group_id: str) -> Backend:
        for backend in self.backends:
            if backend.has_group(group_id):
                return backend
        raise NodeGroupNotFound(group_id)

    def group_for_provider_id(self, provider_id: str) -> tuple[Backend, str] | None:
        if not provider_id:
            return None
        for backend in self.backends:
            gid = backend.group_id_for(provider_id)
            if gid is not None:
                return backend, gid
        return None

    def refresh(self, deadline: Deadline) -> None:
        """The CA's Refresh: each backend whose snapshot is older than its interval starts a listing (or
        joins the running one); all of them are waited for together, at most ``REFRESH_WAIT`` and never
        into the last ``REFRESH_MARGIN`` of the deadline. A listing that takes longer goes on in the
        background and this answers from the snapshots in place; its failure is the sync's to report.
        Then the isolation rule decides."""
        flights = [flight for backend in self.backends if (flight := backend.refresh_listing()) is not None]
        if flights:
            until = min(time.monotonic() + REFRESH_WAIT, deadline.expires_at - REFRESH_MARGIN)
            for flight in flights:
                flight.wait(until - time.monotonic())
        self.check_fresh_enough()

    def check_fresh_enough(self) -> None:
        """Refresh's rule (the isolation rule, docs/explanation/reliability.md): fail for a backend that serves groups
        from state beyond its staleness bound, and when no backend is usable at all (none has synced, or
        the cloud refuses the configuration of every one that has): the CA then has nothing to act on,
        and its log names the cause each loop. While one backend is usable, one that never synced (or
        whose credentials stopped working) serves none (or its last snapshot) and reports through
        status, health, readiness, logs, metrics and Events, so the other clouds keep autoscaling."""
        for backend in self.backends:
            backend.check_fresh_enough()
        active = [(backend, backend.health()) for backend in self.backends if not backend.paused]
        if active and not any(health.usable for _, health in active):
            raise CloudUnavailable(
                "no backend can serve node groups: " + "; ".join(health.problem(b.name) for b, health in active)
            )

    def all_groups(self) -> Iterable[tuple[Backend, GroupState]]:
        seen: set[str] = set()
        for backend in self.backends:
            for group in backend.groups():
                if group.id not in seen:  # ids are unique per cloud; first backend wins on a clash
                    seen.add(group.id)
                    yield backend, group

    def start(self) -> None:
        for backend in self.backends:
            backend.start()

    def pause(self) -> None:
        for backend in self.backends:
            backend.pause()

    def resume(self) -> None:
        for backend in self.backends:
            backend.resume()

    def stop(self) -> None:
        for backend in self.backends:
            backend.stop()
