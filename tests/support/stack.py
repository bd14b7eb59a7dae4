"""The real thing, wired for tests: cloud simulators, our server on a real port, a gRPC stub.

``start_stack`` starts the simulators asked for (each on its own loopback port, on a clock the test
controls), writes the server configuration that points backends at them, starts the server in-process
through ``server.app.start`` (the same path ``ca-externalgrpc serve`` takes) and opens a channel.
Nothing is mocked: the backends talk HTTP to the simulators and the test talks gRPC to the server.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.backend import Backend
from server import app
from server.app import RunningServer
from server.config import ServerConfig, parse
from simulators.bizfly import DEFAULT_APP_CREDENTIALS, DEFAULT_USERS, BizflySimulator
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.support.certs import Pki, make_pki

SCW_SECRET = "3f0c2b4e-5d6a-4b7c-8d9e-0a1b2c3d4e5f"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scaleway_backend(sim: ScalewaySimulator, name: str = "scw", **extra: Any) -> dict[str, Any]:
    """A server config ``backends[]`` entry for the Scaleway simulator's first cluster."""
    return {
        "name": name,
        "type": "scaleway",
        "scaleway": {
            "cluster_id": sim.cluster_id,
            "region": sim.region,
            "api_url": sim.url,
            "secret_key": sim.secret_key,
        },
        **extra,
    }


def bizfly_backend(sim: BizflySimulator, name: str = "bizfly", auth: str = "password", **extra: Any) -> dict[str, Any]:
    """A server config ``backends[]`` entry for the Bizfly simulator's first cluster."""
    if auth == "password":
        email, password = next(iter(DEFAULT_USERS.items()))
        credentials = {"auth_method": "password", "email": email, "password": password}
    else:
        cred_id, cred_secret = next(iter(DEFAULT_APP_CREDENTIALS.items()))
        credentials = {
            "auth_method": "application_credential",
            "app_credential_id": cred_id,
            "app_credential_secret": cred_secret,
        }
    return {
        "name": name,
        "type": "bizfly",
        "bizfly": {
            **credentials,
            "region": "HN",
            "api_url": sim.url,
            "token_url": sim.token_url,
            "cluster_name": bizfly_cluster_uid(sim),
        },
        **extra,
    }


def bizfly_cluster_uid(sim: BizflySimulator) -> str:
    """The uid of the simulator's first cluster (what CLUSTER_NAME holds for a real cluster)."""
    return str(sim.snapshot()["clusters"][0]["uid"])


@dataclass
class Stack:
    server: RunningServer
    channel: grpc.Channel
    stub: pb_grpc.CloudProviderStub
    clock: ManualClock
    config: dict[str, Any]
    scaleway: ScalewaySimulator | None = None
    bizfly: BizflySimulator | None = None
    pki: Pki | None = None
    _closers: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def backend(self, name: str) -> Backend:
        for backend in self.server.registry.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)

    def advance(self, seconds: float, sync: bool = True) -> None:
        """Move simulated cloud time on, then let every backend re-read the cloud."""
        self.clock.advance(seconds)
        if sync:
            self.sync()

    def sync(self) -> None:
        from providers.deadline import Deadline

        for backend in self.server.registry.backends:
            backend.sync(Deadline.after(10))

    def groups(self) -> dict[str, pb.NodeGroup]:
        return {g.id: g for g in self.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups}

    def target(self, group_id: str) -> int:
        return self.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group_id), timeout=5).targetSize

    def instances(self, group_id: str) -> list[pb.Instance]:
        return list(self.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group_id), timeout=5).instances)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
        self.server.stop(grace=1.0)
        for sim in (self.scaleway, self.bizfly):
            if sim is not None:
                sim.stop()


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


def start_stack(
    tmp: Path,
    *,
    scaleway: dict[str, Any] | None = None,
    bizfly: dict[str, Any] | None = None,
    tls: str | None = None,
    bizfly_auth: str = "password",
    backend_extra: Mapping[str, Mapping[str, Any]] | None = None,
    server_extra: Mapping[str, Any] | None = None,
) -> Stack:
    """Start the simulators given a scenario (``{}`` = the simulator's default), then the server.

    ``tls`` is None (plaintext), "tls" or "mtls". ``backend_extra`` adds keys (``node_groups``,
    ``sync``) to the backend named "scw" or "bizfly".
    """
    clock = ManualClock()
    extra = backend_extra or {}
    backends: list[dict[str, Any]] = []
    scw_sim = bz_sim = None
    if scaleway is not None:
        scw_sim = ScalewaySimulator(scenario=scaleway or None, clock=clock, secret_key=SCW_SECRET)
        scw_sim.start()
        backends.append(scaleway_backend(scw_sim, **extra.get("scw", {})))
    if bizfly is not None:
        bz_sim = BizflySimulator(scenario=bizfly or None, clock=clock)
        bz_sim.start()
        backends.append(bizfly_backend(bz_sim, auth=bizfly_auth, **extra.get("bizfly", {})))
    config: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "http_listen": "127.0.0.1:0",
        "shutdown_grace": "2s",
        "backends": backends,
        **(server_extra or {}),
    }
    pki = None
    if tls is not None:
        pki = make_pki(tmp / "pki")
        config["tls"] = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
        if tls == "mtls":
            config["tls"]["client_ca"] = str(pki.ca_cert)
    try:
        parsed: ServerConfig = parse(config, env={}, base=tmp)
        running = app.start(parsed)
    except BaseException:
        for sim in (scw_sim, bz_sim):
            if sim is not None:
                sim.stop()
        raise
    address = f"127.0.0.1:{running.port}"
    if pki is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, client_credentials(pki, with_cert=tls == "mtls"))
    return Stack(running, channel, pb_grpc.CloudProviderStub(channel), clock, config, scw_sim, bz_sim, pki)


def client_credentials(pki: Pki, with_cert: bool = True, other: bool = False) -> grpc.ChannelCredentials:
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())
    cert, key = (pki.other_client_cert, pki.other_client_key) if other else (pki.client_cert, pki.client_key)
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=key.read_bytes(),
        certificate_chain=cert.read_bytes(),
    )


@contextlib.contextmanager
def running_stack(tmp: Path, **kwargs: Any) -> Iterator[Stack]:
    stack = start_stack(tmp, **kwargs)
    try:
        yield stack
    finally:
        stack.stop()
