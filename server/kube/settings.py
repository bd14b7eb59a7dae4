"""The ``kubernetes:`` section of the config file: which Kubernetes features run, and how."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator
from pydantic_core import InitErrorDetails

from providers.config_values import (
    ConfigModel,
    Flag,
    duration,
    duration_seconds,
    format_duration,
    problem,
    rule_error,
    whole_number,
)

# A Kubernetes object name (DNS-1123 subdomain, kept to the label form every kind accepts).
_OBJECT_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


def _seconds_or_none(value: Any) -> float | None:
    """A duration's seconds for a cross rule; None when the value is wrong (its own check reports it)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)  # a model built in code passes seconds
    try:
        return duration_seconds(value)
    except Exception:  # noqa: BLE001 - the field's own validation names the mistake
        return None


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
    """Two or more replicas: only the holder of the Lease writes to the clouds and answers the CA; the
    others keep their snapshots warm and fail `/readyz`."""
    lease_name: str = "ca-externalgrpc"
    """The `coordination.k8s.io` Lease the replicas compete for."""
    lease_duration: duration(2, 600) = 15.0  # type: ignore[valid-type]
    """How long a Lease nobody renews stays taken before another replica may take it over."""
    renew_deadline: duration(1, 600) = 10.0  # type: ignore[valid-type]
    """The leader stops writing when it could not renew the Lease for this long; shorter than
    `lease_duration`, so it stops before another replica may take over."""
    retry_period: duration(0.1, 60) = 2.0  # type: ignore[valid-type]
    """How often a replica tries to take or renew the Lease; shorter than `renew_deadline`."""
    follower_connection_age: duration(0.5, 600) = 5.0  # type: ignore[valid-type]
    """A replica that stops leading fails `/readyz` at once and this long after sends every gRPC connection
    it holds away (GOAWAY); one that arrives later, while it still does not lead, goes 1 s after it opened.
    Long enough for the readiness probe to see the replica unready and the Service's endpoints to drop it
    (about 5s with the shipped probe), at most `lease_duration - renew_deadline`, so that the CA's
    reconnection reaches the leader."""
    _name = field_validator("lease_name", mode="before")(kube_object_name)

    @classmethod
    def cross_rules(cls, raw: Mapping[str, Any], context: Mapping[str, Any]) -> list[InitErrorDetails]:
        """retry_period < renew_deadline < lease_duration: the leader gets several renewal tries before it
        stops writing, and stops before any other replica may take the Lease over."""
        defaults = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0, "follower_connection_age": 5.0}
        seconds = {key: _seconds_or_none(raw[key]) if key in raw else value for key, value in defaults.items()}
        lease, renew, retry = seconds["lease_duration"], seconds["renew_deadline"], seconds["retry_period"]
        age = seconds["follower_connection_age"]
        errors = []
        if lease is not None and renew is not None and age is not None and renew < lease and age > lease - renew:
            errors.append(
                rule_error(
                    "follower_connection_age",
                    f"follower_connection_age ({format_duration(age)}) is longer than lease_duration - "
                    f"renew_deadline ({format_duration(lease - renew)}): after a replica cut off from the API "
                    "server stops leading, the next one may be Ready while the CA's connection is still on the "
                    "old one, whose every write is refused",
                    f"make follower_connection_age at most {format_duration(lease - renew)} (it must also cover "
                    "the readiness probe's period and timeout and the endpoints' update, about 5s with the "
                    "shipped probe), or lengthen lease_duration",
                )
            )
        if lease is not None and renew is not None and renew >= lease:
            errors.append(
                rule_error(
                    "renew_deadline",
                    f"renew_deadline ({format_duration(renew)}) is not shorter than lease_duration "
                    f"({format_duration(lease)}): another replica could take over while this one still writes",
                    "make renew_deadline shorter than lease_duration, e.g. 10s with 15s",
                )
            )
        if renew is not None and retry is not None and retry >= renew:
            errors.append(
                rule_error(
                    "retry_period",
                    f"retry_period ({format_duration(retry)}) is not shorter than renew_deadline "
                    f"({format_duration(renew)}): the leader would get no second try to renew before it steps down",
                    "make retry_period a fraction of renew_deadline, e.g. 2s with 10s",
                )
            )
        return errors


class JournalConfig(ConfigModel):
    """In-flight and unknown-outcome size changes recorded in a ConfigMap before the cloud call."""

    enabled: Flag = False
    """Record each size change in a ConfigMap before the cloud call, so that a restarted server or a new
    leader recognises the CA's retry of a change whose answer was lost instead of applying it twice."""
    configmap: str = "ca-externalgrpc-journal"
    """The ConfigMap of the journal, in `kubernetes.namespace`."""
    _name = field_validator("configmap", mode="before")(kube_object_name)


