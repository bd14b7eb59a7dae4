"""The simulated Kapsule state: clusters, pools and nodes, and their clock-driven transitions.

Everything here is guarded by one re-entrant lock; the HTTP handlers and the test helpers both go
through these methods. Asynchronous behaviour is a heap of (due time, node) events processed by
``run_due(now)``: a node's next step is due at the time its previous step was due plus the configured
duration, so one large clock jump plays the whole sequence in order.

Lookups are by id in dicts; each cluster keeps its pools and nodes in insertion order with a cached
list for paging, so listing 5,000 nodes 100 at a time stays linear.
"""

from __future__ import annotations

import functools
import heapq
import random
import threading
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from simulators.common.clock import Clock
from simulators.scaleway.catalog import api_node_type, lookup
from simulators.scaleway.catalog import default_labels as well_known_labels
from simulators.scaleway.catalog import kubernetes_labels as node_kubernetes_labels

POOL_STATUSES = ("ready", "deleting", "deleted", "scaling", "warning", "locked", "upgrading", "unknown")
NODE_STATUSES = (
    "creating",
    "starting",
    "registering",
    "not_ready",
    "ready",
    "deleting",
    "deleted",
    "locked",
    "rebooting",
    "creation_error",
    "upgrading",
    "unknown",
)
# Pool statuses set by hand (tests) that the simulator must not overwrite and that refuse size changes.
HELD_POOL_STATUSES = frozenset({"locked", "upgrading"})
GONE_NODE_STATUSES = frozenset({"deleting", "deleted"})
# A pool's system volume unless the scenario says otherwise (recorded pools: 20 GB to 100 GB).
DEFAULT_ROOT_VOLUME_SIZE = 20_000_000_000
REGISTERED_NODE_STATUSES = frozenset({"not_ready", "ready", "rebooting", "upgrading", "locked", "deleting"})
SCALE_UP_FAILURE_MODES = ("creation_error", "quota", "out_of_stock")
ERROR_SHAPES = ("recorded", "typed")
TRANSIENT_POOL_WRITES = ("conflict", "accept")
NODE_TYPE_SPELLINGS = ("api", "as_given")
PRIVATE_ENDPOINTS = ("open", "refused")
# Every region the Scaleway SDK knows (scaleway-sdk-go scw.AllRegions): the API serves them whether or not a
# cluster of the scenario is there, so a cluster asked for in the wrong one is a 404 naming the cluster.
KAPSULE_REGIONS = ("fr-par", "nl-ams", "pl-waw", "it-mil")


# -- errors (the API layer maps each to the matching Scaleway error body) ---------------------------


class ScalewaySimError(Exception):
    """Base of the errors a state operation raises; each maps to one Scaleway error type."""


class NotFound(ScalewaySimError):
    def __init__(self, resource: str, resource_id: str) -> None:
        super().__init__(f"{resource} {resource_id} not found")
        self.resource = resource
        self.resource_id = resource_id


@dataclass(frozen=True)
class ArgumentProblem:
    argument_name: str
    reason: str  # Scaleway reasons: "required", "constraint", "invalid_type", ...
    help_message: str


class InvalidArguments(ScalewaySimError):
    def __init__(self, *problems: ArgumentProblem) -> None:
        super().__init__("; ".join(f"{p.argument_name}: {p.help_message}" for p in problems))
        self.problems = problems

    @classmethod
    def single(cls, argument_name: str, reason: str, help_message: str) -> InvalidArguments:
        return cls(ArgumentProblem(argument_name, reason, help_message))


class TransientState(ScalewaySimError):
    def __init__(self, resource: str, resource_id: str, current_state: str) -> None:
        super().__init__(f"{resource} {resource_id} is in a transient state ({current_state})")
        self.resource = resource
        self.resource_id = resource_id
        self.current_state = current_state


class QuotaExceeded(ScalewaySimError):
    def __init__(self, resource: str, quota: int, current: int) -> None:
        super().__init__(f"quota exceeded for {resource}: {current}/{quota}")
        self.resource = resource
        self.quota = quota
        self.current = current


class OutOfStock(ScalewaySimError):
    def __init__(self, resource: str) -> None:
        super().__init__(f"{resource} is out of stock")
        self.resource = resource


class ScenarioError(ValueError):
    """A scenario (dict or YAML) that cannot be loaded; the message names the offending key."""


