"""How long a client connection lives, on both engines (issue 30): ``serving.max_connection_age`` and its
grace as grpc-go's ``MaxConnectionAge`` and ``MaxConnectionAgeGrace`` (GOAWAY at the age, spread by
+/-10 %; calls in flight get the grace, then the connection is closed), and what a replica that does not
lead does with the connections it holds and accepts (``Engine.follow`` and ``lead``, server/app.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devstack.harness import Stack, running_stack
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from simulators.common import Fault
from simulators.scaleway import demo_scenario
from tests.support.connections import client_ports

ENGINES = ["grpcio", "native"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start(tmp_path: Path, engine: str, **serving: Any) -> Any:
    return running_stack(tmp_path, scaleway=demo_scenario(), server_extra={"serving": {"engine": engine, **serving}})


def connect(stack: Stack) -> tuple[grpc.Channel, int]:
    """A channel of its own with one connection made (a call answered); the connection's local port."""
    before = client_ports(stack.server.port)
    # A subchannel pool of its own: grpcio otherwise shares one connection among a process's channels.
    channel = grpc.insecure_channel(stack.address, options=[("grpc.use_local_subchannel_pool", 1)])
    pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=5)
    (port,) = client_ports(stack.server.port) - before
    return channel, port


def closed_after(stack: Stack, ports: set[int], opened: float, timeout: float) -> dict[int, float]:
    """Seconds from ``opened`` at which each of ``ports`` closed (polled every 10 ms)."""
    closed: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(closed) < len(ports) and time.monotonic() < deadline:
        open_now = client_ports(stack.server.port)
        for port in ports - open_now - set(closed):
            closed[port] = time.monotonic() - opened
        time.sleep(0.01)
    return closed


def test_a_connection_goes_away_at_its_maximum_age_spread_by_ten_percent(tmp_path: Path, engine: str) -> None:
    with start(tmp_path, engine, max_connection_age="2s", max_connection_age_grace="1s") as stack:
        opened = time.monotonic()
        channels = [connect(stack) for _ in range(6)]
        lifetimes = closed_after(stack, {port for _, port in channels}, opened, 5)
        print(f"\n{engine}: connections closed after {sorted(round(t, 2) for t in lifetimes.values())} s (age 2s)")
        assert len(lifetimes) == 6, "a connection outlived its age"
        assert all(1.75 <= t <= 2.2 + 0.4 for t in lifetimes.values()), lifetimes  # +/-10 %, and polling
        assert max(lifetimes.values()) - min(lifetimes.values()) > 0.02, "no jitter: every connection at once"
        channel, _ = channels[0]
        # The channel reconnects by itself, on a new connection.
        assert pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        for channel, _ in channels:
            channel.close()


@pytest.mark.parametrize(("grace", "answered"), [("1s", False), ("4s", True)])
def test_a_call_in_flight_at_the_age_gets_the_grace_then_its_connection_is_closed(
    tmp_path: Path, engine: str, grace: str, answered: bool
) -> None:
    with start(tmp_path, engine, max_connection_age="1s", max_connection_age_grace=grace) as stack:
        assert stack.scaleway is not None
        group = next(iter(stack.groups()))
        channel, _ = connect(stack)
        stack.scaleway.faults.add(Fault(route="*", method="PATCH", delay=2.5, times=1))
        call = pb_grpc.CloudProviderStub(channel).NodeGroupIncreaseSize.future(
            pb.NodeGroupIncreaseSizeRequest(id=group, delta=1), timeout=10
        )
        if answered:
            call.result(timeout=10)  # the age passed while it ran: it finished within the grace
        else:
            with pytest.raises(grpc.RpcError) as cut:
                call.result(timeout=10)
            assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value
        channel.close()


def lifetime(stack: Stack, timeout: float) -> float | None:
    """How long a new connection lives (None: still open after ``timeout``)."""
    opened = time.monotonic()
    channel, port = connect(stack)
    try:
        return closed_after(stack, {port}, opened, timeout).get(port)
    finally:
        channel.close()


def test_a_follower_sends_every_connection_away_until_it_leads(tmp_path: Path, engine: str) -> None:
    with start(tmp_path, engine) as stack:
        follow: Callable[[float, float, float], None] = stack.server.engine.follow
        channel, port = connect(stack)
        follow(1.5, 0.5, 1.0)
        since = time.monotonic()
        assert closed_after(stack, {port}, since, 3).get(port) == pytest.approx(1.5, abs=0.3), "the one held"
        time.sleep(max(0.0, since + 2.0 - time.monotonic()))
        late = lifetime(stack, 3)
        assert late == pytest.approx(0.5, abs=0.25), f"one that came after the follower's age lived {late}s"
        stack.server.engine.lead()
        time.sleep(0.5)
        assert lifetime(stack, 2.5) is None, "a connection to the leader must stay"
        channel.close()


