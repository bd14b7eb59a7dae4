"""Kapsule pools as node groups: the Scaleway ``CloudAdapter``.

Only what is Scaleway-specific lives here (docs/reference/scaleway.md): which pools are
groups, how nodes map to instances, how a size is written and a node deleted, templates and prices.
Delta and min/max checks, pending changes, locking and syncing are the shared ``Backend``'s.

The two modes of the config differ only in the endpoints (client.py) and in which pools are groups
(``AutoscaledPools``: Kapsule's autoscaling on, the pool's bounds; ``ConfiguredPools``: the pools the
config names, autoscaling off, the config's bounds). In the public mode the template's resources and
the price come from the Instance product catalog (``CatalogCache``) instead of the pool record.

What this adapter relies on from Kapsule (each fact with its public source: docs/reference/scaleway.md, "Evidence"):
- ``DELETE .../nodes/{id}`` (either mode) drains the node and lowers its pool's ``size`` by one on the
  cloud side (public API docs: "Pool size is reduced by 1"; upstream mirrors it with a local
  ``pool.Size--`` after the call). So ``delete_instance`` only deletes; it never PATCHes the size,
  which would shrink the pool twice (a smaller size makes Kapsule remove a machine of its choosing).
- ``PATCH .../pools/{id}`` with ``{"size": n}`` sets the absolute desired size. It is sent
  whatever the pool's last known status: nothing public says Kapsule refuses it while the pool is
  ``upgrading`` or ``locked`` (the upstream provider sends it too), and when Kapsule does refuse, its 409
  names the state it saw (``current_state``), which is what the CA is told.
- A 2xx answer to either write means it is done, whatever its body; a 404 means "gone" only when the
  body is Scaleway's typed ``not_found`` naming the pool or the node (a gateway's bare 404 is not).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from providers.cloud import CloudAdapter
from providers.deadline import Deadline
from providers.errors import (
    CloudAuthFailed,
    CloudRequestRejected,
    DomainError,
    GroupBusy,
    NodeGroupNotFound,
    NotSupported,
)
from providers.http_transport import BreakerSettings, RetryPolicy
from providers.model import CloudListing, GroupState, Instance, NodeRef, NodeTemplate
from providers.scaleway.client import Node, Pool, ScalewayClient, ServerType
from providers.scaleway.config import PoolBounds, ScalewayConfig
from providers.scaleway.statuses import KNOWN_STATUSES, instance_status
from providers.scaleway.templates import (
    GPU_LABEL,
    POOL_ID_LABEL,
    Machine,
    catalog_machine,
    gpu_type,
    instance_type,
    pool_template,
    same_instance_type,
)

log = logging.getLogger(__name__)

# Error ``resource`` names that mean the pool or the node itself (recorded answers say "pool"; the
# simulator's earlier "k8s_"-prefixed names are read too).
POOL_RESOURCES = frozenset({"pool", "k8s_pool"})
NODE_RESOURCES = frozenset({"node", "k8s_node"})
# A node in one of these states is already what a deletion asks for.
GONE_NODE_STATES = frozenset({"deleting", "deleted"})
# Prefix of the id of a node Kapsule has not given a machine yet (empty provider_id), see synthetic_id.
SYNTHETIC_ID_PREFIX = "scaleway://kapsule-node/"
# Public mode: a zone's product catalog is read again after this long (prices and types change rarely).
CATALOG_MAX_AGE = 3600.0
# ... and, after a failed read with nothing cached, at the next listing this much later at the earliest.
CATALOG_RETRY = 60.0


def synthetic_id(node: Node) -> str:
    """Instance id for a node whose ``provider_id`` is still empty (or duplicated).

    Upstream keys nodes by ``provider_id``, so several nodes being created collapse into one map entry
    and the CA under-counts upcoming nodes (docs/reference/scaleway.md, "Instances"). We give such a node an id
    built from its Kapsule node id: it is stable from one sync to the next (the node id never changes),
    unique, and cannot collide with a real ``scaleway://instance/<zone>/<uuid>`` providerID. The CA
    sees it as an upcoming instance; when the machine registers, the real providerID replaces it.
    A DeleteNodes for it (the CA's fake node of an unregistered instance carries this id) still works
    because deletion uses the node id, kept as ``Instance.cloud_id``.
    """
    return SYNTHETIC_ID_PREFIX + node.id


def _resource(err: CloudRequestRejected) -> str:
    value = (err.body or {}).get("resource")
    return value if isinstance(value, str) else ""


def _current_state(err: CloudRequestRejected) -> str:
    value = (err.body or {}).get("current_state")
    return value if isinstance(value, str) else ""


def _names(err: CloudRequestRejected, resources: frozenset[str]) -> bool:
    """Whether the error body is Scaleway's typed answer about one of ``resources`` (``resource`` field)."""
    return _resource(err) in resources


def _untyped_not_found(err: CloudRequestRejected, what: str) -> CloudRequestRejected:
    """A 404 that does not say the pool or node is gone (a gateway's bare ``{"message": ...}``, or another
    resource such as the region): the call reached no Kapsule object, so nothing is known about ``what``."""
    named = _resource(err)
    why = f"names the {named}, not the {what.split()[0]}" if named else "names no resource"
    return CloudRequestRejected(
        f"{err} The 404 {why}: {what} was not reached (check api_url and region in the scaleway config)",
        status=err.status,
        body=err.body,
    )


def debug_line(pool: Pool) -> str:
    """The pool summary in the format of the CA's own Scaleway provider (its ``Debug()``)."""
    return (
        f"id:{pool.id},status:{pool.status},version:{pool.version},autoscaling:{str(pool.autoscaling).lower()},"
        f"size:{pool.size},min_size:{pool.min_size},max_size:{pool.max_size}"
    )


def to_instances(nodes: Iterable[Node]) -> tuple[Instance, ...]:
    """Instances of one pool's nodes, sorted by id so equal cloud states give equal tuples."""
    instances: list[Instance] = []
    seen: set[str] = set()
    for node in sorted(nodes, key=lambda n: n.id):
        instance_id = node.provider_id if node.provider_id and node.provider_id not in seen else synthetic_id(node)
        if node.provider_id and instance_id != node.provider_id:
            log.warning(
                "two Kapsule nodes report providerID %s; node %s is listed as %s",
                node.provider_id,
                node.id,
                instance_id,
                extra={"node_group": node.pool_id},
            )
        seen.add(instance_id)
        if node.status not in KNOWN_STATUSES:
            log.warning(
                "unknown Kapsule node status %r for node %s; reported to the CA as an instance error",
                node.status,
                node.id,
                extra={"node_group": node.pool_id},
            )
        state, error = instance_status(node.status, node.error_message)
        instances.append(
            Instance(
                id=instance_id,
                state=state,
                cloud_id=node.id,
                name=node.name,
                error=error,
                cloud_status=node.status,
            )
        )
    return tuple(sorted(instances, key=lambda i: i.id))


@dataclass(frozen=True, slots=True)
class Selected:
    """A pool that is a node group, with the bounds the CA keeps it within."""

    pool: Pool
    min_size: int
    max_size: int


@dataclass(frozen=True, slots=True)
class PoolFinding:
    """One entry of ``scaleway.pools`` the public mode does not serve as written: the server logs it, and
    ``validate --online`` names it as a problem of the setting ``pools.<key>``."""

    key: str  # the entry of scaleway.pools (a pool name or id)
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"scaleway.pools.{self.key}: {self.problem}; {self.fix}"


class AutoscaledPools:
    """Private mode: every pool whose Kapsule autoscaling is on, within the pool's own bounds (as upstream)."""

    def select(self, pools: Iterable[Pool]) -> tuple[list[Selected], list[PoolFinding]]:
        return [Selected(p, p.min_size, p.max_size) for p in pools if p.autoscaling], []


class ConfiguredPools:
    """Public mode: the pools ``scaleway.pools`` names (by name or id), within the config's bounds; a named
    pool whose Kapsule autoscaling is on is left to Kapsule's managed autoscaler, with one line saying so."""

    def __init__(self, pools: Mapping[str, PoolBounds], region: str, cluster_id: str) -> None:
        self.pools = dict(pools)
        self.region = region
        self.cluster_id = cluster_id

    def select(self, pools: Iterable[Pool]) -> tuple[list[Selected], list[PoolFinding]]:
        listed = list(pools)
        chosen: dict[str, Selected] = {}
        named_by: dict[str, str] = {}  # pool id -> the entry that chose it
        findings: list[PoolFinding] = []
        for key, bounds in self.pools.items():
            matches = [p for p in listed if key in (p.id, p.name)]
            if not matches:
                findings.append(
                    PoolFinding(
                        key,
                        "the cluster has no pool of that name or id, so no node group comes of it",
                        f"name a pool as `scw k8s pool list cluster-id={self.cluster_id} region={self.region}` shows "
                        f"it (its name or its id), or remove {key!r} from scaleway.pools",
                    )
                )
                continue
            if len(matches) > 1:
                ids = ", ".join(p.id for p in matches)
                findings.append(
                    PoolFinding(
                        key,
                        f"{len(matches)} pools of the cluster are named {key!r} ({ids}), so none of them is a "
                        "node group",
                        "name the pool by its id instead",
                    )
                )
                continue
            pool = matches[0]
            if pool.autoscaling:
                findings.append(
                    PoolFinding(
                        key,
                        f"pool {pool.name!r} ({pool.id}) is left untouched: its Kapsule autoscaling is on, so "
                        "Kapsule's managed autoscaler also manages it",
                        f"switch its autoscaling off (console: the pool's settings, or `scw k8s pool update {pool.id} "
                        f"autoscaling=false region={self.region}`), or remove {key!r} from scaleway.pools",
                    )
                )
                continue
            if pool.id in chosen:
                first = named_by[pool.id]
                findings.append(
                    PoolFinding(
                        key,
                        f"names pool {pool.id}, which {first!r} names too (one by name, one by id); the bounds of "
                        f"{first!r} are used",
                        "remove one of the two entries",
                    )
                )
                continue
            chosen[pool.id] = Selected(pool, bounds.min_size, bounds.max_size)
            named_by[pool.id] = key
        return list(chosen.values()), findings


def to_group(selected: Selected, nodes: Iterable[Node], region: str, machine: Machine | None = None) -> GroupState:
    pool = selected.pool
    return GroupState(
        id=pool.id,
        min_size=selected.min_size,
        max_size=selected.max_size,
        target_size=pool.size,
        instances=to_instances(nodes),
        template=pool_template(pool, region, None, machine),
        debug=debug_line(pool),
        name=pool.name,
        price_per_hour=machine.price_per_hour if machine is not None else pool.node_price_per_hour,
        cloud_data=pool,
    )


def to_groups(
    selected: Sequence[Selected],
    nodes: Iterable[Node],
    region: str,
    machines: Mapping[str, Machine] | None = None,
) -> tuple[GroupState, ...]:
    """One group per selected pool; nodes of other pools are dropped (docs/reference/scaleway.md)."""
    chosen = {s.pool.id: s for s in selected}
    by_pool: dict[str, list[Node]] = {pool_id: [] for pool_id in chosen}
    for node in nodes:
        if node.pool_id in by_pool:
            by_pool[node.pool_id].append(node)
    return tuple(to_group(chosen[pid], by_pool[pid], region, (machines or {}).get(pid)) for pid in sorted(chosen))


class CatalogCache:
    """The Instance product catalog of each zone the groups are in (public mode), read at most once an hour.

    A failed read keeps the copy in hand (prices and types change rarely); with none, the pools of that
    zone have no template or price until a later listing reads it. A failed read is tried again, and
    logged, at most once a minute."""

    def __init__(self, client: ScalewayClient, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._zones: dict[str, tuple[float, Mapping[str, ServerType]]] = {}
        self._failed: dict[str, float] = {}
        # Why each zone's last read failed, until one succeeds (validate --online names it).
        self.failures: dict[str, DomainError] = {}

    def types(self, zone: str, deadline: Deadline) -> Mapping[str, ServerType]:
        now = self._clock()
        fetched_at, types = self._zones.get(zone, (-math.inf, {}))
        if now - fetched_at < CATALOG_MAX_AGE or now - self._failed.get(zone, -math.inf) < CATALOG_RETRY:
            return types
        try:
            fresh = self._client.list_server_types(zone, deadline)
        except DomainError as err:
            self._failed[zone] = now
            self.failures[zone] = err
            permission = (
                " (the key needs to read the Instance API: an IAM policy with InstancesReadOnly, or "
                "InstancesFullAccess, for the cluster's project)"
                if isinstance(err, CloudAuthFailed)
                else ""
            )
            log.log(
                logging.ERROR if isinstance(err, CloudAuthFailed) else logging.WARNING,
                "the Instance product catalog of %s could not be read%s; %s",
                zone,
                permission,
                "the copy read earlier is kept" if types else "its pools have no template or price until it is",
                extra={"zone": zone, "error": str(err)},
            )
            return types
        self._failed.pop(zone, None)
        self.failures.pop(zone, None)
        self._zones[zone] = (now, fresh)
        return fresh


def node_price(price_per_hour: float, start: dt.datetime, end: dt.datetime) -> float:
    """Upstream NodePrice: whole hours rounded up times the hourly price (0 for an empty window)."""
    hours = math.ceil((end - start).total_seconds() / 3600.0)
    return max(hours, 0) * price_per_hour


class ScalewayAdapter(CloudAdapter):
    """Kapsule autoscaled pools as node groups. Thread-safe: state is an atomically swapped dict."""

    cloud = "scaleway"

    def __init__(
        self,
        config: ScalewayConfig,
        *,
        client: ScalewayClient | None = None,
        retry: RetryPolicy | None = None,
        breaker: BreakerSettings = BreakerSettings(),  # noqa: B008 - frozen, immutable default
    ) -> None:
        self.config = config
        self.client = client or ScalewayClient(config, retry=retry, breaker=breaker)
        self._region = config.region
        self.selection = (
            ConfiguredPools(config.pools, config.region, config.cluster_id) if config.public else AutoscaledPools()
        )
        self.catalog = CatalogCache(self.client) if config.public else None
        # Last pools seen (groups only), for GPU types; replaced whole, never mutated. Public mode: what the
        # catalog says a new node of each is (pool id -> Machine).
        self._pools: Mapping[str, Pool] = {}
        self._machines: Mapping[str, Machine] = {}
        self._pools_lock = threading.Lock()
        # The selection's findings at the last listing (logged when they change; validate --online names them).
        self.findings: tuple[PoolFinding, ...] = ()

    # ------------------------------------------------------------------ reads
    def list_groups(self, deadline: Deadline) -> CloudListing:
        pools = self.client.list_pools(deadline)
        nodes = self.client.list_nodes(deadline)
        selected = self._select(pools.items)
        machines = self._catalog_machines([s.pool for s in selected], deadline)
        groups = to_groups(selected, nodes.items, self._region, machines)
        with self._pools_lock:
            self._pools = {g.id: g.cloud_data for g in groups}
            self._machines = machines
        ages = [age for age in (pools.max_age, nodes.max_age) if age is not None]
        return CloudListing(groups, max_age=min(ages) if ages else None)

    def read_group(self, group_id: str, deadline: Deadline) -> GroupState:
        # Only the pool's sizes are needed before an absolute size write (CloudAdapter.read_group). The
        # autoscaler API has no single-pool GET: the pool list is one page per 100 pools, while the node
        # list of a 5,000-node cluster is 50 pages, too slow for a 5 s CA deadline on the real API. The
        # public API has one.
        if self.client.public:
            try:
                pools = [self.client.get_pool(group_id, deadline)]
            except CloudRequestRejected as err:
                if err.status == 404 and _names(err, POOL_RESOURCES):
                    raise NodeGroupNotFound(group_id) from err
                raise
        else:
            pools = list(self.client.list_pools(deadline).items)
        chosen, _ = self.selection.select(pools)  # its findings are the listing's to log
        selected = next((s for s in chosen if s.pool.id == group_id), None)
        if selected is None:
            raise NodeGroupNotFound(group_id)
        group = to_group(selected, (), self._region, self._machines.get(group_id))
        with self._pools_lock:
            self._pools = {**self._pools, group_id: selected.pool}
        return group

    def _select(self, pools: Iterable[Pool]) -> list[Selected]:
        selected, findings = self.selection.select(pools)
        if tuple(findings) != self.findings:
            self.findings = tuple(findings)
            for finding in findings:
                log.warning("%s", finding, extra={"cluster_id": self.config.cluster_id})
        return selected

    def _catalog_machines(self, pools: Iterable[Pool], deadline: Deadline) -> dict[str, Machine]:
        """Public mode: each pool's node type as the catalog of its zone describes it (none in private mode)."""
        if self.catalog is None:
            return {}
        machines: dict[str, Machine] = {}
        for pool in pools:
            server = self.catalog.types(pool.zone, deadline).get(instance_type(pool.node_type))
            if server is not None:
                machines[pool.id] = catalog_machine(server, pool)
        return machines

    # ------------------------------------------------------------------ writes
    def set_target_size(self, group: GroupState, new_size: int, deadline: Deadline) -> None:
        # Sent whatever status the last listing showed (upgrading, locked...): Kapsule decides, and says why.
        try:
            answer = self.client.update_pool_size(group.id, new_size, deadline)
        except CloudRequestRejected as err:
            if err.status == 404 and _names(err, POOL_RESOURCES):
                raise NodeGroupNotFound(group.id) from err
            if err.status == 404:
                raise _untyped_not_found(err, f"pool {group.id}") from err
            if err.status == 409:
                raise self._busy(group.id, err) from err
            raise
        if answer is None:
            return  # a 2xx without a readable pool: done; the next listing shows the new size
        if answer.size != new_size:
            log.warning(
                "Kapsule answered size %d to a request for %d",
                answer.size,
                new_size,
                extra={"node_group": group.id, "pool_status": answer.status},
            )

    def delete_instance(self, group: GroupState, instance: Instance, node: NodeRef, deadline: Deadline) -> None:
        try:
            self.client.delete_node(instance.cloud_id, deadline)
        except CloudRequestRejected as err:
            if err.status == 404 and _names(err, NODE_RESOURCES):
                # Already gone (a retry after a lost answer, or Kapsule finished first): the goal is met.
                log.info(
                    "node %s was already deleted",
                    instance.cloud_id,
                    extra={"node_group": group.id, "cloud_id": instance.cloud_id},
                )
                return
            if err.status == 404:
                raise _untyped_not_found(err, f"node {instance.cloud_id}") from err
            state = _current_state(err)
            # 409 transient_state names the state Kapsule saw. A node that is already being deleted is what
            # we asked for; any other state (locked, rebooting, upgrading...) is a real refusal.
            if err.status == 409 and _names(err, NODE_RESOURCES) and state in GONE_NODE_STATES:
                return
            if err.status == 409:
                what = f"the API says the {_resource(err) or 'resource'} is {state}" if state else "a conflict"
                raise GroupBusy(
                    f"Kapsule refused to delete node {instance.name or instance.cloud_id} of pool {group.id} now: "
                    f"{what} ({err}); the CA will retry"
                ) from err
            raise

    @staticmethod
    def _busy(group_id: str, err: CloudRequestRejected) -> GroupBusy:
        state = _current_state(err)
        if not state:
            return GroupBusy(
                f"Kapsule refused the size change of pool {group_id} with 409 without naming a state ({err}); the CA "
                "retries on a later loop"
            )
        return GroupBusy(
            f"Kapsule refused the size change of pool {group_id}: the API says the {_resource(err) or 'pool'} is "
            f"{state} ({err}); the CA retries on a later loop. If it stays {state}, check the pool in the Scaleway "
            "console (an upgrade in progress, or a locked account)"
        )

    # ------------------------------------------------------------------ templates, GPUs, prices
    @property
    def gpu_label(self) -> str:
        return GPU_LABEL

    def available_gpu_types(self) -> tuple[str, ...]:
        pools, machines = self._pools, self._machines
        return tuple(sorted({t for t in (gpu_type(p, machines.get(p.id)) for p in pools.values()) if t}))

    def template(self, group: GroupState, observed_labels: Mapping[str, str] | None) -> NodeTemplate | None:
        if isinstance(group.cloud_data, Pool):
            return pool_template(group.cloud_data, self._region, observed_labels, self._machines.get(group.id))
        return group.template

    def same_machine_type(self, first: str, second: str) -> bool:
        return same_instance_type(first, second)

    def group_for_price_node(self, node: NodeRef) -> str | None:
        return node.labels.get(POOL_ID_LABEL) or None

    def node_price(self, group: GroupState, node: NodeRef, start: dt.datetime, end: dt.datetime) -> float:
        if group.price_per_hour is None:
            source = "hourly_price in the Instance product catalog" if self.client.public else "node_price_per_hour"
            raise NotSupported(f"Kapsule pool {group.id} has no {source}; no price for its nodes")
        return node_price(group.price_per_hour, start, end)

    def pod_price(self, pod_bytes: bytes, start: dt.datetime, end: dt.datetime) -> float:
        # Kapsule bills nodes, not pods: a pod's price is 0, as in the CA's own Scaleway provider.
        return 0.0

    # ------------------------------------------------------------------ plumbing
    def instrument(self, metrics: object) -> None:
        self.client.transport.instrument(metrics)

    def guard_writes(self, gate: Callable[[str], float | None]) -> None:
        self.client.transport.guard_writes(gate)

    def health_detail(self) -> str:
        refused = f"; {len(self.findings)} problem(s) with scaleway.pools (see the log)" if self.findings else ""
        return (
            f"scaleway API {self.config.api_url} region {self._region} ({self.config.mode} mode): breaker "
            f"{self.client.transport.breaker_state}{refused}"
        )

    def close(self) -> None:
        self.client.close()
