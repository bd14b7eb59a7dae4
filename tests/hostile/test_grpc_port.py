"""Hostile and broken clients on the gRPC port, on both serving engines (issue 25).

Each attack runs against ``ca-externalgrpc serve`` as a child process (its threads, RSS and open file
descriptors read from /proc, tests/hostile/measure.py) and asserts that they stay under a stated bound
while a normal RPC and a health Check, on a connection opened before the attack as the CA's is, keep
answering: the median of several probes within 100 ms.

The flood sizes are small enough for ``make test``; ``HOSTILE_CONNECTIONS=1000 HOSTILE_STREAMS=200``
gives the figures of docs/evidence/hostile-clients.md ("gRPC port").

Where the engines differ, the test says which is right: the grpcio engine is the reference for the
protocol, grpc-go for what grpcio leaves open (a malformed ``grpc-timeout``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.certs import make_pki
from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, client_credentials, server_config
from protos import externalgrpc_pb2 as pb
from server.service import SERVICE_NAME
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator
from tests.hostile import measure
from tests.hostile.raw_http2 import PREFACE, RawGrpc, closed_by_peer, grpc_frame, open_silent

ENGINES = ("native", "grpcio")
CONNECTIONS = int(os.environ.get("HOSTILE_CONNECTIONS", "200"))
STREAMS = int(os.environ.get("HOSTILE_STREAMS", "40"))
GROUP = "aaaaaaaa-0000-4000-8000-000000000001"
SCENARIO = {
    "seed": 3,
    "clusters": [
        {
            "id": "11111111-2222-4333-8444-555555555555",
            "name": "hostile",
            "pools": [{"id": GROUP, "name": "general", "node_type": "DEV1-M", "size": 2, "min_size": 0, "max_size": 9}],
        }
    ],
}
#: the limits the attacks meet, short enough to watch them act
SERVING = {"handshake_timeout": "2s", "idle_timeout": "3s", "max_connections": 5000}
TARGET_SIZE = f"/{SERVICE_NAME}/NodeGroupTargetSize"
REFRESH = f"/{SERVICE_NAME}/Refresh"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
#: a normal call answers within this, median of several probes, during every attack
PROBE_SECONDS = 0.1
MIB = 1024 * 1024
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 4, 8, 12, 13


class Target:
    """A server process on one engine, its simulator, and a channel opened before any attack."""

    def __init__(self, engine: str, tmp: Path, serving: dict[str, Any], mtls: bool = False) -> None:
        self.engine = engine
        self.sim = ScalewaySimulator(scenario=SCENARIO, clock=ManualClock()).start()
        self.pki = make_pki(tmp / "pki") if mtls else None
        credentials = client_credentials(self.pki) if self.pki is not None else None
        raw = server_config([scaleway_backend(self.sim)], pki=self.pki, mtls=mtls)
        raw["serving"] = {"engine": engine, **serving}
        try:
            self.server = ServerProcess(raw, workdir=tmp, credentials=credentials, name=f"hostile-{engine}")
        except BaseException:
            self.sim.stop()
            raise
        self.health = health_pb2_grpc.HealthStub(self.server.channel)
        self.probe()  # the channel is connected before the attack, as the CA's is

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def pid(self) -> int:
        return self.server.pid

    def probe(self) -> None:
        """One health Check and one table-answered RPC on the established channel."""
        check = self.health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        self.server.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=GROUP), timeout=5)

    def assert_responsive(self, during: str) -> float:
        """The median probe time, asserted within PROBE_SECONDS."""
        median = measure.median_latency(self.probe)
        assert median < PROBE_SECONDS, f"{self.engine}: probes took {median * 1000:.0f} ms (median) during {during}"
        return median

    def stop(self) -> None:
        self.server.stop()
        self.sim.stop()


@contextlib.contextmanager
def target(engine: str, tmp: Path, serving: dict[str, Any] | None = None, mtls: bool = False) -> Iterator[Target]:
    t = Target(engine, tmp, {**SERVING, **(serving or {})}, mtls=mtls)
    try:
        yield t
    finally:
        t.stop()


@pytest.fixture(scope="module", params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with target(request.param, tmp_path_factory.mktemp(request.param)) as t:
        yield t


def settle(pid: int, seconds: float = 0.5) -> measure.Usage:
    time.sleep(seconds)
    return measure.usage(pid)


def report(name: str, engine: str, **figures: Any) -> None:
    """One line per attack in the test output (pytest -s), the figures docs/evidence/hostile-clients.md quotes."""
    print(f"\n[hostile] {engine} {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# ----------------------------------------------------------------------------------------- connections


def test_silent_and_half_sent_connections_cost_little_and_close_at_the_handshake_deadline(server: Target) -> None:
    before = measure.usage(server.pid)
    half = CONNECTIONS // 2
    sockets = [open_silent(server.address) for _ in range(half)]
    sockets += [open_silent(server.address, PREFACE[:10]) for _ in range(CONNECTIONS - half)]
    try:
        during = settle(server.pid)
        latency = server.assert_responsive(f"{CONNECTIONS} silent connections")
        report(
            "silent connections", server.engine, n=CONNECTIONS, before=before, during=during, probe_ms=latency * 1000
        )
        assert during.threads <= before.threads + 2, f"a thread per connection? {before} -> {during}"
        assert during.rss_mib <= before.rss_mib + 10 + CONNECTIONS * 0.05, f"{before} -> {during}"
        assert during.fds <= before.fds + CONNECTIONS + 10, f"{before} -> {during}"
        # handshake_timeout is 2 s: every one of them is closed by the server.
        deadline = time.monotonic() + 2 + 8
        open_ones = list(sockets)
        while open_ones and time.monotonic() < deadline:
            time.sleep(0.25)
            open_ones = [s for s in open_ones if not closed_by_peer(s)]
        assert not open_ones, (
            f"{server.engine}: {len(open_ones)} of {CONNECTIONS} still open past the handshake deadline"
        )
        after = settle(server.pid)
        assert after.fds <= before.fds + 5, f"{before} -> {after}"
    finally:
        for s in sockets:
            s.close()


def test_a_connection_that_only_says_hello_is_closed_when_idle(server: Target) -> None:
    raw = RawGrpc(server.address)
    try:
        started = time.monotonic()
        raw.pump(3 + 5)  # idle_timeout is 3 s
        assert raw.closed or raw.goaway is not None, f"{server.engine}: an idle connection is still open"
        assert time.monotonic() - started < 3 + 5
    finally:
        raw.close()


def test_at_max_connections_a_new_client_still_gets_answers(server: Target, tmp_path: Path) -> None:
    """With every slot taken by idle connections, a prober's new connection is still served (native:
    the longest-idle connection is closed for it)."""
    with target(server.engine, tmp_path, {"max_connections": 20, "idle_timeout": "0s"}) as t:
        before = measure.usage(t.pid)
        idle = [RawGrpc(t.address) for _ in range(40)]
        try:
            for raw in idle:
                raw.pump(0.01)
            during = settle(t.pid)
            assert during.fds <= before.fds + 20 + 5, f"{t.engine}: over max_connections: {before} -> {during}"
            with grpc.insecure_channel(t.address) as fresh:
                check = health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest(), timeout=3)
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            t.assert_responsive("a full connection table")
        finally:
            for raw in idle:
                raw.close()


# ----------------------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize(
    "path",
    [TARGET_SIZE, REFRESH, HEALTH_CHECK, HEALTH_WATCH, REFLECTION],
    ids=["table", "python", "health-check", "health-watch", "reflection"],
)
def test_a_body_that_never_ends_is_answered_at_the_deadline(server: Target, path: str) -> None:
    raw = RawGrpc(server.address)
    try:
        stream = raw.start(path, timeout="1S")
        raw.send(stream, grpc_frame(b"\x0a\x01x", length=1000))  # announces 1000 bytes, sends 3
        raw.wait([stream], 5)
        answer = raw.answers[stream]
        assert answer.status == DEADLINE_EXCEEDED, f"{server.engine} {path}: {answer}"
        assert answer.seconds is not None and 0.9 <= answer.seconds < 2.5, f"{server.engine} {path}: {answer}"
    finally:
        raw.close()


def test_many_never_ending_4_mib_bodies_on_one_connection_are_answered_in_time_and_freed(server: Target) -> None:
    """STREAMS bodies announcing 4 MiB, each sent up to 4 MiB - 1 byte, with a 1 s deadline.

    grpcio buffers every one until its deadline (DEADLINE_EXCEEDED at 1 s) and its RSS stays up after
    them; the native front holds at most 16 MiB per connection: the first four get DEADLINE_EXCEEDED at
    1 s, the rest RESOURCE_EXHAUSTED at once, and the memory is given back. The native front is right:
    grpcio has no bound on what one client's bodies hold (docs/explanation/reliability.md, "Hostile clients").
    """
    before = measure.usage(server.pid)
    raw = RawGrpc(server.address)
    body = grpc_frame(b"\x0a" + b"x" * (4 * MIB - 2), length=4 * MIB)[: 4 * MIB + 4]
    try:
        streams = []
        progress: dict[int, int] = {}
        for _ in range(STREAMS):
            while len([s for s in streams if raw.answers[s].ended_at is None]) >= 90:
                raw.pump(0.05)  # the server allows 100 streams at once
            stream = raw.start(TARGET_SIZE, timeout="1S")
            streams.append(stream)
            progress[stream] = 0
        peak = before
        until = time.monotonic() + 8
        while time.monotonic() < until and any(raw.answers[s].ended_at is None for s in streams):
            for stream in streams:
                if raw.answers[stream].ended_at is None and progress[stream] < len(body):
                    with contextlib.suppress(Exception):
                        progress[stream] += raw.send(stream, body[progress[stream] : progress[stream] + MIB])
            raw.pump(0.05)
            now = measure.usage(server.pid)
            peak = now if now.rss_mib > peak.rss_mib else peak
        answers = [raw.answers[s] for s in streams]
        codes = sorted({a.status for a in answers}, key=str)
        slowest = max((a.seconds or 99) for a in answers)
        after = settle(server.pid, 1.0)
        report(
            "never-ending 4 MiB bodies, 1 s deadline",
            server.engine,
            streams=STREAMS,
            codes=codes,
            slowest_s=round(slowest, 2),
            deadline_exceeded=sum(a.status == DEADLINE_EXCEEDED for a in answers),
            before=before,
            peak=peak,
            after=after,
        )
        assert all(a.status in (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED) for a in answers), codes
        assert slowest < 2.5, f"{server.engine}: the last answer came {slowest:.1f} s after its stream opened"
        if server.engine == "native":
            assert peak.rss_mib <= before.rss_mib + 16 + 20, f"native holds more than 16 MiB: {before} -> {peak}"
            assert after.rss_mib <= before.rss_mib + 20, f"native kept the bodies: {before} -> {after}"
    finally:
        raw.close()
    server.assert_responsive("after the bodies")


def test_a_connection_holds_at_most_16_mib_of_announced_request_bytes(server: Target) -> None:
    """Six calls each announce a 4 MiB message and send only its prefix, 2 s deadline.

    native: the first four are held until their deadline, the fifth and sixth are refused
    RESOURCE_EXHAUSTED at once (16 MiB per connection, counted from the prefix). grpcio has no such
    bound: all six wait for their deadline. The native front is right: nothing else caps what one
    connection makes the process hold (100 streams of 4 MiB each on grpcio).
    """
    raw = RawGrpc(server.address)
    try:
        streams = []
        for _ in range(6):
            stream = raw.start(TARGET_SIZE, timeout="2S")
            raw.send(stream, grpc_frame(b"", length=4 * MIB))
            raw.pump(0.05)
            streams.append(stream)
        raw.wait(streams, 4)
        answers = [raw.answers[s] for s in streams]
        expected = [DEADLINE_EXCEEDED] * 4 + [
            RESOURCE_EXHAUSTED if server.engine == "native" else DEADLINE_EXCEEDED
        ] * 2
        assert [a.status for a in answers] == expected, answers
        if server.engine == "native":
            assert all((a.seconds or 99) < 1 for a in answers[4:]), "refused at once"
            assert "16777216" in answers[4].message, answers[4].message
    finally:
        raw.close()


def test_a_whole_unary_message_is_answered_without_the_half_close(server: Target) -> None:
    raw = RawGrpc(server.address)
    try:
        request = pb.NodeGroupTargetSizeRequest(id=GROUP).SerializeToString()
        streams = [raw.call(TARGET_SIZE, request, end=False), raw.call(REFRESH, b"", end=False)]
        raw.call(HEALTH_CHECK, b"", end=False)
        raw.wait(streams, 3)
        for stream in streams:
            answer = raw.answers[stream]
            assert answer.status == 0 and (answer.seconds or 99) < 1, f"{server.engine}: {answer}"
    finally:
        raw.close()


@pytest.mark.parametrize("value", ["abc", "123456789S", "1.5S", "S"])
def test_a_malformed_grpc_timeout_is_refused(server: Target, value: str) -> None:
    """INTERNAL, as grpc-go refuses it ("malformed grpc-timeout"; the spec allows 8 digits at most).

    grpcio refuses the same way ("Error parsing 'grpc-timeout' metadata") but takes 9 digits as a
    deadline: there grpc-go and the spec are right, and the native front follows them."""
    raw = RawGrpc(server.address)
    try:
        stream = raw.call(TARGET_SIZE, pb.NodeGroupTargetSizeRequest(id=GROUP).SerializeToString(), timeout=value)
        raw.wait([stream], 3)
        answer = raw.answers[stream]
        if server.engine == "grpcio" and value == "123456789S":
            assert answer.status == 0, answer
            return
        assert answer.status == INTERNAL, answer
        assert "grpc-timeout" in answer.message, answer
    finally:
        raw.close()


def test_a_zero_deadline_is_exceeded_even_for_a_table_answer(server: Target) -> None:
    raw = RawGrpc(server.address)
    try:
        request = pb.NodeGroupTargetSizeRequest(id=GROUP).SerializeToString()
        streams = [raw.call(TARGET_SIZE, request, timeout="0n"), raw.call(HEALTH_CHECK, b"", timeout="0n")]
        raw.wait(streams, 3)
        assert [raw.answers[s].status for s in streams] == [DEADLINE_EXCEEDED] * 2, raw.answers
    finally:
        raw.close()


# ----------------------------------------------------------------------------------------- encodings


def test_gzip_requests_from_grpcios_own_client_are_answered(server: Target) -> None:
    channel = grpc.insecure_channel(server.address, compression=grpc.Compression.Gzip)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5).status == 1
        call = channel.unary_unary(TARGET_SIZE)
        answer = call(pb.NodeGroupTargetSizeRequest(id=GROUP).SerializeToString(), timeout=5)
        assert pb.NodeGroupTargetSizeResponse.FromString(answer).targetSize == 2
        refresh = channel.unary_unary(REFRESH)(b"", timeout=5, compression=grpc.Compression.Deflate)
        assert refresh == b""
    finally:
        channel.close()


def test_an_unknown_encoding_or_an_unannounced_compression_gets_the_specs_codes(server: Target) -> None:
    """The spec: an encoding the server does not support is UNIMPLEMENTED with grpc-accept-encoding
    (native, right); grpcio answers INTERNAL "Error parsing 'grpc-encoding' metadata"."""
    raw = RawGrpc(server.address)
    try:
        unknown = raw.start(TARGET_SIZE, "5S", extra=[("grpc-encoding", "snappy")])
        raw.send(unknown, grpc_frame(b"xyz", compressed=True), end=True)
        unannounced = raw.start(TARGET_SIZE, "5S")
        raw.send(unannounced, grpc_frame(b"xyz", compressed=True), end=True)
        raw.wait([unknown, unannounced], 3)
        refused = raw.answers[unknown]
        if server.engine == "native":
            assert refused.status == UNIMPLEMENTED, refused
            assert "gzip" in refused.headers.get("grpc-accept-encoding", ""), refused
        else:
            assert refused.status == INTERNAL and "grpc-encoding" in refused.message, refused
        assert raw.answers[unannounced].status == INTERNAL, raw.answers[unannounced]
    finally:
        raw.close()


# ----------------------------------------------------------------------------------------- headers and streams


@pytest.mark.parametrize("kib", [20, 100])
def test_oversized_metadata_fails_that_call_only(server: Target, kib: int) -> None:
    """RESOURCE_EXHAUSTED for the call (grpcio's answer), and a health Watch on the same connection lives."""
    channel = grpc.insecure_channel(server.address)
    try:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        call = channel.unary_unary(TARGET_SIZE)
        request = pb.NodeGroupTargetSizeRequest(id=GROUP).SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=5, metadata=[("x-padding", "p" * kib * 1024)])
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
        assert call(request, timeout=5), "the connection still serves"
        assert watch.is_active(), f"{server.engine}: the Watch on the same connection died: {watch}"
        watch.cancel()
    finally:
        channel.close()


