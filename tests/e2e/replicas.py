"""Two replicas of our server with every Kubernetes feature on, behind what plays their Service (by
default the readiness-gated proxy): what ``E2EEnvironment(serve=...)`` starts for the two-replica
scenarios.

Both replicas get the same backends, the same Lease, journal and status ConfigMaps; each runs with
leader election, the change journal, learned templates and Events, in kube-system, as a user of the
e2e control plane bound to nothing but the Role and ClusterRole the mTLS layout binds the server's
ServiceAccount to (deploy/kubernetes/server-mtls, rendered). The CA's cloud-config names the Service.

``replicas(...)`` changes what a scenario needs: a feature switched off, each replica reaching the API
server through a proxy of its own (so a scenario can cut one off, ``cut_api``), and ``service``: how the
CA reaches the replicas (``Route``: the stand-in here; a real Service where a scenario has one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc
import yaml
from kubernetes import client

from devstack.harness import server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.config_values import duration_seconds
from server.kube.leader import holder_name
from tests.deploy.rendering import one, render, service_account_roles
from tests.e2e.environment import E2EEnvironment, OurServer, ServeBackends
from tests.e2e.readiness_proxy import Endpoint, ReadinessProxy
from tests.kube.proxy import HttpsProxy
from tests.kube.rbac import bind_user

NAMESPACE = "kube-system"
IDENTITIES = ("replica-a", "replica-b")
# The shipped durations (deploy/kubernetes/server-mtls/config.yaml) are kept: the figures are the ones
# a cluster would see.

# The objects the features keep in NAMESPACE; the config below and the rules name the same ones.
JOURNAL_CONFIGMAP = "ca-externalgrpc-journal"
STATUS_CONFIGMAP = "ca-externalgrpc-status"  # the object the Events are about
TEMPLATES_PREFIX = "ca-externalgrpc-templates"  # one ConfigMap per backend: <prefix>-<backend name>
# The replicas' backends are named as the layout's config names them (not as environment.py does): the
# learned templates' ConfigMaps are <prefix>-<backend name>, and the shipped Role grants those names only.
BACKEND_NAMES = {"scaleway": "scaleway", "bizfly": "bizfly"}  # backend type -> name

FEATURES = ("leader_election", "journal", "learned_templates", "events")
SERVICE_ACCOUNT = "ca-externalgrpc-server"  # the one the mTLS layout runs the server as


def _shipped() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The rules of the Role and the ClusterRole the mTLS layout binds the server's ServiceAccount to,
    and its ``kubernetes:`` settings, as deploy/kubernetes/server-mtls renders them."""
    docs = render("server-mtls")
    config = yaml.safe_load(one(docs, "ConfigMap", "ca-externalgrpc-config")["data"]["config.yaml"])
    role_rules, cluster_rules = service_account_roles(docs, SERVICE_ACCOUNT, NAMESPACE)
    granted = {name for rule in role_rules for name in rule.get("resourceNames") or ()}
    assert {f"{TEMPLATES_PREFIX}-{name}" for name in BACKEND_NAMES.values()} <= granted, granted
    return role_rules, cluster_rules, dict(config["kubernetes"])


class Service(Protocol):
    """How the CA reaches the replicas: the address its cloud-config names, and which replica new
    connections go to. The readiness-gated proxy plays it (``stand_in``); a real Service can too."""

    @property
    def address(self) -> str: ...

    def ready(self) -> str | None:
        """The replica new connections go to now (None: no Ready endpoint)."""
        ...

    def ready_since(self, replica: str) -> float | None:
        """Wall-clock time ``replica`` last became an endpoint new connections go to (None: not one now)."""
        ...

    def stop(self) -> None: ...


#: Builds the Service in front of the replicas (name -> replica), once they run.
Route = Callable[[Mapping[str, OurServer]], Service]


def stand_in(probe_interval: float = 0.5) -> Route:
    """The readiness-gated proxy (tests/e2e/readiness_proxy.py), probing every ``probe_interval``."""

    def route(servers: Mapping[str, OurServer]) -> Service:
        endpoints = [
            Endpoint(name, server.address, f"http://{server.process.http_address}/readyz")
            for name, server in servers.items()
        ]
        return ReadinessProxy(endpoints, probe_interval=probe_interval).start()

    return route


def _features(shipped: dict[str, Any], off: tuple[str, ...] = ()) -> dict[str, Any]:
    """All four features on as shipped (but ``off``); the object names must be the ones the rules name."""
    features = {name: {**dict(shipped.get(name) or {}), "enabled": name not in off} for name in FEATURES}
    assert features["journal"]["configmap"] == JOURNAL_CONFIGMAP
    assert features["events"]["object_name"] == STATUS_CONFIGMAP
    assert features["learned_templates"]["configmap_prefix"] == TEMPLATES_PREFIX
    return features


