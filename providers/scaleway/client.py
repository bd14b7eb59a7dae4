"""Scaleway Kapsule API client, in either mode of the ``scaleway:`` config
(docs/reference/scaleway.md, "Endpoints used"):

- ``private``: the ``/k8s/v1/regions/{region}/autoscaler/`` endpoints the CA's own Scaleway provider uses;
  they carry the per-pool template data (capacity, allocatable, labels, taints as a map, hourly price);
- ``public``: Kapsule's public, documented pool and node endpoints (the ones Scaleway's SDKs call), and the
  Instance API's product catalog (``/instance/v1/zones/{zone}/products/servers``) for what a node type is
  made of and costs. The read calls here (pools, one pool, nodes, the catalog) are all a check of the
  credentials needs.

Both modes share the paging, the records and the error handling. This module only speaks HTTP and turns
JSON into frozen records; the node-group logic lives in ``adapter.py``.

Differences from upstream's client, on purpose:
- pagination follows ``total_count`` (and still stops on an empty or short page), and removes
  duplicates a concurrent change can cause between pages;
- error bodies are read (``{"message", "type", ...}``) so messages say why the cloud refused;
- ``application/json; charset=utf-8`` is accepted; a non-JSON 5xx is still a server-side failure;
- timeouts come from the caller's deadline, retries/backoff/breaker from ``HttpTransport``.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from providers.deadline import Deadline
from providers.errors import CloudUnavailable, InvalidRequest
from providers.http_transport import BreakerSettings, HttpTransport, JsonResponse, RetryPolicy
from providers.scaleway.config import ScalewayConfig

log = logging.getLogger(__name__)

PROJECT_USER_AGENT = "ca-externalgrpc-server/0.2.0"
PAGE_SIZE = 100
# A listing longer than this many pages is a cloud bug or a moving target, not a cluster.
MAX_PAGES = 500

# The Instance API's product list answers 50 types a page unless asked (recorded), at most 100.
CATALOG_PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class Routes:
    """The four Kapsule endpoints of one mode (``{region}``, ``{cluster_id}``, ``{pool_id}``, ``{node_id}``)."""

    pools: str
    nodes: str
    pool: str
    node: str


PRIVATE_ROUTES = Routes(
    pools="/k8s/v1/regions/{region}/autoscaler/clusters/{cluster_id}/pools",
    nodes="/k8s/v1/regions/{region}/autoscaler/clusters/{cluster_id}/nodes",
    pool="/k8s/v1/regions/{region}/autoscaler/pools/{pool_id}",
    node="/k8s/v1/regions/{region}/autoscaler/nodes/{node_id}",
)
PUBLIC_ROUTES = Routes(
    pools="/k8s/v1/regions/{region}/clusters/{cluster_id}/pools",
    nodes="/k8s/v1/regions/{region}/clusters/{cluster_id}/nodes",
    pool="/k8s/v1/regions/{region}/pools/{pool_id}",
    node="/k8s/v1/regions/{region}/nodes/{node_id}",
)
SERVER_TYPES_ROUTE = "/instance/v1/zones/{zone}/products/servers"
# Kapsule zones look like fr-par-1, nl-ams-3.
_ZONE = re.compile(r"^[a-z]{2}-[a-z0-9]{2,8}-[0-9]{1,2}$")


@dataclass(frozen=True, slots=True)
class Pool:
    """One Kapsule pool as either endpoint describes it (the public one sends no capacity, allocatable or
    price, and ``tags``, ``root_volume_size`` and ``kubelet_args`` besides)."""

    id: str
    name: str
    status: str
    version: str
    node_type: str
    autoscaling: bool
    size: int
    min_size: int
    max_size: int
    zone: str
    node_price_per_hour: float | None
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    labels: Mapping[str, str]
    taints: Mapping[str, str]  # key -> "value:Effect" or "Effect"
    tags: tuple[str, ...] = ()
    root_volume_size: int | None = None  # bytes
    max_pods: int | None = None  # kubelet_args.maxPods, when the pool sets it


@dataclass(frozen=True, slots=True)
class ServerType:
    """One commercial type of the Instance product catalog."""

    name: str  # the commercial type, e.g. PRO2-XXS
    cpus: int
    memory: int  # bytes
    gpus: int
    gpu_name: str  # gpu_info.gpu_name, e.g. L4; "" without GPUs
    arch: str  # x86_64, arm64, arm
    hourly_price: float | None  # EUR


@dataclass(frozen=True, slots=True)
class Node:
    """One Kapsule node. ``provider_id`` may be empty while it is created."""

    id: str
    pool_id: str
    provider_id: str
    name: str
    status: str
    error_message: str


@dataclass(frozen=True, slots=True)
class Listing:
    items: tuple[Any, ...]
    max_age: float | None  # smallest Cache-Control max-age seen on the pages, None when none sent


def parse_cache_control(value: str | None) -> float | None:
    """``max-age`` seconds of a Cache-Control header; None when absent or unreadable.

    Same reading as upstream (first ``max-age`` directive, whole seconds), but an unreadable value
    means "no hint" (the Backend then uses its configured default) rather than a fixed 60 s.
    """
    if not value:
        return None
    for directive in value.split(","):
        directive = directive.strip()
        if not directive.lower().startswith("max-age"):
            continue
        _, _, number = directive.partition("=")
        number = number.strip().strip('"')
        if not number.isdigit():
            return None
        return float(int(number))
    return None


def scaleway_error_message(status: int, body: Any) -> str:
    """Turn a Scaleway JSON error body (``{"message", "type", ...}``) into one readable line."""
    if not isinstance(body, Mapping):
        return str(body)[:300] if body else ""
    message = str(body.get("message") or "").strip()
    error_type = str(body.get("type") or "").strip()
    parts = [f"{error_type}: {message}" if error_type and message else error_type or message]
    details = body.get("details")
    if isinstance(details, list):
        for item in details[:5]:
            if not isinstance(item, Mapping):
                continue
            if "argument_name" in item:
                why = f"{item.get('reason', '')} {item.get('help_message', '')}".strip()
                parts.append(f"argument {item.get('argument_name')}: {why}")
            elif "quota" in item:
                parts.append(
                    f"quota of {item.get('resource')}: {item.get('current')} used of {item.get('quota')} allowed"
                )
            elif "action" in item:
                parts.append(f"no permission to {item.get('action')} {item.get('resource')}")
    if body.get("current_state"):
        parts.append(f"{body.get('resource', 'resource')} is {body['current_state']}")
    if isinstance(body.get("fields"), Mapping):
        for name, problems in list(body["fields"].items())[:5]:
            parts.append(f"field {name}: {problems}")
    return "; ".join(p for p in parts if p)


def is_auth_failure(status: int, body: Any) -> bool:
    """Scaleway answers 403 ``quotas_exceeded`` when a scale-up needs more than the project's quota:
    a refusal of this request, not of the credentials (``permissions_denied`` is a credentials one)."""
    return not (status == 403 and isinstance(body, Mapping) and body.get("type") == "quotas_exceeded")


class ScalewayClient:
    """The four Kapsule endpoints of the configured mode (and, public, one pool and the catalog) on one
    HttpTransport. Thread-safe (the transport is)."""

    def __init__(
        self,
        config: ScalewayConfig,
        *,
        transport_factory: Callable[..., HttpTransport] = HttpTransport,
        breaker: BreakerSettings = BreakerSettings(),  # noqa: B008 - frozen, immutable default
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        secret = config.secret_key
        self.transport = transport_factory(
            "scaleway",
            config.api_url,
            user_agent=f"{PROJECT_USER_AGENT} cluster-id/{config.cluster_id}",
            # A static key: a 401 refuses it for good, so the request is never repeated with it.
            headers={"X-Auth-Token": secret},
            error_message=scaleway_error_message,
            retry=retry or RetryPolicy(attempts=config.max_attempts),
            breaker=breaker,
            max_timeout=config.request_timeout,
            secrets=config.secrets,
            is_auth_failure=is_auth_failure,
        )
        self._region = config.region
        self._cluster = config.cluster_id
        self.public = config.public
        self.routes = PUBLIC_ROUTES if config.public else PRIVATE_ROUTES
        # The nodes of the last complete listing, by id. A node that has not changed since is taken from
        # here, so a listing of a steady cluster keeps no new object past the page it came in on (a
        # 20,000-node listing otherwise holds 20,000 new nodes until its last page, and the process
        # keeps that memory). Replaced whole by the one listing thread.
        self._last_nodes: Mapping[str, Node] = {}

    def close(self) -> None:
        self.transport.close()

    # ------------------------------------------------------------------ endpoints
    def list_pools(self, deadline: Deadline) -> Listing:
        route = self.routes.pools
        return self._paginate(
            route.format(region=self._region, cluster_id=self._cluster), route, "pools", _parse_pool, deadline
        )

    def get_pool(self, pool_id: str, deadline: Deadline) -> Pool:
        """One pool (public mode: the autoscaler endpoints have no single-pool GET)."""
        _require_id("pool id", pool_id)
        route = PUBLIC_ROUTES.pool
        answer = self.transport.request(
            "GET", route.format(region=self._region, pool_id=pool_id), endpoint=route, deadline=deadline
        )
        return _parse_pool(answer.body)

    def list_server_types(self, zone: str, deadline: Deadline) -> dict[str, ServerType]:
        """The Instance product catalog of one zone, by commercial type. Paged with ``page`` and ``per_page``;
        the count is in the ``X-Total-Count`` header, not the body (recorded)."""
        if not _ZONE.match(zone):
            raise InvalidRequest(f"zone must look like fr-par-1, got {zone!r}")
        path = SERVER_TYPES_ROUTE.format(zone=zone)
        types: dict[str, ServerType] = {}
        for page in range(1, MAX_PAGES + 1):
            answer = self.transport.request(
                "GET",
                path,
                endpoint=SERVER_TYPES_ROUTE,
                deadline=deadline,
                params={"page": page, "per_page": CATALOG_PAGE_SIZE},
            )
            body = answer.body
            servers = body.get("servers") if isinstance(body, Mapping) else None
            if not isinstance(servers, Mapping):
                raise _malformed(SERVER_TYPES_ROUTE, f"page {page} has no 'servers' object")
            for name, raw in servers.items():
                try:
                    types[str(name)] = _parse_server_type(str(name), raw)
                except CloudUnavailable as err:  # one odd entry costs that type, not the catalog
                    log.info("scaleway product catalog of %s: %s; that type is left out", zone, err)
            total = _total_count(answer, body)
            if not servers or len(servers) < CATALOG_PAGE_SIZE or (total is not None and len(types) >= total):
                return types
        raise _malformed(SERVER_TYPES_ROUTE, f"more than {MAX_PAGES} pages of {CATALOG_PAGE_SIZE}")

    def list_nodes(self, deadline: Deadline) -> Listing:
        route = self.routes.nodes
        path = route.format(region=self._region, cluster_id=self._cluster)
        known = self._last_nodes

        def parse(raw: Any) -> Node:
            node = _parse_node(raw)
            before = known.get(node.id)
            return before if before == node else node

        listing = self._paginate(path, route, "nodes", parse, deadline)
        self._last_nodes = {node.id: node for node in listing.items}
        return listing

    def update_pool_size(self, pool_id: str, size: int, deadline: Deadline) -> Pool | None:
        """PATCH ``{"size": size}``; the pool as the cloud answered it, or None when the 2xx answer was empty
        or a JSON object that is not a pool (the write is done all the same: docs/reference/scaleway.md,
        "Writes")."""
        _require_id("pool id", pool_id)
        route = self.routes.pool
        answer = self.transport.request(
            "PATCH",
            route.format(region=self._region, pool_id=pool_id),
            endpoint=route,
            deadline=deadline,
            json_body={"size": size},
        )
        return _parse_write_answer(answer, _parse_pool, "PATCH " + route)

    def delete_node(self, node_id: str, deadline: Deadline) -> Node | None:
        """DELETE one node. Kapsule drains it and lowers its pool's size by one itself. The node as the
        cloud answered it, or None when the 2xx answer was empty or not a node (the deletion is done).

        On the public endpoint the query carries ``skip_drain=false``, as Scaleway's SDKs always send it (the
        field is documented as inactive): Kapsule drains the node first either way."""
        _require_id("node id", node_id)
        route = self.routes.node
        answer = self.transport.request(
            "DELETE",
            route.format(region=self._region, node_id=node_id),
            endpoint=route,
            deadline=deadline,
            params={"skip_drain": "false"} if self.public else None,
        )
        return _parse_write_answer(answer, _parse_node, "DELETE " + route)

    # ------------------------------------------------------------------ paging
    def _paginate(
        self, path: str, route: str, field_name: str, parse: Callable[[Any], Any], deadline: Deadline
    ) -> Listing:
        items: dict[str, Any] = {}
        max_age: float | None = None
        for page, answer in self._pages(path, route, deadline):
            body = answer.body
            if not isinstance(body, Mapping):
                raise _malformed(route, f"page {page} is not a JSON object")
            raw_items = body.get(field_name)
            if raw_items is None:
                raw_items = []  # upstream's tests send "pools": null for an empty page
            if not isinstance(raw_items, list):
                raise _malformed(route, f"{field_name!r} of page {page} is not a list")
            for raw in raw_items:
                item = parse(raw)
                items[item.id] = item  # a concurrent change can shift an item onto the next page too
            age = parse_cache_control(answer.headers.get("Cache-Control"))
            if age is not None:
                max_age = age if max_age is None else min(max_age, age)
            total = body.get("total_count")
            if isinstance(total, bool) or (total is not None and not isinstance(total, int)):
                raise _malformed(route, f"total_count of page {page} is not a number")
            if not raw_items or len(raw_items) < PAGE_SIZE or (total is not None and page * PAGE_SIZE >= total):
                break
        return Listing(tuple(items.values()), max_age)

    def _pages(self, path: str, route: str, deadline: Deadline) -> Iterator[tuple[int, JsonResponse]]:
        for page in range(1, MAX_PAGES + 1):
            yield (
                page,
                self.transport.request(
                    "GET", path, endpoint=route, deadline=deadline, params={"page": page, "page_size": PAGE_SIZE}
                ),
            )
        raise _malformed(route, f"more than {MAX_PAGES} pages of {PAGE_SIZE}; the listing never ended")


# ---------------------------------------------------------------------- JSON -> records


def _malformed(route: str, why: str) -> CloudUnavailable:
    return CloudUnavailable(f"malformed answer from scaleway API {route}: {why}")


def _total_count(answer: JsonResponse, body: Any) -> int | None:
    """The item count of a paged answer: ``total_count`` in the body, else the ``X-Total-Count`` header."""
    raw: Any = body.get("total_count") if isinstance(body, Mapping) else None
    if raw is None:
        header = answer.headers.get("X-Total-Count")
        raw = int(header) if header and header.strip().isdigit() else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _require_id(what: str, value: str) -> None:
    if not value or "/" in value:
        # A programming error upstream of here, never a cloud answer: fail before sending anything.
        raise InvalidRequest(f"{what} must be a non-empty path segment, got {value!r}")


def _parse_write_answer(answer: JsonResponse, parse: Callable[[Any], Any], route: str) -> Any:
    """The record a write's 2xx answer describes, or None: no public client reads these bodies, so nothing
    says they are always JSON records, and the cloud has applied the write whatever the body is."""
    if answer.body is None:
        return None
    try:
        return parse(answer.body)
    except CloudUnavailable as err:
        log.info(
            "scaleway API %s answered %d with a body that is not the expected record (%s); the write is done",
            route,
            answer.status,
            err,
        )
        return None


class _Fields:
    """Typed reads from one JSON object; any type clash is a malformed answer."""

    def __init__(self, raw: Any, what: str) -> None:
        if not isinstance(raw, Mapping):
            raise _malformed(what, f"expected an object, got {type(raw).__name__}")
        self.raw = raw
        self.what = what

    def text(self, name: str, required: bool = False) -> str:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise _malformed(self.what, f"{name!r} is missing")
            return ""
        if not isinstance(value, str):
            raise _malformed(self.what, f"{name!r} is {type(value).__name__}, not a string")
        return value

    def integer(self, name: str) -> int:
        value = self.raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _malformed(self.what, f"{name!r} is {value!r}, not an integer")
        return value

    def whole_or_none(self, name: str) -> int | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _malformed(self.what, f"{name!r} is {value!r}, not a whole number")
        return value

    def strings(self, name: str) -> list[str]:
        value = self.raw.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise _malformed(self.what, f"{name!r} is not a list of strings")
        return list(value)

    def number(self, name: str) -> float | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _malformed(self.what, f"{name!r} is {value!r}, not a number")
        return float(value)

    def mapping(self, name: str, value_type: type) -> dict[str, Any]:
        value = self.raw.get(name)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise _malformed(self.what, f"{name!r} is {type(value).__name__}, not an object")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, bool) or not isinstance(item, value_type):
                raise _malformed(self.what, f"{name}[{key!r}] is {item!r}, not {value_type.__name__}")
            out[str(key)] = item
        return out


def _parse_pool(raw: Any) -> Pool:
    f = _Fields(raw, "pool")
    pool_id = f.text("id", required=True)
    f.what = f"pool {pool_id}"
    autoscaling = raw.get("autoscaling", False)
    if not isinstance(autoscaling, bool):
        raise _malformed(f.what, f"'autoscaling' is {autoscaling!r}, not a boolean")
    return Pool(
        id=pool_id,
        name=f.text("name"),
        status=f.text("status"),
        version=f.text("version"),
        node_type=f.text("node_type"),
        autoscaling=autoscaling,
        size=f.integer("size"),
        min_size=f.integer("min_size"),
        max_size=f.integer("max_size"),
        zone=f.text("zone"),
        node_price_per_hour=f.number("node_price_per_hour"),
        capacity=f.mapping("capacity", int),
        allocatable=f.mapping("allocatable", int),
        labels=f.mapping("labels", str),
        taints=_taints(f),
        tags=tuple(f.strings("tags")),
        root_volume_size=f.whole_or_none("root_volume_size"),
        max_pods=_max_pods(f),
    )


def _max_pods(f: _Fields) -> int | None:
    """``kubelet_args.maxPods`` (a string map on the public pool), when it is a positive number."""
    value = f.mapping("kubelet_args", str).get("maxPods", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _parse_server_type(name: str, raw: Any) -> ServerType:
    f = _Fields(raw, f"server type {name}")
    gpu_info = raw.get("gpu_info")
    gpu_name = gpu_info.get("gpu_name") if isinstance(gpu_info, Mapping) else None
    return ServerType(
        name=name,
        cpus=f.integer("ncpus"),
        memory=f.integer("ram"),
        gpus=f.whole_or_none("gpu") or 0,
        gpu_name=gpu_name if isinstance(gpu_name, str) else "",
        arch=f.text("arch"),
        hourly_price=f.number("hourly_price"),
    )


def _taints(f: _Fields) -> dict[str, str]:
    """The pool's taints as ``key -> "value:Effect"`` (or ``"Effect"``). The autoscaler endpoint sends that map
    (the CA's own provider decodes it so); the public pool endpoint sends a list of ``{key, value, effect}``,
    read too, so a change of form on the autoscaler endpoint costs no listing."""
    raw = f.raw.get("taints")
    if not isinstance(raw, list):
        return f.mapping("taints", str)
    taints: dict[str, str] = {}
    for item in raw:
        taint = _Fields(item, f"{f.what} taint")
        key, value, effect = taint.text("key", required=True), taint.text("value"), taint.text("effect")
        taints[key] = f"{value}:{effect}" if value else effect
    return taints


def _parse_node(raw: Any) -> Node:
    f = _Fields(raw, "node")
    node_id = f.text("id", required=True)
    f.what = f"node {node_id}"
    # The pool id and status repeat on thousands of nodes: one string each instead of one per node
    # (a 20,000-node listing holds every node until its last page, and the memory stays with the process).
    return Node(
        id=node_id,
        pool_id=sys.intern(f.text("pool_id")),
        provider_id=f.text("provider_id"),
        name=f.text("name"),
        status=sys.intern(f.text("status")),
        error_message=f.text("error_message"),
    )