def test_rapid_resets_and_half_sent_streams_are_bounded(server: Target) -> None:
    """1,000 streams opened and reset, then 900 calls whose body never comes (no deadline).

    The native front reads bodies on its event loop: the probes go on. The grpcio engine gives each
    call a pool thread (max_workers, 16) from its headers on, so 16 half-sent calls without a deadline
    stall every other call until those connections close: the native front is right, and
    docs/explanation/reliability.md says so for the grpcio engine.
    """
    before = measure.usage(server.pid)
    raw = RawGrpc(server.address)
    half_sent = [RawGrpc(server.address) for _ in range(10)]
    try:
        for _ in range(1000):
            raw.reset(raw.start(TARGET_SIZE, "5S"))
        raw.pump(0.2)
        for conn in half_sent:
            for _ in range(90):
                conn.start(TARGET_SIZE)  # headers, no body, no deadline
            conn.pump(0.01)
        during = settle(server.pid)
        if server.engine == "grpcio":
            with pytest.raises(grpc.RpcError) as stalled:
                server.server.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=GROUP), timeout=1)
            assert stalled.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            latency = float("nan")
        else:
            latency = server.assert_responsive("1,000 resets and 900 half-sent streams")
        report("resets and half-sent streams", server.engine, before=before, during=during, probe_ms=latency * 1000)
        assert during.threads <= before.threads + (2 if server.engine == "native" else 16), f"{before} -> {during}"
        assert during.rss_mib <= before.rss_mib + 30, f"{before} -> {during}"
    finally:
        for conn in [raw, *half_sent]:
            conn.close()
    after = settle(server.pid, 1.0)
    assert after.fds <= before.fds + 5, f"{before} -> {after}"
    server.assert_responsive("after the half-sent streams left")


