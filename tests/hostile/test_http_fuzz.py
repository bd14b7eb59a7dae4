"""A property test of the probe/metrics port on a real server process (the engine of
``CA_EXTERNALGRPC_TEST_ENGINE``): random bytes and random pipelined requests, cut at random points into
separate TCP segments. Whatever arrives, the port answers with well-formed HTTP/1.1 answers (in order,
one per request it read), closes after any refusal, writes no traceback, and stays healthy. The budget
is fixed (``EXAMPLES`` per property, no deadline per example) so ``make test`` always spends about the
same time here."""

from __future__ import annotations

import contextlib
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, server_config
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario
from tests.hostile.measure import open_fds

EXAMPLES = 120
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: every status the port may answer with
STATUSES = {200, 400, 404, 405, 408, 413, 414, 431, 501, 505}
ROUTES = {"/healthz": 200, "/readyz": 200, "/metrics": 200}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        started = ServerProcess(server_config([scaleway_backend(sim)]), workdir=Path(tempfile.mkdtemp()))
        try:
            yield started
        finally:
            started.stop()
            tracebacks = [line for line in started.output.splitlines() if "Traceback" in line]
            assert not tracebacks, tracebacks


def _send_in_pieces(port: int, data: bytes, cuts: list[int]) -> bytes:
    """``data`` sent in segments cut at ``cuts``, then the write side closed; all the server answers."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
        with contextlib.suppress(OSError):  # the server may close after a refusal while we still send
            for start, end in zip(bounds, bounds[1:], strict=False):
                if end > start:
                    sock.sendall(data[start:end])
                    time.sleep(0.001)
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


ANSWER_HEAD = re.compile(rb"HTTP/1\.1 (\d{3}) [^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n")


def _answers(stream: bytes, heads_only: list[bool | None]) -> list[tuple[int, dict[str, str]]]:
    """The answers in ``stream``, framed by their Content-Length: no body for a HEAD (``heads_only``; for
    None or past its end, none when the next answer follows the head at once: no body starts so)."""
    answers = []
    while stream:
        match = ANSWER_HEAD.match(stream)
        assert match, f"not an HTTP/1.1 answer: {stream[:120]!r}"
        fields = {}
        for line in match.group(2).decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        head = heads_only[len(answers)] if len(answers) < len(heads_only) else None
        if head is None:
            head = stream[match.end() :].startswith(b"HTTP/1.1 ")
        length = 0 if head else int(fields["content-length"])
        answers.append((int(match.group(1)), fields))
        stream = stream[match.end() + length :]
    return answers


@pytest.fixture(scope="module")
def fds_before(server: ServerProcess) -> int:
    """The server's open fds before the first property ran."""
    return open_fds(server.pid)


def _still_healthy(server: ServerProcess) -> None:
    assert server.http_get("/healthz")[0] == 200
    assert server.process.poll() is None


@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8))
@FUZZ
def test_random_bytes_get_well_formed_answers_and_a_close(
    server: ServerProcess, fds_before: int, data: bytes, cuts: list[int]
) -> None:
    answers = _answers(_send_in_pieces(server.http_port, data, cuts), [])
    for status, _ in answers:
        assert status in STATUSES, (data, status)
    if answers and answers[-1][0] not in (200, 404):
        assert answers[-1][1].get("connection") == "close", (data, answers)
    _still_healthy(server)


_PATHS = st.sampled_from(["/healthz", "/readyz", "/metrics", "/nope", "/healthz/", "/%2e%2e/x", "/healthz?x=1"])
_FIELD_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
_FIELD_VALUES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,;=0123456789/", max_size=30)


@st.composite
def _request(draw: st.DrawFn) -> tuple[bytes, bool, int]:
    """One valid request: (bytes, is HEAD, the status it must get)."""
    method = draw(st.sampled_from(["GET", "HEAD"]))
    path = draw(_PATHS)
    target = draw(st.sampled_from([path, f"http://probe.example:8087{path}"]))
    extra = draw(st.lists(st.tuples(_FIELD_NAMES, _FIELD_VALUES), max_size=5))
    fields = [("Host", "probe.example"), *((f"X-{n}", v.strip()) for n, v in extra)]
    client = h11.Connection(h11.CLIENT)
    raw = client.send(h11.Request(method=method, target=target, headers=fields))
    assert raw is not None
    status = ROUTES.get(path.split("?", 1)[0], 404)
    return raw, method == "HEAD", status


@given(requests=st.lists(_request(), min_size=1, max_size=12), cuts=st.lists(st.integers(0, 4_000), max_size=10))
@FUZZ
def test_pipelined_requests_cut_anywhere_are_answered_in_order(
    server: ServerProcess, fds_before: int, requests: list[tuple[bytes, bool, int]], cuts: list[int]
) -> None:
    data = b"".join(raw for raw, _, _ in requests)
    answers = _answers(_send_in_pieces(server.http_port, data, cuts), [head for _, head, _ in requests])
    assert [status for status, _ in answers] == [status for _, _, status in requests]
    _still_healthy(server)


def test_the_fuzzed_server_holds_no_connection_afterwards(server: ServerProcess, fds_before: int) -> None:
    """After both properties (same module server): every connection they opened is gone."""
    deadline = time.monotonic() + 10
    while open_fds(server.pid) > fds_before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert open_fds(server.pid) <= fds_before + 2
    _still_healthy(server)


@given(
    requests=st.lists(_request(), min_size=1, max_size=8),
    where=st.integers(min_value=0),
    byte=st.integers(min_value=0, max_value=255),
    cuts=st.lists(st.integers(0, 4_000), max_size=10),
)
@FUZZ
def test_one_corrupted_byte_spoils_at_most_its_own_request(
    server: ServerProcess,
    fds_before: int,
    requests: list[tuple[bytes, bool, int]],
    where: int,
    byte: int,
    cuts: list[int],
) -> None:
    """A pipeline with one byte replaced: every request before the spoilt one is answered as it should
    be; the spoilt one gets some answer, and a refusal (neither 200 nor 404) is the last answer, with close."""
    data = bytearray(b"".join(raw for raw, _, _ in requests))
    where %= len(data)
    data[where] = byte
    spoilt = next(i for i, end in enumerate(_ends(requests)) if where < end)
    heads: list[bool | None] = [head for _, head, _ in requests[:spoilt]]
    answers = _answers(_send_in_pieces(server.http_port, bytes(data), cuts), heads)
    expected = [status for _, _, status in requests]
    assert [status for status, _ in answers[:spoilt]] == expected[: min(spoilt, len(answers))]
    assert len(answers) >= spoilt, (bytes(data), answers)
    for index, (status, fields) in enumerate(answers):
        assert status in STATUSES
        if status not in (200, 404):
            assert index == len(answers) - 1 and fields.get("connection") == "close", answers
    _still_healthy(server)


def _ends(requests: list[tuple[bytes, bool, int]]) -> list[int]:
    ends, total = [], 0
    for raw, _, _ in requests:
        total += len(raw)
        ends.append(total)
    return ends
