"""One simulated cluster as an alert sees it: a cloud, the network path to it, our server, and a CA calling it.

- the Scaleway simulator on a wall clock, behind ``TcpFaults`` (tests/support/tcp_faults.py), so the
  path to the cloud can hang or refuse connections while the simulator itself can refuse the key,
  rate-limit or fail a route;
- ``ca-externalgrpc serve`` as a child process (devstack.harness.ServerProcess), its backend pointed at
  the relay;
- ``CaLoop``: a thread that calls the server as the cluster-autoscaler's loop does, every
  ``scan_interval`` (the CA's ``--scan-interval``, 10 s by default): Refresh, NodeGroups, per group
  TargetSize, Nodes and GetOptions, NodeGroupForNode for every node, TemplateNodeInfo for the empty
  groups, and, while ``scale_up`` names a group, a size increase of it, each with the CA's 5 s deadline.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, open_channel, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from simulators.common.clock import WallClock
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.scenarios import generated_cluster
from tests.monitoring.prometheus import Target
from tests.support.tcp_faults import TcpFaults

SECRET = "alerts-secret-8d2c4f1e-0b3a-4e5d-9c6f-7a8b9c0d1e2f"
REVOKED = "revoked-key-0000-0000-0000-000000000000"
CA_DEADLINE = 5.0
DEFAULTS = pb.NodeGroupAutoscalingOptions(
    scaleDownUtilizationThreshold=0.5,
    scaleDownGpuUtilizationThreshold=0.5,
    scaleDownUnneededDuration=duration_pb2.Duration(seconds=600),
    scaleDownUnreadyDuration=duration_pb2.Duration(seconds=1200),
    MaxNodeProvisionDuration=duration_pb2.Duration(seconds=900),
)


class CaLoop:
    """The CA's calls, every ``scan_interval`` seconds on a thread of its own, until ``stop``."""

    def __init__(self, address: str, scan_interval: float) -> None:
        self.channel = open_channel(address)
        self.stub = pb_grpc.CloudProviderStub(self.channel)
        self.scan_interval = scan_interval
        self.scale_up: str | None = None
        self.codes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.loops = 0
        self._calling = threading.Event()
        self._calling.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ca-loop", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """The CA stops calling (it crashed, or calls another address)."""
        self._calling.clear()

    def resume(self) -> None:
        self._calling.set()

    def stop(self) -> None:
        self._stop.set()
        self._calling.set()
        self._thread.join(timeout=30)
        self.channel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._calling.wait()
            if self._stop.is_set():
                return
            self.loop()
            self._stop.wait(self.scan_interval)

    def call(self, method: str, request: Any) -> Any:
        try:
            answer = getattr(self.stub, method)(request, timeout=CA_DEADLINE)
        except grpc.RpcError as err:
            self.codes[(method, err.code().name)] += 1
            return None
        self.codes[(method, "OK")] += 1
        return answer

    def loop(self) -> None:
        self.loops += 1
        self.call("Refresh", pb.RefreshRequest())
        answer = self.call("NodeGroups", pb.NodeGroupsRequest())
        for group in answer.nodeGroups if answer is not None else ():
            size = self.call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=group.id))
            nodes = self.call("NodeGroupNodes", pb.NodeGroupNodesRequest(id=group.id))
            for instance in nodes.instances if nodes is not None else ():
                node = pb.ExternalGrpcNode(providerID=instance.id)
                self.call("NodeGroupForNode", pb.NodeGroupForNodeRequest(node=node))
            self.call("NodeGroupGetOptions", pb.NodeGroupAutoscalingOptionsRequest(id=group.id, defaults=DEFAULTS))
            if size is not None and size.targetSize == 0:
                self.call("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id=group.id))
        if self.scale_up is not None:
            self.call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=self.scale_up, delta=1))


class Cluster:
    """A cloud, the path to it, our server and a CA; ``target`` is what Prometheus scrapes."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        scan_interval: float = 10.0,
        sync: Mapping[str, Any] | None = None,
        cloud: Mapping[str, Any] | None = None,
        key_refused: bool = False,
        pools: int = 4,
        nodes: int = 12,
    ) -> None:
        self.name = name
        workdir.mkdir(parents=True, exist_ok=True)
        scenario = generated_cluster(pools, nodes, seed=3)
        scenario["clusters"][0]["pools"][-1].update(size=0, nodes=0)  # one group at zero: templates asked
        self.simulator = ScalewaySimulator(scenario, clock=WallClock(), secret_key=SECRET).start()
        if key_refused:
            self.simulator.api.secret_key = REVOKED  # the cloud does not know the key the server has
        self.network = TcpFaults("127.0.0.1", self.simulator.port)
        entry = scaleway_backend(self.simulator, "scaleway")
        entry["scaleway"].update(cloud or {}, api_url=self.network.url)
        if sync:
            entry["sync"] = dict(sync)
        raw = server_config([entry], log={"format": "json", "level": "info"})
        self.server = ServerProcess(raw, env={}, workdir=workdir, log_path=workdir / "server.log", name=name)
        self.ca = CaLoop(self.server.address, scan_interval)

    @property
    def target(self) -> Target:
        assert self.server.http_address is not None
        return Target(self.server.http_address, namespace=self.name, pod=f"{self.name}-0")

    def groups(self) -> list[str]:
        with self.simulator.state.lock:
            return sorted(self.simulator.state.pools)

    def stop(self) -> None:
        self.ca.stop()
        self.server.stop()
        self.network.stop()
        self.simulator.stop()
