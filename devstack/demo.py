"""The demo ``make run`` starts: the real server in front of both cloud simulators, on a wall clock.

Both simulators start with their demo scenario (several autoscaling pools, some with running nodes,
one at size 0, all below max), so a scale-up requested with grpcurl or a real CA completes within a
minute of real time. Three backends: Scaleway's private mode and Bizfly on those pools, and Scaleway's
public (self-managed) mode on a second Kapsule cluster of the same simulator, whose pools have
Kapsule autoscaling off (``demo_public_cluster``). No credentials or cloud account are involved: the
simulators accept the fixed demo credentials written into the generated configuration, which is also
written to a file while the demo runs, so ``validate --online`` can be tried on it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.harness import InProcessServer, server_config, write_config
from server.app import RunningServer
from simulators.bizfly import BizflySimulator
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import WallClock
from simulators.scaleway import ScalewaySimulator, demo_public_cluster
from simulators.scaleway import demo_scenario as scaleway_demo

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
# Re-read each cloud every 10 s (at least 2 s apart), so a change shows up quickly in the demo.
DEMO_SYNC = {"interval": "10s", "min_interval": "2s"}
CLI = ".venv/bin/ca-externalgrpc"
# The public-mode backend's groups: the pools of demo_public_cluster with Kapsule autoscaling off, and their bounds
# (its `managed` pool, autoscaling on, is Kapsule's and named nowhere).
PUBLIC_POOLS = {"web": {"min_size": 1, "max_size": 4}, "jobs": {"min_size": 0, "max_size": 3}}


@dataclass
class Demo:
    server: InProcessServer
    scaleway: ScalewaySimulator
    bizfly: BizflySimulator
    config_path: Path  # the generated config, in a directory of its own removed at stop

    @property
    def running(self) -> RunningServer:
        return self.server.running

    def stop(self) -> None:
        self.server.stop(grace=self.running.config.shutdown_grace)
        self.scaleway.stop()
        self.bizfly.stop()
        shutil.rmtree(self.config_path.parent, ignore_errors=True)


def demo_config(
    listen: str, http_listen: str | None, scaleway: ScalewaySimulator, bizfly: BizflySimulator, public_cluster: str
) -> dict[str, Any]:
    public = {"cluster_id": public_cluster, "mode": "public", "pools": PUBLIC_POOLS}
    backends = [  # a copy of DEMO_SYNC each, so the written file has no YAML aliases
        scaleway_backend(scaleway, "scaleway-demo", sync=dict(DEMO_SYNC)),
        bizfly_backend(bizfly, "bizfly-demo", sync=dict(DEMO_SYNC)),
        scaleway_backend(scaleway, "scaleway-public-demo", settings=public, sync=dict(DEMO_SYNC)),
    ]
    return server_config(backends, listen=listen, http_listen=http_listen or None, shutdown_grace="5s")


def start_demo(listen: str, http_listen: str | None, speed: float = 1.0) -> Demo:
    """Start both simulators on a shared wall clock, then the server pointed at them."""
    clock = WallClock(speed=speed)
    scenario, public = scaleway_demo(), demo_public_cluster()
    scenario["clusters"].append(public)
    scaleway = ScalewaySimulator(scenario=scenario, clock=clock).start()
    bizfly = BizflySimulator(scenario=bizfly_demo(), clock=clock)
    workdir = Path(tempfile.mkdtemp(prefix="ca-externalgrpc-demo-"))
    try:
        bizfly.start()
        raw = demo_config(listen, http_listen, scaleway, bizfly, public["id"])
        # The config is generated: environment variables must not redirect it to a real cloud.
        server = InProcessServer(raw, env={})
        # The same config with the ports the server got, for `validate --online` (listen 0 is fine to serve,
        # but the file should say where this demo is).
        served = {**raw, "listen": server.address}
        if server.running.http is not None:
            served["http_listen"] = f"127.0.0.1:{server.http_port}"
        config_path = write_config(workdir / "config.yaml", served)
    except BaseException:
        scaleway.stop()
        bizfly.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Demo(server, scaleway, bizfly, config_path)


def example_group(running: RunningServer) -> str | None:
    """The group with the most machines: TargetSize and Nodes print something worth reading for it."""
    groups = [group for _, group in running.registry.all_groups()]
    if not groups:
        return None
    return max(groups, key=lambda g: (len(g.instances), g.target_size)).id


def grpcurl_command() -> str | None:
    """``grpcurl`` when it is on PATH, else the one ``make build`` made (its full path), else None."""
    if shutil.which("grpcurl") is not None:
        return "grpcurl"
    from tests.support.gobuild import bin_dir  # the one place that knows where make build puts it

    built = bin_dir() / "grpcurl"
    return shlex.quote(str(built)) if built.is_file() and os.access(built, os.X_OK) else None


def banner(demo: Demo) -> str:
    running = demo.running
    address = running.address
    http = running.http_address
    groups = [g.id for _, g in running.registry.all_groups()]
    lines = [
        f"ca-externalgrpc demo: gRPC on {address} (plaintext), "
        + (f"probes and /metrics on http://{http}" if http else "no HTTP endpoint"),
        f"  simulated Scaleway API: {demo.scaleway.url}",
        f"  simulated Bizfly API:   {demo.bizfly.url}",
        "  backends: scaleway-demo (private mode: the pools with Kapsule autoscaling on), bizfly-demo, "
        f"scaleway-public-demo (public mode: pools {', '.join(PUBLIC_POOLS)}, Kapsule autoscaling off)",
        f"  node groups: {', '.join(groups) if groups else '(none yet: first sync pending)'}",
        f"  config: {demo.config_path}",
        "Try, from the repository root in another terminal:",
        f"  {CLI} status --address {address}",
        f"  {CLI} validate --online --config {shlex.quote(str(demo.config_path))}",
    ]
    example = example_group(running)
    grpcurl = grpcurl_command()
    if grpcurl is None:
        lines.append(
            "  (grpcurl is not on PATH and make build has not built it: run make build, or install it as the "
            "README says)"
        )
    else:
        lines.append(f"  {grpcurl} -plaintext {address} {SERVICE}/NodeGroups")
        if example is not None:
            request = f'\'{{"id": "{example}"}}\''
            lines.append(f"  {grpcurl} -plaintext -d {request} {address} {SERVICE}/NodeGroupNodes")
    if http and shutil.which("curl") is not None:
        lines.append(f"  curl -s http://{http}/readyz")
    lines.append("Stop with Ctrl-C.")
    return "\n".join(lines)
