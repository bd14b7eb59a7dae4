"""The Bizfly Kubernetes Engine state model: clusters, worker pools and their nodes.

Everything here is plain Python guarded by one lock; HTTP lives in ``api.py``. Asynchronous node
transitions are evaluated lazily against the simulator clock (``reconcile``) on every read or write, so a
test that advances a manual clock sees exactly the transitions that are due and nothing else.

Where the real API is not known (docs/reference/bizfly.md, "The simulator") the choices below are the simulator's,
and are stated where they are made.
"""

from __future__ import annotations

import enum
import hashlib
import random
import re
import string
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

# The project a cluster belongs to when the scenario names none (a Keystone project id: 32 hex digits).
DEFAULT_PROJECT_ID = "c4c0aa4a2b3f4c86a9d7c8b0c5bd6f11"
# The message of a creation refused for quota (Nova's wording), the default failure of fail_next_scale_up.
QUOTA_REASON = "Quota exceeded for cores: Requested 2, but already used 20 of 20 cores"
NODE_ID_LABEL = "bke.bizflycloud.vn/node-id"
POOL_NAME_LABEL = "bke.bizflycloud.vn/pool-name"
PROVIDER_ID_PREFIX = "bizflycloud://"


class StateError(Exception):
    """Base of the errors the state model raises; each maps to one HTTP status in ``api.py``."""


class ResourceNotFound(StateError):
    def __init__(self, kind: str, resource_id: str) -> None:
        super().__init__(f"{kind} {resource_id!r} not found")
        self.kind = kind
        self.resource_id = resource_id


class InvalidUpdate(StateError):
    """A request the API refuses with 400 (type mismatch, bounds violation)."""


@dataclass(frozen=True)
class StatusVocabulary:
    """The node ``status`` strings (and ``status_reason``) the simulator emits.

    By default the words of the OpenStack Senlin cluster behind each Bizfly worker pool (a pool has an
    ``autoscaling_group_id``; its nodes read "Creation succeeded", Senlin's own reason), from Senlin's
    node status list and node life cycle (docs/reference/bizfly.md, "Evidence"): ``INIT`` -> ``CREATING`` ->
    ``ACTIVE``, ``DELETING``, ``ERROR`` with "Failed in creating server: ..." for a failed creation and
    "Check: Node is not ACTIVE." for a failed health check, and ``WARNING``, ``UPDATING``,
    ``RECOVERING``, ``OPERATING`` for a node that exists. Two older vocabularies stay as scenario options:
    ``provisioning`` (``PROVISIONING`` -> ``ACTIVE``, this simulator's former default, which no public
    source shows for a node) and ``upstream`` (the lower-case words the CA's in-tree provider expects).
    """

    provisioning: str
    running: str
    deleting: str
    failed: str
    # The status of a node whose record exists but whose server is not being built yet (Senlin's INIT).
    init: str | None = None
    init_reason: str = "Initializing"
    provisioning_reason: str = "Creation in progress"
    running_reason: str = "Creation succeeded"
    deleting_reason: str = "Deletion in progress"
    # The status_reason of a failed creation, from the failure's message.
    failed_reason_format: str = "{reason}"
    unhealthy_reason: str = "Check: Node is not ACTIVE."
    # The status_reason of a node whose recovery (its server recreated) failed, from the failure's message.
    recovery_failed_format: str = "Recovery failed: {reason}."
    # Statuses of a node that exists and serves (or serves again soon), with their usual reason: phase running.
    serving: tuple[tuple[str, str], ...] = ()

    def failure_reason(self, reason: str) -> str:
        return self.failed_reason_format.format(reason=reason.rstrip("."))

    def recovery_failure_reason(self, node_id: str, reason: str) -> str:
        return self.recovery_failed_format.format(node_id=node_id, reason=reason.rstrip("."))

    def serving_reason(self, status: str) -> str | None:
        """The usual reason of a serving status other than ``running``; None when ``status`` is not one."""
        return dict(self.serving).get(status)


