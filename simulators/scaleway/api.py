"""The HTTP face of the simulated Kapsule: the four private autoscaler endpoints and Scaleway errors.

Endpoints and shapes are those of docs/reference/scaleway.md, "Endpoints used"; errors follow what recorded traffic
of the real API shows (docs/reference/scaleway.md, "Evidence"): the services' typed bodies (``{"message", "type",
...}``, ``resource`` named ``pool``, ``cluster``, ``node``), the gateway's bare ``{"message": ...}`` for
server errors and unknown routes, and its rate limiter's 429 with no body, no content type and no
``Retry-After``, only ``X-Envoy-Ratelimited: true``. ``Behaviour.error_shapes: typed`` brings back the
earlier model (a typed JSON body for every error, and a 429 with ``Retry-After`` and ``X-Ratelimit-*``).
Every JSON answer is ``Content-Type: application/json`` exactly, because the upstream Go client rejects
anything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse
from simulators.scaleway.state import (
    InvalidArguments,
    NotFound,
    OutOfStock,
    QuotaExceeded,
    ScalewaySimError,
    ScalewayState,
    TransientState,
)

AUTOSCALER_PREFIX = "/k8s/v1/regions/{region}/autoscaler"

# Route names, for fault injection and request-log filters.
ROUTE_LIST_POOLS = "list_pools"
ROUTE_UPDATE_POOL = "update_pool"
ROUTE_LIST_NODES = "list_nodes"
ROUTE_DELETE_NODE = "delete_node"

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    403: "permissions_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "transient_state",
    429: "too_many_requests",
    500: "internal_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


# Statuses the API gateway answers itself, in front of the services: recorded with a bare message body.
GATEWAY_STATUSES = frozenset({404, 500, 502, 503, 504})
# The one header recorded on the gateway's rate-limited answers (no Retry-After, no X-Ratelimit-*).
GATEWAY_RATE_LIMIT_HEADERS = {"X-Envoy-Ratelimited": "true"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """A typed Scaleway error body for a bare status (the ``typed`` error shapes, and 401/403/4xx always)."""
    if status == 401:
        return authentication_denied()
    body: dict[str, Any] = {"message": message, "type": _TYPE_BY_STATUS.get(status, "unknown_error")}
    if status == 403:
        body["details"] = [{"resource": "k8s", "action": "write"}]
    return body


def error_responder(shapes: Callable[[], str]) -> Callable[[int, str, dict[str, str]], SimResponse]:
    """Every error answer the server makes itself (routing, faults, rate limit), in the shapes ``shapes()``
    names: ``recorded`` (what the real gateway sends) or ``typed`` (a typed JSON body for everything)."""

    def respond(status: int, message: str, headers: dict[str, str]) -> SimResponse:
        if shapes() == "typed":
            return SimResponse(status, error_body(status, message), headers)
        if status == 429:
            return SimResponse(429, None, headers, content_type=None)
        if status in GATEWAY_STATUSES:
            return SimResponse(status, {"message": message}, headers)
        return SimResponse(status, error_body(status, message), headers)

    return respond


def rate_limit_headers_for(shapes: Callable[[], str]) -> Callable[[int, float], dict[str, str]]:
    def headers(remaining: int, reset_in: float) -> dict[str, str]:
        if shapes() == "typed":
            return {"Retry-After": str(max(0, math.ceil(reset_in))), **rate_limit_headers(remaining, reset_in)}
        return dict(GATEWAY_RATE_LIMIT_HEADERS)

    return headers


def authentication_denied(reason: str = "invalid_argument") -> dict[str, Any]:
    return {
        "message": "authentication is denied",
        "method": "api_key",
        "reason": reason,
        "type": "denied_authentication",
    }


def permissions_denied() -> dict[str, Any]:
    """The IAM refusal as recorded (403; ``details`` is empty or names a resource and an action)."""
    return {"details": [], "message": "insufficient permissions", "type": "permissions_denied"}


def rate_limit_headers(remaining: int, reset_in: float) -> dict[str, str]:
    # Scaleway's Go SDK reads these next to Retry-After on a 429.
    return {"X-Ratelimit-Remaining": str(remaining), "X-Ratelimit-Reset": str(max(1, int(reset_in + 0.999)))}


def as_sim_error(exc: ScalewaySimError) -> SimError:
    body: dict[str, Any]
    if isinstance(exc, NotFound):
        body = {
            "message": "resource is not found",
            "resource": exc.resource,
            "resource_id": exc.resource_id,
            "type": "not_found",
        }
        return SimError(404, str(exc), body=body)
    if isinstance(exc, InvalidArguments):
        details = [
            {"argument_name": p.argument_name, "reason": p.reason, "help_message": p.help_message} for p in exc.problems
        ]
        return SimError(
            400, str(exc), body={"message": "invalid argument(s)", "type": "invalid_arguments", "details": details}
        )
    if isinstance(exc, TransientState):
        body = {
            "message": "resource is in a transient state",
            "resource": exc.resource,
            "resource_id": exc.resource_id,
            "current_state": exc.current_state,
            "type": "transient_state",
        }
        return SimError(409, str(exc), body=body)
    if isinstance(exc, QuotaExceeded):
        body = {
            "message": "quota(s) exceeded for this resource",
            "type": "quotas_exceeded",
            "details": [{"resource": exc.resource, "quota": exc.quota, "current": exc.current}],
        }
        return SimError(403, str(exc), body=body)
    if isinstance(exc, OutOfStock):
        return SimError(
            503,
            str(exc),
            body={"message": "resource is out of stock", "resource": exc.resource, "type": "out_of_stock"},
        )
    return SimError(500, str(exc))


def int_argument(query: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidArguments.single(name, "constraint", f"{name} must be an integer {bound}") from None
    return value


class ScalewayApi:
    """Registers the autoscaler routes on a ``JsonApiServer`` and serves them from a ``ScalewayState``."""

    def __init__(self, state: ScalewayState, secret_key: str) -> None:
        self.state = state
        self.secret_key = secret_key

    def register(self, server: JsonApiServer) -> None:
        private = self.private
        server.route(
            "GET", AUTOSCALER_PREFIX + "/clusters/{cluster_id}/pools", ROUTE_LIST_POOLS, private(self.list_pools)
        )
        server.route("PATCH", AUTOSCALER_PREFIX + "/pools/{pool_id}", ROUTE_UPDATE_POOL, private(self.update_pool))
        server.route(
            "GET", AUTOSCALER_PREFIX + "/clusters/{cluster_id}/nodes", ROUTE_LIST_NODES, private(self.list_nodes)
        )
        server.route("DELETE", AUTOSCALER_PREFIX + "/nodes/{node_id}", ROUTE_DELETE_NODE, private(self.delete_node))

    def private(self, handler: Callable[[SimRequest], SimResponse]) -> Callable[[SimRequest], SimResponse]:
        """An autoscaler route: the key is checked first (401), then ``Behaviour.private_endpoints`` decides
        whether the private endpoints serve an accepted key or refuse it with Scaleway's recorded IAM 403."""

        def serve(request: SimRequest) -> SimResponse:
            self.authenticate(request)
            if self.state.behaviour.private_endpoints == "refused":
                raise SimError(403, "insufficient permissions", body=permissions_denied())
            return handler(request)

        return serve

    # -- common checks ------------------------------------------------------------------------------

    def authenticate(self, request: SimRequest) -> None:
        token = request.headers.get("x-auth-token")
        if token != self.secret_key:
            reason = "not_found" if token else "invalid_argument"
            raise SimError(401, "authentication is denied", body=authentication_denied(reason))

    def _check_region(self, region: str) -> None:
        if not self.state.known_region(region):
            raise as_sim_error(NotFound("region", region))

    def paging(self, request: SimRequest) -> tuple[int, int]:
        behaviour = self.state.behaviour
        page = int_argument(request.query, "page", 1, 1, None)
        page_size = int_argument(request.query, "page_size", behaviour.default_page_size, 1, behaviour.max_page_size)
        return page, page_size

    def list_headers(self) -> dict[str, str]:
        max_age = self.state.behaviour.cache_max_age
        return {} if max_age is None else {"Cache-Control": f"max-age={max_age}"}

    def guarded(self, request: SimRequest, operation: Any) -> SimResponse:
        self.authenticate(request)
        try:
            self._check_region(request.params["region"])
            return operation()
        except ScalewaySimError as exc:
            raise as_sim_error(exc) from exc

    # -- endpoints -------------------------------------------------------------------------------------

    def list_pools(self, request: SimRequest) -> SimResponse:
        def run() -> SimResponse:
            page, page_size = self.paging(request)
            result = self.state.list_pools(request.params["region"], request.params["cluster_id"], page, page_size)
            items = result.items if result.items or not self.state.behaviour.null_empty_pages else None
            return SimResponse(200, {"pools": items, "total_count": result.total_count}, self.list_headers())

        return self.guarded(request, run)

    def list_nodes(self, request: SimRequest) -> SimResponse:
        def run() -> SimResponse:
            page, page_size = self.paging(request)
            result = self.state.list_nodes(request.params["region"], request.params["cluster_id"], page, page_size)
            items = result.items if result.items or not self.state.behaviour.null_empty_pages else None
            return SimResponse(200, {"nodes": items, "total_count": result.total_count}, self.list_headers())

        return self.guarded(request, run)

    def update_pool(self, request: SimRequest) -> SimResponse:
        def run() -> SimResponse:
            body = request.body
            if not isinstance(body, dict) or "size" not in body:
                raise InvalidArguments.single("size", "required", 'body must be {"size": <integer>}')
            size = body["size"]
            if isinstance(size, bool) or not isinstance(size, int):
                raise InvalidArguments.single("size", "invalid_type", "size must be an integer")
            return SimResponse(
                200, self.state.update_pool_size(request.params["region"], request.params["pool_id"], size)
            )

        return self.guarded(request, run)

    def delete_node(self, request: SimRequest) -> SimResponse:
        def run() -> SimResponse:
            return SimResponse(200, self.state.delete_node(request.params["region"], request.params["node_id"]))

        return self.guarded(request, run)
