"""HTTP client for the Bizfly Kubernetes Engine API (the calls upstream's gobizfly makes, made safely).

Calls (docs/reference/bizfly.md, "Endpoints used"), relative to the Kubernetes Engine endpoint:

* ``GET    /_/{cluster}``                 the cluster with its worker pools (bare object)
* ``GET    /_/{cluster}/{pool}``          one pool with its nodes (bare object)
* ``PATCH  /_/{cluster}/{pool}``          ``{"desired_size": N}``; N is sent even when 0 (upstream's
  ``omitempty`` turned a 0 target into ``{}``, a no-op, so scale to 0 never reached the cloud)
* ``DELETE /_/{cluster}/{pool}/{node}``   no ``?force=true``: the vendored upstream client never sends
  it (only a newer gobizfly did, briefly), and the CA has already drained the node itself

The endpoint is ``kubernetes_engine_url`` when configured, else the ``service_url`` of the service
catalog entry ``kubernetes_engine`` whose region matches after normalisation (regions.py). The
catalog (``<api_url>/api/auth/service``) needs no credentials, as upstream, and is read once.

Every call has a deadline, bounded retries, a circuit breaker (providers/http_transport.py) and the
current vendor client's headers: ``X-Auth-Token``, ``X-Auth-Type: token`` and ``X-Project-ID`` (auth.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from providers.bizfly.auth import TokenSource, base_of, using_deadline
from providers.bizfly.config import BizflyConfig, catalog_url
from providers.bizfly.regions import normalize_region, same_region
from providers.deadline import RESPONSE_MARGIN, Deadline
from providers.errors import CloudRequestRejected, CloudUnavailable, DeadlineTooShort
from providers.http_transport import BreakerSettings, HttpTransport, RetryPolicy

log = logging.getLogger(__name__)

CLOUD = "bizfly"
# Each transport is named by the API it calls (the ``api`` label of the cloud API metrics).
API_KUBERNETES_ENGINE = CLOUD
API_TOKEN = f"{CLOUD}-token"
API_CATALOG = f"{CLOUD}-catalog"
USER_AGENT = "ca-externalgrpc-server/0.2 (bizfly)"
KUBERNETES_ENGINE_SERVICE = "kubernetes_engine"
# Endpoint names for metrics and messages. The Kubernetes Engine paths (/_/{cluster}/{pool}/{node})
# say little to a person reading a dashboard, so each call is named after what it reads or writes.
CLUSTER_ENDPOINT = "cluster"
CLUSTERS_ENDPOINT = "cluster list"
POOL_ENDPOINT = "worker pool"
POOL_NODE_ENDPOINT = "worker pool node"
# The token endpoint is retried less: a login that keeps failing must cost few requests.
TOKEN_RETRY = RetryPolicy(attempts=2)


def error_message(status: int, body: Any) -> str:
    """The human part of a Bizfly error body; its schema is undocumented, ``message`` is common."""
    if isinstance(body, Mapping):
        for key in ("message", "error", "detail", "description"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, Mapping) and isinstance(value.get("message"), str):
                return str(value["message"])
    return body if isinstance(body, str) else ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _segment(value: str) -> str:
    # Upstream joins ids unescaped; an id with "/" (e.g. a tampered node label) must not change the path.
    return quote(value, safe="")


class BizflyClient:
    """The four Kubernetes Engine calls the backend needs, plus token and catalog handling."""

    def __init__(
        self,
        config: BizflyConfig,
        *,
        retry: RetryPolicy | None = None,
        breaker: BreakerSettings = BreakerSettings(),  # noqa: B008 - frozen, immutable default
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        token_refresh_margin: float | None = None,
        token_failure_cooldown: float | None = None,
    ) -> None:
        self.config = config
        self._transport_args: dict[str, Any] = {
            "user_agent": USER_AGENT,
            "error_message": error_message,
            "breaker": breaker,
            "max_timeout": config.request_timeout,
            "clock": clock,
            "sleep": sleep,
            "secrets": config.secrets,
        }
        retry = retry or RetryPolicy(attempts=config.max_attempts)
        self._retry = retry
        self._token_transport = HttpTransport(
            API_TOKEN, base_of(config.token_url), retry=TOKEN_RETRY, **self._transport_args
        )
        self._catalog_transport = HttpTransport(
            API_CATALOG, base_of(config.api_url), retry=retry, **self._transport_args
        )
        options: dict[str, Any] = {}
        if token_refresh_margin is not None:
            options["refresh_margin"] = token_refresh_margin
        if token_failure_cooldown is not None:
            options["failure_cooldown"] = token_failure_cooldown
        self.tokens = TokenSource(
            config, self._token_transport, clock=clock, wall_clock=wall_clock, on_token=self._add_secret, **options
        )
        self._lock = threading.Lock()
        self._api: HttpTransport | None = None
        self._api_prefix = ""
        self._engines: list[tuple[str, str]] | None = None  # the catalog's Kubernetes Engine entries
        self._metrics: Any = None
        self._write_gate: Callable[[str], float | None] | None = None

    # ------------------------------------------------------------------ the four calls
    def get_cluster(self, deadline: Deadline) -> Any:
        return self._call("GET", f"/_/{_segment(self.config.cluster_name)}", CLUSTER_ENDPOINT, deadline).body

    def list_clusters(self, deadline: Deadline) -> Any:
        """``GET <k8s>/_/``: the clusters of the project (``{"clusters": [...]}``); read by ``validate --online``
        only, to tell a wrong cluster UID apart from a wrong endpoint."""
        return self._call("GET", "/_/", CLUSTERS_ENDPOINT, deadline).body

    def get_cluster_at(self, url: str, deadline: Deadline) -> Any:
        """The configured cluster as the Kubernetes Engine at ``url`` (another region's) answers for it."""
        api, prefix = self._engine_transport(url)
        try:
            with using_deadline(deadline):
                path = f"{prefix}/_/{_segment(self.config.cluster_name)}"
                return api.request("GET", path, endpoint=CLUSTER_ENDPOINT, deadline=deadline).body
        finally:
            api.close()

    def get_pool(self, pool_id: str, deadline: Deadline) -> Any:
        path = f"/_/{_segment(self.config.cluster_name)}/{_segment(pool_id)}"
        return self._call("GET", path, POOL_ENDPOINT, deadline).body

    # The two writes: a 2xx answer with an empty body or JSON is done (no public client reads these answers);
    # one with another body is an unknown outcome the backend reads back (providers/http_transport.py).
    def set_desired_size(self, pool_id: str, size: int, deadline: Deadline) -> None:
        path = f"/_/{_segment(self.config.cluster_name)}/{_segment(pool_id)}"
        self._call("PATCH", path, POOL_ENDPOINT, deadline, json_body={"desired_size": int(size)})

    def delete_node(self, pool_id: str, node_id: str, deadline: Deadline) -> None:
        path = f"/_/{_segment(self.config.cluster_name)}/{_segment(pool_id)}/{_segment(node_id)}"
        self._call("DELETE", path, POOL_NODE_ENDPOINT, deadline)

    # ------------------------------------------------------------------ plumbing
    def _call(
        self,
        method: str,
        path: str,
        endpoint: str,
        deadline: Deadline,
        json_body: Any = None,
    ) -> Any:
        with using_deadline(deadline):
            api = self._api_transport(deadline)
            return api.request(
                method,
                self._api_prefix + path,
                endpoint=endpoint,
                deadline=deadline,
                json_body=json_body,
            )

    def _api_transport(self, deadline: Deadline) -> HttpTransport:
        api = self._api
        if api is not None:
            return api
        # The first calls may wait for another caller's catalog lookup, but never past their deadline.
        if not self._lock.acquire(timeout=max(deadline.remaining() - RESPONSE_MARGIN, 0.0)):
            raise DeadlineTooShort(
                "the Bizfly service catalog lookup of another call did not finish within this call's deadline; "
                "retry shortly"
            )
        try:
            return self._api_transport_locked(deadline)
        finally:
            self._lock.release()

    def _api_transport_locked(self, deadline: Deadline) -> HttpTransport:
        if self._api is not None:
            return self._api
        url = self.config.kubernetes_engine_url or self._catalog_lookup(deadline)
        api, prefix = self._engine_transport(url)
        if self._metrics is not None:
            api.instrument(self._metrics)
        if self._write_gate is not None:  # before publishing it: no write may go out ungated
            api.guard_writes(self._write_gate)
        # The prefix first: callers read ``_api`` without the lock and then use the prefix.
        self._api_prefix = prefix
        self._api = api
        return api

    def _engine_transport(self, url: str) -> tuple[HttpTransport, str]:
        """A transport to the Kubernetes Engine at ``url``, and the path every call there is prefixed with: the
        URL carries a path (…/api/kubernetes-engine), the transport gets the scheme and host."""
        api = HttpTransport(
            API_KUBERNETES_ENGINE, base_of(url), auth=self.tokens.headers, retry=self._retry, **self._transport_args
        )
        return api, url[len(base_of(url)) :].rstrip("/")

    def kubernetes_engines(self, deadline: Deadline) -> list[tuple[str, str]]:
        """``(region, service_url)`` of every ``kubernetes_engine`` entry of the service catalog, in its order;
        read once."""
        if self._engines is not None:
            return self._engines
        url = catalog_url(self.config.api_url)
        response = self._catalog_transport.request(
            "GET", url[len(base_of(url)) :], endpoint="/api/auth/service", deadline=deadline
        )
        services = response.body.get("services") if isinstance(response.body, Mapping) else None
        if not isinstance(services, list):
            raise CloudUnavailable(
                f"malformed answer from the Bizfly service catalog {url}: no 'services' list; check api_url"
            )
        self._engines = [
            (str(entry.get("region") or ""), _text(entry.get("service_url")).rstrip("/"))
            for entry in services
            if isinstance(entry, Mapping) and entry.get("canonical_name") == KUBERNETES_ENGINE_SERVICE
        ]
        return self._engines

    def _catalog_lookup(self, deadline: Deadline) -> str:
        engines = self.kubernetes_engines(deadline)
        for region, service_url in engines:
            if same_region(region, self.config.region) and service_url:
                log.info(
                    "Bizfly Kubernetes Engine endpoint found in the service catalog",
                    extra={"cloud": CLOUD, "region": normalize_region(region), "endpoint_url": service_url},
                )
                return service_url
        # Upstream silently falls back to a URL that is not the Kubernetes Engine (docs/reference/bizfly.md, "Regions").
        offered = ", ".join(region for region, _ in engines) or "none"
        raise CloudRequestRejected(
            f"the Bizfly service catalog at {catalog_url(self.config.api_url)} has no {KUBERNETES_ENGINE_SERVICE} "
            f"endpoint for region {self.config.region!r} (regions offered: {offered}); set region to one of "
            "them, or set kubernetes_engine_url explicitly",
            status=None,
        )

    def _add_secret(self, token: str) -> None:
        for transport in (self._token_transport, self._catalog_transport, self._api):
            if transport is not None:
                transport.add_secret(token)

    def instrument(self, metrics: Any) -> None:
        self._metrics = metrics
        for transport in (self._token_transport, self._catalog_transport, self._api):
            if transport is not None:
                transport.instrument(metrics)

    def guard_writes(self, gate: Callable[[str], float | None]) -> None:
        """Every transport, including the Kubernetes Engine one made later, checks ``gate`` before a write."""
        self._write_gate = gate
        for transport in (self._token_transport, self._catalog_transport, self._api):
            if transport is not None:
                transport.guard_writes(gate)

    @property
    def breaker_state(self) -> str:
        return self._api.breaker_state if self._api is not None else self._catalog_transport.breaker_state

    def close(self) -> None:
        for transport in (self._token_transport, self._catalog_transport, self._api):
            if transport is not None:
                transport.close()