SENLIN_VOCABULARY = StatusVocabulary(
    provisioning="CREATING",
    running="ACTIVE",
    deleting="DELETING",
    failed="ERROR",
    init="INIT",
    failed_reason_format="Failed in creating server: {reason}.",
    # Node.do_recover keeps str() of the EResourceOperation that wraps the recreation's creation error.
    recovery_failed_format="Failed in recovering node '{node_id}': Failed in creating server: {reason}.",
    serving=(
        ("WARNING", "Failed in adding node into lb pool."),
        ("UPDATING", "Update in progress"),
        ("RECOVERING", "Recovery in progress"),
        ("OPERATING", "Operation 'reboot' in progress"),
    ),
)
PROVISIONING_VOCABULARY = StatusVocabulary(
    provisioning="PROVISIONING", running="ACTIVE", deleting="DELETING", failed="ERROR"
)
UPSTREAM_VOCABULARY = StatusVocabulary(
    provisioning="provisioning", running="running", deleting="deleting", failed="error"
)
VOCABULARIES = {"senlin": SENLIN_VOCABULARY, "provisioning": PROVISIONING_VOCABULARY, "upstream": UPSTREAM_VOCABULARY}


@dataclass(frozen=True)
class ApiShapes:
    """How the answers are shaped. The defaults follow the evidence (docs/reference/bizfly.md, "Evidence"); each
    other value is an older shape of this simulator, kept for the test that names it."""

    # created_at as the API writes it: naive ISO 8601 with microseconds ("naive"), or with a "Z" ("utc").
    timestamps: str = "naive"
    # The cluster's statistics object: "stats" with null totals, or the older "stat" with computed ones.
    stats_key: str = "stats"
    # Pool node names: Senlin's "<pool>-<cluster uid>-node-<8 mixed-case characters>" ("mixed"), or the
    # older lower-case DNS label ("lower").
    node_names: str = "mixed"

    def __post_init__(self) -> None:
        for name, allowed in (("timestamps", ("naive", "utc")), ("stats_key", ("stats", "stat")),
                              ("node_names", ("mixed", "lower"))):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"api.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Timings:
    """Seconds of simulated time each asynchronous transition takes."""

    provision_seconds: float = 120.0
    delete_seconds: float = 30.0
    # ``?force=true`` skips the drain, so the node disappears at once by default.
    force_delete_seconds: float = 0.0
    # How long a new node stays INIT (in the Senlin vocabulary) before it is CREATING; within provision_seconds.
    init_seconds: float = 2.0
    # How long a pool added as pending (``pending: true``) stays PENDING_PROVISION, without nodes.
    pool_provision_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in ("provision_seconds", "delete_seconds", "force_delete_seconds", "init_seconds",
                     "pool_provision_seconds"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class NodePhase(enum.Enum):
    """Internal lifecycle, independent of the emitted status vocabulary."""

    CREATING = "creating"
    RUNNING = "running"
    FAILED = "failed"  # its creation failed: it never joined the cluster
    UNHEALTHY = "unhealthy"  # it existed and failed later (a failed health check): joined, not Ready
    DELETING = "deleting"
    # A status set by a test helper that matches no vocabulary entry: shown as-is, never transitions.
    CUSTOM = "custom"


@dataclass
class Node:
    id: str
    name: str
    physical_id: str
    ip_address: str
    phase: NodePhase
    status: str
    status_reason: str
    created_at: float
    # When the pending automatic transition is due (creating -> running/failed, deleting -> gone).
    due_at: float | None = None
    will_fail_reason: str | None = None
    # When an INIT node turns CREATING.
    init_until: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "physical_id": self.physical_id,
            "ip_addresses": [self.ip_address],
            "status": self.status,
            "status_reason": self.status_reason,
        }