def test_a_replica_that_leads_again_before_the_age_keeps_its_connections(tmp_path: Path, engine: str) -> None:
    with start(tmp_path, engine) as stack:
        channel, port = connect(stack)
        stack.server.engine.follow(1.0, 0.5, 1.0)
        time.sleep(0.3)
        stack.server.engine.lead()
        assert closed_after(stack, {port}, time.monotonic(), 2) == {}, "sent away although it leads again"
        channel.close()


def test_calls_go_on_without_an_error_across_the_age_goaways(tmp_path: Path, engine: str) -> None:
    # The backstop must cost the CA nothing but a reconnection: calls made as its connection ages out are
    # answered (gRPC clients move to a new connection on GOAWAY, and retry a call the server never took).
    with start(tmp_path, engine, max_connection_age="1s", max_connection_age_grace="1s") as stack:
        channel, _ = connect(stack)
        stub = pb_grpc.CloudProviderStub(channel)
        ports: set[int] = set()
        calls = failures = 0
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            try:
                stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
            except grpc.RpcError as err:
                failures += 1
                print(err)
            calls += 1
            ports |= client_ports(stack.server.port)
            time.sleep(0.01)
        channel.close()
        print(f"\n{engine}: {calls} calls on {len(ports)} connections, {failures} failed")
        assert len(ports) >= 4, "the connection did not age out"
        assert failures == 0


def _ipv6_connects(port: int) -> bool:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("::1", port)) == 0


def test_grpcio_on_0_0_0_0_stays_ipv4_only_across_its_server_swaps(tmp_path: Path) -> None:
    # The grpcio engine sends connections away by starting a second server on the port; on 0.0.0.0 that
    # server must not take [::] dual-stack where the first one listened on IPv4 alone.
    serving = {"engine": "grpcio"}
    extra = {"listen": "0.0.0.0:0", "allow_plaintext_non_loopback": True, "serving": serving}
    with running_stack(tmp_path, scaleway=demo_scenario(), server_extra=extra) as stack:
        engine, port = stack.server.engine, stack.server.port
        assert not _ipv6_connects(port), "IPv6 answered before any swap"
        engine.drop_connections(1.0)
        assert not _ipv6_connects(port), "IPv6 answered after drop_connections"
        engine.follow(0.2, 0.5, 0.5)
        time.sleep(0.6)
        assert not _ipv6_connects(port), "IPv6 answered once the follower's server took the port"
        engine.lead()
        assert not _ipv6_connects(port), "IPv6 answered once the leader's server took the port back"
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=5)
        channel.close()


def test_calls_go_on_without_an_error_across_follow_and_lead_swaps(tmp_path: Path, engine: str) -> None:
    """Issue 40, item 5: on the grpcio engine, follow() and lead() move the port to a new server and stop
    the old one, and grpc core fails the calls that reach a server it is stopping: a client calling back to
    back, like the CA, got CANCELLED (and UNAVAILABLE or a hang on a fresh connection) on 0.2-0.4 calls
    per swap. Ten swaps, one client on its own connection and one opening a new one per call: no call
    fails, on either engine."""
    with start(tmp_path, engine) as stack:
        stop = threading.Event()
        failures: list[str] = []
        calls = [0, 0]

        def client(fresh: bool) -> None:
            channel = None
            while not stop.is_set():
                if channel is None or fresh:
                    if channel is not None:
                        channel.close()
                    channel = grpc.insecure_channel(stack.address, options=[("grpc.use_local_subchannel_pool", 1)])
                    stub = pb_grpc.CloudProviderStub(channel)
                try:
                    stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
                except grpc.RpcError as err:
                    failures.append(f"{'fresh' if fresh else 'held'}: {err.code().name} {err.details()}")
                calls[fresh] += 1
            if channel is not None:
                channel.close()

        clients = [threading.Thread(target=client, args=(fresh,)) for fresh in (False, True)]
        for thread in clients:
            thread.start()
        try:
            time.sleep(0.3)
            for _ in range(5):
                stack.server.engine.follow(0.05, 0.5, 1.0)  # the follower's server takes the port after 50 ms
                time.sleep(0.4)
                stack.server.engine.lead()
                time.sleep(0.4)
        finally:
            stop.set()
            for thread in clients:
                thread.join()
        print(f"\n{engine}: {calls[0]} calls on a held connection, {calls[1]} on fresh ones, {len(failures)} failed")
        assert calls[0] > 100 and calls[1] > 20, calls
        assert not failures, failures
