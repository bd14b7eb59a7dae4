"""Two replicas of our server with every Kubernetes feature on, behind the readiness-gated proxy that
plays their Service: what ``E2EEnvironment(serve=...)`` starts for the two-replica scenarios.

Both replicas get the same backends, the same Lease, journal and status ConfigMaps; each runs with
leader election, the change journal, learned templates and Events, in kube-system, as a user of the
e2e control plane bound to nothing but the Role and ClusterRole the mTLS layout binds the server's
ServiceAccount to (deploy/kubernetes/server-mtls, rendered). The CA's cloud-config names the proxy.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import yaml
from kubernetes import client

from devstack.harness import server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.config_values import duration_seconds
from server.kube.leader import holder_name
from tests.deploy.rendering import one, render, service_account_roles
from tests.e2e.environment import E2EEnvironment, OurServer
from tests.e2e.readiness_proxy import Endpoint, ReadinessProxy
from tests.kube.rbac import bind_user

NAMESPACE = "kube-system"
IDENTITIES = ("replica-a", "replica-b")
# The shipped durations (deploy/kubernetes/server-mtls/config.yaml) are kept: the figures are the ones
# a cluster would see.

# The objects the features keep in NAMESPACE; the config below and the rules name the same ones.
JOURNAL_CONFIGMAP = "ca-externalgrpc-journal"
STATUS_CONFIGMAP = "ca-externalgrpc-status"  # the object the Events are about
TEMPLATES_PREFIX = "ca-externalgrpc-templates"  # one ConfigMap per backend: <prefix>-<backend name>
BACKEND_NAMES = ("scw", "bizfly")  # as environment.py names the two backends

FEATURES = ("leader_election", "journal", "learned_templates", "events")
SERVICE_ACCOUNT = "ca-externalgrpc-server"  # the one the mTLS layout runs the server as


def _shipped() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The rules of the Role and the ClusterRole the mTLS layout binds the server's ServiceAccount to,
    and its ``kubernetes:`` settings, as deploy/kubernetes/server-mtls renders them."""
    docs = render("server-mtls")
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    role_rules, cluster_rules = service_account_roles(docs, SERVICE_ACCOUNT, NAMESPACE)
    return role_rules, cluster_rules, dict(config["kubernetes"])


def _features(shipped: dict[str, Any]) -> dict[str, Any]:
    """All four features on as shipped; the object names must be the ones the rules name."""
    features = {name: {**dict(shipped.get(name) or {}), "enabled": True} for name in FEATURES}
    assert features["journal"]["configmap"] == JOURNAL_CONFIGMAP
    assert features["events"]["object_name"] == STATUS_CONFIGMAP
    assert features["learned_templates"]["configmap_prefix"] == TEMPLATES_PREFIX
    return features


class ReplicatedServer:
    """Two ``OurServer`` replicas and their proxy; offers the reads scenarios make of ``OurServer``."""

    def __init__(self, env: E2EEnvironment, backends: list[dict[str, Any]]) -> None:
        assert env.control_plane is not None and env.api is not None
        role_rules, cluster_rules, shipped = _shipped()
        features = _features(shipped)
        election = features["leader_election"]
        self.lease_name = str(election["lease_name"])
        self.lease_duration = duration_seconds(election["lease_duration"])
        self.retry_period = duration_seconds(election["retry_period"])
        self.api = env.api
        self.replicas: dict[str, OurServer] = {}
        self.killed: set[str] = set()
        for identity in IDENTITIES:
            bind_user(env.api, NAMESPACE, identity, role_rules, cluster_rules)
            config = server_config(
                backends,
                kubernetes={
                    "kubeconfig": str(env.control_plane.user_kubeconfig(identity)),
                    "namespace": NAMESPACE,
                    "identity": identity,
                    **features,
                },
            )
            self.replicas[identity] = OurServer(config, env.workdir, name=identity)
        self.proxy = ReadinessProxy(
            [
                Endpoint(name, server.address, f"http://{server.process.http_address}/readyz")
                for name, server in self.replicas.items()
            ]
        ).start()
        env.wait_for(self.proxy.ready_endpoint, 30, "one replica leads, syncs and turns Ready")

    # ------------------------------------------------------------------ what the environment uses
    @property
    def address(self) -> str:
        return self.proxy.address

    def check_running(self) -> None:
        for name, server in self.replicas.items():
            if name not in self.killed:
                server.check_running()

    def stop(self) -> None:
        self.proxy.stop()
        for name, server in self.replicas.items():
            if name not in self.killed:
                server.stop()

    # ------------------------------------------------------------------ leadership
    def holder(self) -> str:
        """The holder's identity (without the suffix each process adds)."""
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(self.lease_name, NAMESPACE)
        return holder_name(str(lease.spec.holder_identity or ""))

    def leader(self) -> OurServer:
        """The replica the proxy routes to now (the Ready one)."""
        endpoint = self.proxy.ready_endpoint()
        assert endpoint is not None, "no replica is Ready"
        return self.replicas[endpoint.name]

    def kill(self, name: str) -> None:
        self.replicas[name].kill()
        self.killed.add(name)

    def increase_through_proxy(self, group_id: str, delta: int, timeout: float = 5.0) -> None:
        """A NodeGroupIncreaseSize sent as the CA sends it: through the Service (the proxy), with the CA's
        default gRPC deadline. Raises grpc.RpcError when it is not answered OK."""
        with grpc.insecure_channel(self.proxy.address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta), timeout=timeout)

    # ------------------------------------------------------------------ the features' objects
    def journal(self) -> dict[str, dict[str, Any]]:
        """The change journal ConfigMap's entries (key -> entry), {} when it holds none or does not exist."""
        try:
            found = client.CoreV1Api(self.api).read_namespaced_config_map(JOURNAL_CONFIGMAP, NAMESPACE)
        except client.ApiException as err:
            if err.status == 404:
                return {}
            raise
        return {key: json.loads(value) for key, value in (found.data or {}).items()}

    # ------------------------------------------------------------------ OurServer's reads, from the leader
    def rpc_log(self, method: str) -> list[dict[str, Any]]:
        return [record for server in self.replicas.values() for record in server.rpc_log(method)]

    def group_ids(self) -> list[str]:
        return self.leader().group_ids()

    def target(self, group_id: str) -> int:
        return self.leader().target(group_id)

    def instances(self, group_id: str) -> list[Any]:
        return self.leader().instances(group_id)


def two_replicas(env: E2EEnvironment, backends: list[dict[str, Any]]) -> ReplicatedServer:
    return ReplicatedServer(env, backends)
