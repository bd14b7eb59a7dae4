"""Which addresses each port answers on, for the listen forms an operator writes (both engines: make test
runs tests/integration once per engine). ``[::]`` is every address, IPv6 and IPv4 alike (the kubelet
probes the pod's IPv4 address), ``0.0.0.0`` every IPv4 address, a loopback address only itself; the gRPC
port and the probe/metrics port follow the same rule (docs/reference/config.md, "listen" and "http_listen"). On
the grpcio engine grpc core would take ``0.0.0.0`` for both families; a guard socket holds ``[::]`` of the
port IPv6-only so that it listens on IPv4 alone (server/http_server.py, ``ipv4_only_guard``)."""

from __future__ import annotations

import socket
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.certs import make_pki
from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, client_credentials, server_config
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario

IPV4, IPV6 = "127.0.0.1", "::1"


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind((IPV6, 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _grpc_serving(address: str, port: int, credentials: grpc.ChannelCredentials) -> bool:
    with grpc.secure_channel(f"{_url_host(address)}:{port}", credentials) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err  # nothing listening: never another error
            return False
    return answer.status == health_pb2.HealthCheckResponse.SERVING


def _http_healthy(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{_url_host(address)}:{port}/healthz", timeout=5) as answer:
            return answer.status == 200
    except urllib.error.URLError as err:
        assert isinstance(err.reason, ConnectionRefusedError), err
        return False


@pytest.mark.parametrize(
    ("host", "answers_ipv4", "answers_ipv6"),
    [("[::]", True, True), ("0.0.0.0", True, False), (IPV4, True, False), (f"[{IPV6}]", False, True)],
)
def test_each_port_answers_on_the_addresses_its_host_names(tmp_path, host, answers_ipv4, answers_ipv6):
    pki = make_pki(tmp_path / "pki", hosts=("localhost", IPV4, IPV6))
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        raw = server_config([scaleway_backend(sim)], pki=pki, mtls=True)
        server = ServerProcess(raw, workdir=tmp_path, listen=f"{host}:0", http_listen=f"{host}:0")
        try:
            credentials = client_credentials(pki)
            for address, expected in ((IPV4, answers_ipv4), (IPV6, answers_ipv6)):
                assert _grpc_serving(address, server.grpc_port, credentials) is expected, (host, address, "gRPC")
                assert _http_healthy(address, server.http_port) is expected, (host, address, "HTTP")
        finally:
            server.stop()
