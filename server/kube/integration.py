"""Start the Kubernetes features the config switches on, and stop them with the server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from providers.registry import Registry
from server.kube.client import KubeConnection, connect
from server.kube.leader import Election, Leadership
from server.kube.settings import KubernetesConfig

if TYPE_CHECKING:
    from server.metrics import Metrics
    from server.service import CloudProviderService

log = logging.getLogger(__name__)


@dataclass
class KubeFeatures:
    """The running features; ``stop`` ends them in reverse start order, then closes the connection."""

    connection: KubeConnection
    stoppers: list[Callable[[], None]] = field(default_factory=list)
    election: Election | None = None

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            try:
                stop()
            except Exception:  # one feature failing to stop must not keep the others running
                log.exception("stopping a Kubernetes feature failed")
        self.stoppers.clear()
        self.connection.close()


def start_features(
    settings: KubernetesConfig,
    registry: Registry,
    *,
    leadership: Leadership | None = None,
    service: CloudProviderService | None = None,
    metrics: Metrics | None = None,
    liveness: Any = None,
    start_backends: bool = True,
) -> KubeFeatures | None:
    """None when no feature is on (the ``kubernetes`` client is then never imported).

    ``leadership`` (made by the caller before it serves, so its gates hold from the first RPC) turns
    on leader election: the backends then start syncing only when this replica leads. ``service``
    tells Events of every scale action; ``metrics`` counts the features' API errors and writes.
    """
    if not settings.any_enabled:
        return None
    features = KubeFeatures(connect(settings))
    log.info(
        "Kubernetes features on",
        extra={"namespace": features.connection.namespace, "identity": features.connection.identity},
    )
    on_api_error = metrics.kube_api_error if metrics is not None else None
    # Without leader election this replica is the only one and always reports.
    leads = leadership.holds if leadership is not None else (lambda: True)
    try:
        # Learned templates first: they are loaded before the first sync, on every replica.
        if settings.learned_templates.enabled:
            from server.kube.templates import start_learning

            learner = start_learning(
                features.connection, registry, settings.learned_templates, on_api_error, leads=leads
            )
            features.stoppers.append(learner.stop)
        if settings.events.enabled:
            from prometheus_client import CollectorRegistry

            from server.kube.events import start_events

            metrics_registry = metrics.registry if metrics is not None else CollectorRegistry()
            recorder = start_events(settings.events, features.connection, registry, metrics_registry, leads=leads)
            features.stoppers.append(recorder.stop)
            if service is not None:
                service.scale_observers.append(recorder.scale_action)
        if settings.journal.enabled:
            from server.kube.journal import start_journal

            observe = metrics.journal_operation if metrics is not None else None
            features.stoppers.append(start_journal(features.connection, settings.journal, registry, observe))
        if leadership is not None:
            features.election = Election(features.connection, leadership, registry, metrics, liveness, start_backends)
            features.election.start()
            # Stopped last: the other features' final writes at a stop (the status and queued Events, the
            # learned templates, the journal's settles) are a leader's, and it keeps renewing meanwhile.
            features.stoppers.insert(0, features.election.stop)
    except BaseException:
        features.stop()
        raise
    return features