@dataclass
class Pool:
    id: str
    name: str
    flavor: str
    min_size: int
    max_size: int
    desired_size: int
    enable_autoscaling: bool
    labels: dict[str, str]
    taints: list[dict[str, str]]
    created_at: float
    availability_zone: str = "HN1"
    volume_type: str = "ENTERPRISE-SSD1"
    volume_size: int = 40
    profile_type: str = "premium"
    nodes: list[Node] = field(default_factory=list)
    # Failure reasons for the next nodes this pool creates (FIFO): "fail the next scale-up".
    pending_failures: list[str] = field(default_factory=list)
    # A pool added as pending has no autoscaling group (null ids) and no nodes until this time.
    provisioned_at: float | None = None

    def pending(self, now: float) -> bool:
        return self.provisioned_at is not None and now < self.provisioned_at

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.phase is not NodePhase.DELETING]

    def to_json(self, cluster: Cluster, with_nodes: bool, now: float, shapes: ApiShapes) -> dict[str, Any]:
        settled = all(n.phase is NodePhase.RUNNING for n in self.nodes) and len(self.nodes) == self.desired_size
        pending = self.pending(now)
        status = "PENDING_PROVISION" if pending else "PROVISIONED" if settled else "PROVISIONING"
        body: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "version": cluster.kubernetes_version,
            "flavor": self.flavor,
            "flavor_detail": flavor_detail(self.flavor),
            "profile_type": self.profile_type,
            "volume_type": self.volume_type,
            "volume_size": self.volume_size,
            "availability_zone": self.availability_zone,
            "desired_size": self.desired_size,
            "enable_autoscaling": self.enable_autoscaling,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "tags": [],
            "labels": dict(self.labels),
            "taints": [dict(t) for t in self.taints],
            "provision_status": status,
            # Null until the pool's autoscaling group exists, as the API shows a pending pool.
            "launch_config_id": None if pending else str(uuid.UUID(int=hash_int(self.id, "lc"), version=4)),
            "autoscaling_group_id": None if pending else str(uuid.UUID(int=hash_int(self.id, "asg"), version=4)),
            "created_at": iso_time(self.created_at, shapes),
        }
        if with_nodes:
            body["nodes"] = [n.to_json() for n in self.nodes]
        return body


@dataclass
class Cluster:
    uid: str
    name: str
    kubernetes_version: str
    created_at: float
    created_by: str
    private_network_id: str
    project_id: str
    region: str = ""  # "" for the catalog's own region; else the catalog's spelling of another region
    pools: dict[str, Pool] = field(default_factory=dict)  # insertion order is API order

    def to_json(self, now: float, shapes: ApiShapes) -> dict[str, Any]:
        pools = [p.to_json(self, with_nodes=False, now=now, shapes=shapes) for p in self.pools.values()]
        busy = any(p["provision_status"] != "PROVISIONED" for p in pools)
        stats: dict[str, Any]
        if shapes.stats_key == "stats":
            # What the API's own examples show: the totals are null.
            stats = {"worker_pools": len(pools), "total_cpu": None, "total_memory": None, "total_disk": {}}
        else:
            total_cpu = total_memory = 0
            for pool in self.pools.values():
                detail = flavor_detail(pool.flavor)
                total_cpu += detail.get("vcpus", 0) * len(pool.nodes)
                total_memory += detail.get("ram", 0) // 1024 * len(pool.nodes)
            stats = {"worker_pools": len(pools), "total_cpu": total_cpu, "total_memory": total_memory}
        return {
            "uid": self.uid,
            "name": self.name,
            "version": {
                "id": f"v{self.kubernetes_version}",
                "name": f"v{self.kubernetes_version}",
                "description": f"Kubernetes {self.kubernetes_version}",
                "kubernetes_version": self.kubernetes_version,
            },
            "private_network_id": self.private_network_id,
            "auto_upgrade": False,
            "tags": [],
            "provision_status": "PROVISIONED",
            "cluster_status": "PROVISIONING" if busy else "PROVISIONED",
            "created_at": iso_time(self.created_at, shapes),
            "created_by": self.created_by,
            "worker_pools_count": len(pools),
            "worker_pools": pools,
            shapes.stats_key: stats,
        }


_FLAVOR_RE = re.compile(r"^(?P<family>[a-z0-9]+)\.(?P<cpu>\d+)c_(?P<ram>\d+)g(?:_(?P<gpu>[a-z0-9_]+))?$")


def flavor_detail(flavor: str) -> dict[str, Any]:
    """Describe a flavor name such as ``nix.2c_4g``; the names encode vCPUs and GiB of RAM."""
    match = _FLAVOR_RE.match(flavor)
    if match is None:
        return {"name": flavor}
    detail: dict[str, Any] = {"name": flavor, "vcpus": int(match["cpu"]), "ram": int(match["ram"]) * 1024}
    if match["gpu"]:
        detail["gpu"] = match["gpu"]
    return detail


def _dns_label(text: str) -> str:
    # The older shape: names that double as Kubernetes Node names, lowercase DNS labels.
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "pool"


def _host_label(text: str) -> str:
    # A host name part in any case (the kubelet lowercases the host name it registers).
    return re.sub(r"[^A-Za-z0-9-]+", "-", text).strip("-") or "pool"


