"""The Bizfly HTTP surface: token endpoint, service catalog and Kubernetes Engine routes.

Handlers translate between ``SimRequest``/``SimResponse`` and the state model; they hold no state of
their own beyond the catalog settings.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from simulators.bizfly.auth import AuthRejected, TokenIssuer
from simulators.bizfly.state import BizflyState, InvalidUpdate, PoolUpdate, ResourceNotFound, iso_time
from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse

K8S_PREFIX = "/api/kubernetes-engine"
# Another region's Kubernetes Engine, where the catalog points for it: ``/<region slug>/api/kubernetes-engine``.
REGIONAL_K8S_PREFIX = "/{region_slug}" + K8S_PREFIX

# Route names, as used by fault injection and the request log.
ROUTE_TOKEN = "token"
ROUTE_CATALOG = "service_catalog"
ROUTE_LIST_CLUSTERS = "list_clusters"
ROUTE_GET_CLUSTER = "get_cluster"
ROUTE_GET_POOL = "get_pool"
ROUTE_UPDATE_POOL = "update_pool"
ROUTE_DELETE_NODE = "delete_node"


def error_body(status: int, message: str) -> dict[str, Any]:
    """Bizfly error bodies have no published schema and gobizfly never parses them (it keeps the raw text);
    ``{"message": ...}`` is the shape of the vendor's own small answers, and the status is repeated so
    logs are self-explanatory."""
    return {"message": message, "code": status}


def _region_slug(region: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", region.lower()).strip("-") or "region"


class CatalogSettings:
    """Which region strings the service catalog advertises. Thread-safe, changeable at run time."""

    def __init__(self, region: str, other_regions: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._region = region
        self._others = tuple(other_regions)

    def set(self, region: str, other_regions: Sequence[str] | None = None) -> None:
        with self._lock:
            self._region = region
            if other_regions is not None:
                self._others = tuple(other_regions)

    def get(self) -> tuple[str, tuple[str, ...]]:
        with self._lock:
            return self._region, self._others

    def services(self, base_url: str) -> list[dict[str, Any]]:
        """The catalog entries. Other regions come first, each pointing at its own Kubernetes Engine, which
        holds only the clusters a scenario puts in that region: a client that takes the first
        ``kubernetes_engine`` entry without comparing the region gets 404s instead of silently working."""
        region, others = self.get()
        entries: list[dict[str, Any]] = []
        for other in others:
            if other != region:
                entries += _region_services(other, f"{base_url}/{_region_slug(other)}/api")
        entries += _region_services(region, f"{base_url}/api")
        return entries


def _region_services(region: str, api_base: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "Cloud Server",
            "code": "CS",
            "canonical_name": "cloud_server",
            "id": 1,
            "region": region,
            "icon": "",
            "description": "Cloud Server",
            "enabled": True,
            "service_url": f"{api_base}/cloud-server",
        },
        {
            "name": "Kubernetes Engine",
            "code": "KE",
            "canonical_name": "kubernetes_engine",
            "id": 9,
            "region": region,
            "icon": "",
            "description": "Bizfly Kubernetes Engine",
            "enabled": True,
            "service_url": f"{api_base}/kubernetes-engine",
        },
        {
            "name": "Authentication",
            "code": "IAM",
            "canonical_name": "auth",
            "id": 2,
            "region": region,
            "icon": "",
            "description": "Identity and access",
            "enabled": True,
            "service_url": api_base,
        },
    ]


class BizflyApi:
    """Registers the Bizfly routes on a ``JsonApiServer`` and answers them from the state model."""

    def __init__(
        self,
        state: BizflyState,
        tokens: TokenIssuer,
        catalog: CatalogSettings,
        base_url: Callable[[], str],
    ) -> None:
        self.state = state
        self.tokens = tokens
        self.catalog = catalog
        self._base_url = base_url

    def register(self, server: JsonApiServer) -> None:
        server.route("POST", "/api/token", ROUTE_TOKEN, self.create_token)
        server.route("GET", "/api/auth/service", ROUTE_CATALOG, self.service_catalog)
        # The catalog's own region first, then the other regions it lists, each with the clusters put there.
        for prefix in (K8S_PREFIX, REGIONAL_K8S_PREFIX):
            server.route("GET", f"{prefix}/_/", ROUTE_LIST_CLUSTERS, self.list_clusters)
            server.route("GET", f"{prefix}/_", ROUTE_LIST_CLUSTERS, self.list_clusters)
            server.route("GET", f"{prefix}/_/{{cluster_uid}}", ROUTE_GET_CLUSTER, self.get_cluster)
            server.route("GET", f"{prefix}/_/{{cluster_uid}}/{{pool_id}}", ROUTE_GET_POOL, self.get_pool)
            server.route("PATCH", f"{prefix}/_/{{cluster_uid}}/{{pool_id}}", ROUTE_UPDATE_POOL, self.update_pool)
            server.route(
                "DELETE", f"{prefix}/_/{{cluster_uid}}/{{pool_id}}/{{node_id}}", ROUTE_DELETE_NODE, self.delete_node
            )

    # ----- auth -----------------------------------------------------------------------------------------
    def create_token(self, request: SimRequest) -> SimResponse:
        # A stale X-Auth-Token, X-Project-ID and the old X-Tenant-* headers arrive here too (gobizfly sends
        # them on a login); they are ignored: the body's project_id scopes the token.
        try:
            issued = self.tokens.issue(request.body)
        except AuthRejected as exc:
            raise SimError(401, str(exc)) from exc
        expires = iso_time(issued.expires_at)
        return SimResponse(
            200,
            {
                "token": issued.token,
                "expires_at": expires,
                "expire_at": expires,  # the newer gobizfly's spelling
                "project_id": issued.project_id,
                "project_name": self.tokens.projects.get(issued.project_id, ""),
            },
        )

    def service_catalog(self, _request: SimRequest) -> SimResponse:
        # Deliberately unauthenticated: upstream fetches it with no headers at all.
        return SimResponse(200, {"services": self.catalog.services(self._base_url())})

    def _authenticate(self, request: SimRequest) -> str:
        """Check the credentials; the project the call acts in: ``X-Project-ID`` when the client sends one
        (as the current vendor client does), else the token's. The old ``X-Tenant-*`` headers are ignored."""
        headers = request.headers
        # The newer gobizfly sends application credentials on every call instead of a token.
        if headers.get("x-auth-type") == "application_credential":
            credential_id = headers.get("x-app-credential-id", "")
            secret = headers.get("x-app-credential-secret", "")
            if credential_id and secret and self.tokens.app_credential_valid(credential_id, secret):
                return self._project(headers.get("x-project-id") or self.tokens.default_project)
            raise SimError(401, "Invalid application credential")
        try:
            issued = self.tokens.check(headers.get("x-auth-token"))
        except AuthRejected as exc:
            raise SimError(401, str(exc)) from exc
        return self._project(headers.get("x-project-id") or issued.project_id)

    def _project(self, project_id: str) -> str:
        if self.tokens.projects and project_id not in self.tokens.projects:
            raise SimError(403, f"You are not allowed to act in project {project_id}")
        return project_id

    # ----- regions ----------------------------------------------------------------------------------------
    def _serves(self, request: SimRequest) -> Callable[[str], bool]:
        """Which clusters (by their ``region``) the endpoint a request reached holds. The path of a region the
        catalog does not list is not served (404, as before regions had endpoints of their own)."""
        own, others = self.catalog.get()
        slug = request.params.get("region_slug")
        if slug is None:
            return lambda region: not region or _region_slug(region) == _region_slug(own)
        if slug not in {_region_slug(other) for other in others if other != own}:
            raise SimError(404, f"no route for {request.method} {request.path}")
        return lambda region: bool(region) and _region_slug(region) == slug

    def _in_region(self, request: SimRequest) -> None:
        """A cluster put in another region than the endpoint's is not found there."""
        region = self.state.cluster_region(request.params["cluster_uid"])
        if region is not None and not self._serves(request)(region):
            raise SimError(404, f"Cluster {request.params['cluster_uid']} not found")

    # ----- Kubernetes Engine ----------------------------------------------------------------------------
    def list_clusters(self, request: SimRequest) -> SimResponse:
        project = self._authenticate(request)
        return SimResponse(200, {"clusters": self.state.list_clusters_json(project, self._serves(request))})

    def get_cluster(self, request: SimRequest) -> SimResponse:
        project = self._authenticate(request)
        self._in_region(request)
        with state_errors():
            return SimResponse(200, self.state.cluster_json(request.params["cluster_uid"], project))

    def get_pool(self, request: SimRequest) -> SimResponse:
        project = self._authenticate(request)
        self._in_region(request)
        params = request.params
        with state_errors():
            return SimResponse(200, self.state.pool_json(params["cluster_uid"], params["pool_id"], project))

    def update_pool(self, request: SimRequest) -> SimResponse:
        project = self._authenticate(request)
        self._in_region(request)
        with state_errors():
            # ``{}`` is what gobizfly sends for a target of 0 (omitempty); it is a valid no-op.
            update = PoolUpdate.from_json(request.body)
            body = self.state.update_pool(request.params["cluster_uid"], request.params["pool_id"], update, project)
            return SimResponse(200, body)

    def delete_node(self, request: SimRequest) -> SimResponse:
        project = self._authenticate(request)
        self._in_region(request)
        force = request.query.get("force", "").lower() in ("true", "1", "yes")
        params = request.params
        with state_errors():
            self.state.delete_node(
                params["cluster_uid"], params["pool_id"], params["node_id"], force=force, project_id=project
            )
        return SimResponse(202, {"message": f"Deleting node {params['node_id']}", "force": force})


@contextlib.contextmanager
def state_errors() -> Iterator[None]:
    """Translate state-model errors into API answers."""
    try:
        yield
    except ResourceNotFound as exc:
        raise SimError(404, f"{exc.kind.capitalize()} {exc.resource_id} not found") from exc
    except InvalidUpdate as exc:
        raise SimError(400, str(exc)) from exc
