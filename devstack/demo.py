"""The demo ``make run`` starts: the real server in front of both cloud simulators, on a wall clock.

Both simulators start with their demo scenario (several autoscaling pools, some with running nodes,
one at size 0, all below max), so a scale-up requested with grpcurl or a real CA completes within a
minute of real time. No credentials or cloud account are involved: the simulators accept the fixed
demo credentials written into the generated configuration.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass

from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.harness import InProcessServer, server_config
from server.app import RunningServer
from simulators.bizfly import BizflySimulator
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import WallClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway import demo_scenario as scaleway_demo

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
# Re-read each cloud every 10 s (at least 2 s apart), so a change shows up quickly in the demo.
DEMO_SYNC = {"interval": "10s", "min_interval": "2s"}
CLI = ".venv/bin/ca-externalgrpc"


@dataclass
class Demo:
    server: InProcessServer
    scaleway: ScalewaySimulator
    bizfly: BizflySimulator

    @property
    def running(self) -> RunningServer:
        return self.server.running

    def stop(self) -> None:
        self.server.stop(grace=self.running.config.shutdown_grace)
        self.scaleway.stop()
        self.bizfly.stop()


def demo_config(
    listen: str, http_listen: str | None, scaleway: ScalewaySimulator, bizfly: BizflySimulator
) -> dict[str, object]:
    backends = [
        scaleway_backend(scaleway, "scaleway-demo", sync=DEMO_SYNC),
        bizfly_backend(bizfly, "bizfly-demo", sync=DEMO_SYNC),
    ]
    return server_config(backends, listen=listen, http_listen=http_listen or None, shutdown_grace="5s")


def start_demo(listen: str, http_listen: str | None, speed: float = 1.0) -> Demo:
    """Start both simulators on a shared wall clock, then the server pointed at them."""
    clock = WallClock(speed=speed)
    scaleway = ScalewaySimulator(scenario=scaleway_demo(), clock=clock).start()
    bizfly = BizflySimulator(scenario=bizfly_demo(), clock=clock)
    try:
        bizfly.start()
        # The config is generated: environment variables must not redirect it to a real cloud.
        server = InProcessServer(demo_config(listen, http_listen, scaleway, bizfly), env={})
    except BaseException:
        scaleway.stop()
        bizfly.stop()
        raise
    return Demo(server, scaleway, bizfly)


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
        f"  node groups: {', '.join(groups) if groups else '(none yet: first sync pending)'}",
        "Try, from the repository root in another terminal:",
        f"  {CLI} status --address {address}",
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