def iso_time(epoch: float, shapes: ApiShapes | None = None) -> str:
    """A time as the API writes ``created_at``: naive UTC with microseconds (``2020-10-25T15:47:22.611000``);
    with ``shapes.timestamps == "utc"`` (and for token expiries, which the API writes so) with a ``Z``."""
    text = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return text if shapes is not None and shapes.timestamps == "naive" else text + "Z"


def hash_int(*parts: str) -> int:
    """A stable 128-bit number from strings (ids derived from others, identical on every run)."""
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:16], "big")


class IdFactory:
    """Realistic-looking identifiers from a seeded generator, so a scenario replays identically."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._ip_counter = 10

    def cluster_uid(self) -> str:
        return "".join(self._random.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(16))

    def pool_id(self) -> str:
        return f"{self._random.getrandbits(96):024x}"  # a Mongo-style ObjectId, as in the real API

    def uuid(self) -> str:
        return str(uuid.UUID(int=self._random.getrandbits(128), version=4))

    def node_suffix(self, mixed_case: bool = True) -> str:
        # Senlin names a node "<cluster name>-node-" and 8 random letters and digits of both cases.
        letters = string.ascii_letters + string.digits if mixed_case else string.ascii_lowercase + string.digits
        return "".join(self._random.choice(letters) for _ in range(8))

    def ip_address(self) -> str:
        self._ip_counter += 1
        return f"10.20.{self._ip_counter // 250}.{self._ip_counter % 250 + 2}"


@dataclass(frozen=True)
class PoolUpdate:
    """The PATCH body after type checks: ``None`` means the field was absent, i.e. unchanged."""

    desired_size: int | None = None
    min_size: int | None = None
    max_size: int | None = None
    enable_autoscaling: bool | None = None

    @staticmethod
    def from_json(body: Any) -> PoolUpdate:
        if body is None:
            return PoolUpdate()
        if not isinstance(body, dict):
            raise InvalidUpdate("request body must be a JSON object")
        values: dict[str, Any] = {}
        for key in ("desired_size", "min_size", "max_size"):
            value = body.get(key)
            # JSON booleans are ints in Python; the real server (Go) rejects them like any type mismatch.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidUpdate(f"{key} must be an integer, got {value!r}")
            if value is not None and value < 0:
                raise InvalidUpdate(f"{key} must not be negative, got {value}")
            values[key] = value
        autoscaling = body.get("enable_autoscaling")
        if autoscaling is not None and not isinstance(autoscaling, bool):
            raise InvalidUpdate(f"enable_autoscaling must be a boolean, got {autoscaling!r}")
        return PoolUpdate(enable_autoscaling=autoscaling, **values)


class BizflyState:
    """All clusters of one account, with lazily-evaluated node transitions on ``clock_now``."""

    def __init__(
        self,
        clock_now: Callable[[], float],
        *,
        vocabulary: StatusVocabulary = SENLIN_VOCABULARY,
        timings: Timings | None = None,
        delete_accepts_physical_id: bool = False,
        seed: int = 1,
        shapes: ApiShapes | None = None,
        default_project: str = DEFAULT_PROJECT_ID,
    ) -> None:
        self._now = clock_now
        self._lock = threading.RLock()
        self._clusters: dict[str, Cluster] = {}
        self._ids = IdFactory(seed)
        self.vocabulary = vocabulary
        self.timings = timings or Timings()
        self.shapes = shapes or ApiShapes()
        # The project of a cluster added without one (the account's default project).
        self.default_project = default_project
        # Which id DELETE accepts is not known; by default only the pool node ``id`` works,
        # so a client that sends ``physical_id`` gets a 404 and the mix-up shows in tests.
        self.delete_accepts_physical_id = delete_accepts_physical_id

    # ----- building -------------------------------------------------------------------------------------
    def add_cluster(
        self,
        name: str,
        *,
        uid: str | None = None,
        kubernetes_version: str = "1.30.4",
        created_by: str = "user@example.com",
        project_id: str | None = None,
        region: str = "",
    ) -> Cluster:
        with self._lock:
            cluster = Cluster(
                uid=uid or self._ids.cluster_uid(),
                name=name,
                kubernetes_version=kubernetes_version,
                created_at=self._now(),
                created_by=created_by,
                private_network_id=self._ids.uuid(),
                project_id=project_id or self.default_project,
                region=region,
            )
            if cluster.uid in self._clusters:
                raise ValueError(f"duplicate cluster uid {cluster.uid!r}")
            self._clusters[cluster.uid] = cluster
            return cluster

    def add_pool(
        self,
        cluster_uid: str,
        name: str,
        *,
        flavor: str,
        min_size: int,
        max_size: int,
        desired_size: int,
        enable_autoscaling: bool,
        pool_id: str | None = None,
        labels: dict[str, str] | None = None,
        taints: Iterable[dict[str, str]] = (),
        availability_zone: str = "HN1",
        nodes: Iterable[dict[str, Any]] | None = None,
        pending: bool = False,
    ) -> Pool:
        """Add a pool; ``nodes`` lists initial nodes (dicts with optional id/physical_id/name/status), or
        ``None`` to start with ``desired_size`` running nodes. A ``pending`` pool is PENDING_PROVISION
        (null autoscaling group) and makes no nodes for ``timings.pool_provision_seconds``."""
        if not 0 <= min_size <= desired_size <= max_size:
            raise ValueError(f"pool {name!r}: need 0 <= min_size <= desired_size <= max_size")
        with self._lock:
            cluster = self._cluster(cluster_uid)
            pool = Pool(
                id=pool_id or self._ids.pool_id(),
                name=name,
                flavor=flavor,
                min_size=min_size,
                max_size=max_size,
                desired_size=desired_size,
                enable_autoscaling=enable_autoscaling,
                labels=dict(labels or {}),
                taints=[dict(t) for t in taints],
                created_at=self._now(),
                availability_zone=availability_zone,
                provisioned_at=self._now() + self.timings.pool_provision_seconds if pending else None,
            )
            if any(pool.id in c.pools for c in self._clusters.values()):
                raise ValueError(f"duplicate pool id {pool.id!r}")
            cluster.pools[pool.id] = pool
            specs = list(nodes) if nodes is not None else [{} for _ in range(0 if pending else desired_size)]
            for spec in specs:
                pool.nodes.append(self._initial_node(cluster, pool, spec))
            return pool

    def _initial_node(self, cluster: Cluster, pool: Pool, spec: dict[str, Any]) -> Node:
        node = self._new_node(cluster, pool, node_id=spec.get("id"), physical_id=spec.get("physical_id"))
        if spec.get("name"):
            node.name = str(spec["name"])
        self._apply_status(node, str(spec.get("status", self.vocabulary.running)), spec.get("status_reason"))
        return node

    def _new_node(
        self, cluster: Cluster, pool: Pool, *, node_id: str | None = None, physical_id: str | None = None
    ) -> Node:
        vocab = self.vocabulary
        now = self._now()
        if self.shapes.node_names == "mixed":
            name = f"{_host_label(pool.name)}-{cluster.uid}-node-{self._ids.node_suffix()}"
        else:
            name = f"{_dns_label(pool.name)}-{cluster.uid[:8]}-node-{self._ids.node_suffix(mixed_case=False)}"
        init_seconds = min(self.timings.init_seconds, self.timings.provision_seconds)
        initial = vocab.init is not None and init_seconds > 0
        return Node(
            id=node_id or self._ids.uuid(),
            name=name,
            physical_id=physical_id or self._ids.uuid(),
            ip_address=self._ids.ip_address(),
            phase=NodePhase.CREATING,
            status=vocab.init if initial and vocab.init else vocab.provisioning,
            status_reason=vocab.init_reason if initial else vocab.provisioning_reason,
            created_at=now,
            due_at=now + self.timings.provision_seconds,
            init_until=now + init_seconds if initial else None,
        )

    # ----- reads ----------------------------------------------------------------------------------------
    def cluster_region(self, cluster_uid: str) -> str | None:
        """The region a cluster was put in ("" for the catalog's own), None for an unknown cluster."""
        with self._lock:
            cluster = self._clusters.get(cluster_uid)
            return None if cluster is None else cluster.region

    def list_clusters_json(
        self, project_id: str | None = None, in_region: Callable[[str], bool] | None = None
    ) -> list[dict[str, Any]]:
        """The clusters of ``project_id`` (every project's when None) whose region ``in_region`` accepts."""
        with self._lock:
            self.reconcile()
            result = []
            for cluster in self._clusters.values():
                if project_id is not None and cluster.project_id != project_id:
                    continue
                if in_region is not None and not in_region(cluster.region):
                    continue
                body = cluster.to_json(self._now(), self.shapes)
                del body["worker_pools"]  # the cluster list carries no pools
                result.append(body)
            return result

    def cluster_json(self, cluster_uid: str, project_id: str | None = None) -> dict[str, Any]:
        with self._lock:
            self.reconcile()
            return self._cluster(cluster_uid, project_id).to_json(self._now(), self.shapes)

    def pool_json(self, cluster_uid: str, pool_id: str, project_id: str | None = None) -> dict[str, Any]:
        with self._lock:
            self.reconcile()
            cluster = self._cluster(cluster_uid, project_id)
            return self._pool(cluster, pool_id).to_json(cluster, with_nodes=True, now=self._now(), shapes=self.shapes)

    def snapshot(self) -> dict[str, Any]:
        """Everything, including internal phases and the k8s identities of nodes, for ``/_sim/state``."""
        with self._lock:
            self.reconcile()
            clusters = []
            for cluster in self._clusters.values():
                body = cluster.to_json(self._now(), self.shapes)
                body["project_id"] = cluster.project_id
                body["worker_pools"] = []
                for pool in cluster.pools.values():
                    pool_body = pool.to_json(cluster, with_nodes=True, now=self._now(), shapes=self.shapes)
                    pool_body["pending_failures"] = len(pool.pending_failures)
                    for node_body, node in zip(pool_body["nodes"], pool.nodes, strict=True):
                        node_body["phase"] = node.phase.value
                        node_body["k8s"] = k8s_identity(node, pool)
                    body["worker_pools"].append(pool_body)
                clusters.append(body)
            return {"now": self._now(), "vocabulary": asdict(self.vocabulary), "clusters": clusters}

    def node_refs(self, cluster_uid: str) -> list[dict[str, Any]]:
        """The Kubernetes identities of every node: what a kubelet + BKE would put on the Node object."""
        with self._lock:
            self.reconcile()
            cluster = self._cluster(cluster_uid)
            return [k8s_identity(n, p) for p in cluster.pools.values() for n in p.nodes]

    # ----- writes ---------------------------------------------------------------------------------------
    def update_pool(
        self, cluster_uid: str, pool_id: str, update: PoolUpdate, project_id: str | None = None
    ) -> dict[str, Any]:
        """Apply a PATCH: absent fields stay unchanged; the merged sizes must satisfy min <= desired <= max."""
        with self._lock:
            self.reconcile()
            cluster = self._cluster(cluster_uid, project_id)
            pool = self._pool(cluster, pool_id)
            desired = pool.desired_size if update.desired_size is None else update.desired_size
            minimum = pool.min_size if update.min_size is None else update.min_size
            maximum = pool.max_size if update.max_size is None else update.max_size
            if not minimum <= maximum:
                raise InvalidUpdate(f"min_size {minimum} is greater than max_size {maximum}")
            if not minimum <= desired <= maximum:
                raise InvalidUpdate(f"desired_size {desired} is outside [min_size {minimum}, max_size {maximum}]")
            pool.desired_size, pool.min_size, pool.max_size = desired, minimum, maximum
            if update.enable_autoscaling is not None:
                pool.enable_autoscaling = update.enable_autoscaling
            self.reconcile()
            return pool.to_json(cluster, with_nodes=False, now=self._now(), shapes=self.shapes)

    def delete_node(
        self, cluster_uid: str, pool_id: str, node_ref: str, *, force: bool, project_id: str | None = None
    ) -> None:
        """Start deleting a node and shrink ``desired_size`` by one, so the pool does not replace it.

        Deleting a node that is already being deleted is accepted and changes nothing.
        """
        with self._lock:
            self.reconcile()
            cluster = self._cluster(cluster_uid, project_id)
            pool = self._pool(cluster, pool_id)
            node = self._find_node(pool, node_ref)
            if node.phase is NodePhase.DELETING:
                if force:
                    node.due_at = min(node.due_at or 0.0, self._now() + self.timings.force_delete_seconds)
                    self.reconcile()
                return
            pool.desired_size = max(pool.desired_size - 1, 0)
            seconds = self.timings.force_delete_seconds if force else self.timings.delete_seconds
            self._start_deleting(node, seconds)
            self.reconcile()

    # ----- test helpers ---------------------------------------------------------------------------------
    def fail_next_scale_up(self, pool_id: str, count: int = 1, reason: str = QUOTA_REASON) -> None:
        """The next ``count`` nodes this pool creates end in the failed status; ``reason`` is the failure's
        message, which the vocabulary puts in its status_reason (Senlin: "Failed in creating server: <reason>.")."""
        with self._lock:
            pool = self._pool_anywhere(pool_id)
            pool.pending_failures.extend([reason] * count)

    def set_pool_labels_and_taints(self, pool_id: str, labels: dict[str, str], taints: list[dict[str, str]]) -> None:
        """Replace what the pool gives its new nodes, as an operator editing the pool does."""
        with self._lock:
            pool = self._pool_anywhere(pool_id)
            pool.labels = dict(labels)
            pool.taints = [dict(t) for t in taints]

    def fail_health_check(self, node_ref: str, reason: str | None = None) -> None:
        """A node that exists fails its health check: ERROR with Senlin's "Check: Node is not ACTIVE."; it
        stays a member of the cluster (not Ready) until it is recovered or deleted."""
        self._fail_existing(node_ref, lambda node: reason or self.vocabulary.unhealthy_reason)

    def fail_recovery(self, node_ref: str, reason: str = QUOTA_REASON) -> None:
        """A node that exists is recovered by recreating its server, and the new server cannot be created:
        ERROR with the recovery's failure (Senlin: "Failed in recovering node '<id>': Failed in creating
        server: <reason>."). Like a failed health check, it stays a member of the cluster (not Ready)."""
        self._fail_existing(node_ref, lambda node: self.vocabulary.recovery_failure_reason(node.id, reason))

    def _fail_existing(self, node_ref: str, reason: Callable[[Node], str]) -> None:
        with self._lock:
            self.reconcile()
            node = self._node_anywhere(node_ref)
            node.phase, node.status = NodePhase.UNHEALTHY, self.vocabulary.failed
            node.status_reason = reason(node)
            node.due_at = node.init_until = None
            node.will_fail_reason = None

    def set_node_status(self, node_ref: str, status: str, reason: str | None = None) -> None:
        """Force a node's status. A vocabulary value sets the matching phase (a provisioning node set this
        way stays provisioning until changed; ERROR on a running node is a failed health check); any other
        string is shown as-is and never transitions."""
        with self._lock:
            self.reconcile()
            self._apply_status(self._node_anywhere(node_ref), status, reason)
            self.reconcile()

    def _node_anywhere(self, node_ref: str) -> Node:
        for cluster in self._clusters.values():
            for pool in cluster.pools.values():
                for node in pool.nodes:
                    # by name in any case: the Kubernetes Node's name is the pool node's in lower case
                    if node_ref in (node.id, node.physical_id) or node_ref.lower() == node.name.lower():
                        return node
        raise ResourceNotFound("node", node_ref)

    # ----- reconciler -----------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Bring every pool up to date with the clock. Runs the due transitions, then converges node counts
        on ``desired_size``, then runs transitions again in case some take zero seconds."""
        with self._lock:
            now = self._now()
            for cluster in self._clusters.values():
                for pool in cluster.pools.values():
                    if pool.pending(now):
                        continue  # no autoscaling group yet: nothing is created
                    self._run_due_transitions(pool, now)
                    self._converge(cluster, pool, now)
                    self._run_due_transitions(pool, now)

    def _run_due_transitions(self, pool: Pool, now: float) -> None:
        vocab = self.vocabulary
        kept: list[Node] = []
        for node in pool.nodes:
            if node.init_until is not None and node.init_until <= now and node.phase is NodePhase.CREATING:
                node.init_until = None
                node.status, node.status_reason = vocab.provisioning, vocab.provisioning_reason
            due = node.due_at is not None and node.due_at <= now
            if due and node.phase is NodePhase.DELETING:
                continue  # gone
            if due and node.phase is NodePhase.CREATING:
                node.due_at = None
                node.init_until = None
                if node.will_fail_reason is not None:
                    reason = vocab.failure_reason(node.will_fail_reason)
                    node.phase, node.status, node.status_reason = NodePhase.FAILED, vocab.failed, reason
                else:
                    node.phase, node.status, node.status_reason = NodePhase.RUNNING, vocab.running, vocab.running_reason
            kept.append(node)
        pool.nodes = kept

    def _converge(self, cluster: Cluster, pool: Pool, now: float) -> None:
        live = pool.live_nodes()
        if len(live) < pool.desired_size:
            for _ in range(pool.desired_size - len(live)):
                node = self._new_node(cluster, pool)
                if pool.pending_failures:
                    node.will_fail_reason = pool.pending_failures.pop(0)
                pool.nodes.append(node)
        elif len(live) > pool.desired_size:
            # Senlin's scale-in takes ERROR and WARNING nodes first, then those never created; which of
            # the others a Bizfly pool's deletion policy picks is not known: the newest here.
            rank = {
                NodePhase.FAILED: 0,
                NodePhase.UNHEALTHY: 0,
                NodePhase.CUSTOM: 1,
                NodePhase.CREATING: 2,
                NodePhase.RUNNING: 3,
            }

            def victim_rank(node: Node) -> tuple[int, float]:
                warned = node.phase is NodePhase.RUNNING and node.status == "WARNING"
                return (0 if warned else rank[node.phase], -node.created_at)

            surplus = sorted(live, key=victim_rank)
            for node in surplus[: len(live) - pool.desired_size]:
                self._start_deleting(node, self.timings.delete_seconds)

    def _start_deleting(self, node: Node, seconds: float) -> None:
        node.init_until = None
        node.phase = NodePhase.DELETING
        node.status, node.status_reason = self.vocabulary.deleting, self.vocabulary.deleting_reason
        node.due_at = self._now() + seconds

    def _apply_status(self, node: Node, status: str, reason: str | None) -> None:
        vocab = self.vocabulary
        was_running = node.phase in (NodePhase.RUNNING, NodePhase.UNHEALTHY)
        node.status = status
        node.due_at = node.init_until = None
        node.will_fail_reason = None
        if status == vocab.running:
            node.phase, node.status_reason = NodePhase.RUNNING, reason or vocab.running_reason
        elif vocab.serving_reason(status) is not None:
            node.phase, node.status_reason = NodePhase.RUNNING, reason or vocab.serving_reason(status) or ""
        elif status in (vocab.provisioning, vocab.init):
            default = vocab.init_reason if status == vocab.init else vocab.provisioning_reason
            node.phase, node.status_reason = NodePhase.CREATING, reason or default
        elif status == vocab.failed and was_running:
            node.phase, node.status_reason = NodePhase.UNHEALTHY, reason or vocab.unhealthy_reason
        elif status == vocab.failed:
            node.phase, node.status_reason = NodePhase.FAILED, reason or vocab.failure_reason("Creation failed")
        elif status == vocab.deleting:
            node.phase, node.status_reason = NodePhase.DELETING, reason or vocab.deleting_reason
            node.due_at = self._now() + self.timings.delete_seconds
        else:
            node.phase, node.status_reason = NodePhase.CUSTOM, reason or ""

    # ----- lookups --------------------------------------------------------------------------------------
    def _cluster(self, cluster_uid: str, project_id: str | None = None) -> Cluster:
        """The cluster; one of another project than ``project_id`` (when given) is not found."""
        cluster = self._clusters.get(cluster_uid)
        if cluster is None or (project_id is not None and cluster.project_id != project_id):
            raise ResourceNotFound("cluster", cluster_uid)
        return cluster

    @staticmethod
    def _pool(cluster: Cluster, pool_id: str) -> Pool:
        try:
            return cluster.pools[pool_id]
        except KeyError:
            raise ResourceNotFound("worker pool", pool_id) from None

    def _pool_anywhere(self, pool_id: str) -> Pool:
        for cluster in self._clusters.values():
            if pool_id in cluster.pools:
                return cluster.pools[pool_id]
            for pool in cluster.pools.values():
                if pool.name == pool_id:
                    return pool
        raise ResourceNotFound("worker pool", pool_id)

    def _find_node(self, pool: Pool, node_ref: str) -> Node:
        for node in pool.nodes:
            if node.id == node_ref or (self.delete_accepts_physical_id and node.physical_id == node_ref):
                return node
        raise ResourceNotFound("node", node_ref)


def k8s_identity(node: Node, pool: Pool) -> dict[str, Any]:
    """How the Kubernetes Node for a pool node is identified (docs/reference/bizfly.md, "Instances"). The kubelet
    registers the host name in lower case; the pool lists the server's name as Senlin made it."""
    return {
        "name": node.name.lower(),
        "provider_id": PROVIDER_ID_PREFIX + node.physical_id,
        "labels": {NODE_ID_LABEL: node.id, POOL_NAME_LABEL: pool.name, **pool.labels},
        "pool_id": pool.id,
    }