class ReplicatedServer:
    """Two ``OurServer`` replicas and their proxy; offers the reads scenarios make of ``OurServer``."""

    def __init__(
        self,
        env: E2EEnvironment,
        backends: list[dict[str, Any]],
        *,
        service: Route | None = None,
        off: tuple[str, ...] = (),
        api_proxies: bool = False,
    ) -> None:
        assert env.control_plane is not None and env.api is not None
        role_rules, cluster_rules, shipped = _shipped()
        features = _features(shipped, off)
        election = features["leader_election"]
        self.lease_name = str(election["lease_name"])
        self.lease_duration = duration_seconds(election["lease_duration"])
        self.renew_deadline = duration_seconds(election["renew_deadline"])
        self.retry_period = duration_seconds(election["retry_period"])
        self.follower_connection_age = duration_seconds(election["follower_connection_age"])
        backends = [{**backend, "name": BACKEND_NAMES[backend["type"]]} for backend in backends]
        self.api = env.api
        self.replicas: dict[str, OurServer] = {}
        self.killed: set[str] = set()
        # identity -> the proxy its API calls go through (api_proxies), for cut_api and heal_api
        self.api_proxies: dict[str, HttpsProxy] = {}
        for identity in IDENTITIES:
            bind_user(env.api, NAMESPACE, identity, role_rules, cluster_rules)
            kubeconfig = env.control_plane.user_kubeconfig(identity)
            if api_proxies:
                proxy = HttpsProxy.for_kubeconfig(
                    kubeconfig, env.control_plane.pki.ca_key, env.workdir / "api-proxies", identity
                ).start()
                self.api_proxies[identity] = proxy
                kubeconfig = proxy.kubeconfig()
            config = server_config(
                backends,
                kubernetes={"kubeconfig": str(kubeconfig), "namespace": NAMESPACE, "identity": identity, **features},
            )
            self.replicas[identity] = OurServer(config, env.workdir, name=identity)
        self.service: Service = (service or stand_in())(self.replicas)
        env.wait_for(self.service.ready, 30, "one replica leads, syncs and turns Ready")

    @property
    def proxy(self) -> ReadinessProxy:
        """The readiness-gated proxy, when it plays the Service."""
        assert isinstance(self.service, ReadinessProxy), "the Service is not the readiness-gated proxy"
        return self.service

    # ------------------------------------------------------------------ what the environment uses
    @property
    def address(self) -> str:
        return self.service.address

    def check_running(self) -> None:
        for name, server in self.replicas.items():
            if name not in self.killed:
                server.check_running()

    def stop(self) -> None:
        self.service.stop()
        for name, server in self.replicas.items():
            if name not in self.killed:
                server.stop()
        for proxy in self.api_proxies.values():
            proxy.stop()

    # ------------------------------------------------------------------ leadership
    def holder(self) -> str:
        """The holder's identity (without the suffix each process adds)."""
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(self.lease_name, NAMESPACE)
        return holder_name(str(lease.spec.holder_identity or ""))

    def leader(self) -> OurServer:
        """The replica the Service routes to now (the Ready one)."""
        name = self.service.ready()
        assert name is not None, "no replica is Ready"
        return self.replicas[name]

    def kill(self, name: str) -> None:
        self.killed.add(name)  # first: a check from another thread must not take its exit for a crash
        self.replicas[name].kill()

    def terminate(self, name: str) -> None:
        """SIGTERM, as a rolling update or a pod deletion does: the replica drains and hands the Lease back."""
        self.killed.add(name)
        self.replicas[name].stop()

    def cut_api(self, name: str) -> None:
        """Cut ``name`` off from the API server (not from the clouds, nor from the CA): its requests hang."""
        proxy = self.api_proxies[name]
        proxy.set(mode="hang")
        proxy.drop_connections()  # the watches it had open end too

    def heal_api(self, name: str) -> None:
        self.api_proxies[name].set(mode="pass")

    def slow_api(self, name: str, delay: float) -> None:
        """Hold each of ``name``'s API requests ``delay`` seconds before it reaches the API server (0: heal)."""
        self.api_proxies[name].set(delay=delay)

    def start_again(self, name: str) -> None:
        """Start a replica that was killed or terminated again on its addresses, as the kubelet restarts a
        pod's container: the Service's endpoint and the API proxy stay; it campaigns as a new process."""
        self.replicas[name].start_again()
        self.killed.discard(name)

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


def replicas(service: Route | None = None, off: tuple[str, ...] = (), api_proxies: bool = False) -> ServeBackends:
    """Two replicas as ``two_replicas``, with the options of ``ReplicatedServer``."""

    def serve(env: E2EEnvironment, backends: list[dict[str, Any]]) -> ReplicatedServer:
        return ReplicatedServer(env, backends, service=service, off=off, api_proxies=api_proxies)

    return serve
