"""Kapsule pools as node groups: the Scaleway ``CloudAdapter``.

Only what is Scaleway-specific lives here (docs/reference/scaleway.md): which pools are
groups, how nodes map to instances, how a size is written and a node deleted, templates and prices.
Delta and min/max checks, pending changes, locking and syncing are the shared ``Backend``'s.

What this adapter relies on from Kapsule (each fact with its public source: docs/reference/scaleway.md, "Evidence"):
- ``DELETE .../autoscaler/nodes/{id}`` drains the node and lowers its pool's ``size`` by one on the
  cloud side (public API docs: "Pool size is reduced by 1"; upstream mirrors it with a local
  ``pool.Size--`` after the call). So ``delete_instance`` only deletes; it never PATCHes the size,
  which would race with the cloud's own decrement.
- ``PATCH .../autoscaler/pools/{id}`` with ``{"size": n}`` sets the absolute desired size. It is sent
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
from collections.abc import Callable, Iterable, Mapping

from providers.cloud import CloudAdapter
from providers.deadline import Deadline
from providers.errors import CloudRequestRejected, GroupBusy, NodeGroupNotFound, NotSupported
from providers.http_transport import BreakerSettings, RetryPolicy
from providers.model import CloudListing, GroupState, Instance, NodeRef, NodeTemplate
from providers.scaleway.client import Node, Pool, ScalewayClient
from providers.scaleway.config import ScalewayConfig
from providers.scaleway.statuses import KNOWN_STATUSES, instance_status
from providers.scaleway.templates import GPU_LABEL, POOL_ID_LABEL, gpu_type, pool_template, same_instance_type

log = logging.getLogger(__name__)

# Error ``resource`` names that mean the pool or the node itself (recorded answers say "pool"; the
# simulator's earlier "k8s_"-prefixed names are read too).
POOL_RESOURCES = frozenset({"pool", "k8s_pool"})
NODE_RESOURCES = frozenset({"node", "k8s_node"})
# A node in one of these states is already what a deletion asks for.
GONE_NODE_STATES = frozenset({"deleting", "deleted"})
# Prefix of the id of a node Kapsule has not given a machine yet (empty provider_id), see synthetic_id.
SYNTHETIC_ID_PREFIX = "scaleway://kapsule-node/"


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


def to_group(pool: Pool, nodes: Iterable[Node], region: str) -> GroupState:
    return GroupState(
        id=pool.id,
        min_size=pool.min_size,
        max_size=pool.max_size,
        target_size=pool.size,
        instances=to_instances(nodes),
        template=pool_template(pool, region),
        debug=debug_line(pool),
        price_per_hour=pool.node_price_per_hour,
        cloud_data=pool,
    )


def to_groups(pools: Iterable[Pool], nodes: Iterable[Node], region: str) -> tuple[GroupState, ...]:
    """One group per pool with ``autoscaling: true``; nodes of other pools are dropped (docs/reference/scaleway.md)."""
    autoscaled = {pool.id: pool for pool in pools if pool.autoscaling}
    by_pool: dict[str, list[Node]] = {pool_id: [] for pool_id in autoscaled}
    for node in nodes:
        if node.pool_id in by_pool:
            by_pool[node.pool_id].append(node)
    return tuple(to_group(autoscaled[pid], by_pool[pid], region) for pid in sorted(autoscaled))


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
        # Last pools seen (autoscaled only), for GPU types; replaced whole, never mutated.
        self._pools: Mapping[str, Pool] = {}
        self._pools_lock = threading.Lock()

    # ------------------------------------------------------------------ reads
    def list_groups(self, deadline: Deadline) -> CloudListing:
        pools = self.client.list_pools(deadline)
        nodes = self.client.list_nodes(deadline)
        groups = to_groups(pools.items, nodes.items, self._region)
        with self._pools_lock:
            self._pools = {g.id: g.cloud_data for g in groups}
        ages = [age for age in (pools.max_age, nodes.max_age) if age is not None]
        return CloudListing(groups, max_age=min(ages) if ages else None)

    def read_group(self, group_id: str, deadline: Deadline) -> GroupState:
        # Only the pool's sizes are needed before an absolute size write (CloudAdapter.read_group). The
        # autoscaler API has no single-pool GET: the pool list is one page per 100 pools, while the node
        # list of a 5,000-node cluster is 50 pages, too slow for a 5 s CA deadline on the real API.
        pools = self.client.list_pools(deadline)
        pool = next((p for p in pools.items if p.id == group_id), None)
        if pool is None or not pool.autoscaling:
            raise NodeGroupNotFound(group_id)
        group = to_group(pool, (), self._region)
        with self._pools_lock:
            self._pools = {**self._pools, pool.id: pool}
        return group

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
        pools = self._pools
        return tuple(sorted({t for t in (gpu_type(p) for p in pools.values()) if t}))

    def template(self, group: GroupState, observed_labels: Mapping[str, str] | None) -> NodeTemplate | None:
        if isinstance(group.cloud_data, Pool):
            return pool_template(group.cloud_data, self._region, observed_labels)
        return group.template

    def same_machine_type(self, first: str, second: str) -> bool:
        return same_instance_type(first, second)

    def group_for_price_node(self, node: NodeRef) -> str | None:
        return node.labels.get(POOL_ID_LABEL) or None

    def node_price(self, group: GroupState, node: NodeRef, start: dt.datetime, end: dt.datetime) -> float:
        if group.price_per_hour is None:
            raise NotSupported(f"Kapsule pool {group.id} has no node_price_per_hour; no price for its nodes")
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
        return (
            f"scaleway API {self.config.api_url} region {self._region}: breaker {self.client.transport.breaker_state}"
        )

    def close(self) -> None:
        self.client.close()
