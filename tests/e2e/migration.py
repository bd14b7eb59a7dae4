"""The migration scenario's cluster: one cloud run by the CA's in-tree provider, then by our server, then back.

``MigrationEnvironment`` is an ``E2EEnvironment`` whose autoscaling side changes hands while the cluster
(simulated cloud, control plane, node agent, Nodes and pods) keeps running:

- ``in_tree``: the CA 1.36.1 built with its in-tree providers (``cluster-autoscaler-1.36.1-intree``),
  ``--cloud-provider=scaleway`` or ``bizflycloud``, configured as those providers are, by variables:
  Scaleway's ``CLUSTER_ID``/``SCW_*`` with ``SCW_API_URL`` at the simulator; Bizfly's ``BIZFLYCLOUD_*``
  and ``CLUSTER_NAME`` and nothing that points anywhere, so its client logs in at the production host,
  which ``InterceptingProxy`` answers for the simulator (``HTTPS_PROXY`` and ``SSL_CERT_FILE``);
- ``ours``: ``ca-externalgrpc config from-in-tree`` run on those same variables (and Scaleway's
  cloud-config file), our server started on the config it printed (on loopback port 0 and with the
  suite's 2 s sync interval), with the same variables (the Secret a real cluster keeps), and the CA
  1.36.1 built with externalgrpc pointed at it.

Each hand-over stops the CA first (SIGTERM: it deletes its status ConfigMap on the way out), so the
status ConfigMap read afterwards is the new CA's own (``E2EEnvironment.status`` reads only the running
CA's). ``quiet_window`` checks the first loops after a switch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes
import pytest
import yaml

from devstack.clouds import bizfly_in_tree_env, scaleway_in_tree_env
from devstack.harness import REPO_ROOT, SCW_SECRET, child_env
from simulators.bizfly import BizflySimulator
from simulators.common.request_log import RecordedRequest
from simulators.scaleway import ScalewaySimulator
from tests.e2e.autoscaler import Autoscaler, LogEntry, write_cloud_config
from tests.e2e.control_plane import ControlPlane
from tests.e2e.environment import BACKEND_SYNC, AutoscalerPrograms, E2EEnvironment, GroupStatus, Layout, OurServer
from tests.e2e.node_agent import NodeAgent, bizfly_source, scaleway_source
from tests.support.gobuild import GoBuildError, binary_path
from tests.support.https_intercept import BIZFLY_PRODUCTION_HOST, InterceptingProxy

IN_TREE_CA = "cluster-autoscaler-1.36.1-intree"
IN_TREE_PROVIDER = {"scaleway": "scaleway", "bizfly": "bizflycloud"}
# The in-tree Scaleway provider re-lists the cloud only when ListPools' Cache-Control max-age has passed
# (60 s without the header; what Kapsule sends is not documented). Every 4 s keeps its view as fresh as
# a couple of CA loops, so a phase settles in seconds.
SCALEWAY_MAX_AGE_SECONDS = 4
#: routes that only read, or log in; every other request changes the cloud
NOT_WRITES = {"token"}


def in_tree_program() -> Path:
    """The in-tree CA ``make build`` produced; one line naming what is missing and how to build it."""
    missing = ""
    try:
        return binary_path(IN_TREE_CA)
    except GoBuildError as err:
        missing = str(err)
    pytest.fail(missing, pytrace=False)


@dataclass(frozen=True)
class QuietWindow:
    """What happened between a switch and the end of the new CA's first ``loops`` loops."""

    loops: int
    seconds: float
    writes: list[RecordedRequest]
    nodes_deleted: list[str]
    decisions: list[LogEntry]
    statuses: list[dict[str, GroupStatus]]  # every status write seen (polled twice a loop), oldest first