# -- configuration ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timings:
    """Seconds a node spends in each asynchronous status before moving on."""

    creating: float = 30.0
    starting: float = 30.0
    registering: float = 20.0
    not_ready: float = 0.0  # > 0: registering -> not_ready -> ready, else registering -> ready
    deleting: float = 30.0
    deleted_kept: float = 0.0  # > 0: deleting -> deleted (still listed) for this long, then removed
    scale_down_settle: float = 1.0  # after a size decrease or a node DELETE the pool reads "scaling" this long


@dataclass(frozen=True)
class Behaviour:
    """How the simulated API answers. The defaults follow the public evidence of the real one
    (docs/reference/scaleway.md, "Evidence"); each earlier model of ours stays as a value a test names."""

    # Cache-Control max-age on list answers; None (the default, as recorded) sends no header.
    cache_max_age: int | None = None
    default_page_size: int = 100
    max_page_size: int = 100  # larger page_size -> 400 invalid_arguments
    null_empty_pages: bool = False  # answer an empty page with "pools": null / "nodes": null
    enforce_size_bounds: bool = True  # PATCH size outside [min_size, max_size] -> 400
    repeated_delete: str = "idempotent"  # "idempotent" (200) or "conflict" (409) on a deleting node
    # False (as recorded): a node being created is listed with provider_id "" until it is starting.
    provider_id_at_creation: bool = False
    warning_on_creation_error: bool = True  # pool status "warning" while a counted node is creation_error
    node_quota: int | None = None  # max nodes (not deleting) per cluster; beyond it a scale-up -> 403
    # "recorded": the gateway's bare 429 and {"message"} bodies; "typed": a typed JSON body for every error.
    error_shapes: str = "recorded"
    # A size PATCH or node DELETE on a locked/upgrading pool: "conflict" (409 transient_state) or "accept".
    transient_pool_writes: str = "conflict"
    # "api" (as recorded): a pool's node_type as the pools API answers it, lower case with underscores
    # ("pro2_xxs"), whatever spelling the scenario used; "as_given": the scenario's spelling.
    node_type_spelling: str = "api"
    # True: a pool reads "scaling" until its removed nodes are gone (our earlier model); False (as recorded):
    # "ready" once Timings.scale_down_settle has passed, while the removed nodes are still "deleting".
    pool_scaling_while_deleting: bool = False
    # What the private autoscaler endpoints answer an accepted key: "open" (they serve it) or "refused" (403
    # permissions_denied, as the IAM refusals recorded on other products). Nothing public says which an ordinary
    # IAM key gets from outside Kapsule's managed control plane (docs/reference/scaleway.md, "Evidence").
    private_endpoints: str = "open"

    def __post_init__(self) -> None:
        if self.repeated_delete not in ("idempotent", "conflict"):
            raise ValueError(f"repeated_delete must be 'idempotent' or 'conflict', not {self.repeated_delete!r}")
        if not 1 <= self.default_page_size <= self.max_page_size:
            raise ValueError("default_page_size must be between 1 and max_page_size")
        for name, allowed in (
            ("error_shapes", ERROR_SHAPES),
            ("transient_pool_writes", TRANSIENT_POOL_WRITES),
            ("node_type_spelling", NODE_TYPE_SPELLINGS),
            ("private_endpoints", PRIVATE_ENDPOINTS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")


def _dataclass_from(cls: type, data: Any, where: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ScenarioError(f"{where} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return cls(**data)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def timings_from(data: Any) -> Timings:
    return _dataclass_from(Timings, data, "timings")


def behaviour_from(data: Any, base: Behaviour | None = None) -> Behaviour:
    if base is None:
        return _dataclass_from(Behaviour, data, "behaviour")
    merged = {**asdict(base), **(data or {})}
    return _dataclass_from(Behaviour, merged, "behaviour")


# -- the model ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def rfc3339(timestamp: float) -> str:
    # Cached: a listing formats every node's two timestamps, which rarely change, and strftime was two
    # thirds of the cost of serving a page of 100 nodes (20,000 nodes are 200 pages per listing).
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Cluster:
    id: str
    name: str
    region: str
    pools: dict[str, Pool] = field(default_factory=dict)  # insertion ordered
    nodes: dict[str, Node] = field(default_factory=dict)  # insertion ordered
    _pool_list: list[Pool] | None = None  # paging caches, dropped on membership change
    _node_list: list[Node] | None = None

    def pool_list(self) -> list[Pool]:
        if self._pool_list is None:
            self._pool_list = list(self.pools.values())
        return self._pool_list

    def node_list(self) -> list[Node]:
        if self._node_list is None:
            self._node_list = list(self.nodes.values())
        return self._node_list

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "region": self.region}


@dataclass
class Pool:
    id: str
    cluster_id: str
    name: str
    status: str
    version: str
    node_type: str
    autoscaling: bool
    size: int
    min_size: int
    max_size: int
    zone: str
    node_price_per_hour: float
    capacity: dict[str, int]
    allocatable: dict[str, int]
    labels: dict[str, str]
    taints: dict[str, str]  # the autoscaler endpoint's map form: key -> "value:Effect" or "Effect"
    created_at: float
    updated_at: float
    # Public pool fields: the owner's tags (copied onto every server of the pool, and so node labels and
    # taints), the root volume in bytes, and the kubelet arguments (``maxPods``, ...).
    tags: list[str] = field(default_factory=list)
    root_volume_size: int = DEFAULT_ROOT_VOLUME_SIZE
    kubelet_args: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)  # insertion ordered
    pending_failures: deque[tuple[str, int | None]] = field(default_factory=deque)
    settle_until: float | None = None  # after a size decrease: reads "scaling" until then

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cluster_id": self.cluster_id,
            "name": self.name,
            "status": self.status,
            "version": self.version,
            "node_type": self.node_type,
            "autoscaling": self.autoscaling,
            "size": self.size,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "zone": self.zone,
            "node_price_per_hour": self.node_price_per_hour,
            "capacity": dict(self.capacity),
            "allocatable": dict(self.allocatable),
            "labels": dict(self.labels),
            "taints": dict(self.taints),
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
        }


@dataclass
class Node:
    id: str
    pool_id: str
    cluster_id: str
    provider_id: str
    name: str
    status: str
    created_at: float
    updated_at: float
    error_message: str | None = None
    sequence: int = 0  # creation order, for "newest first" scale-down
    fails_with: str | None = None  # when set, ``creating`` ends in creation_error with this message
    pending_provider_id: str = ""  # provider_id to reveal at ``starting`` (provider_id_at_creation=False)
    due: float | None = None  # when the current status ends, None when it is stable
    generation: int = 0  # bumped on every status change, so stale heap events are ignored

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pool_id": self.pool_id,
            "cluster_id": self.cluster_id,
            "provider_id": self.provider_id,
            "name": self.name,
            "status": self.status,
            "error_message": self.error_message,
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
        }


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    total_count: int


