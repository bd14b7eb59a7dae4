"""Kapsule's public pool and node endpoints and the Instance product list, which the server's public mode
calls (docs/reference/scaleway.md, "Public mode"). They share the state, auth, faults and errors of the autoscaler
endpoints but speak the public shapes, as recorded: taints as ``[{key, value, effect}]``, ``tags``,
``root_volume_size`` and ``kubelet_args``, no capacity or price in pools; nodes with
``error_message``/``conditions``/``region``; the product list paged 50 types at a time unless asked for up
to 100, its count in ``X-Total-Count`` (not in the body) and the pages in a ``Link`` header.
"""

from __future__ import annotations

from typing import Any

from simulators.common.http import JsonApiServer, SimRequest, SimResponse
from simulators.scaleway.api import ScalewayApi, as_sim_error, int_argument
from simulators.scaleway.catalog import NODE_TYPES
from simulators.scaleway.state import (
    HELD_POOL_STATUSES,
    ArgumentProblem,
    Cluster,
    InvalidArguments,
    Node,
    NotFound,
    Pool,
    ScalewayState,
    TransientState,
    rfc3339,
)

PUBLIC_PREFIX = "/k8s/v1/regions/{region}"
ROUTE_PUBLIC_GET_CLUSTER = "public_get_cluster"
ROUTE_PUBLIC_LIST_POOLS = "public_list_pools"
ROUTE_PUBLIC_GET_POOL = "public_get_pool"
ROUTE_PUBLIC_UPDATE_POOL = "public_update_pool"
ROUTE_PUBLIC_LIST_NODES = "public_list_nodes"
ROUTE_PUBLIC_GET_NODE = "public_get_node"
ROUTE_PUBLIC_DELETE_NODE = "public_delete_node"
ROUTE_LIST_SERVER_TYPES = "list_server_types"
_EDITABLE_POOL_FIELDS = ("size", "min_size", "max_size", "autoscaling")
_SECONDS_PER_MONTH = 730 * 3600
# The product list's page size when none is asked for, and the most it takes (recorded; the SDK's docs).
CATALOG_DEFAULT_PER_PAGE = 50
CATALOG_MAX_PER_PAGE = 100


def split_taint(key: str, encoded: str) -> dict[str, str]:
    """``"value:Effect"`` or ``"Effect"`` (autoscaler form) -> one public taint object."""
    value, _, effect = encoded.rpartition(":")
    return {"key": key, "value": value, "effect": effect}


def public_pool(pool: Pool, region: str) -> dict[str, Any]:
    return {
        "id": pool.id,
        "cluster_id": pool.cluster_id,
        "name": pool.name,
        "status": pool.status,
        "version": pool.version,
        "node_type": pool.node_type.lower().replace("-", "_"),
        "autoscaling": pool.autoscaling,
        "size": pool.size,
        "min_size": pool.min_size,
        "max_size": pool.max_size,
        "container_runtime": "containerd",
        "autohealing": False,
        "tags": list(pool.tags),
        "placement_group_id": None,
        "kubelet_args": dict(pool.kubelet_args),
        "upgrade_policy": {"max_unavailable": 1, "max_surge": 0},
        "zone": pool.zone,
        "root_volume_type": "default_volume_type",
        "root_volume_size": pool.root_volume_size,
        "public_ip_disabled": False,
        "security_group_id": None,
        "labels": dict(pool.labels),
        "taints": [split_taint(key, encoded) for key, encoded in pool.taints.items()],
        "startup_taints": [],
        "region": region,
        "created_at": rfc3339(pool.created_at),
        "updated_at": rfc3339(pool.updated_at),
    }