class MigrationEnvironment(E2EEnvironment):
    def __init__(
        self,
        programs: AutoscalerPrograms,
        in_tree_ca: Path,
        workdir: Path,
        cloud: str,
        layout: Layout,
        prepare: Callable[[E2EEnvironment], None] | None = None,
    ) -> None:
        super().__init__(programs, workdir, layout, prepare=prepare)
        self.cloud = cloud
        self.in_tree_ca = in_tree_ca
        self.proxy: InterceptingProxy | None = None
        self.phases = 0
        self.switched_at = 0.0
        self.converted: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scaleway = ScalewaySimulator(
            scenario=self.layout.scaleway_scenario(), clock=self.clock, secret_key=SCW_SECRET
        ).start()
        self.scaleway.set_behaviour(cache_max_age=SCALEWAY_MAX_AGE_SECONDS)
        self.bizfly = BizflySimulator(scenario=self.layout.bizfly_scenario(), clock=self.clock).start()
        bizfly = urlsplit(self.bizfly.url)
        assert bizfly.hostname is not None and bizfly.port is not None
        self.proxy = InterceptingProxy({BIZFLY_PRODUCTION_HOST: (bizfly.hostname, bizfly.port)}, self.workdir).start()
        self.control_plane = ControlPlane(self.programs.control_plane, self.workdir).start()
        self.api = kubernetes.config.new_client_from_config(str(self.control_plane.kubeconfig))
        self.agent = NodeAgent(self.api, [scaleway_source(self.scaleway.url), bizfly_source(self.bizfly.url)]).start()
        self.wait_for(self._machines_registered, 30, "the running machines registered as Ready nodes")
        if self.prepare is not None:
            self.prepare(self)
        self.start_in_tree()

    def stop(self) -> None:
        super().stop()
        if self.proxy is not None:
            self.proxy.stop()

    def check_running(self) -> None:
        assert self.control_plane is not None and self.agent is not None
        self.control_plane.check_running()
        self.ca.check_running()
        if self.server is not None:
            self.server.check_running()
        if not self.agent.alive():
            raise AssertionError("the node agent thread has stopped")

    # ------------------------------------------------------------------------------------- the two sides
    def in_tree_env(self) -> dict[str, str]:
        """The variables the cluster's CA Secret holds for the in-tree provider (and the proxy settings
        that make the production Bizfly host this machine's simulator)."""
        if self.cloud == "scaleway":
            return scaleway_in_tree_env(self.scw)
        assert self.proxy is not None
        return {**bizfly_in_tree_env(self.bz), **self.proxy.env()}

    def in_tree_cloud_config(self) -> Path | None:
        """Scaleway's cloud-config JSON as its README documents it (the 1.36.1 provider never opens it);
        the Bizfly provider takes none."""
        if self.cloud != "scaleway":
            return None
        path = self.workdir / "scaleway-cloud-config.json"
        path.write_text(json.dumps({"cluster_id": self.scw.cluster_id, "region": self.scw.region}))
        return path

    def _phase_dir(self, side: str) -> Path:
        self.phases += 1
        return self.workdir / f"phase{self.phases}-{side}"

    def start_in_tree(self) -> Autoscaler:
        assert self.control_plane is not None
        self.switched_at = time.time()
        self.autoscaler = Autoscaler(
            self.in_tree_ca,
            self.control_plane.kubeconfig,
            self.in_tree_cloud_config(),
            self._phase_dir("in-tree"),
            {"cloud-provider": IN_TREE_PROVIDER[self.cloud]},
            env=child_env(self.in_tree_env()),
        ).start()
        return self.autoscaler

    def from_in_tree(self) -> tuple[subprocess.CompletedProcess[str], Path]:
        """``ca-externalgrpc config from-in-tree`` on the in-tree provider's own settings."""
        output = self.workdir / "from-in-tree.yaml"
        argv = [sys.executable, "-m", "server.cli", "config", "from-in-tree"]
        argv += ["--cloud-provider", IN_TREE_PROVIDER[self.cloud], "--output", str(output)]
        cloud_config = self.in_tree_cloud_config()
        if cloud_config is not None:
            argv += ["--cloud-config", str(cloud_config)]
        done = subprocess.run(
            argv, env=child_env(self.in_tree_env()), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
        )
        return done, output

    def start_ours(self) -> OurServer:
        """Our server on the config ``from-in-tree`` printed, then the externalgrpc CA pointed at it."""
        assert self.control_plane is not None
        self.switched_at = time.time()
        done, output = self.from_in_tree()
        assert done.returncode == 0, f"from-in-tree failed:\n{done.stdout}{done.stderr}"
        self.converted = yaml.safe_load(output.read_text())
        # Served as printed, but with the suite's sync interval (every 2 s, like the in-tree providers'
        # refreshes here) instead of the layout's 30 s, and on loopback port 0 (OurServer).
        served = {**self.converted, "backends": [{**b, "sync": dict(BACKEND_SYNC)} for b in self.converted["backends"]]}
        directory = self._phase_dir("ours")
        self.server = OurServer(served, directory, env=self.in_tree_env())
        self.autoscaler = Autoscaler(
            self.programs.cluster_autoscaler,
            self.control_plane.kubeconfig,
            write_cloud_config(directory / "cloud-config.yaml", self.server.address),
            directory,
        ).start()
        return self.server

    def stop_autoscaling(self) -> None:
        """The CA stops (SIGTERM, as a rollout does), then our server if it ran."""
        self.ca.stop()
        if self.server is not None:
            self.server.stop()
            self.server = None

    # ------------------------------------------------------------------------------------- reads
    def cloud_writes(self, since: float) -> list[RecordedRequest]:
        """Every request that changes the cloud since ``since`` (any method but GET, logins aside)."""
        sim = self.scw if self.cloud == "scaleway" else self.bz
        return [r for r in sim.requests.filter() if r.at >= since and r.method != "GET" and r.route not in NOT_WRITES]

    def logins(self, since: float) -> list[tuple[str, str]]:
        """Bizfly logins the simulator answered since ``since``: (client, production host it was sent to)
        of each. Every one must have come through the interception proxy: the client asked for that host."""
        assert self.proxy is not None
        tunnelled = [r for r in self.proxy.relayed if r.at >= since and (r.method, r.path) == ("POST", "/api/token")]
        answered = [r for r in self.bz.requests.filter(route="token") if r.at >= since and r.status == 200]
        assert len(tunnelled) == len(answered), (tunnelled, answered)
        return [
            (str(r.headers.get("user-agent", "")).split(" ")[0], via.host)
            for r, via in zip(answered, tunnelled, strict=True)
        ]

    def quiet_window(self, loops: int, timeout: float = 120) -> QuietWindow:
        """Watch the new CA's first ``loops`` loops after a switch: writes, deletions, decisions, statuses."""
        assert self.agent is not None
        since = self.switched_at
        statuses: dict[str, dict[str, GroupStatus]] = {}  # by the time the CA wrote each
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            written, found = self.status_written()
            if found:
                statuses[written] = found
            started = self.ca.log.loops(since)
            if len(started) > loops:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"only {max(len(started) - 1, 0)} CA loops after the switch in {timeout:.0f}s")
            time.sleep(0.5)
        end = started[loops].at
        return QuietWindow(
            loops=loops,
            seconds=end - since,
            writes=[r for r in self.cloud_writes(since) if r.at <= end],
            nodes_deleted=[n for n, at in self.agent.record.nodes_deleted.items() if since <= at <= end],
            decisions=self.ca.log.matching(r"^Scale-up: setting group|^Scale-down: removing", since),
            statuses=list(statuses.values()),
        )


def user_agents(requests: list[RecordedRequest]) -> set[str]:
    return {str(r.headers.get("user-agent", "")).split(" ")[0] for r in requests}


def sizes(status: Mapping[str, GroupStatus]) -> dict[str, tuple[int, int, int]]:
    """Group id -> (min, max, target): what must not change when the CA changes hands."""
    return {group: found.sizes() for group, found in status.items()}


def show(status: Mapping[str, GroupStatus], names: Mapping[str, str]) -> str:
    return ", ".join(
        f"{names.get(group, group)} min/max/target {g.min_size}/{g.max_size}/{g.target} registered {g.registered}"
        for group, g in sorted(status.items(), key=lambda item: names.get(item[0], item[0]))
    )
