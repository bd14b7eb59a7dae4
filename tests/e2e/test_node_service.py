"""The Service path for real: the mTLS layout (deploy/kubernetes/server-mtls, the official chart with
deploy/helm/values-mtls-service.yaml) on the real node, two server replicas behind their Service, and
the leader taken away three ways while a client writes through the Service by its name.

The client (tests/e2e/service_prober.py) runs in the node's network namespace and talks as the CA does:
one long-lived channel to ``ca-externalgrpc-server.kube-system.svc.cluster.local:8086``, resolved by the
cluster DNS, routed by kube-proxy to the Ready replica, with the layout's client certificate. The real
CA runs beside it and goes on with its own loop. For each event the scenario reports the seconds from
the event to the first write the new leader accepted, and every call refused in between, by the
client's gRPC status; and how many calls of the CA's failed meanwhile:

- **kill**: SIGKILL of the leader's server process (a crash or an OOM kill); the kubelet restarts it;
- **delete**: ``kubectl delete pod`` of the leader (SIGTERM: it drains and hands the Lease back);
- **cut**: the leader's packets to the API server dropped (iptables in the node's namespace), so it can
  renew its Lease no more, while it keeps serving the connections it has.

Every accepted write made one machine, and the cloud holds exactly one per accepted write: nothing was
applied twice. ``make node-e2e`` runs it; the figures go to docs/evidence/failover.md.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client as k8s

from devstack.harness import REPO_ROOT
from server.kube.leader import holder_name
from tests.e2e.environment import Layout, bizfly_pool, scaleway_pool
from tests.e2e.node_cluster import NAMESPACE, NodeEnvironment, PodLog, node_environments
from tests.e2e.node_layouts import MTLS_SERVER_ACCOUNT, ca_log, deploy_mtls_chart, leader_pod, wait_leader_ready
from tests.e2e.report import publish

SERVICE_NAME = "ca-externalgrpc-server.kube-system.svc.cluster.local"
WRITE_INTERVAL = 0.25  # how often the client retries a refused write
WRITE_DEADLINE = 10.0  # each call's deadline: the grpc_timeout of the layout's cloud-config
EVENT_TIMEOUT = 120.0  # a fail-over slower than this fails the scenario

FAILOVER_LAYOUT = Layout(
    scaleway_pools=[
        scaleway_pool("general", "DEV1-M", 1, 1, 4),
        scaleway_pool("probe", "DEV1-M", 0, 0, 10),  # one machine per accepted write of the client
    ],
    bizfly_pools=[bizfly_pool("general", "nix.2c_4g", 1, 1, 3)],
)


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


class ServiceClient:
    """tests/e2e/service_prober.py in the node's network namespace, fed commands on stdin."""

    def __init__(self, env: NodeEnvironment, certs: Path) -> None:
        node = env.real_node
        target = f"dns://{node.net.ipv4}:53/{SERVICE_NAME}:8086"
        argv = node.namespaces.command(
            [sys.executable, "-m", "tests.e2e.service_prober", "--target", target, "--certs", str(certs)], mount=False
        )
        self.log = (env.workdir / "logs" / "service-client.log").open("ab")
        self.process = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise AssertionError(f"the service client exited with {self.process.wait(timeout=10)}")
        return dict(json.loads(line))

    def write(self, group: str, timeout: float = EVENT_TIMEOUT) -> dict[str, Any]:
        return self.ask(
            {"cmd": "write", "group": group, "interval": WRITE_INTERVAL, "timeout": timeout, "deadline": WRITE_DEADLINE}
        )

    def close(self) -> None:
        stdin: IO[str] | None = self.process.stdin
        if stdin is not None:
            stdin.close()
        self.process.wait(timeout=30)
        self.log.close()


