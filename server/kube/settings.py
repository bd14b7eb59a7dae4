"""The ``kubernetes:`` section of the config file: which Kubernetes features run, and how."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from providers.config_values import ConfigModel, Flag, duration, problem, whole_number

# A Kubernetes object name (DNS-1123 subdomain, kept to the label form every kind accepts).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


def kube_object_name(value: Any) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not _OBJECT_NAME.match(text):
        raise problem(
            f"{value!r} is not a Kubernetes object name",
            "use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        )
    return text


class LeaderElectionConfig(ConfigModel):
    """Two or more replicas: only the holder of a coordination.k8s.io Lease writes to the clouds."""

    enabled: Flag = False
    lease_name: str = "ca-externalgrpc"
    lease_duration: duration(2, 600) = 15.0  # type: ignore[valid-type]
    renew_deadline: duration(1, 600) = 10.0  # type: ignore[valid-type]
    retry_period: duration(0.1, 60) = 2.0  # type: ignore[valid-type]
    _name = field_validator("lease_name", mode="before")(kube_object_name)


class JournalConfig(ConfigModel):
    """In-flight and unknown-outcome size changes recorded in a ConfigMap before the cloud call."""

    enabled: Flag = False
    configmap: str = "ca-externalgrpc-journal"
    _name = field_validator("configmap", mode="before")(kube_object_name)


class LearnedTemplatesConfig(ConfigModel):
    """Templates for scale-from-zero learned from the Node objects of each group's real nodes."""

    enabled: Flag = False
    configmap_prefix: str = "ca-externalgrpc-templates"
    _name = field_validator("configmap_prefix", mode="before")(kube_object_name)


class EventsConfig(ConfigModel):
    """Kubernetes Events for scale actions, failed cloud writes and backends going stale or fresh."""

    enabled: Flag = False
    # The object the Events are about (a ConfigMap the server keeps in its namespace).
    object_name: str = "ca-externalgrpc-status"
    # Token bucket per (reason, object): at most ``burst`` API writes at once, then one per refill_interval.
    burst: whole_number(1, 1000, 25) = 25  # type: ignore[valid-type]
    refill_interval: duration(0.1, 3600) = 10.0  # type: ignore[valid-type]
    # A repeat of the same reason and message within this window grows the existing Event's count.
    aggregation_window: duration(1, 86400) = 600.0  # type: ignore[valid-type]
    # The status ConfigMap is rewritten on change, at most once per this interval.
    status_interval: duration(1, 3600) = 10.0  # type: ignore[valid-type]
    _name = field_validator("object_name", mode="before")(kube_object_name)


class KubernetesConfig(ConfigModel):
    # A kubeconfig file; unset: the pod's service account (in-cluster configuration).
    kubeconfig: str | None = None
    # Where the Lease, ConfigMaps and Events live; unset: the pod's namespace, else kube-system.
    namespace: str | None = None
    # This replica's name in the Lease and in Events; unset: $POD_NAME, else the host name.
    identity: str | None = None
    # Each call to the API server gives up after this long.
    request_timeout: duration(0.1, 60) = 5.0  # type: ignore[valid-type]
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    journal: JournalConfig = Field(default_factory=JournalConfig)
    learned_templates: LearnedTemplatesConfig = Field(default_factory=LearnedTemplatesConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)

    @property
    def any_enabled(self) -> bool:
        return any(
            feature.enabled for feature in (self.leader_election, self.journal, self.learned_templates, self.events)
        )
