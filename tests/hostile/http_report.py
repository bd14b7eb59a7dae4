"""The documented measurement of docs/evidence/hostile-clients.md, "Probe and metrics port": a server process in
front of the Scaleway simulator, then ``--connections`` connections to its probe/metrics port that
each send half a request line (or nothing, ``--idle``) and stay open. Prints the process's threads,
RSS and fds before and during the flood, and the median latency of ``/healthz``, ``/metrics`` and a
NodeGroups RPC during it.

    .venv/bin/python -m tests.hostile.http_report --connections 1000
    CA_EXTERNALGRPC_TEST_ENGINE=grpcio .venv/bin/python -m tests.hostile.http_report --connections 1000
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
import urllib.request
from pathlib import Path

from devstack.clouds import scaleway_backend
from devstack.harness import ENGINE_ENV, ServerProcess, server_config
from protos import externalgrpc_pb2 as pb
from simulators.common import ManualClock
from simulators.scaleway import ScalewaySimulator, demo_scenario
from tests.hostile.http_clients import HALF_REQUEST_LINE, Flood
from tests.hostile.measure import median_latency, settled_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--idle", action="store_true", help="connect and send nothing")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds to wait after opening the flood")
    args = parser.parse_args()
    payload = b"" if args.idle else HALF_REQUEST_LINE
    with ScalewaySimulator(scenario=demo_scenario(), clock=ManualClock()) as sim:
        server = ServerProcess(server_config([scaleway_backend(sim)]), workdir=Path(tempfile.mkdtemp()))
        try:
            base = f"http://{server.http_address}"

            def get(path: str) -> None:
                with urllib.request.urlopen(base + path, timeout=30) as answer:
                    answer.read()

            def rpc() -> None:
                server.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=30)

            rpc()
            before = settled_usage(server.pid)
            print(
                f"engine {os.environ.get(ENGINE_ENV) or 'native'}; {args.connections} connections sending {payload!r}"
            )
            print(f"before:  {before}")
            started = time.monotonic()
            with Flood(server.http_port, args.connections, payload, budget=120.0) as flood:
                opened = time.monotonic() - started
                time.sleep(args.hold)
                during = settled_usage(server.pid)
                figures = {path: median_latency(functools.partial(get, path)) for path in ("/healthz", "/metrics")}
                figures["NodeGroups RPC"] = median_latency(rpc)
                closed = flood.closed_by_server()
                print(f"flood:   {flood.connected} connected in {opened:.1f}s; {closed} closed by the server")
                print(f"during:  {during}")
                for what, seconds in figures.items():
                    print(f"         {what} median {seconds * 1000:.1f} ms")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
