"""Start the Kubernetes features the config switches on, and stop them with the server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from providers.registry import Registry
from server.kube.client import KubeConnection, connect
from server.kube.settings import KubernetesConfig

if TYPE_CHECKING:
    from server.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass
class KubeFeatures:
    """The running features; ``stop`` ends them in reverse start order, then closes the connection."""

    connection: KubeConnection
    stoppers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            try:
                stop()
            except Exception:  # one feature failing to stop must not keep the others running
                log.exception("stopping a Kubernetes feature failed")
        self.stoppers.clear()
        self.connection.close()


def start_features(
    settings: KubernetesConfig, registry: Registry, metrics: Metrics | None = None
) -> KubeFeatures | None:
    """None when no feature is on (the ``kubernetes`` client is then never imported)."""
    if not settings.any_enabled:
        return None
    features = KubeFeatures(connect(settings))
    log.info(
        "Kubernetes features on",
        extra={"namespace": features.connection.namespace, "identity": features.connection.identity},
    )
    if settings.journal.enabled:
        from server.kube.journal import start_journal

        observe = metrics.journal_operation if metrics is not None else None
        features.stoppers.append(start_journal(features.connection, settings.journal, registry, observe))
    return features
