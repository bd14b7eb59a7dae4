"""Two replicas of our server with leader election, behind the readiness-gated proxy that plays their
Service: what ``E2EEnvironment(serve=...)`` starts for the two-replica scenarios.

Both replicas get the same backends and the same Lease; each runs as a user of the e2e control plane
bound to exactly the Role the mTLS layout ships (deploy/kubernetes/server-mtls), in kube-system as
there. The CA's cloud-config names the proxy.
"""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client

from devstack.harness import server_config
from providers.config_values import duration_seconds
from tests.deploy.rendering import one, render
from tests.deploy.test_leader_election_layout import lease_role
from tests.e2e.environment import E2EEnvironment, OurServer
from tests.e2e.readiness_proxy import Endpoint, ReadinessProxy

NAMESPACE = "kube-system"
IDENTITIES = ("replica-a", "replica-b")
# The shipped durations (deploy/kubernetes/server-mtls/config.yaml) are kept: the figures are the ones
# a cluster would see.


def _shipped() -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's Role and its leader_election settings, as the mTLS layout renders them."""
    docs = render("server-mtls")
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    return lease_role(docs), dict(config["kubernetes"]["leader_election"])


def _bind(api: client.ApiClient, role: dict[str, Any], user: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    name = role["metadata"]["name"]
    try:
        rbac.create_namespaced_role(NAMESPACE, {"metadata": {"name": name}, "rules": role["rules"]})
    except client.ApiException as err:
        if err.status != 409:
            raise
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        {
            "metadata": {"name": f"ca-externalgrpc-{user}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


class ReplicatedServer:
    """Two ``OurServer`` replicas and their proxy; offers the reads scenarios make of ``OurServer``."""

    def __init__(self, env: E2EEnvironment, backends: list[dict[str, Any]]) -> None:
        assert env.control_plane is not None and env.api is not None
        role, election = _shipped()
        self.lease_name = str(election["lease_name"])
        self.lease_duration = duration_seconds(election["lease_duration"])
        self.retry_period = duration_seconds(election["retry_period"])
        self.api = env.api
        self.replicas: dict[str, OurServer] = {}
        self.killed: set[str] = set()
        for identity in IDENTITIES:
            _bind(env.api, role, identity)
            config = server_config(
                backends,
                kubernetes={
                    "kubeconfig": str(env.control_plane.user_kubeconfig(identity)),
                    "namespace": NAMESPACE,
                    "identity": identity,
                    "leader_election": {"enabled": True, **election},
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
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(self.lease_name, NAMESPACE)
        return str(lease.spec.holder_identity or "")

    def leader(self) -> OurServer:
        """The replica the proxy routes to now (the Ready one)."""
        endpoint = self.proxy.ready_endpoint()
        assert endpoint is not None, "no replica is Ready"
        return self.replicas[endpoint.name]

    def kill(self, name: str) -> None:
        self.replicas[name].kill()
        self.killed.add(name)

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