def public_cluster(cluster: Cluster) -> dict[str, Any]:
    """The cluster as the public API answers a GET: the recorded fields this simulator has values for."""
    versions = sorted({pool.version for pool in cluster.pools.values()})
    return {
        "region": cluster.region,
        "id": cluster.id,
        "type": "kapsule",
        "name": cluster.name,
        "description": "",
        "status": "ready",
        "version": versions[-1] if versions else "",
        "cni": "cilium",
        "tags": [],
        "autoscaler_config": {
            "scale_down_disabled": False,
            "scale_down_delay_after_add": "10m",
            "estimator": "binpacking",
            "expander": "random",
            "ignore_daemonsets_utilization": False,
            "balance_similar_node_groups": False,
            "expendable_pods_priority_cutoff": 0,
            "scale_down_unneeded_time": "10m",
            "scale_down_utilization_threshold": 0.5,
            "max_graceful_termination_sec": 0,
        },
    }


def public_node(node: Node, region: str) -> dict[str, Any]:
    return {
        "id": node.id,
        "pool_id": node.pool_id,
        "cluster_id": node.cluster_id,
        "provider_id": node.provider_id,
        "region": region,
        "name": node.name,
        "public_ip_v4": None,
        "public_ip_v6": None,
        "conditions": {"Ready": "True"} if node.status == "ready" else {},
        "status": node.status,
        "error_message": node.error_message,
        "created_at": rfc3339(node.created_at),
        "updated_at": rfc3339(node.updated_at),
    }


