"""How long the cluster-autoscaler waits on its cloud provider, read off the wire.

The upstream example server has no metrics, and the CA times none of its provider calls, so the one
measure that treats both servers alike is the loopback traffic between them. ``tcpdump`` records the
IP and TCP headers of every packet to and from the server's port (never the payload); the CA's calls
are strictly sequential on its one connection, so the traffic alternates: the CA sends a request,
the server answers, the CA works, the CA sends the next request. For each such exchange the wait is
from the last packet of the request to the last packet of the answer. A packet the CA sends that
needs no answer (an HTTP/2 window update, a ping) is followed by the server's next answer only
because the CA's next request comes first, and the later request's own packet is then the last one
before the answer, so such packets never add the CA's own work to a wait. Packets without payload
(TCP's bare acknowledgements) are skipped.

The sum of the waits of the exchanges that end inside a CA loop, over that loop's duration, is the
share of the loop the CA spent waiting on the provider; the rest is its own work and the Kubernetes
API server's answers.
"""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Link-layer header lengths by pcap link type: Ethernet (Linux loopback), Linux cooked v1 and v2.
_LINK_HEADER = {1: 14, 113: 16, 276: 20}
_SNAP_LENGTH = 128  # IP + TCP headers with options and the first HTTP/2 frame headers
_BLOCK_TIMEOUT = 1.5


class CaptureUnavailable(RuntimeError):
    """tcpdump is missing or cannot capture here; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One call: the seconds the client waited for the server, and when the answer's last packet left."""

    wait: float
    answer_end: float  # wall-clock time


