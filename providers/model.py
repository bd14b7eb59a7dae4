"""The node-group model every cloud maps onto (one model for every cloud; docs/explanation/architecture.md,
"Layers")."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class InstanceState(enum.IntEnum):
    """Values of the externalgrpc ``InstanceStatus.InstanceState`` enum."""

    UNSPECIFIED = 0
    RUNNING = 1
    CREATING = 2
    DELETING = 3


class ErrorClass(enum.IntEnum):
    """cloudprovider.InstanceErrorClass values understood by the CA core."""

    OUT_OF_RESOURCES = 1
    OTHER = 99


@dataclass(frozen=True, slots=True)
class InstanceError:
    code: str
    message: str
    error_class: ErrorClass = ErrorClass.OTHER


@dataclass(frozen=True, slots=True)
class Instance:
    """One cloud machine of a node group.

    ``id`` is what the CA sees and must equal the Kubernetes ``spec.providerID`` of the node the
    machine registers as, or the CA takes the node for unregistered and deletes it (docs/reference/protocol.md,
    "Instance status"). ``cloud_id`` is the cloud's own handle used to delete it.
    """

    id: str
    state: InstanceState
    cloud_id: str
    name: str = ""
    error: InstanceError | None = None
    cloud_status: str = ""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class NodeTemplate:
    """What a new node of a group will look like; quantities are Kubernetes quantity strings."""

    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LearnedTemplate:
    """A template recorded from a real Ready node of the group (server/kube/templates.py learns them)."""

    template: NodeTemplate
    node_name: str
    learned_at: str  # UTC, RFC 3339 to the second: when this content was first seen
    # Label keys found to differ between the group's nodes or over time (providers/node_labels.py,
    # LabelAgreement): kept out of the template, and remembered across restarts with the record.
    varying_labels: frozenset[str] = frozenset()

    @property
    def source(self) -> str:
        return f"learned from node {self.node_name} at {self.learned_at}"


@dataclass(frozen=True, slots=True)
class GroupState:
    """A node group as the cloud reports it at one moment."""

    id: str
    min_size: int
    max_size: int
    target_size: int
    instances: tuple[Instance, ...]
    template: NodeTemplate | None = None
    debug: str = ""
    #: the pool's name in the cloud's console, for people (``status``); the id is what the CA uses
    name: str = ""
    price_per_hour: float | None = None
    cloud_data: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class CloudListing:
    """The result of one full sync: every autoscaled group, and the cloud's cache hint."""

    groups: tuple[GroupState, ...]
    max_age: float | None = None  # seconds, from e.g. Cache-Control: max-age


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A Kubernetes node as the CA describes it in requests (``ExternalGrpcNode``)."""

    provider_id: str
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def fake_reason(self) -> str:
        """Non-empty for the CA's synthetic nodes of unregistered or failed instances."""
        return self.annotations.get("k8s.io/cluster-autoscaler/fake-node-reason", "")