# A label or taint key, or a prefix ending in "/" that stands for every key under it.
_KEY_OR_PREFIX = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
)


def key_patterns(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise problem(
            "is not a list of label or taint keys",
            'give keys and prefixes ending in "/", e.g. [example.com/disk-type, feature.example.com/]',
        )
    bad = [item for item in value if not item or not _KEY_OR_PREFIX.match(item)]
    if bad:
        raise problem(
            f"{', '.join(repr(item) for item in bad[:5])} is not a label or taint key, nor a prefix ending in '/'",
            'write a key (example.com/disk-type) or a prefix that ends in "/" (feature.example.com/)',
        )
    return list(value)


class LearnedTemplatesConfig(ConfigModel):
    """Templates for scale-from-zero learned from the Node objects of each group's real nodes."""

    enabled: Flag = False
    """Learn each group's scale-from-zero template from the Node objects of its real nodes, and keep it in
    a ConfigMap across restarts."""
    configmap_prefix: str = "ca-externalgrpc-templates"
    """One ConfigMap per backend, `<configmap_prefix>-<backend name>`, one key per node group."""
    min_write_interval: duration(0, 3600) = 30.0  # type: ignore[valid-type]
    """A backend's ConfigMap is written at most this often (a rolling node upgrade changes many nodes)."""
    labels: list[str] = Field(default_factory=list)
    """Labels of a real node kept for its group besides the built-in list, by learned templates and, even
    when they are off, in the cloud's template from the nodes `NodeGroupForNode` shows: keys, or prefixes
    ending in `/`."""
    taints: list[str] = Field(default_factory=list)
    """Taints learned from a node (the pool's own always come from the cloud): keys, or prefixes ending in
    `/`."""
    forget_after: duration(0, 30 * 86400) = 3600.0  # type: ignore[valid-type]
    """The record of a node group the cloud has not listed for this long is deleted, in memory and in the
    ConfigMap."""
    _name = field_validator("configmap_prefix", mode="before")(kube_object_name)
    _patterns = field_validator("labels", "taints", mode="before")(key_patterns)


class EventsConfig(ConfigModel):
    """Kubernetes Events for scale actions, failed cloud writes and backends going stale or fresh."""

    enabled: Flag = False
    """Kubernetes Events for scale actions, failed cloud writes and backends going stale or fresh, and a
    status ConfigMap that `kubectl describe` shows them on."""
    object_name: str = "ca-externalgrpc-status"
    """The object the Events are about: a ConfigMap the server keeps in its namespace."""
    burst: whole_number(1, 1000, 25) = 25  # type: ignore[valid-type]
    """Events written at once for one reason and object (a token bucket), then one per
    `refill_interval`."""
    refill_interval: duration(0.1, 3600) = 10.0  # type: ignore[valid-type]
    """How often the Event token bucket gains one token."""
    aggregation_window: duration(1, 86400) = 600.0  # type: ignore[valid-type]
    """A repeat of the same reason and message within this window grows the count of the Event already
    written."""
    status_interval: duration(1, 3600) = 10.0  # type: ignore[valid-type]
    """The status ConfigMap is rewritten on change, at most once per this interval."""
    _name = field_validator("object_name", mode="before")(kube_object_name)


class KubernetesConfig(ConfigModel):
    kubeconfig: str | None = None
    """A kubeconfig file; unset: the pod's service account (in-cluster configuration)."""
    namespace: str | None = None
    """Where the Lease, the ConfigMaps and the Events live; unset: the pod's namespace, else `kube-system`."""
    identity: str | None = None
    """This replica's name in Events, the journal and refusals, and (with a suffix unique to the process) in
    the Lease; unset: `$POD_NAME`, else the host name."""
    request_timeout: duration(0.1, 60) = 5.0  # type: ignore[valid-type]
    """Each call to the Kubernetes API server gives up after this long; the feature degrades and the
    autoscaling goes on."""
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    """Two or more replicas: only the holder of a `coordination.k8s.io` Lease writes to the clouds."""
    journal: JournalConfig = Field(default_factory=JournalConfig)
    """In-flight and unknown-outcome size changes recorded in a ConfigMap before the cloud call."""
    learned_templates: LearnedTemplatesConfig = Field(default_factory=LearnedTemplatesConfig)
    """Templates for scale-from-zero learned from the Node objects of each group's real nodes."""
    events: EventsConfig = Field(default_factory=EventsConfig)
    """Kubernetes Events for scale actions, failed cloud writes and backends going stale or fresh."""

    @property
    def any_enabled(self) -> bool:
        return any(
            feature.enabled for feature in (self.leader_election, self.journal, self.learned_templates, self.events)
        )
