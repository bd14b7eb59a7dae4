"""The interface a cloud package implements; everything else is shared (providers/backend.py)."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.deadline import Deadline
from providers.errors import NotSupported
from providers.model import CloudListing, GroupState, Instance, NodeRef, NodeTemplate
from providers.preflight import Preflight


class CloudAdapter(abc.ABC):
    """How one cloud lists pools and nodes, sets a size, deletes a machine and describes a template.

    Implementations are thread-safe: the shared Backend calls them from the background sync thread
    and from gRPC handler threads at once. They raise only ``providers.errors`` exceptions.
    """

    #: the cloud's name, as a backend's ``type`` names it ("scaleway", "bizfly")
    cloud: str = ""

    @abc.abstractmethod
    def list_groups(self, deadline: Deadline) -> CloudListing:
        """Every autoscaled group with its instances, read fresh from the cloud."""

    @abc.abstractmethod
    def read_group(self, group_id: str, deadline: Deadline) -> GroupState:
        """One group's sizes read fresh from the cloud (before an absolute size write on a stale view).

        Only ``min_size``, ``max_size``, ``target_size`` and ``cloud_data`` are used; ``instances`` may be
        empty (the Backend keeps the snapshot's), so an adapter need not page through every node.
        Raises NodeGroupNotFound when the group is gone or no longer autoscaled.
        """

    @abc.abstractmethod
    def set_target_size(self, group: GroupState, new_size: int, deadline: Deadline) -> None:
        """Write the group's desired size (absolute) to the cloud. ``new_size`` may be 0."""

    @abc.abstractmethod
    def delete_instance(self, group: GroupState, instance: Instance, node: NodeRef, deadline: Deadline) -> None:
        """Terminate one machine of ``group`` and lower its desired size by one (cloud-side)."""

    @property
    @abc.abstractmethod
    def gpu_label(self) -> str:
        """The node label that marks GPU nodes of this cloud."""

    def available_gpu_types(self) -> tuple[str, ...]:
        return ()

    def template(self, group: GroupState, observed_labels: Mapping[str, str] | None) -> NodeTemplate | None:
        """The template for scale-from-zero; by default what the listing carried."""
        return group.template

    def same_machine_type(self, first: str, second: str) -> bool:
        """Whether two values of ``node.kubernetes.io/instance-type`` name one machine type.

        A cloud whose API spells its types otherwise than its nodes' label does (Scaleway's ``pro2_xxs``
        against ``PRO2-XXS``) says so here, so a template learned from a node is not dropped as "the
        group's machine type changed" when only the spelling differs. Default: equal strings.
        """
        return first == second

    def node_price(self, group: GroupState, node: NodeRef, start: dt.datetime, end: dt.datetime) -> float:
        raise NotSupported(f"{self.cloud} has no node pricing")

    def pod_price(self, pod_bytes: bytes, start: dt.datetime, end: dt.datetime) -> float:
        raise NotSupported(f"{self.cloud} has no pod pricing")

    def group_for_price_node(self, node: NodeRef) -> str | None:
        """The group id a (template) node belongs to for pricing, from its labels; None if unknown."""
        return None

    def instrument(self, metrics: object) -> None:
        """Hand the adapter's HTTP transport(s) the server's metrics object.

        ``metrics`` has ``observe_cloud_request(api, endpoint, method, status_or_error, seconds, retried)``
        and ``set_breaker_state(api, state)`` (``server.metrics.BackendMetrics``, which adds the backend
        name). Default: nothing.
        """
        return None

    def guard_writes(self, gate: Callable[[str], float | None]) -> None:
        """Have every cloud-changing request of this adapter call ``gate("METHOD endpoint")`` once its
        connection is ready, just before it is sent; the gate raises ``NotLeader`` to stop it, else returns
        the seconds the sending may take (leader election, server/kube/leader.py).

        A cloud package must pass the gate to all its transports; the default refuses, so a cloud that
        forgot it cannot run with leader election on and write from a follower.
        """
        raise NotSupported(f"{self.cloud or type(self).__name__} cannot guard its cloud writes for leader election")

    def health_detail(self) -> str:
        """A short human string about the cloud connection (breaker state, auth), for health/status."""
        return ""

    def close(self) -> None:
        """Release HTTP sessions."""
        return None


@dataclass(frozen=True)
class CloudType:
    """How the server's config loader plugs in one cloud package (``providers/<name>/__init__.py``)."""

    name: str
    # the schema of the cloud's config mapping (a providers.config_values.CloudSettings model)
    config_model: type[Any]
    build_adapter: Callable[[Any], CloudAdapter]
    default_sync_interval: float
    # ``validate --online``: read-only checks through an adapter ``build_adapter`` made, reported into a
    # providers.preflight.Preflight (see that module)
    preflight: Callable[[Any, Preflight], None] | None = None
