"""How much of the time a leader holds its Lease when every call to the API server is slow.

    .venv/bin/python -m tests.kube.lease_hold [--delays 2.2 3 4.5] [--seconds 70]

Starts the e2e suite's etcd and kube-apiserver (``make build`` with the e2e group), then, for each delay, one
elector (server/kube/leader.py, the shipped timings: lease 15 s, renew deadline 10 s, retry 2 s, request
timeout 5 s) reaching the API server through ``HttpsProxy``, which holds every request that long before
forwarding it. Once the elector leads, the delay is switched on and ``Leadership.holds()`` (what the write
gate and ``ca_externalgrpc_leader`` read) is sampled every 50 ms. Prints one row per delay: the share of
the time held, the step-downs, and the Lease writes that reached the API server.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

from server.kube.client import KubeConnection
from server.kube.leader import LeaderElector, Leadership
from server.kube.settings import LeaderElectionConfig
from tests.e2e.conftest import resolve_programs
from tests.e2e.control_plane import ControlPlane
from tests.kube.proxy import HttpsProxy


def measure(plane: ControlPlane, workdir: Path, index: int, delay: float, seconds: float) -> tuple[float, int, int]:
    admin = config.new_client_from_config(config_file=str(plane.kubeconfig))
    namespace = f"lease-hold-{index}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    proxy = HttpsProxy.for_kubeconfig(plane.kubeconfig, plane.pki.ca_key, workdir / f"proxy-{index}").start()
    api = config.new_client_from_config(config_file=str(proxy.kubeconfig()))
    role = Leadership(LeaderElectionConfig(enabled=True), identity="measured")
    losses: list[float] = []
    elector = LeaderElector(
        KubeConnection(api, namespace, identity="measured", request_timeout=5.0),
        namespace,
        role,
        request_timeout=5.0,
        on_started=lambda term: None,
        on_stopped=lambda: losses.append(time.monotonic()),
    )
    try:
        elector.start()
        until = time.monotonic() + 20
        while not role.holds():
            if time.monotonic() > until:
                raise SystemExit("the elector did not lead within 20 s")
            time.sleep(0.05)
        proxy.set(delay=delay)
        writes_before = len(proxy.log("PUT"))
        held = samples = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            held += role.holds()
            samples += 1
            time.sleep(0.05)
        writes = len([r for r in proxy.log("PUT")[writes_before:] if r.status == 200])
        return held / samples, len(losses), writes
    finally:
        elector.stop()
        proxy.stop()
        api.close()
        admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[2.2, 3.0, 4.5])
    parser.add_argument("--seconds", type=float, default=70.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lease-hold-"))
    plane = ControlPlane(resolve_programs().control_plane, workdir, scheduler=False).start()
    try:
        print(f"| s per API call | Lease held | step-downs in {args.seconds:g} s | Lease writes |")
        print("|---|---|---|---|")
        for index, delay in enumerate(args.delays):
            share, losses, writes = measure(plane, workdir, index, delay, args.seconds)
            print(f"| {delay:g} | {share:.0%} | {losses} | {writes} |", flush=True)
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