class ScalewayState:
    def __init__(
        self,
        clock: Clock,
        *,
        default_region: str = "fr-par",
        seed: int = 0,
        timings: Timings | None = None,
        behaviour: Behaviour | None = None,
    ) -> None:
        self.clock = clock
        self.default_region = default_region
        self.timings = timings or Timings()
        self.behaviour = behaviour or Behaviour()
        self.clusters: dict[str, Cluster] = {}
        self.pools: dict[str, Pool] = {}
        self.nodes: dict[str, Node] = {}
        self.lock = threading.RLock()
        self._random = random.Random(seed)
        self._events: list[tuple[float, int, str, int]] = []
        self._event_sequence = 0
        self._node_sequence = 0
        self._settling: dict[str, Pool] = {}  # pools reading "scaling" until their settle_until

    # -- ids -----------------------------------------------------------------------------------

    def new_id(self) -> str:
        return str(uuid.UUID(int=self._random.getrandbits(128), version=4))

    # -- building the state (scenarios, test helpers) --------------------------------------------

    def add_cluster(
        self, cluster_id: str | None = None, name: str = "sim-cluster", region: str | None = None
    ) -> Cluster:
        with self.lock:
            cluster = Cluster(cluster_id or self.new_id(), name, region or self.default_region)
            if cluster.id in self.clusters:
                raise ScenarioError(f"duplicate cluster id {cluster.id}")
            self.clusters[cluster.id] = cluster
            return cluster

    def add_pool(
        self,
        cluster_id: str,
        *,
        name: str,
        node_type: str = "DEV1-M",
        size: int = 0,
        min_size: int = 0,
        max_size: int | None = None,
        autoscaling: bool = True,
        pool_id: str | None = None,
        status: str | None = None,
        version: str = "1.31.2",
        zone: str | None = None,
        node_price_per_hour: float | None = None,
        capacity: dict[str, int] | None = None,
        allocatable: dict[str, int] | None = None,
        labels: dict[str, str] | None = None,
        taints: dict[str, str] | None = None,
        nodes: int | list[dict[str, Any]] | None = None,
        default_labels: bool = False,
        tags: list[str] | None = None,
        root_volume_size: int = DEFAULT_ROOT_VOLUME_SIZE,
        kubelet_args: dict[str, str] | None = None,
    ) -> Pool:
        """Add a pool; ``nodes`` is a count of ready nodes, a list of node specs, or None for ``size`` ready.

        ``default_labels``: False (as recorded: a pool's ``labels`` are what its owner set, ``{}`` when
        nothing) serves ``labels`` alone; True adds the well-known node labels under them
        (``catalog.default_labels``, our earlier model, close to the CA provider's own test data).
        ``node_type`` is stored as the pools API spells it (``Behaviour.node_type_spelling``).
        """
        with self.lock:
            cluster = self._cluster(cluster_id)
            max_size = size if max_size is None else max_size
            for label, value in (("size", size), ("min_size", min_size), ("max_size", max_size)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ScenarioError(f"pool {name}: {label} must be a non-negative integer, got {value!r}")
            if isinstance(nodes, bool) or (isinstance(nodes, int) and nodes < 0):
                raise ScenarioError(f"pool {name}: nodes must be a count >= 0 or a list of node specs")
            if not 0 <= min_size <= max_size:
                raise ScenarioError(f"pool {name}: need 0 <= min_size <= max_size, got {min_size}..{max_size}")
            if status is not None and status not in POOL_STATUSES:
                raise ScenarioError(f"pool {name}: unknown status {status!r}")
            catalog_entry = lookup(node_type)
            if catalog_entry is None and (capacity is None or node_price_per_hour is None):
                raise ScenarioError(
                    f"pool {name}: node_type {node_type!r} is not in the simulator catalog; "
                    "give capacity and node_price_per_hour explicitly"
                )
            pool_id = pool_id or self.new_id()
            if pool_id in self.pools:
                raise ScenarioError(f"duplicate pool id {pool_id}")
            zone = zone or f"{cluster.region}-1"
            now = self.clock.now()
            if capacity is None:
                capacity = catalog_entry.capacity() if catalog_entry else {}
            if allocatable is None:
                allocatable = catalog_entry.allocatable() if catalog_entry else dict(capacity)
            if node_price_per_hour is None:
                node_price_per_hour = catalog_entry.price_per_hour if catalog_entry else 0.0
            merged_labels = (
                well_known_labels(
                    catalog_entry,
                    pool_id=pool_id,
                    pool_name=name,
                    cluster_id=cluster.id,
                    region=cluster.region,
                    zone=zone,
                )
                if default_labels
                else {}
            )
            merged_labels.update(labels or {})
            pool = Pool(
                id=pool_id,
                cluster_id=cluster.id,
                name=name,
                status=status or "ready",
                version=version,
                node_type=api_node_type(node_type) if self.behaviour.node_type_spelling == "api" else node_type,
                autoscaling=autoscaling,
                size=size,
                min_size=min_size,
                max_size=max_size,
                zone=zone,
                node_price_per_hour=float(node_price_per_hour),
                capacity=dict(capacity),
                allocatable=dict(allocatable),
                labels=merged_labels,
                taints=dict(taints or {}),
                created_at=now,
                updated_at=now,
                tags=list(tags or []),
                root_volume_size=root_volume_size,
                kubelet_args=dict(kubelet_args or {}),
            )
            self.pools[pool.id] = pool
            cluster.pools[pool.id] = pool
            cluster._pool_list = None
            if nodes is None:
                nodes = size
            specs = [{} for _ in range(nodes)] if isinstance(nodes, int) else nodes
            for spec in specs:
                self._add_node_from_spec(pool, spec)
            # Fewer initial nodes than ``size`` start booting now; more are retired (the size invariant).
            self._reconcile(pool, None)
            if status is None:
                self._refresh_pool_status(pool)
            return pool

    def _add_node_from_spec(self, pool: Pool, spec: dict[str, Any]) -> Node:
        unknown = sorted(set(spec) - {"id", "status", "provider_id", "name", "error_message"})
        if unknown:
            raise ScenarioError(f"pool {pool.name}: unknown node key(s) {', '.join(unknown)}")
        status = spec.get("status", "ready")
        if status not in NODE_STATUSES:
            raise ScenarioError(f"pool {pool.name}: unknown node status {status!r}")
        node = self._create_node(pool, status=status, node_id=spec.get("id"), provider_id=spec.get("provider_id"))
        if "name" in spec:
            node.name = spec["name"]
        node.error_message = spec.get("error_message")
        self._schedule(node, self.clock.now())
        return node

    def _create_node(
        self, pool: Pool, *, status: str, node_id: str | None = None, provider_id: str | None = None
    ) -> Node:
        cluster = self.clusters[pool.cluster_id]
        node_id = node_id or self.new_id()
        if node_id in self.nodes:
            raise ScenarioError(f"duplicate node id {node_id}")
        server_id = self.new_id()
        real_provider_id = provider_id if provider_id is not None else f"scaleway://instance/{pool.zone}/{server_id}"
        hidden = status == "creating" and not self.behaviour.provider_id_at_creation and provider_id is None
        now = self.clock.now()
        self._node_sequence += 1
        node = Node(
            id=node_id,
            pool_id=pool.id,
            cluster_id=cluster.id,
            provider_id="" if hidden else real_provider_id,
            pending_provider_id=real_provider_id if hidden else "",
            name=f"scw-{cluster.name}-{pool.name}-{server_id.replace('-', '')[:20]}",
            status=status,
            created_at=now,
            updated_at=now,
            sequence=self._node_sequence,
        )
        self.nodes[node.id] = node
        pool.nodes[node.id] = node
        cluster.nodes[node.id] = node
        cluster._node_list = None
        return node

    def _remove_node(self, node: Node) -> None:
        self.nodes.pop(node.id, None)
        pool = self.pools.get(node.pool_id)
        if pool is not None:
            pool.nodes.pop(node.id, None)
        cluster = self.clusters.get(node.cluster_id)
        if cluster is not None:
            cluster.nodes.pop(node.id, None)
            cluster._node_list = None
        node.generation += 1  # invalidates any queued event

    def remove_pool(self, pool_id: str) -> None:
        with self.lock:
            pool = self._pool(pool_id)
            for node in list(pool.nodes.values()):
                self._remove_node(node)
            del self.pools[pool.id]
            cluster = self.clusters[pool.cluster_id]
            cluster.pools.pop(pool.id, None)
            cluster._pool_list = None

    # -- lookups -------------------------------------------------------------------------------------

    def _cluster(self, cluster_id: str, region: str | None = None) -> Cluster:
        cluster = self.clusters.get(cluster_id)
        if cluster is None or (region is not None and cluster.region != region):
            raise NotFound("cluster", cluster_id)
        return cluster

    def _pool(self, pool_id: str, region: str | None = None) -> Pool:
        pool = self.pools.get(pool_id)
        if pool is None or (region is not None and self.clusters[pool.cluster_id].region != region):
            raise NotFound("pool", pool_id)
        return pool

    def _node(self, node_id: str, region: str | None = None) -> Node:
        node = self.nodes.get(node_id)
        if node is None or (region is not None and self.clusters[node.cluster_id].region != region):
            raise NotFound("node", node_id)
        return node

    def known_region(self, region: str) -> bool:
        with self.lock:
            return (
                region in KAPSULE_REGIONS
                or region == self.default_region
                or any(c.region == region for c in self.clusters.values())
            )

    # -- region-checked views for the HTTP layer (callers hold ``lock`` while they serialise) ----------

    def cluster_in(self, region: str, cluster_id: str) -> Cluster:
        with self.lock:
            return self._cluster(cluster_id, region)

    def cluster_pools(self, region: str, cluster_id: str) -> list[Pool]:
        with self.lock:
            self.run_due()
            return self._cluster(cluster_id, region).pool_list()

    def cluster_nodes(self, region: str, cluster_id: str, pool_id: str | None = None) -> list[Node]:
        with self.lock:
            self.run_due()
            cluster = self._cluster(cluster_id, region)
            if pool_id is None:
                return cluster.node_list()
            pool = cluster.pools.get(pool_id)
            return list(pool.nodes.values()) if pool is not None else []

    def pool_in(self, region: str, pool_id: str) -> Pool:
        with self.lock:
            self.run_due()
            return self._pool(pool_id, region)

    def node_in(self, region: str, node_id: str) -> Node:
        with self.lock:
            self.run_due()
            return self._node(node_id, region)

    # -- the autoscaler API operations -----------------------------------------------------------------

    def list_pools(self, region: str, cluster_id: str, page: int, page_size: int) -> Page:
        with self.lock:
            self.run_due()
            pools = self._cluster(cluster_id, region).pool_list()
            start = (page - 1) * page_size
            return Page([pool.to_api() for pool in pools[start : start + page_size]], len(pools))

    def list_nodes(self, region: str, cluster_id: str, page: int, page_size: int) -> Page:
        with self.lock:
            self.run_due()
            nodes = self._cluster(cluster_id, region).node_list()
            start = (page - 1) * page_size
            return Page([node.to_api() for node in nodes[start : start + page_size]], len(nodes))

    def update_pool_size(self, region: str, pool_id: str, size: int) -> dict[str, Any]:
        with self.lock:
            self.run_due()
            pool = self._pool(pool_id, region)
            self._check_held(pool)
            if size < 0:
                raise InvalidArguments(ArgumentProblem("size", "constraint", "size must be greater or equal to 0"))
            # min_size and max_size bound a pool only while its autoscaling is on (the SDK's field docs).
            bounded = self.behaviour.enforce_size_bounds and pool.autoscaling
            if bounded and not pool.min_size <= size <= pool.max_size:
                raise InvalidArguments(
                    ArgumentProblem(
                        "size",
                        "constraint",
                        f"size must be between min_size ({pool.min_size}) and max_size ({pool.max_size})",
                    )
                )
            failure: tuple[str, int | None] | None = None
            if size > pool.size:
                self._check_quota(pool, size)
                if pool.pending_failures:
                    failure = pool.pending_failures.popleft()
                    mode = failure[0]
                    if mode == "quota":
                        current = self._active_nodes_in_cluster(pool.cluster_id)
                        raise QuotaExceeded("k8s_nodes", current, current)
                    if mode == "out_of_stock":
                        raise OutOfStock(pool.node_type)
            changed = size != pool.size
            smaller = size < pool.size
            pool.size = size
            if changed:
                pool.updated_at = self.clock.now()
                if smaller:
                    self._settle(pool)
                self._reconcile(pool, failure)
            self._refresh_pool_status(pool)
            answer = pool.to_api()
            if changed and answer["status"] == "ready":
                answer["status"] = "scaling"  # recorded: the PATCH answer says scaling whenever the size changed
            return answer

    def delete_node(self, region: str, node_id: str) -> dict[str, Any]:
        with self.lock:
            self.run_due()
            node = self._node(node_id, region)
            pool = self.pools[node.pool_id]
            if node.status in GONE_NODE_STATUSES:
                if self.behaviour.repeated_delete == "conflict":
                    raise TransientState("node", node.id, node.status)
                return node.to_api()
            self._check_held(pool)
            now = self.clock.now()
            self._set_status(node, "deleting", now)
            # Public-API docs and upstream's local pool.Size-- agree: deleting a node shrinks its pool.
            pool.size = max(0, pool.size - 1)
            pool.updated_at = now
            self._settle(pool)
            self._refresh_pool_status(pool)
            return node.to_api()

    # -- scaling ---------------------------------------------------------------------------------------

    def _check_held(self, pool: Pool) -> None:
        """A write on a locked or upgrading pool: refused (409) unless the scenario says Kapsule accepts it."""
        if pool.status in HELD_POOL_STATUSES and self.behaviour.transient_pool_writes == "conflict":
            raise TransientState("pool", pool.id, pool.status)

    def _settle(self, pool: Pool) -> None:
        """Recorded: a pool whose size went down reads "scaling" briefly, then "ready" while the removed
        nodes are still "deleting"."""
        if not self.behaviour.pool_scaling_while_deleting:
            pool.settle_until = self.clock.now() + self.timings.scale_down_settle
            self._settling[pool.id] = pool

    def _active_nodes_in_cluster(self, cluster_id: str) -> int:
        return sum(1 for n in self.clusters[cluster_id].nodes.values() if n.status not in GONE_NODE_STATUSES)

    def _check_quota(self, pool: Pool, new_size: int) -> None:
        quota = self.behaviour.node_quota
        if quota is None:
            return
        current = self._active_nodes_in_cluster(pool.cluster_id)
        active_in_pool = sum(1 for n in pool.nodes.values() if n.status not in GONE_NODE_STATUSES)
        wanted = current + max(0, new_size - active_in_pool)
        if wanted > quota:
            raise QuotaExceeded("k8s_nodes", quota, current)

    def _reconcile(self, pool: Pool, failure: tuple[str, int | None] | None) -> None:
        """Create or retire nodes so the pool's non-deleting nodes converge to ``pool.size``."""
        now = self.clock.now()
        active = [n for n in pool.nodes.values() if n.status not in GONE_NODE_STATUSES]
        missing = pool.size - len(active)
        if missing > 0:
            failing = 0
            if failure is not None and failure[0] == "creation_error":
                failing = missing if failure[1] is None else min(missing, failure[1])
            for index in range(missing):
                node = self._create_node(pool, status="creating")
                if index < failing:
                    node.fails_with = "scaleway node could not be created: insufficient capacity for node type"
                self._schedule(node, now)
        elif missing < 0:
            # Default policy (Kapsule's is not published): nodes that are not ready go first, then the newest.
            victims = sorted(active, key=lambda n: (n.status == "ready", -n.sequence))[:-missing]
            for node in victims:
                self._set_status(node, "deleting", now)

    # -- transitions -------------------------------------------------------------------------------------

    def _duration(self, status: str) -> float | None:
        timings = self.timings
        return {
            "creating": timings.creating,
            "starting": timings.starting,
            "registering": timings.registering,
            "not_ready": timings.not_ready if timings.not_ready > 0 else None,
            "deleting": timings.deleting,
            "deleted": timings.deleted_kept if timings.deleted_kept > 0 else None,
        }.get(status)

    def _schedule(self, node: Node, since: float) -> None:
        node.generation += 1
        duration = self._duration(node.status)
        if duration is None:
            node.due = None
            return
        node.due = since + duration
        self._event_sequence += 1
        heapq.heappush(self._events, (node.due, self._event_sequence, node.id, node.generation))

    def _set_status(self, node: Node, status: str, at: float) -> None:
        node.status = status
        node.updated_at = at
        self._schedule(node, at)

    def _next_status(self, node: Node) -> str | None:
        """The status after the current one ends; None means the node disappears."""
        if node.status == "creating":
            return "creation_error" if node.fails_with else "starting"
        if node.status == "starting":
            return "registering"
        if node.status == "registering":
            return "not_ready" if self.timings.not_ready > 0 else "ready"
        if node.status == "not_ready":
            return "ready"
        if node.status == "deleting":
            return "deleted" if self.timings.deleted_kept > 0 else None
        return None  # "deleted" after its grace period

    def run_due(self, now: float | None = None) -> int:
        """Apply every transition due by ``now``; returns how many were applied."""
        with self.lock:
            now = self.clock.now() if now is None else now
            applied = 0
            touched: dict[str, Pool] = {}
            while self._events and self._events[0][0] <= now:
                due, _, node_id, generation = heapq.heappop(self._events)
                node = self.nodes.get(node_id)
                if node is None or node.generation != generation:
                    continue  # superseded by a manual edit, a delete or removal
                applied += 1
                pool = self.pools[node.pool_id]
                touched[pool.id] = pool
                following = self._next_status(node)
                if following is None:
                    self._remove_node(node)
                    continue
                if node.status == "creating" and node.pending_provider_id:
                    node.provider_id, node.pending_provider_id = node.pending_provider_id, ""
                if following == "creation_error":
                    node.error_message = node.fails_with
                self._set_status(node, following, due)
            for pool_id, pool in list(self._settling.items()):
                if pool.settle_until is None or pool.settle_until <= now:
                    pool.settle_until = None
                    del self._settling[pool_id]
                    if pool_id in self.pools:
                        touched[pool_id] = pool
            for pool in touched.values():
                self._refresh_pool_status(pool)
            return applied

    def _refresh_pool_status(self, pool: Pool) -> None:
        if pool.status in HELD_POOL_STATUSES:
            return
        active = [n for n in pool.nodes.values() if n.status not in GONE_NODE_STATUSES]
        # Which nodes keep the pool "scaling": booting ones; draining ones only in our earlier model.
        working = pool.nodes.values() if self.behaviour.pool_scaling_while_deleting else active
        if self.behaviour.warning_on_creation_error and any(n.status == "creation_error" for n in active):
            status = "warning"
        elif (
            len(active) != pool.size
            or any(n.due is not None for n in working)
            or (pool.settle_until is not None and self.clock.now() < pool.settle_until)
        ):
            status = "scaling"  # work is in flight: nodes booting (or draining), or size not reached
        else:
            status = "ready"
        if status != pool.status:
            pool.status = status
            pool.updated_at = self.clock.now()

    # -- manual edits (tests, control API) -------------------------------------------------------------

    def fail_next_scale_up(self, pool_id: str, mode: str = "creation_error", nodes: int | None = None) -> None:
        """Make the next size increase of this pool fail.

        ``creation_error``: the PATCH succeeds, then ``nodes`` of the new nodes (all when None) end in
        ``creation_error`` instead of starting and stay there. ``quota``: the PATCH answers 403
        ``quotas_exceeded``. ``out_of_stock``: the PATCH answers 503 ``out_of_stock``.
        """
        if mode not in SCALE_UP_FAILURE_MODES:
            raise ValueError(f"mode must be one of {', '.join(SCALE_UP_FAILURE_MODES)}, not {mode!r}")
        if nodes is not None and nodes < 1:
            raise ValueError("nodes must be >= 1 or None")
        with self.lock:
            self._pool(pool_id).pending_failures.append((mode, nodes))

    def set_pool_status(self, pool_id: str, status: str) -> None:
        """Force a pool status. ``locked``/``upgrading`` hold until changed; others are recomputed."""
        if status not in POOL_STATUSES:
            raise ValueError(f"unknown pool status {status!r}")
        with self.lock:
            pool = self._pool(pool_id)
            pool.status = status
            pool.updated_at = self.clock.now()
            self._refresh_pool_status(pool)

    def edit_pool(self, pool_id: str, **changes: Any) -> Pool:
        """Edit pool fields in place (autoscaling, min/max, labels, taints, price, ...); size reconciles."""
        editable = {
            "autoscaling",
            "min_size",
            "max_size",
            "labels",
            "taints",
            "node_price_per_hour",
            "capacity",
            "allocatable",
            "version",
            "name",
            "size",
            "status",
            "tags",
        }
        unknown = sorted(set(changes) - editable)
        if unknown:
            raise ValueError(f"cannot edit pool field(s) {', '.join(unknown)}; editable: {', '.join(sorted(editable))}")
        with self.lock:
            pool = self._pool(pool_id)
            status = changes.pop("status", None)
            size = changes.pop("size", None)
            for name, value in changes.items():
                setattr(pool, name, value)
            pool.updated_at = self.clock.now()
            if size is not None and size != pool.size:
                pool.size = size
                self._reconcile(pool, None)
            if status is not None:
                self.set_pool_status(pool.id, status)
            else:
                self._refresh_pool_status(pool)
            return pool

    def set_node_status(self, node_id: str, status: str, error_message: str | None = None) -> None:
        """Force a node status; transitional statuses resume their sequence from now."""
        if status not in NODE_STATUSES:
            raise ValueError(f"unknown node status {status!r}")
        with self.lock:
            node = self._node(node_id)
            if node.pending_provider_id and status != "creating":
                node.provider_id, node.pending_provider_id = node.pending_provider_id, ""
            node.error_message = error_message
            if status != "creation_error":
                node.fails_with = None
            self._set_status(node, status, self.clock.now())
            self._refresh_pool_status(self.pools[node.pool_id])

    def set_behaviour(self, **changes: Any) -> Behaviour:
        with self.lock:
            self.behaviour = replace(self.behaviour, **changes)
            return self.behaviour

    # -- views ---------------------------------------------------------------------------------------------

    def pool(self, pool_id: str) -> Pool:
        with self.lock:
            return self._pool(pool_id)

    def node(self, node_id: str) -> Node:
        with self.lock:
            return self._node(node_id)

    def nodes_of(self, pool_id: str) -> list[Node]:
        with self.lock:
            return list(self._pool(pool_id).nodes.values())

    def node_refs(self, cluster_id: str, registered_only: bool = True) -> list[dict[str, Any]]:
        """The Kubernetes Node objects the cluster would have, reduced to what a provider is given.

        A node is registered with Kubernetes once its kubelet has joined (``not_ready`` onwards, still
        while draining); its labels are the pool labels plus the hostname.
        """
        with self.lock:
            self.run_due()
            refs = []
            for node in self._cluster(cluster_id).node_list():
                if registered_only and node.status not in REGISTERED_NODE_STATUSES:
                    continue
                labels = self.kubernetes_labels(node)
                refs.append(
                    {
                        "provider_id": node.provider_id,
                        "name": node.name,
                        "labels": labels,
                        "annotations": {},
                        "pool_id": node.pool_id,
                        "node_id": node.id,
                        "status": node.status,
                    }
                )
            return refs

    def kubernetes_labels(self, node: Node) -> dict[str, str]:
        """The labels of the Kubernetes Node of ``node`` as a real Kapsule node has them
        (``catalog.kubernetes_labels``)."""
        with self.lock:
            pool = self.pools[node.pool_id]
            return node_kubernetes_labels(
                node_type=pool.node_type,
                node_name=node.name,
                node_id=node.id,
                pool_id=pool.id,
                pool_name=pool.name,
                cluster_id=pool.cluster_id,
                region=self.clusters[pool.cluster_id].region,
                zone=pool.zone,
                pool_labels=pool.labels,
                pool_tags=pool.tags,
            )

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            self.run_due()
            return {
                "now": self.clock.now(),
                "timings": asdict(self.timings),
                "behaviour": asdict(self.behaviour),
                "clusters": [cluster.to_dict() for cluster in self.clusters.values()],
                "pools": [{**pool.to_api(), "tags": list(pool.tags)} for pool in self.pools.values()],
                "nodes": [node.to_api() for node in self.nodes.values()],
            }