def test_a_ping_flood_gets_goaway_enhance_your_calm(server: Target) -> None:
    raw = RawGrpc(server.address)
    try:
        raw.pump(0.2)
        for i in range(20):
            if raw.goaway is not None or raw.closed:
                break
            raw.ping(f"ping{i:04d}".encode())
            raw.pump(0.02)
        raw.pump(3)
        assert raw.goaway is not None, f"{server.engine}: 20 pings in 0.5 s, no GOAWAY"
        assert raw.goaway.error_code == 11 and b"too_many_pings" in (raw.goaway.additional_data or b""), raw.goaway
        assert raw.closed or (raw.pump(2) is None and raw.closed), f"{server.engine}: still open after GOAWAY"
    finally:
        raw.close()
    server.assert_responsive("after a ping flood")


# ----------------------------------------------------------------------------------------- keepalive and TLS


@pytest.mark.parametrize("engine", ENGINES)
def test_a_peer_that_stops_answering_pings_is_closed(engine: str, tmp_path: Path) -> None:
    """A health Watch keeps the connection busy (not idle); the peer then goes silent, ACKs included."""
    with target(engine, tmp_path, {"keepalive_time": "1s", "keepalive_timeout": "1s", "idle_timeout": "0s"}) as t:
        raw = RawGrpc(t.address)
        try:
            watch = raw.call(HEALTH_WATCH, b"", timeout=None)
            raw.pump(0.5)
            assert raw.answers[watch].data, "the Watch answered"
            time.sleep(6)  # no reads: the server's PINGs go unanswered
            assert closed_by_peer(raw.sock), f"{engine}: a silent peer still holds its connection"
        finally:
            raw.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_tls_handshake_stalls_are_closed_at_the_handshake_deadline(engine: str, tmp_path: Path) -> None:
    with target(engine, tmp_path, mtls=True) as t:
        assert t.pki is not None
        silent = open_silent(t.address)
        hello_cut = open_silent(t.address, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello, cut
        context = ssl.create_default_context(cafile=str(t.pki.ca_cert))
        context.load_cert_chain(str(t.pki.client_cert), str(t.pki.client_key))
        context.set_alpn_protocols(["h2"])
        after_tls = context.wrap_socket(
            socket.create_connection(("127.0.0.1", t.server.grpc_port)), server_hostname="localhost"
        )
        try:
            time.sleep(2 + 2)
            stalled = {"silent": silent, "cut hello": hello_cut, "no preface after TLS": after_tls}
            still_open = [name for name, s in stalled.items() if not closed_by_peer(s)]
            assert not still_open, f"{engine}: still open past the 2 s handshake deadline: {still_open}"
            t.assert_responsive("handshake stalls")
        finally:
            for s in (silent, hello_cut, after_tls):
                s.close()
