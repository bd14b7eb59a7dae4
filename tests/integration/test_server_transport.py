"""How the server is reached: TLS and mTLS, grpc.health.v1, reflection, HTTP probes, SIGTERM draining."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from devstack.certs import make_pki
from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, ServerStartError, client_credentials, running_stack, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from simulators.common import Fault, ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario
from tests.support.connections import client_ports

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
RPCS = {
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
}


def node_groups(channel: grpc.Channel) -> list[str]:
    stub = pb_grpc.CloudProviderStub(channel)
    return [g.id for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=3).nodeGroups]


def test_tls_serves_a_client_that_trusts_the_server_and_refuses_plaintext(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario(), tls="tls") as stack:
        assert node_groups(stack.channel)
        with grpc.insecure_channel(stack.address) as plain, pytest.raises(grpc.RpcError) as info:
            node_groups(plain)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_requires_a_client_certificate_from_the_configured_ca(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario(), tls="mtls") as stack:
        assert stack.pki is not None
        assert node_groups(stack.channel)
        refused = (
            client_credentials(stack.pki, with_cert=False),
            client_credentials(stack.pki, other=True),
        )
        for creds in refused:
            with grpc.secure_channel(stack.address, creds) as channel, pytest.raises(grpc.RpcError) as info:
                node_groups(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(stack.address) as plain, pytest.raises(grpc.RpcError):
            node_groups(plain)


def test_health_reports_the_server_and_each_backend(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario()) as stack:
        health = health_pb2_grpc.HealthStub(stack.channel)
        for service in ("", SERVICE, "ca-externalgrpc.backend.scw"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=3).status
            assert status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=3)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_tells_a_dead_backend_apart(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario()) as stack:
        assert stack.scaleway is not None
        stack.scaleway.faults.add(Fault(route="*", status=503))
        backend = stack.backend("scw")
        backend.settings = type(backend.settings)(max_staleness=0.0, min_interval=0.0)
        with pytest.raises(Exception):  # noqa: B017 - any DomainError: the sync must fail
            stack.sync()
        health = health_pb2_grpc.HealthStub(stack.channel)
        backend_status = health.Check(health_pb2.HealthCheckRequest(service="ca-externalgrpc.backend.scw"), timeout=3)
        assert backend_status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        overall = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        assert overall.status == health_pb2.HealthCheckResponse.SERVING  # the process itself is fine
        with pytest.raises(grpc.RpcError) as info:
            stack.stub.Refresh(pb.RefreshRequest(), timeout=3)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "scw" in info.value.details()


def test_reflection_lists_the_service_and_resolves_every_method(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario()) as stack:
        database = ProtoReflectionDescriptorDatabase(stack.channel)
        services = set(database.get_services())
        assert {SERVICE, "grpc.health.v1.Health"} <= services
        file_proto = database.FindFileContainingSymbol(SERVICE)
        service = next(s for s in file_proto.service if f"{file_proto.package}.{s.name}" == SERVICE)
        assert {m.name for m in service.method} == RPCS
        for method in service.method:
            for type_name in (method.input_type, method.output_type):
                found = database.FindFileContainingSymbol(type_name.lstrip("."))
                assert isinstance(found, descriptor_pb2.FileDescriptorProto)


def test_http_probes_answer_on_the_plaintext_port(tmp_path):
    with running_stack(tmp_path, scaleway=demo_scenario(), tls="mtls") as stack:
        http = stack.server.http
        assert http is not None
        port = http.port  # type: ignore[attr-defined]
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as answer:
                assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as answer:
            assert b"grpc_server_handled_total" in answer.read()


def test_sigterm_drains_in_flight_calls_then_exits(tmp_path):
    clock = ManualClock()
    with ScalewaySimulator(scenario=demo_scenario(), clock=clock) as sim:
        config = server_config([scaleway_backend(sim)], shutdown_grace="10s", log={"format": "json", "level": "info"})
        server = ServerProcess(config, workdir=tmp_path)
        try:
            group = next(iter(node_groups(server.channel)))
            # The size write to the cloud takes 2 s: SIGTERM arrives while it is in flight.
            sim.faults.add(Fault(route="*", method="PATCH", delay=2.0, times=1))
            result: dict[str, object] = {}

            def increase() -> None:
                with grpc.insecure_channel(server.address) as channel:
                    stub = pb_grpc.CloudProviderStub(channel)
                    try:
                        stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group, delta=1), timeout=8)
                        result["code"] = "OK"
                    except grpc.RpcError as err:
                        result["code"] = err.code().name

            worker = threading.Thread(target=increase)
            worker.start()
            time.sleep(0.7)
            server.process.send_signal(signal.SIGTERM)
            worker.join(15)
            assert result.get("code") == "OK", result
            assert server.process.wait(timeout=20) == 0
            patches = [r for r in sim.requests.all() if r.method == "PATCH"]
            assert len(patches) == 1
            with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError):
                node_groups(channel)
        finally:
            server.stop(signal.SIGKILL)
        lines = [json.loads(line) for line in server.output.splitlines() if line.startswith("{")]
        assert lines and all({"ts", "caller", "msg"} <= set(line) for line in lines)  # Kubernetes JSON log lines


def test_tls_off_loopback_without_client_authentication_refuses_to_start(tmp_path):
    """Anyone who can reach a non-loopback port could resize pools: a server certificate alone is not enough."""
    pki = make_pki(tmp_path / "pki")
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        raw = server_config([scaleway_backend(sim)], pki=pki)
        try:
            server = ServerProcess(raw, workdir=tmp_path, listen="0.0.0.0:0")
        except ServerStartError as err:
            output = str(err)
        else:
            try:
                with grpc.secure_channel(
                    f"127.0.0.1:{server.grpc_port}", client_credentials(pki, with_cert=False)
                ) as channel:
                    groups = node_groups(channel)
            finally:
                server.stop(signal.SIGKILL)
            raise AssertionError(f"served {len(groups)} groups to a client without a certificate on 0.0.0.0")
    assert "exited with 2" in output, output
    assert "tls.client_ca" in output and "allow_unauthenticated_clients" in output, output
    assert "Traceback" not in output


def test_tls_off_loopback_serves_unauthenticated_clients_only_when_allowed_explicitly(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        raw = server_config([scaleway_backend(sim)], pki=pki)
        raw["tls"]["allow_unauthenticated_clients"] = True
        server = ServerProcess(raw, workdir=tmp_path, listen="0.0.0.0:0")
        try:
            with grpc.secure_channel(
                f"127.0.0.1:{server.grpc_port}", client_credentials(pki, with_cert=False)
            ) as channel:
                assert node_groups(channel)
        finally:
            server.stop()
    assert "allow_unauthenticated_clients" in server.output  # the start-up warning names the key


def test_drop_connections_sends_clients_elsewhere_and_lets_open_calls_finish(tmp_path):
    """What a replica that stops leading does (issue 26): every client connection gets GOAWAY, the call in
    flight finishes within the grace, the channel reconnects by itself, and the port keeps listening."""
    with running_stack(tmp_path, scaleway=demo_scenario()) as stack:
        assert stack.scaleway is not None
        group = next(iter(stack.groups()))
        connected = client_ports(stack.server.port)
        assert len(connected) == 1, connected
        stack.scaleway.faults.add(Fault(route="*", method="PATCH", delay=1.5, times=1))
        increase = stack.stub.NodeGroupIncreaseSize.future(
            pb.NodeGroupIncreaseSizeRequest(id=group, delta=1), timeout=10
        )
        time.sleep(0.5)  # the size write is in flight
        stack.server.engine.drop_connections(5.0)
        increase.result(timeout=10)  # answered OK within the grace
        deadline = time.monotonic() + 5
        while client_ports(stack.server.port) & connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client_ports(stack.server.port) & connected, "the old connection is still open"
        assert stack.target(group) >= 1  # the same channel, on a new connection
        reconnected = client_ports(stack.server.port)
        assert reconnected and not reconnected & connected, (connected, reconnected)