def client_certs(env: NodeEnvironment) -> Path:
    """The files of the layout's client Secret, as the CA's pod mounts them."""
    secret: Any = env.core.read_namespaced_secret("ca-externalgrpc-client-tls", NAMESPACE)
    directory = env.workdir / "client-tls"
    directory.mkdir(exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (directory / key).write_bytes(base64.b64decode(secret.data[key]))
    return directory


@dataclass
class Failover:
    event: str
    old_leader: str
    new_leader: str
    seconds: float | None  # None: no write accepted within EVENT_TIMEOUT
    refused: dict[str, int]  # gRPC status -> calls
    ca_failed_calls: int
    last_refusal: str
    old_leader_accepted: int  # writes the old leader still accepted after the event was set off
    #: accepted writes the server answered as the retry of an earlier one (no cloud call): a new leader
    #: that adopted an unconfirmed change from the journal cannot tell a retry from a new request
    taken_as_retry: int = 0

    def row(self) -> str:
        refused = ", ".join(f"{n} {code}" for code, n in sorted(self.refused.items())) or "none"
        total = sum(self.refused.values())
        took = f"{self.seconds:.1f} s" if self.seconds is not None else f"none within {EVENT_TIMEOUT:.0f} s"
        return (
            f"| {self.event} | {took} | {total} ({refused}) | {self.old_leader_accepted} | {self.taken_as_retry} "
            f"| {self.ca_failed_calls} |"
        )


def kill(env: NodeEnvironment, pod: Any) -> Callable[[], None]:
    env.real_node.kill_container(env.container_id(pod, "ca-externalgrpc"))
    return lambda: None


def delete(env: NodeEnvironment, pod: Any) -> Callable[[], None]:
    env.kubectl("-n", NAMESPACE, "delete", "pod", pod.metadata.name, "--wait=false")
    return lambda: None


def cut(env: NodeEnvironment, pod: Any) -> Callable[[], None]:
    """Drop the pod's packets to the API server (what kube-proxy sends 10.96.0.1:443 to); the undo."""
    node = env.real_node
    rule = ["-s", pod.status.pod_ip, "-d", node.net.ipv4, "-p", "tcp", "--dport", str(node.api_port), "-j", "DROP"]
    node.namespaces.run("iptables", "-I", "INPUT", *rule, mount=False)

    def undo() -> None:
        node.namespaces.run("iptables", "-D", "INPUT", *rule, mount=False)

    return undo


EVENTS: dict[str, Callable[[NodeEnvironment, Any], Callable[[], None]]] = {"kill": kill, "delete": delete, "cut": cut}


def lease_holder(env: NodeEnvironment) -> str:
    lease: Any = k8s.CoordinationV1Api(env.api).read_namespaced_lease("ca-externalgrpc", NAMESPACE)
    return holder_name(str(lease.spec.holder_identity or ""))


def server_process(pod: Any) -> tuple[str, int]:
    """A server replica's process: its pod and its container's run (restarts count)."""
    (status,) = [c for c in pod.status.container_statuses or [] if c.name == "ca-externalgrpc"]
    return pod.metadata.name, int(status.restart_count)


#: what the backend logs when it answers an increase as the retry of an earlier call (providers/backend.py)
TAKEN_AS_RETRY = r"^increase already applied by an earlier call whose answer was lost"


def accepted_at(
    env: NodeEnvironment, since: float, message: str = r"^NodeGroupIncreaseSize OK"
) -> list[tuple[str, int]]:
    """The server processes running now that logged ``message`` (an accepted NodeGroupIncreaseSize) since
    ``since``."""
    found = []
    for pod in env.pods("app.kubernetes.io/name=ca-externalgrpc-server"):
        if not pod.status.container_statuses:
            continue
        name, run = server_process(pod)
        log = PodLog(env, pod, "ca-externalgrpc", restart=run)
        # The line is written when the call ends, on the same clock as the client's start time: a line
        # from before ``since`` is an earlier write's (one taken a second earlier would be miscounted).
        if log.matching(message, since=since):
            found.append((name, run))
    return found


def accepting_processes(env: NodeEnvironment, at: float) -> list[tuple[str, int]]:
    """The process that logged the write accepted at ``at`` (its log line may lag the answer a little)."""
    return env.wait_for(lambda: accepted_at(env, at), 10, "the accepting replica's log")


def fail_over(env: NodeEnvironment, client: ServiceClient, group: str, event: str) -> Failover:
    # Settled: the two replicas up, the leader Ready, and the client served again (its channel may still be
    # in its reconnection backoff after the previous event).
    wait_leader_ready(env)
    env.wait_for(
        lambda: client.ask({"cmd": "read"})["ok"], 60, f"the client reading through the Service before {event}"
    )
    old = leader_pod(env)
    old_process = server_process(old)
    started = time.time()
    undo = EVENTS[event](env, old)
    attempts: list[dict[str, Any]] = []
    accepted: float | None = None
    old_accepted = 0
    taken_as_retry = 0
    try:
        # Write until a process other than the old leader accepts (a write the old leader still took, before
        # the event reached it, is counted apart and the client writes again), within the bound.
        while accepted is None and time.time() - started < EVENT_TIMEOUT:
            outcome = client.write(group, timeout=EVENT_TIMEOUT - (time.time() - started))
            attempts += outcome["attempts"]
            if outcome["accepted"] is None:
                break
            by = accepting_processes(env, float(outcome["accepted"]))
            # (logged before the OK line, so present once that one is)
            taken_as_retry += bool(set(by) & set(accepted_at(env, float(outcome["accepted"]), TAKEN_AS_RETRY)))
            if old_process in by:
                old_accepted += 1
            else:
                accepted = outcome["accepted"]
    finally:
        undo()
    refusals = [a for a in attempts if a["code"] != "OK"]
    refused: dict[str, int] = {}
    for attempt in refusals:
        refused[attempt["code"]] = refused.get(attempt["code"], 0) + 1
    until = accepted if accepted is not None else time.time()
    ca_failed = [e for e in ca_log(env).provider_errors(since=started) if e.at <= until]
    return Failover(
        event,
        old.metadata.name,
        lease_holder(env),
        accepted - started if accepted is not None else None,
        refused,
        len(ca_failed),
        refusals[-1]["detail"] if refusals else "",
        old_accepted,
        taken_as_retry,
    )


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(900)
def test_the_ca_reaches_the_leader_through_the_service_and_a_client_writes_again_after_each_failover(
    start_node: Any,
) -> None:
    env: NodeEnvironment = start_node(FAILOVER_LAYOUT)
    deployed = deploy_mtls_chart(env)
    assert deployed.server_account == MTLS_SERVER_ACCOUNT
    group = str(env.scaleway_pool("probe")["id"])
    client = ServiceClient(env, client_certs(env))
    try:
        first = client.write(group, timeout=30)
        assert first["accepted"] is not None and len(first["attempts"]) == 1, first
        results = [fail_over(env, client, group, event) for event in EVENTS]
    finally:
        client.close()
    publish(
        "| event | to the first write the new leader accepted | refused calls in between "
        "| writes the old leader took meanwhile | of the accepted, answered as a retry (no cloud call) "
        "| CA calls failed |"
    )
    for result in results:
        publish(result.row())
        publish(
            f"  {result.event}: leader {result.old_leader} -> {result.new_leader}; last refusal: {result.last_refusal}"
        )
    # One resize of the pool per accepted write, none more: no write was applied twice. A write the server
    # answered as the retry of an earlier one made no resize (counted, reported, and in the docs).
    accepted = [r for r in results if r.seconds is not None]
    writes = 1 + len(accepted) + sum(r.old_leader_accepted for r in results) - sum(r.taken_as_retry for r in results)
    resizes = [r for r in env.cloud_requests("scaleway", "update_pool") if r.path.endswith(group)]
    assert len(resizes) == writes, [(r.at, r.body) for r in resizes]
    wait_leader_ready(env)
    env.stop()
    assert env.real_node.leftovers == [], env.real_node.leftovers
    # Each event: a write accepted by the new leader within the bound.
    assert len(accepted) == len(results), [r.row() for r in results]
