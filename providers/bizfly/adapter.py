"""``BizflyAdapter``: Bizfly Kubernetes Engine worker pools as node groups.

Facts followed (docs/reference/bizfly.md, "Node groups" and "Instances"): a node group is a worker pool with
``enable_autoscaling`` true in the cluster GET; its min/max come from that cluster GET entry (that is
where upstream reads them), its target from the pool GET's ``desired_size``; an instance id is
``bizflycloud://<physical_id>`` (what the Bizfly CCM puts in ``spec.providerID``).

Node deletion: the DELETE call takes the pool node ``id``; it is read from the node label
``bke.bizflycloud.vn/node-id`` like upstream, and when the label is missing, from the pool node whose
``physical_id`` matches the node's providerID (the Backend has already matched it). The API lowers
the pool's ``desired_size`` by one when it deletes a node (upstream relies on that too: it only
decrements its cache and never PATCHes after a delete; the simulator does the same), so this adapter
sends no PATCH after a DELETE. A 404 means the node is already gone, which is what was asked.

Node statuses (providers/bizfly/statuses.py): an ``ERROR`` is a failed creation or a machine that failed
after it existed; when its reason does not say which, what this adapter saw of the node in earlier
listings of its pool decides (``History``), so the adapter remembers, per pool, each listed node's
history (bounded by the pool's own node list, forgotten with it).

Scale to zero: no public Bizfly client has ever sent ``desired_size: 0`` (gobizfly's field is omitted
when zero), so after a 2xx to that PATCH the pool is read back; a pool that does not show 0 is a precise
error (and a ``cloud_write_checks_total`` sample), never a silent success.

Upstream defects not copied: a pool that disappears between the cluster GET and its pool GET no
longer aborts the whole refresh (it is skipped); pools are read concurrently; malformed bodies are
typed errors, never a crash; providerIDs are matched through the Backend's dict, not an O(N²) scan.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.bizfly.client import BizflyClient
from providers.bizfly.config import BizflyConfig
from providers.bizfly.statuses import History, map_status
from providers.bizfly.templates import GPU_LABEL, NODE_ID_LABEL, build_template
from providers.cloud import CloudAdapter
from providers.deadline import Deadline
from providers.errors import (
    CloudRequestRejected,
    CloudUnavailable,
    DomainError,
    GroupBusy,
    NodeGroupNotFound,
)
from providers.model import CloudListing, GroupState, Instance, NodeRef, NodeTemplate

log = logging.getLogger(__name__)

PROVIDER_ID_PREFIX = "bizflycloud://"
# A pool node the API lists before it has a cloud server: a unique id no Kubernetes node will carry.
PENDING_ID_PREFIX = "bizflycloud-pending://"
POOL_FETCH_WORKERS = 4
# The one write no public client has made: read back (see the module docstring).
ZERO_CHECK = "desired_size_zero"


@dataclass(frozen=True, slots=True)
class PoolData:
    """What the adapter keeps of a pool in ``GroupState.cloud_data`` (for templates and deletes)."""

    pool: Mapping[str, Any]
    region_label: str


def _int_field(body: Mapping[str, Any], key: str, what: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if value is None and default is not None:
        return default
    # Upstream decodes with Go: a string or a float here is an error, not a guess.
    if isinstance(value, bool) or not isinstance(value, int):
        raise CloudUnavailable(
            f"malformed answer from the bizfly API: {what} field {key!r} is {value!r}, expected an integer"
        )
    return value


def _mapping(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        shown = "empty" if body is None else type(body).__name__
        raise CloudUnavailable(f"malformed answer from the bizfly API: {what} is {shown}, expected a JSON object")
    return body


class BizflyAdapter(CloudAdapter):
    cloud = "bizfly"

    def __init__(self, config: BizflyConfig, client: BizflyClient | None = None) -> None:
        self.config = config
        self.client = client or BizflyClient(config)
        self._pool = concurrent.futures.ThreadPoolExecutor(POOL_FETCH_WORKERS, thread_name_prefix="bizfly-pool")
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()
        # pool id -> {node key -> History}: what the earlier listings of the pool showed of each node.
        self._histories: dict[str, dict[str, History]] = {}
        self._histories_lock = threading.Lock()
        self._metrics: Any = None

    # ------------------------------------------------------------------ reads
    def list_groups(self, deadline: Deadline) -> CloudListing:
        cluster = self._cluster(deadline)
        entries = [e for e in self._pool_entries(cluster) if e.get("enable_autoscaling") is True]
        if not entries:
            self._warn_once(
                "no-groups",
                "no worker pool of the Bizfly cluster has autoscaling enabled; enable it (and set min/max) "
                "in the dashboard for pools the autoscaler should manage",
            )
        pools = self._fetch_pools([str(e.get("id") or "") for e in entries], deadline)
        with self._histories_lock:  # a pool no longer listed takes its nodes' history with it
            for gone in set(self._histories) - set(pools):
                del self._histories[gone]
        groups = []
        for entry in entries:
            pool = pools.get(str(entry.get("id") or ""))
            if pool is not None:
                groups.append(self._group(entry, pool))
        return CloudListing(tuple(groups))

    def read_group(self, group_id: str, deadline: Deadline) -> GroupState:
        # Both reads are needed (min/max live in the cluster GET): run them side by side.
        # In this call's context: a read for a size change may be its API's breaker probe (change_waiting).
        pool_future = self._pool.submit(contextvars.copy_context().run, self._pool_or_none, group_id, deadline)
        cluster = self._cluster(deadline)
        pool = pool_future.result()
        entry = next((e for e in self._pool_entries(cluster) if str(e.get("id") or "") == group_id), None)
        if entry is None or entry.get("enable_autoscaling") is not True or pool is None:
            raise NodeGroupNotFound(group_id)
        return self._group(entry, pool)

    def _cluster(self, deadline: Deadline) -> Mapping[str, Any]:
        try:
            body = self.client.get_cluster(deadline)
        except CloudRequestRejected as err:
            if err.status == 404:
                raise CloudRequestRejected(
                    f"Bizfly cluster {self.config.cluster_name!r} does not exist for these credentials; check "
                    f"cluster_name (CLUSTER_NAME must be the cluster UID) and the region ({err})",
                    status=404,
                ) from None
            raise
        return _mapping(body, "the cluster")

    @staticmethod
    def _pool_entries(cluster: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        pools = cluster.get("worker_pools")
        if pools is None:
            return []
        if not isinstance(pools, list):
            raise CloudUnavailable("malformed answer from the bizfly API: the cluster's worker_pools is not a list")
        return [p for p in pools if isinstance(p, Mapping) and p.get("id")]

    def _fetch_pools(self, pool_ids: list[str], deadline: Deadline) -> dict[str, Mapping[str, Any]]:
        futures = {pid: self._pool.submit(self._pool_or_none, pid, deadline) for pid in pool_ids}
        result: dict[str, Mapping[str, Any]] = {}
        first_error: BaseException | None = None
        for pid, future in futures.items():
            # Every call inside is bounded by the deadline, so waiting for all of them is bounded too.
            try:
                pool = future.result()
            except Exception as err:  # noqa: BLE001 - re-raised below after the others finished
                first_error = first_error or err
                continue
            if pool is not None:
                result[pid] = pool
        if first_error is not None:
            raise first_error
        return result

    def _pool_or_none(self, pool_id: str, deadline: Deadline) -> Mapping[str, Any] | None:
        try:
            body = self.client.get_pool(pool_id, deadline)
        except CloudRequestRejected as err:
            if err.status == 404:
                # Deleted since the cluster GET: not a group any more (upstream aborted the whole refresh).
                log.info("worker pool disappeared during sync", extra={"cloud": "bizfly", "node_group": pool_id})
                return None
            raise
        return _mapping(body, f"worker pool {pool_id}")

    def _group(self, entry: Mapping[str, Any], pool: Mapping[str, Any]) -> GroupState:
        pool_id = str(entry["id"])
        what = f"worker pool {pool_id}"
        min_size = _int_field(entry, "min_size", what, default=0)
        max_size = _int_field(entry, "max_size", what, default=0)
        desired = _int_field(pool, "desired_size", what, default=0)
        nodes = pool.get("nodes") or []
        if not isinstance(nodes, list):
            raise CloudUnavailable(f"malformed answer from the bizfly API: nodes of {what} is not a list")
        instances = self._instances(pool_id, [n for n in nodes if isinstance(n, Mapping)])
        merged = {**entry, **pool}
        debug = (
            f"id={pool_id} flavor={merged.get('flavor', '')} min={min_size} max={max_size} desired={desired} "
            f"status={merged.get('provision_status', '')}"
        )
        return GroupState(
            id=pool_id,
            min_size=min_size,
            max_size=max_size,
            target_size=desired,
            instances=instances,
            debug=debug,
            name=str(merged.get("name") or ""),
            cloud_data=PoolData(merged, self.config.region_label),
        )

    def _instances(self, pool_id: str, nodes: list[Mapping[str, Any]]) -> tuple[Instance, ...]:
        """The pool's instances, each status read with what earlier listings showed of its node."""
        with self._histories_lock:
            previous = self._histories.get(pool_id)
        seen: dict[str, History] = {}
        instances = []
        for node in nodes:
            key = str(node.get("id") or node.get("physical_id") or "")
            history = History.UNKNOWN if previous is None else previous.get(key, History.NEW)
            instance, serving = self._instance(node, history)
            if instance is None:
                continue
            instances.append(instance)
            if serving is True:
                seen[key] = History.SERVING
            elif serving is False and history is not History.SERVING:
                seen[key] = History.CREATING
            else:
                seen[key] = history
        with self._histories_lock:
            self._histories[pool_id] = seen
        return tuple(instances)

    def _instance(self, node: Mapping[str, Any], history: History) -> tuple[Instance | None, bool | None]:
        node_id = str(node.get("id") or "")
        physical_id = str(node.get("physical_id") or "")
        if physical_id:
            instance_id = PROVIDER_ID_PREFIX + physical_id
        elif node_id:
            instance_id = PENDING_ID_PREFIX + node_id
        else:
            return None, None
        status = node.get("status")
        mapped = map_status(status if isinstance(status, str) else "", node.get("status_reason"), history)
        instance = Instance(
            id=instance_id,
            state=mapped.state,
            cloud_id=node_id,
            name=str(node.get("name") or ""),
            error=mapped.error,
            cloud_status=status if isinstance(status, str) else "",
        )
        return instance, mapped.serving

    # ------------------------------------------------------------------ writes
    def set_target_size(self, group: GroupState, new_size: int, deadline: Deadline) -> None:
        try:
            self.client.set_desired_size(group.id, new_size, deadline)
        except CloudRequestRejected as err:
            raise self._rejected(err, group, f"set desired_size to {new_size}") from None
        if new_size == 0:
            self._check_zero(group, deadline)

    def _check_zero(self, group: GroupState, deadline: Deadline) -> None:
        """Read a pool back after the API accepted ``desired_size: 0``: the one write no public client has
        made (docs/reference/bizfly.md, "Writes"). The pool must read 0; anything else is an error naming what it
        reads."""
        try:
            pool = self._pool_or_none(group.id, deadline)
            seen = None if pool is None else _int_field(pool, "desired_size", f"worker pool {group.id}", default=0)
        except DomainError as err:
            # The API said yes and only the check failed: the write stands, the next listing shows the pool.
            self._count_check("unverified")
            log.warning(
                "could not read the pool back after setting desired_size 0; the next sync shows whether it applied",
                extra={"cloud": "bizfly", "node_group": group.id, "error": str(err)},
            )
            return
        if seen == 0:
            self._count_check("confirmed")
            return
        self._count_check("mismatch")
        shown = "the pool is gone" if seen is None else f"the pool still reads desired_size {seen}"
        raise CloudRequestRejected(
            f"Bizfly accepted desired_size 0 for pool {group.id!r} (it was {group.target_size}) but {shown}: the API "
            'did not apply a size of zero (no public Bizfly client sends 0; docs/reference/bizfly.md, "Writes"). '
            "Nothing else was changed; scale the pool to zero in the Bizfly dashboard, or keep its min_size above 0",
            status=None,
        )

    def _count_check(self, result: str) -> None:
        observe = getattr(self._metrics, "observe_write_check", None)
        if observe is not None:
            observe("bizfly", ZERO_CHECK, result)

    def delete_instance(self, group: GroupState, instance: Instance, node: NodeRef, deadline: Deadline) -> None:
        label = node.labels.get(NODE_ID_LABEL, "")
        candidates = [c for c in dict.fromkeys((label, instance.cloud_id)) if c]
        if not candidates:
            raise CloudRequestRejected(
                f"cannot delete node {node.name or instance.name!r} ({instance.id}) of pool {group.id!r}: it has no "
                f"{NODE_ID_LABEL} label and the pool lists no node id for it yet; retry after the next sync"
            )
        for position, node_id in enumerate(candidates):
            try:
                self.client.delete_node(group.id, node_id, deadline)
                return
            except CloudRequestRejected as err:
                if err.status != 404:
                    raise self._rejected(err, group, f"delete node {node_id}") from None
                if position + 1 < len(candidates):
                    # The label may carry another id than the API's node id (docs/reference/bizfly.md, "Endpoints
                    # used"): try the id the pool itself lists for this providerID before concluding it is gone.
                    log.warning(
                        "node id from the label is unknown to the API; retrying with the pool's node id",
                        extra={"cloud": "bizfly", "node_group": group.id, "node": node.name},
                    )
                    continue
                log.info(
                    "node already gone from the pool",
                    extra={"cloud": "bizfly", "node_group": group.id, "node": node.name, "cloud_id": node_id},
                )

    def _rejected(self, err: CloudRequestRejected, group: GroupState, action: str) -> Exception:
        if err.status == 404:
            return NodeGroupNotFound(group.id)
        if err.status == 409:
            return GroupBusy(f"Bizfly pool {group.id!r} cannot {action} now (it is busy): {err}; retry later")
        return CloudRequestRejected(f"Bizfly refused to {action} on pool {group.id!r}: {err}", status=err.status)

    # ------------------------------------------------------------------ descriptions
    @property
    def gpu_label(self) -> str:
        return GPU_LABEL

    def template(self, group: GroupState, observed_labels: Mapping[str, str] | None) -> NodeTemplate | None:
        data = group.cloud_data
        if not isinstance(data, PoolData):
            return None
        template = build_template(data.pool, data.region_label, observed_labels)
        if template is None:
            self._warn_once(
                f"template:{group.id}",
                f"no scale-from-zero template for pool {group.id!r}: flavor {data.pool.get('flavor')!r} is not "
                "understood and no node of the pool was seen; set node_groups.<id>.template.capacity in the config",
            )
        return template

    def instrument(self, metrics: object) -> None:
        self._metrics = metrics
        self.client.instrument(metrics)

    def guard_writes(self, gate: Callable[[str], float | None]) -> None:
        self.client.guard_writes(gate)

    def health_detail(self) -> str:
        token = "token valid" if self.client.tokens.has_valid_token else "no valid token"
        return f"bizfly api breaker {self.client.breaker_state}, {token}"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def _warn_once(self, key: str, message: str) -> None:
        with self._warned_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, extra={"cloud": "bizfly", "cluster": self.config.cluster_name})


def build_adapter(config: BizflyConfig) -> BizflyAdapter:
    return BizflyAdapter(config)
