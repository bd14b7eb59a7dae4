"""Pure-logic checks of make bench-ca's bookkeeping: the wire timing, the CA's loops, the windows."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.bench import ca_run, wire
from tests.bench.ca_sampler import CaSampler, Loop, Sample, Sampling, parse_ca_metrics
from tests.bench.workload import BUSY_SHARE, LIGHT_SHARE, NodeSlot, plan

SERVER, CA = 8086, 40000


def _frame(kind: int, length: int) -> bytes:
    return length.to_bytes(3, "big") + bytes([kind, 0]) + b"\0\0\0\1" + b"x" * length


HEADERS = _frame(1, 12)
DATA = _frame(0, 20)
PING = _frame(6, 8)


def _pcap(path: Path, packets: list[tuple[float, int, int, bytes]]) -> Path:
    """A pcap file (Ethernet, IPv4, TCP) holding ``(time, source port, destination port, payload)``."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for at, source, destination, payload in packets:
        tcp = struct.pack(">HHIIBBHHH", source, destination, 0, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, b"\x7f\0\0\1", b"\x7f\0\0\1")
        frame = b"\0" * 12 + b"\x08\x00" + ip + tcp
        seconds = int(at)
        out.append(struct.pack("<IIII", seconds, round((at - seconds) * 1e6), len(frame), len(frame)) + frame)
    path.write_bytes(b"".join(out))
    return path


def test_calls_are_timed_from_the_last_request_packet_to_the_last_answer_packet(tmp_path: Path) -> None:
    packets = [
        (10.000, CA, SERVER, HEADERS + DATA),  # call 1: one packet, answered in two
        (10.001, SERVER, CA, HEADERS + DATA),
        (10.002, SERVER, CA, HEADERS),
        (10.0021, CA, SERVER, PING),  # the transport's ping and its answer: no call
        (10.0022, SERVER, CA, PING),
        (10.010, CA, SERVER, HEADERS),  # call 2: HEADERS and DATA apart, an answer to a ping between
        (10.0101, SERVER, CA, PING),
        (10.011, CA, SERVER, DATA),
        (10.014, SERVER, CA, HEADERS + DATA + HEADERS),
        (10.020, CA, SERVER, b""),  # a bare acknowledgement is no packet of a call
        (10.030, CA + 1, SERVER, HEADERS + DATA),  # another connection: its own calls
        (10.035, SERVER, CA + 1, HEADERS + DATA),
    ]
    found = wire.exchanges(wire.read_packets(_pcap(tmp_path / "c.pcap", packets)), SERVER)
    assert [round(e.wait, 4) for e in found] == [0.002, 0.0001 + 0.003, 0.005]
    assert [e.answer_end for e in found] == pytest.approx([10.002, 10.014, 10.035])
    assert wire.wait_in(found, 10.0, 10.02) == (pytest.approx(0.0051), 2)


def test_a_pcap_of_another_kind_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"not a capture at all")
    with pytest.raises(ValueError, match="not a pcap"):
        wire.read_packets(tmp_path / "x")


def test_the_ca_metrics_give_each_loop_its_duration_and_functions(tmp_path: Path) -> None:
    def metrics(main: tuple[float, int], refresh: float, errors: float = 0.0) -> bytes:
        lines = [
            f'cluster_autoscaler_function_duration_seconds_sum{{function="main"}} {main[0]}',
            f'cluster_autoscaler_function_duration_seconds_count{{function="main"}} {main[1]}',
            f'cluster_autoscaler_function_duration_seconds_sum{{function="cloudProviderRefresh"}} {refresh}',
            f'cluster_autoscaler_function_duration_seconds_count{{function="cloudProviderRefresh"}} {main[1]}',
            f'cluster_autoscaler_errors_total{{type="cloudProviderError"}} {errors}',
            'cluster_autoscaler_function_duration_seconds_bucket{function="main",le="0.1"} 0',
        ]
        return "\n".join(lines).encode()

    parsed = parse_ca_metrics(metrics((3.5, 2), 0.25, 1.0))
    assert (parsed.sums["main"], parsed.counts["main"], parsed.errors) == (3.5, 2, 1.0)

    log = tmp_path / "ca.log"
    starts = [100.0, 112.5, 125.0]
    log.write_text("".join(json.dumps({"ts": t * 1000, "msg": "Starting main loop"}) + "\n" for t in starts))
    sampler = CaSampler("http://unused", log, {})
    sampler._read_log()
    for at, scrape in (
        (101.0, metrics((1.0, 1), 0.1)),
        (112.6, metrics((1.0, 1), 0.15)),  # loop 2 under way: its Refresh is counted already
        (115.0, metrics((3.5, 2), 0.3)),
    ):
        sampler._account(parse_ca_metrics(scrape), at)
    [loop] = sampler.sampling.loops
    assert (loop.index, loop.duration_s, loop.start, loop.end) == (2, 2.5, 112.5, 115.0)
    assert loop.functions["cloudProviderRefresh"] == pytest.approx(0.2)


