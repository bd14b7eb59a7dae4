"""One connection to the Kubernetes API server, shared by every enabled feature.

The ``kubernetes`` client is imported here only, and only when a feature is on: a server without
them neither loads it (about 20 MiB) nor needs any RBAC.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.config_errors import ConfigError
from server.kube.settings import KubernetesConfig

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class KubeConnection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    identity: str  # this replica's name (Lease holder, Event source instance)
    request_timeout: float

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def coordination(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self.api)

    def close(self) -> None:
        self.api.close()


def _namespace(settings: KubernetesConfig) -> str:
    if settings.namespace:
        return settings.namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def _identity(settings: KubernetesConfig) -> str:
    return settings.identity or os.environ.get("POD_NAME") or socket.gethostname()


def connect(settings: KubernetesConfig) -> KubeConnection:
    """An API client from the kubeconfig file, else from the pod's service account; ConfigError if neither."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if settings.kubeconfig:
            config.load_kube_config(config_file=settings.kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as err:
        where = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the pod's service account"
        raise ConfigError.single(
            "kubernetes.kubeconfig",
            f"cannot load the API server's address and credentials from {where}: {err}",
            "run in a pod with a service account token mounted, or set kubernetes.kubeconfig to a readable file",
        ) from None
    # One connection pool sized for the features' background threads and the RPCs that journal.
    configuration.connection_pool_maxsize = 8
    # No retries inside the HTTP library: by default it repeats a GET or PUT that timed out three times,
    # so one call could last 4 x request_timeout. Each feature decides itself whether and when to retry.
    configuration.retries = False
    return KubeConnection(
        api=client.ApiClient(configuration),
        namespace=_namespace(settings),
        identity=_identity(settings),
        request_timeout=settings.request_timeout,
    )