class WireCapture:
    """``tcpdump`` on the loopback interface for one TCP port, written to ``path`` until ``stop``."""

    def __init__(self, port: int, path: Path, interface: str = "lo") -> None:
        self.port = port
        self.path = path
        self.interface = interface
        self._process: subprocess.Popen[bytes] | None = None
        self._log = path.with_suffix(".log")

    @staticmethod
    def program() -> str:
        found = shutil.which("tcpdump")
        if found is None:
            raise CaptureUnavailable(
                "make bench-ca times the CA's provider calls on the wire with tcpdump, which is not on PATH: "
                "install it (Debian: apt-get install -y tcpdump) or pass --no-wire to leave that column out"
            )
        return found

    def start(self) -> WireCapture:
        argv = [self.program(), "-i", self.interface, "-n", "-s", str(_SNAP_LENGTH), "-B", "16384"]
        argv += ["-w", str(self.path), f"tcp port {self.port}"]
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        # tcpdump says "listening on ..." once it captures; a missing permission ends it at once.
        deadline = time.monotonic() + 10
        while b"listening on" not in self._log.read_bytes():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise CaptureUnavailable(f"tcpdump did not start: {self._log.read_text(errors='replace').strip()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # The kernel hands captured packets over in blocks, a partly filled one after libpcap's 1 s
        # timeout; packets in a block not handed over yet when tcpdump stops are lost.
        time.sleep(_BLOCK_TIMEOUT)
        process.send_signal(signal.SIGINT)  # tcpdump writes out its file on SIGINT
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def exchanges(self) -> list[Exchange]:
        return exchanges(read_packets(self.path), self.port)


# (time, source port, destination port, TCP payload bytes, HTTP/2 frames seen: HEADERS | DATA bits)
Packet = tuple[float, int, int, int, int]
HEADERS_SEEN, DATA_SEEN = 1, 2


def read_packets(path: Path) -> list[Packet]:
    """Every TCP packet of a pcap file, with the HTTP/2 HEADERS and DATA frames that start in what was
    captured of it (read frame by frame from the start of its payload)."""
    data = path.read_bytes()
    if not data:
        return []  # tcpdump stopped before it wrote its header
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise ValueError(f"{path} is not a pcap file")
    if len(data) < 24:
        return []
    fraction = 1e-9 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1e-6
    link = struct.unpack_from(endian + "I", data, 20)[0]
    if link not in _LINK_HEADER:
        raise ValueError(f"{path}: link type {link} is not one this reader knows")
    skip = _LINK_HEADER[link]
    record = struct.Struct(endian + "IIII")
    packets: list[Packet] = []
    offset = 24
    while offset + 16 <= len(data):
        seconds, fractional, captured, _ = record.unpack_from(data, offset)
        start = offset + 16 + skip
        end = offset + 16 + captured
        offset = end
        version = data[start] >> 4 if start < len(data) else 0
        if version == 4:
            header = (data[start] & 0x0F) * 4
            total = struct.unpack_from(">H", data, start + 2)[0]
            if data[start + 9] != 6:
                continue
            tcp = start + header
            ip_payload = total - header
        elif version == 6:
            if data[start + 6] != 6:  # no extension headers on loopback TCP
                continue
            tcp = start + 40
            ip_payload = struct.unpack_from(">H", data, start + 4)[0]
        else:
            continue
        source, destination = struct.unpack_from(">HH", data, tcp)
        tcp_header = (data[tcp + 12] >> 4) * 4
        frames = _call_frames(data[tcp + tcp_header : end])
        packets.append((seconds + fractional * fraction, source, destination, ip_payload - tcp_header, frames))
    return packets


def _call_frames(seen: bytes) -> int:
    """HEADERS_SEEN | DATA_SEEN for the frames of those types that start in ``seen``."""
    found = offset = 0
    while offset + 9 <= len(seen):
        kind = seen[offset + 3]
        found |= HEADERS_SEEN if kind == 1 else DATA_SEEN if kind == 0 else 0
        offset += 9 + int.from_bytes(seen[offset : offset + 3], "big")
    return found


def exchanges(packets: list[Packet], server_port: int) -> list[Exchange]:
    """The calls to the server on ``server_port``, connection by connection, in the order they ended.

    A burst from a client without a HEADERS or DATA frame is HTTP/2 control traffic (a ping, a window
    update, a settings acknowledgement), never a call: gRPC's transport sends its pings on its own
    while the caller goes on, so the loop does not wait for their answers.
    """
    connections: dict[int, list[Packet]] = {}
    for packet in packets:
        client = packet[1] if packet[2] == server_port else packet[2]
        connections.setdefault(client, []).append(packet)
    found = [e for connection in connections.values() for e in _calls(connection, server_port)]
    return sorted(found, key=lambda e: e.answer_end)


def _calls(packets: list[Packet], server_port: int) -> list[Exchange]:
    """The calls of one connection, whose calls follow one another.

    A burst from the client that opens a stream (HEADERS) starts a call; one with DATA only is the rest
    of the call before it (gRPC may send a request's HEADERS and DATA in two writes, and an answer to
    a ping can fall in between), and its wait is added to that call's.
    """
    found: list[Exchange] = []
    request_end: float | None = None
    frames = 0
    answer_end: float | None = None

    def close() -> None:
        if answer_end is None or request_end is None:
            return
        wait = answer_end - request_end
        if frames & HEADERS_SEEN:
            found.append(Exchange(wait, answer_end))
        elif frames & DATA_SEEN and found:
            found[-1] = Exchange(found[-1].wait + wait, answer_end)

    for at, _, destination, payload, seen in sorted(packets):
        if payload <= 0:
            continue
        if destination == server_port:  # from the client
            if answer_end is not None:
                close()
                answer_end, frames = None, 0
            request_end = at
            frames |= seen
        elif request_end is not None:
            answer_end = at
    close()
    return found


def wait_in(found: list[Exchange], start: float, end: float) -> tuple[float, int]:
    """(seconds waited, exchanges) for the exchanges whose answer ended inside [start, end]."""
    inside = [e for e in found if start <= e.answer_end <= end]
    return sum(e.wait for e in inside), len(inside)
