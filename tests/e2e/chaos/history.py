"""The history of one chaos run, gathered from what the parts outside our server recorded, and kept as one
JSON file (``history.json`` in the run's folder) that the checker reads and nothing else.

Sources, none of them our server:

- the simulators' request logs: every write each cloud received (not GETs, not logins), when it arrived
  in full (``received``) and was answered, the status the cloud's own handler gave it (``handled``: did
  the cloud apply it), its body and the ``Ca-Externalgrpc-Writer`` header the sender put on it (the Lease
  holder and term it wrote in);
- the clouds' own state, polled every ``OBSERVE_EVERY`` seconds (``CloudObserver``): every machine ever
  seen with its ids, name and providerID, each pool's size whenever it changed, and the final state;
- the API server: the audit log of the replicas' Lease writes (``LEASE_AUDIT``: each create or update with
  the Lease it returned, timed by the API server), and at the end the pods, the Nodes and the CA's status
  ConfigMap;
- the cluster-autoscaler's own log: its scale-up, decrease and node-removal decisions and its failures;
- the kernel: each replica process's resident memory from /proc (``MemorySampler``);
- the nemesis's record of the faults it injected and the run's own times (start, healing, settling).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from providers.http_transport import WRITER_HEADER
from tests.e2e.environment import STATUS_CONFIGMAP, E2EEnvironment
from tests.e2e.replicas import IDENTITIES, NAMESPACE, ReplicatedServer
from tests.reliability.clouds import BizflyKit, ScalewayKit
from tests.support.repeating import Repeating

OBSERVE_EVERY = 0.25
MEMORY_EVERY = 2.0
#: The only audit events the run keeps: the replicas' writes of Leases, with the object the API server
#: stored (level RequestResponse); nothing else is written to the audit log.
LEASE_AUDIT: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "RequestResponse",
            "users": list(IDENTITIES),
            "verbs": ["create", "update", "patch"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        {"level": "None"},
    ],
}
KITS = {"scaleway": ScalewayKit(), "bizfly": BizflyKit()}
#: CA log lines the checker reads (its decisions and failures), by the start of their message.
CA_LOG_PREFIXES = (
    "Scale-up: setting group",
    "Decreasing size of",
    "Scale-down: removing",
    "Marking unregistered node",
    "Deleting ",
    "Failed to",
    "Starting main loop",
)


# ---------------------------------------------------------------------------------------------- the clouds
def pools_of(env: E2EEnvironment) -> list[dict[str, Any]]:
    """Every pool of both clouds: cloud, id, name, size, min, max."""
    found = []
    for pool in env.scw.state.snapshot()["pools"]:
        found.append(_pool("scaleway", pool, "size"))
    for pool in env.bz.snapshot()["clusters"][0]["worker_pools"]:
        found.append(_pool("bizfly", pool, "desired_size"))
    return found


def _pool(cloud: str, pool: dict[str, Any], size_key: str) -> dict[str, Any]:
    return {
        "cloud": cloud,
        "id": str(pool["id"]),
        "name": str(pool["name"]),
        "size": int(pool[size_key]),
        "min": int(pool["min_size"]),
        "max": int(pool["max_size"]),
    }


def machines_of(env: E2EEnvironment) -> list[dict[str, Any]]:
    """Every machine both clouds hold now: cloud, id, the other ids a request may name it by (``refs``),
    its name and providerID (what its Node carries), its pool, and ``state``: ``live`` (it counts in its
    pool), ``deleting`` or ``failed``."""
    found = []
    for node in env.scw.state.snapshot()["nodes"]:
        status = str(node["status"])
        state = "deleting" if status == "deleting" else "failed" if status in ("creation_error", "error") else "live"
        found.append(
            {
                "cloud": "scaleway",
                "id": str(node["id"]),
                "refs": [str(node["id"])],
                "name": str(node["name"]),
                "provider_id": str(node["provider_id"]),
                "pool_id": str(node["pool_id"]),
                "state": state,
                "running": status == "ready",
            }
        )
    for pool in env.bz.snapshot()["clusters"][0]["worker_pools"]:
        for node in pool["nodes"]:
            phase = str(node["phase"])
            state = "deleting" if phase == "deleting" else "failed" if phase == "failed" else "live"
            found.append(
                {
                    "cloud": "bizfly",
                    "id": str(node["id"]),
                    "refs": [str(node["id"]), str(node.get("physical_id") or "")],
                    "name": str(node["k8s"]["name"]),
                    "provider_id": str(node["k8s"]["provider_id"]),
                    "pool_id": str(pool["id"]),
                    "state": state,
                    "running": phase == "running",
                }
            )
    return found


class CloudObserver:
    """Polls both clouds' state: every machine ever seen (first and last seen, each state it was seen in)
    and each pool's size whenever it changes."""

    def __init__(self, env: E2EEnvironment, every: float = OBSERVE_EVERY) -> None:
        self.env, self.every = env, every
        self.machines: dict[tuple[str, str], dict[str, Any]] = {}
        self.sizes: list[dict[str, Any]] = []
        self._last_size: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chaos-cloud-observer", daemon=True)

    def start(self) -> CloudObserver:
        self.observe()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.observe()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.observe()

    def observe(self) -> None:
        now = time.time()
        machines, pools = machines_of(self.env), pools_of(self.env)
        with self._lock:
            for machine in machines:
                key = (machine["cloud"], machine["id"])
                seen = self.machines.setdefault(
                    key, {**{k: v for k, v in machine.items() if k != "running"}, "first_seen": now, "states": []}
                )
                seen["last_seen"] = now
                if machine["state"] not in seen["states"]:
                    seen["states"].append(machine["state"])
            for pool in pools:
                if self._last_size.get(pool["id"]) != pool["size"]:
                    self._last_size[pool["id"]] = pool["size"]
                    self.sizes.append({"at": now, "cloud": pool["cloud"], "pool_id": pool["id"], "size": pool["size"]})

    def record(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with self._lock:
            return [dict(m) for m in self.machines.values()], list(self.sizes)


# ---------------------------------------------------------------------------------------------- memory
@dataclass
class MemorySampler(Repeating):
    """Each replica process's resident set size (VmRSS, from /proc) every ``every`` seconds."""

    replicas: ReplicatedServer
    every: float = MEMORY_EVERY
    samples: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        Repeating.__init__(self, "chaos-memory", self.every, at_once=False)

    def tick(self) -> None:
        for name, server in list(self.replicas.replicas.items()):
            process = server.process
            with contextlib.suppress(OSError, ValueError):  # a replica down between two samples
                if process.process.poll() is None:
                    rss = process.memory()["rss_mib"]
                    self.samples.append({"at": time.time(), "replica": name, "pid": process.pid, "rss_mib": rss})


# ---------------------------------------------------------------------------------------------- the rest
def cloud_writes(env: E2EEnvironment) -> list[dict[str, Any]]:
    """Every request that asked a cloud to change something (not a read, not a login), as the cloud logged it."""
    found = []
    for cloud, sim in (("scaleway", env.scw), ("bizfly", env.bz)):
        kit = KITS[cloud]
        for request in sim.requests.all():
            if request.method in ("GET", "HEAD") or request.route in kit.auth_routes:
                continue
            found.append(
                {
                    "cloud": cloud,
                    "route": request.route,
                    "method": request.method,
                    "path": request.path,
                    "received": request.received,
                    "at": request.at,
                    "status": request.status,
                    "handled": request.handled,
                    "writer": request.headers.get(WRITER_HEADER.lower(), ""),
                    "body": request.body,
                }
            )
    return sorted(found, key=lambda w: w["received"])


def lease_writes(env: E2EEnvironment, lease_name: str) -> list[dict[str, Any]]:
    """The replicas' writes of the leader Lease, from the API server's audit log (``LEASE_AUDIT``)."""
    assert env.control_plane is not None
    found = []
    for event in env.control_plane.audit_events():
        ref = event.get("objectRef") or {}
        if ref.get("resource") != "leases" or ref.get("name") != lease_name:
            continue
        answer = event.get("responseObject") or {}
        spec = answer.get("spec") or {} if answer.get("kind") == "Lease" else {}
        found.append(
            {
                "received": _timestamp(event["requestReceivedTimestamp"]),
                "user": (event.get("user") or {}).get("username", ""),
                "verb": event.get("verb", ""),
                "code": int((event.get("responseStatus") or {}).get("code", 0)),
                "holder": str(spec.get("holderIdentity") or ""),
                "transitions": int(spec.get("leaseTransitions") or 0),
            }
        )
    return sorted(found, key=lambda w: w["received"])


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def ca_log(env: E2EEnvironment) -> list[dict[str, Any]]:
    """The CA's log lines the checker reads: when, the message with its fields, where it was logged."""
    return [
        {"at": entry.at, "msg": entry.text(), "caller": str(entry.fields.get("caller", ""))}
        for entry in env.ca.log.entries()
        if entry.message.startswith(CA_LOG_PREFIXES)
    ]


def kubernetes_objects(env: E2EEnvironment) -> dict[str, Any]:
    """The workload's pods, the Nodes and the CA's status ConfigMap, as the API server holds them now."""
    pods = []
    for pod in env.core.list_namespaced_pod("default").items:
        pods.append(
            {
                "name": pod.metadata.name,
                "created": pod.metadata.creation_timestamp.timestamp(),
                "phase": pod.status.phase,
                "started": pod.status.start_time.timestamp() if pod.status.start_time else None,
                "node": pod.spec.node_name,
                "selector": dict(pod.spec.node_selector or {}),
            }
        )
    nodes = [{"name": n.metadata.name, "provider_id": n.spec.provider_id or ""} for n in env.core.list_node().items]
    try:
        status = (env.core.read_namespaced_config_map(STATUS_CONFIGMAP, NAMESPACE).data or {}).get("status", "")
    except ApiException as err:
        if err.status != 404:
            raise
        status = ""
    return {"pods": pods, "nodes": nodes, "ca_status": status}


def save(history: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(history, indent=1, sort_keys=True, default=_plain))
    return path


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