def _sampling(cpu_per_second_idle: float, cpu_per_loop: float) -> Sampling:
    """Loops of 2 s every 12 s from t=0, CPU sampled every 0.5 s: idle at one rate, loops at another."""
    sampling = Sampling()
    for index in range(1, 7):
        start = (index - 1) * 12.0
        sampling.loops.append(Loop(index, 2.0, start + 2.0, {"cloudProviderRefresh": 0.01}, start))
    cpu = 0.0
    for step in range(0, 6 * 24 + 1):
        at = step * 0.5
        sampling.samples.append(Sample(at, {"server": cpu, "ca": at / 2}))
        in_loop = (at % 12.0) < 2.0
        cpu += cpu_per_loop / 4 if in_loop else cpu_per_second_idle * 0.5
        sampling.load.append((at, 1.5))
        sampling.errors_at.append((at, 0.0))
    return sampling


def test_a_phase_counts_cpu_per_loop_over_its_window_and_idle_cpu_between_loops() -> None:
    args = ca_run.parse_args(["--loops", "3", "--warmup", "1"])
    phase = ca_run.summarize_phase("ours", 0, _sampling(0.002, 0.3), args, None, [], {"peak_rss_mib": 50.0}, 0.1)
    assert [loop["index"] for loop in phase["loops"]] == [2, 3, 4]
    assert phase["window"] == [2.0, 38.0]  # end of the warm-up loop to the end of the last measured one
    # every loop's 0.3 s plus 10 s of idle at 2 millicores between loops
    assert phase["cpu_s"]["server"] == pytest.approx(3 * 0.3 + 30 * 0.002, abs=0.01)
    assert phase["idle_cpu_s"] / phase["idle_time_s"] == pytest.approx(0.002, rel=0.05)
    summary = ca_run.summarize_server([phase, phase])
    assert summary["loops"] == 6
    assert summary["main_median_s"] == 2.0 and summary["refresh_median_s"] == 0.01
    assert summary["idle_millicores"] == pytest.approx(2.0, rel=0.05)
    assert summary["server_cpu_per_loop_s"] == pytest.approx(0.32, abs=0.01)


def test_a_phase_whose_ca_counted_errors_is_invalid() -> None:
    sampling = _sampling(0.0, 0.1)
    sampling.errors_at = [(at, 0.0 if at < 20 else 1.0) for at, _ in sampling.errors_at]
    args = ca_run.parse_args(["--loops", "3", "--warmup", "1"])
    with pytest.raises(ca_run.InvalidBench, match="errors"):
        ca_run.summarize_phase("ours", 0, sampling, args, None, [], {"peak_rss_mib": 50.0}, 0.0)


def test_nodes_of_a_group_take_a_busy_pod_a_light_one_or_none_in_turn() -> None:
    nodes = [NodeSlot(f"n{i}", 4, in_group=True) for i in range(6)] + [NodeSlot("fixed", 2, in_group=False)]
    pods = plan(nodes)
    busy, light = int(4000 * BUSY_SHARE), int(4000 * LIGHT_SHARE)
    assert pods == [("n0", busy), ("n1", light), ("n3", busy), ("n4", light), ("fixed", int(2000 * BUSY_SHARE))]