class ScalewayPublicApi:
    def __init__(self, state: ScalewayState, api: ScalewayApi) -> None:
        self.state = state
        self.api = api

    def register(self, server: JsonApiServer) -> None:
        server.route("GET", PUBLIC_PREFIX + "/clusters/{cluster_id}", ROUTE_PUBLIC_GET_CLUSTER, self.get_cluster)
        server.route("GET", PUBLIC_PREFIX + "/clusters/{cluster_id}/pools", ROUTE_PUBLIC_LIST_POOLS, self.list_pools)
        server.route("GET", PUBLIC_PREFIX + "/pools/{pool_id}", ROUTE_PUBLIC_GET_POOL, self.get_pool)
        server.route("PATCH", PUBLIC_PREFIX + "/pools/{pool_id}", ROUTE_PUBLIC_UPDATE_POOL, self.update_pool)
        server.route("GET", PUBLIC_PREFIX + "/clusters/{cluster_id}/nodes", ROUTE_PUBLIC_LIST_NODES, self.list_nodes)
        server.route("GET", PUBLIC_PREFIX + "/nodes/{node_id}", ROUTE_PUBLIC_GET_NODE, self.get_node)
        server.route("DELETE", PUBLIC_PREFIX + "/nodes/{node_id}", ROUTE_PUBLIC_DELETE_NODE, self.delete_node)
        server.route("GET", "/instance/v1/zones/{zone}/products/servers", ROUTE_LIST_SERVER_TYPES, self.server_types)

    def get_cluster(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            with self.state.lock:
                return SimResponse(200, public_cluster(self.state.cluster_in(region, request.params["cluster_id"])))

        return self.api.guarded(request, run)

    def list_pools(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            page, page_size = self.api.paging(request)
            with self.state.lock:
                pools = self.state.cluster_pools(region, request.params["cluster_id"])
                start = (page - 1) * page_size
                items = [public_pool(pool, region) for pool in pools[start : start + page_size]]
            return SimResponse(200, {"pools": items, "total_count": len(pools)})

        return self.api.guarded(request, run)

    def get_pool(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            with self.state.lock:
                return SimResponse(200, public_pool(self.state.pool_in(region, request.params["pool_id"]), region))

        return self.api.guarded(request, run)

    def update_pool(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            body = request.body if isinstance(request.body, dict) else {}
            problems = [
                ArgumentProblem(
                    name, "invalid_type", f"{name} must be {'a boolean' if name == 'autoscaling' else 'an integer'}"
                )
                for name in _EDITABLE_POOL_FIELDS
                if name in body and body[name] is not None and not _right_type(name, body[name])
            ]
            if problems:
                raise InvalidArguments(*problems)
            changes = {name: body[name] for name in _EDITABLE_POOL_FIELDS if body.get(name) is not None}
            with self.state.lock:
                pool = self.state.pool_in(region, request.params["pool_id"])
                if changes and pool.status in HELD_POOL_STATUSES:
                    raise TransientState("pool", pool.id, pool.status)
                bounds = {k: v for k, v in changes.items() if k in ("min_size", "max_size", "autoscaling")}
                if bounds:
                    low = bounds.get("min_size", pool.min_size)
                    high = bounds.get("max_size", pool.max_size)
                    if not 0 <= low <= high:
                        raise InvalidArguments.single("min_size", "constraint", "need 0 <= min_size <= max_size")
                    self.state.edit_pool(pool.id, **bounds)
                if "size" in changes:
                    self.state.update_pool_size(region, pool.id, changes["size"])
                return SimResponse(200, public_pool(pool, region))

        return self.api.guarded(request, run)

    def list_nodes(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            page, page_size = self.api.paging(request)
            pool_id = request.query.get("pool_id")
            status = request.query.get("status")
            with self.state.lock:
                nodes = self.state.cluster_nodes(region, request.params["cluster_id"], pool_id)
                if status:
                    nodes = [node for node in nodes if node.status == status]
                start = (page - 1) * page_size
                items = [public_node(node, region) for node in nodes[start : start + page_size]]
            return SimResponse(200, {"nodes": items, "total_count": len(nodes)})

        return self.api.guarded(request, run)

    def get_node(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            with self.state.lock:
                return SimResponse(200, public_node(self.state.node_in(region, request.params["node_id"]), region))

        return self.api.guarded(request, run)

    def delete_node(self, request: SimRequest) -> SimResponse:
        region = request.params["region"]

        def run() -> SimResponse:
            # The Python SDK sends skip_drain as "False"/"True"; the drain itself is the deleting delay.
            skip_drain = request.query.get("skip_drain", "false").lower()
            if skip_drain not in ("true", "false"):
                raise InvalidArguments.single("skip_drain", "invalid_type", "skip_drain must be a boolean")
            with self.state.lock:
                self.state.delete_node(region, request.params["node_id"])
                return SimResponse(200, public_node(self.state.node_in(region, request.params["node_id"]), region))

        return self.api.guarded(request, run)

    def server_types(self, request: SimRequest) -> SimResponse:
        self.api.authenticate(request)
        zone = request.params["zone"]
        region, _, number = zone.rpartition("-")
        if not number.isdigit() or not self.state.known_region(region):
            raise as_sim_error(NotFound("zone", zone))
        try:
            page = int_argument(request.query, "page", 1, 1, None)
            per_page = int_argument(request.query, "per_page", CATALOG_DEFAULT_PER_PAGE, 1, CATALOG_MAX_PER_PAGE)
        except InvalidArguments as exc:
            raise as_sim_error(exc) from exc
        every = {
            name: {
                "ncpus": node_type.cpus,
                "ram": node_type.memory_bytes,
                "gpu": node_type.gpus,
                "gpu_info": (
                    {"gpu_manufacturer": "NVIDIA", "gpu_name": node_type.gpu_model, "gpu_memory": 0}
                    if node_type.gpus
                    else None
                ),
                "arch": "x86_64" if node_type.arch == "amd64" else node_type.arch,
                "hourly_price": node_type.price_per_hour,
                "monthly_price": round(node_type.price_per_hour * _SECONDS_PER_MONTH / 3600, 2),
            }
            for name, node_type in sorted(NODE_TYPES.items())
        }
        names = sorted(every)[(page - 1) * per_page : page * per_page]
        last = max(1, -(-len(every) // per_page))
        # As recorded: first and previous from page 2 on, next before the last page, last always.
        links = [
            f'</products/servers?page={n}&per_page={per_page}&>; rel="{rel}"'
            for n, rel, shown in (
                (1, "first", page > 1),
                (page - 1, "previous", page > 1),
                (page + 1, "next", page < last),
                (last, "last", True),
            )
            if shown
        ]
        headers = {"X-Total-Count": str(len(every)), "Link": ",".join(links)}
        return SimResponse(200, {"servers": {name: every[name] for name in names}}, headers)


def _right_type(name: str, value: Any) -> bool:
    if name == "autoscaling":
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)
