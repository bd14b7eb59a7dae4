"""One connection to the Kubernetes API server, shared by every enabled feature.

The ``kubernetes`` client is imported here only, and only when a feature is on: a server without
them neither loads it nor needs any RBAC.

Every feature goes through ``request``, ``request_bytes`` and ``stream_lines``: they use the client's
``ApiClient`` (kubeconfig or service-account credentials, TLS, the bearer token and its refresh, the
urllib3 pool) and hand back the answer's JSON or bytes. No generated API class (``CoreV1Api``,
``CoordinationV1Api``) and no model class is imported or built: importing one API class loads about 250
model modules, about 21 MiB of RSS (docs/evidence/kubernetes-features.md, "Memory and CPU"), and every answer would be
turned into model objects. The bodies sent are the API's JSON, written as plain dicts.

Nor is the validator the client's dynamic module loads when it happens to be installed
(``kubernetes_validate``, with jsonschema and its format checkers: 20 MiB where they are, as in a
development environment): ``_import_client`` keeps it out (docs/evidence/memory-and-cloud-requests.md).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from providers.config_errors import ConfigError
from server.kube.settings import KubernetesConfig

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "kube-system"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A request's timeout: one number (the whole call) or (connect, read), as urllib3 takes them.
Timeout = float | tuple[float, float]
Query = Sequence[tuple[str, str | int | bool]]


def core_path(resource: str, namespace: str | None = None, name: str | None = None) -> str:
    """The path of a core/v1 resource: ``core_path("configmaps", "ns", "x")`` is
    ``/api/v1/namespaces/ns/configmaps/x``; without a namespace, a cluster-scoped one (``nodes``)."""
    return _path("/api/v1", resource, namespace, name)


def group_path(group_version: str, resource: str, namespace: str | None = None, name: str | None = None) -> str:
    """The path of a resource of an API group: ``group_path("coordination.k8s.io/v1", "leases", ns, name)``."""
    return _path(f"/apis/{group_version}", resource, namespace, name)


def _path(prefix: str, resource: str, namespace: str | None, name: str | None) -> str:
    path = prefix
    if namespace is not None:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{resource}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    return path


@dataclass(frozen=True)
class KubeConnection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    identity: str  # this replica's name (Lease holder, Event source instance)
    request_timeout: float

    # ------------------------------------------------------------------ raw JSON (no models)
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: Timeout | None = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """One call; the answer's JSON object as plain dicts and lists.

        A non-2xx answer raises the client's ``ApiException`` (its subclass per status: ``status``,
        ``reason``, ``body``), as the generated API classes do; a connection failure or timeout raises
        urllib3's error. ``timeout`` defaults to ``kubernetes.request_timeout``; nothing is retried.
        """
        return self.request_with_headers(
            method, path, query=query, body=body, timeout=timeout, content_type=content_type
        )[0]

    def request_with_headers(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: Timeout | None = None,
        content_type: str = JSON,
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """As ``request``, with the answer's headers (the journal reads the API server's clock from ``Date``;
        the ``ApiException`` of a non-2xx answer carries them as ``headers``)."""
        data, headers = self._exchange(method, path, query, body, timeout, content_type)
        parsed = json.loads(data) if data else {}
        return (parsed if isinstance(parsed, dict) else {"value": parsed}), headers

    def request_bytes(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: Timeout | None = None,
        content_type: str = JSON,
    ) -> bytes:
        """As ``request``, the answer's body undecoded (for a caller that decodes only the fields it uses)."""
        return self._exchange(method, path, query, body, timeout, content_type)[0]

    def _exchange(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Mapping[str, Any] | None,
        timeout: Timeout | None,
        content_type: str,
    ) -> tuple[bytes, Mapping[str, str]]:
        response = self._send(method, path, query, body, timeout, content_type)
        try:
            return bytes(response.data), response.headers
        finally:
            response.release_conn()  # read to its end: the connection goes back to the pool

    @contextmanager
    def stream_lines(self, path: str, *, query: Query | None = None, timeout: Timeout | None = None) -> Iterator[Any]:
        """A GET whose answer is read line by line as it arrives (a watch: one JSON event per line).

        Yields an iterator of the lines (bytes, without the newline); leaving the ``with`` closes the
        connection (a stream left midway cannot be reused), which also ends a read blocked on another thread.
        """
        response = self._send("GET", path, query, None, timeout, JSON)
        try:
            yield _lines(response)
        finally:
            response.close()
            response.release_conn()

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Mapping[str, Any] | None,
        timeout: Timeout | None,
        content_type: str,
    ) -> Any:
        """Send one request; urllib3's answer with its body not read yet, or ApiException for a non-2xx one."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, _ = self.api.param_serialize(
            method,
            path,
            query_params=list(query) if query else None,
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        answer = self.api.call_api(
            method,
            url,
            header_params=headers,
            body=serialized,
            _request_timeout=self.request_timeout if timeout is None else timeout,
        )
        if not 200 <= answer.status <= 299:
            try:
                answer.read()
            finally:
                answer.response.release_conn()
            raise ApiException.from_response(http_resp=answer, body=answer.data.decode("utf-8", "replace"), data=None)
        return answer.response  # the client asks urllib3 with preload_content=False: nothing read yet

    def close(self) -> None:
        self.api.close()


def _lines(response: Any) -> Iterator[bytes]:
    """The body of a streamed urllib3 answer split at newlines, each line as soon as it is complete."""
    pending = b""
    for chunk in response.stream(64 * 1024, decode_content=True):
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line, pending = pending[:end], pending[end + 1 :]
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _namespace(settings: KubernetesConfig) -> str:
    if settings.namespace:
        return settings.namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def _identity(settings: KubernetesConfig) -> str:
    return settings.identity or os.environ.get("POD_NAME") or socket.gethostname()


# Optional packages the ``kubernetes`` package imports when they are installed, for what the server never uses:
# the dynamic client's validation of manifests against the API's schemas.
UNUSED_OPTIONAL_IMPORTS = ("kubernetes_validate",)


def _import_client() -> None:
    """Import the ``kubernetes`` package without the optional packages it would load for features no
    Kubernetes feature of this server uses (``UNUSED_OPTIONAL_IMPORTS``).

    A ``None`` in ``sys.modules`` makes an import of that name fail, so the client takes the package as
    absent, as it is in the image; the entry is taken out again at once, so that other code of the
    process (a test suite) can still import the package itself."""
    if "kubernetes" in sys.modules:
        return
    blocked = [name for name in UNUSED_OPTIONAL_IMPORTS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import kubernetes  # noqa: F401
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def connect(settings: KubernetesConfig) -> KubeConnection:
    """An API client from the kubeconfig file, else from the pod's service account; ConfigError if neither."""
    _import_client()
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
