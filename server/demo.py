"""``ca-externalgrpc demo`` / ``make run``: the real server against the bundled cloud simulators.

Both simulators start with their demo scenario (several autoscaling pools, some with running nodes,
one at size 0, all below max) on a wall clock, so a scale-up requested with grpcurl or a real CA
completes within a minute of real time. No credentials or cloud account are involved: the simulators
accept the fixed demo credentials written into the generated configuration.
"""

from __future__ import annotations

from typing import Any

from server import app
from server.app import RunningServer
from server.config import parse
from simulators.bizfly import DEFAULT_USERS, BizflySimulator
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import WallClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway import demo_scenario as scaleway_demo

Simulators = dict[str, Any]


def demo_config(listen: str, http_listen: str | None, scw: ScalewaySimulator, bz: BizflySimulator) -> dict[str, Any]:
    email, password = next(iter(DEFAULT_USERS.items()))
    return {
        "listen": listen,
        "http_listen": http_listen or None,
        "shutdown_grace": "5s",
        "backends": [
            {
                "name": "scaleway-demo",
                "type": "scaleway",
                "scaleway": {
                    "cluster_id": scw.cluster_id,
                    "region": scw.region,
                    "api_url": scw.url,
                    "secret_key": scw.secret_key,
                },
                "sync": {"interval": "10s", "min_interval": "2s"},
            },
            {
                "name": "bizfly-demo",
                "type": "bizfly",
                "bizfly": {
                    "auth_method": "password",
                    "email": email,
                    "password": password,
                    "region": "HN",
                    "api_url": bz.url,
                    "token_url": bz.token_url,
                    "cluster_name": str(bz.snapshot()["clusters"][0]["uid"]),
                },
                "sync": {"interval": "10s", "min_interval": "2s"},
            },
        ],
    }


def start_demo(listen: str, http_listen: str | None, speed: float = 1.0) -> tuple[RunningServer, Simulators]:
    """Start both simulators on a shared wall clock, then the server pointed at them."""
    clock = WallClock(speed=speed)
    scw = ScalewaySimulator(scenario=scaleway_demo(), clock=clock)
    bz = BizflySimulator(scenario=bizfly_demo(), clock=clock)
    sims: Simulators = {"scaleway": scw, "bizfly": bz}
    scw.start()
    bz.start()
    try:
        # The demo config is generated, so environment variables must not redirect it to a real cloud.
        running = app.start(parse(demo_config(listen, http_listen, scw, bz), env={}))
    except BaseException:
        scw.stop()
        bz.stop()
        raise
    return running, sims


def banner(running: RunningServer, sims: Simulators) -> str:
    groups = [g.id for _, g in running.registry.all_groups()]
    http = running.config.http_listen
    lines = [
        f"ca-externalgrpc demo: gRPC on {running.address} (plaintext), "
        + (f"probes and /metrics on http://{http[0]}:{http[1]}" if http else "no HTTP endpoint"),
        f"  simulated Scaleway API: {sims['scaleway'].url}",
        f"  simulated Bizfly API:   {sims['bizfly'].url}",
        f"  node groups: {', '.join(groups) if groups else '(none yet: first sync pending)'}",
        f"  try: grpcurl -plaintext {running.address} list",
        f"       grpcurl -plaintext {running.address} "
        "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroups",
        f"       ca-externalgrpc status --address {running.address}",
        "Stop with Ctrl-C.",
    ]
    return "\n".join(lines)
