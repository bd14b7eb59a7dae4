"""``make bench-kube``: what the Kubernetes features cost our server at cluster scale.

For each cluster size: a fresh etcd + kube-apiserver (the e2e suite's control plane), a Scaleway
simulator holding the cluster (``bench_scenario``: 50 pools, every tenth at zero, 5 % of the nodes in a
pool with autoscaling off), and one Node per machine shaped like a real kubelet's
(``kubelet_nodes.kubelet_node``: 50 images, nine conditions, addresses, kubelet labels and
annotations), written straight to the API server by parallel POSTs. The nodes of one pool (the
"joining" pool) are registered but not Ready.

Then our server is started once per feature set, one after the other (each timed alone from process
start to ``grpc.health.v1`` SERVING with every group listed, and, with learned templates, to every
Ready group's template learned), each in a namespace of its own (its own Lease, ConfigMaps, Events),
all against the same API server and nodes. With all four running and idle, for ``--window`` seconds:
RSS and peak RSS (``VmRSS``/``VmHWM``), threads, and CPU (user + system from ``/proc/PID/stat``) in
millicores. Last, one node of the joining pool turns Ready and the time until each server with learned
templates serves the group's template as learned from it is measured.

    python -m tests.bench.kube_features                        # 1,000, 5,000 and 20,000 nodes
    python -m tests.bench.kube_features --nodes 1000 --window 30
    python -m tests.bench.kube_features --code /tmp/main-copy  # the server code of another checkout

Prints a Markdown table per size, the targets of issue 26 checked against the run, and the path of the
JSON results. Figures only: nothing here passes or fails on a number (the smoke test in tests/kube checks
that every figure is measured, never its value).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from devstack.clouds import scaleway_backend
from devstack.harness import ServerProcess, process_cpu_seconds, server_config
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from server.kube.client import KubeConnection, core_path
from simulators.common.clock import WallClock
from simulators.scaleway import ScalewaySimulator
from tests.bench import heap
from tests.bench.cluster import BENCH_REGION, BENCH_SECRET_KEY, UNMANAGED_POOL, bench_scenario
from tests.bench.kubelet_nodes import conditions, kubelet_node, nfd_labels
from tests.bench.servers import START_TIMEOUT, Startup, _wait_ready
from tests.e2e.control_plane import ControlPlane, ControlPlanePrograms
from tests.support.gobuild import binary_path

DEFAULT_OUT = Path(tempfile.gettempdir()) / "ca-externalgrpc-bench-kube"
ALL_FOUR = {"leader_election": {"enabled": True}, "journal": {"enabled": True}, "events": {"enabled": True}}
# The feature sets compared, in the order they are started: name -> the ``kubernetes:`` keys switched on.
FEATURE_SETS: dict[str, dict[str, Any]] = {
    "none": {},
    "lease + journal + Events": ALL_FOUR,
    "learned templates": {"learned_templates": {"enabled": True}},
    "all four": {**ALL_FOUR, "learned_templates": {"enabled": True}},
}
CREATE_THREADS = 16
# How long a learner gets to learn every template, or one after a Node turns Ready; past it the figure
# is reported as missing (the code before issue 26 may take minutes for 20,000 Nodes), the run goes on.
LEARN_TIMEOUT = 600.0
POLL = 0.02
MIB = 1024 * 1024


@dataclass
class Measured:
    """One server of one feature set: how it started and what it costs at rest."""

    name: str
    startup_s: float = 0.0  # process start -> health SERVING and every group listed
    templates_learned_s: float | None = None  # process start -> every Ready group's template learned
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    threads: int = 0
    idle_millicores: float = 0.0
    learn_after_ready_s: float | None = None  # a Node turns Ready -> its group's template learned from it
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- /proc
def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Machine:
    index: int
    name: str
    provider_id: str
    pool_id: str
    pool_labels: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]


def machines_of(sim: ScalewaySimulator, extra_labels: int = 0) -> list[Machine]:
    """Every machine of the simulator with what its kubelet would report (Kapsule's labels, Ki units), and
    ``extra_labels`` labels of node-feature-discovery (the same on every machine: all of them learned)."""
    state = sim.state
    hardware = nfd_labels(extra_labels) if extra_labels else {}
    result = []
    with state.lock:
        for index, node in enumerate(state.nodes.values()):
            pool = state.pools[node.pool_id]
            labels = {**hardware, **state.kubernetes_labels(node)}
            memory_kib = pool.capacity.get("memory", 4 * 1024**3) // 1024
            capacity = {
                "cpu": str(pool.capacity.get("cpu", 2)),
                "memory": f"{memory_kib - 150_000}Ki",  # the kernel keeps some: a kubelet reports less
                "ephemeral-storage": "153525000Ki",
                "hugepages-1Gi": "0",
                "hugepages-2Mi": "0",
                "pods": str(pool.capacity.get("pods", 110)),
            }
            allocatable = {
                **capacity,
                "cpu": f"{int(capacity['cpu']) * 1000 - 90}m",
                "memory": f"{memory_kib - 150_000 - 1_100_000}Ki",
                "ephemeral-storage": "141489160042",
            }
            result.append(Machine(index, node.name, node.provider_id, pool.id, labels, capacity, allocatable))
    return result


def create_nodes(connection: KubeConnection, machines: Sequence[Machine], joining_pool: str) -> float:
    """POST every Node (the joining pool's not Ready), in parallel; the seconds it took."""
    started = time.monotonic()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def create(machine: Machine) -> None:
        node = kubelet_node(
            machine.index,
            machine.name,
            machine.provider_id,
            machine.pool_labels,
            machine.capacity,
            machine.allocatable,
            ready=machine.pool_id != joining_pool,
            now=now,
        )
        connection.request("POST", core_path("nodes"), body=node, timeout=60)

    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        for _ in pool.map(create, machines):
            pass
    return time.monotonic() - started


def set_ready(connection: KubeConnection, name: str, ready: bool) -> None:
    """What a kubelet posts when its node turns Ready, or not Ready (a strategic merge: conditions by type)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"status": {"conditions": conditions(ready, now)}}
    connection.request(
        "PATCH",
        core_path("nodes", name=name) + "/status",
        body=patch,
        content_type="application/strategic-merge-patch+json",
    )


# ---------------------------------------------------------------------------------------- our server
def start_server(
    sim: ScalewaySimulator,
    plane: ControlPlane,
    connection: KubeConnection,
    name: str,
    features: Mapping[str, Any],
    groups: int,
    workdir: Path,
    code: Path | None,
    trace_frames: int = 0,
) -> tuple[ServerProcess, Startup]:
    namespace = "bench-" + "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    namespace = "-".join(part for part in namespace.split("-") if part)
    try:
        connection.request("POST", core_path("namespaces"), body={"metadata": {"name": namespace}})
    except Exception as err:  # noqa: BLE001 - exists from an earlier set of the same run
        if getattr(err, "status", None) != 409:
            raise
    kubernetes: dict[str, Any] = {}
    if features:
        kubernetes = {"kubeconfig": str(plane.kubeconfig), "namespace": namespace, "identity": f"bench-{namespace}"}
        kubernetes.update(features)
    raw = server_config([scaleway_backend(sim, "scw")], log={"format": "json", "level": "info"})
    if kubernetes:
        raw["kubernetes"] = kubernetes
    process = ServerProcess(
        raw,
        env={heap.SNAPSHOT_ENV: str(workdir / f"{namespace}.tracemalloc")} if trace_frames else None,
        workdir=workdir,
        command=heap.server_command(code, trace_frames),
        log_path=workdir / f"{namespace}.log",
        name=namespace,
        start_timeout=START_TIMEOUT,
    )
    return process, _wait_ready(process, process.address, groups, health=True)


def learned_groups(stub: pb_grpc.CloudProviderStub) -> dict[str, str]:
    """Group id -> its template's source, for the groups whose template is learned."""
    groups = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
    return {g.id: g.debug.rsplit("template=", 1)[1] for g in groups if "template=learned" in g.debug}


def _learned_at_least(process: ServerProcess, count: int) -> Callable[[], bool]:
    return lambda: len(learned_groups(process.stub)) >= count


def _learned_from(process: ServerProcess, group: str, node: str) -> Callable[[], bool]:
    return lambda: f"from node {node} " in learned_groups(process.stub).get(group, "")


def wait_until(what: str, probe: Callable[[], bool], timeout: float = LEARN_TIMEOUT) -> float:
    """Poll until ``probe`` is true; the monotonic time it was first seen true."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return time.monotonic()
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f}s: {what}")
        time.sleep(POLL)


# ---------------------------------------------------------------------------------------- one size
def control_plane_programs() -> ControlPlanePrograms:
    return ControlPlanePrograms(
        etcd=binary_path("etcd-3.6.8"),
        kube_apiserver=binary_path("kube-apiserver-1.36.2"),
        kube_scheduler=binary_path("kube-scheduler-1.36.2"),
    )


def admin_connection(plane: ControlPlane) -> KubeConnection:
    """The bench's own client (the admin), with a connection per creating thread."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = CREATE_THREADS
    api = client.ApiClient(configuration)
    return KubeConnection(api=api, namespace="default", identity="bench", request_timeout=30.0)


@dataclass(frozen=True)
class Cluster:
    """One size's cluster: the API server with its Nodes, the cloud behind them, who joins late."""

    plane: ControlPlane
    sim: ScalewaySimulator
    connection: KubeConnection
    machines: list[Machine]
    groups: int
    filled: list[str]  # groups with machines
    joining: str  # the group whose Nodes are registered but not Ready
    workdir: Path


def run_size(nodes: int, args: argparse.Namespace, codes: Mapping[str, Path | None]) -> dict[str, Any]:
    """One cluster size: a fresh control plane, the nodes, then every feature set of every code."""
    workdir = args.out / f"nodes_{nodes}"
    workdir.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(control_plane_programs(), workdir / "control-plane", scheduler=False).start()
    sim = ScalewaySimulator(
        bench_scenario(args.pools, nodes), clock=WallClock(), secret_key=BENCH_SECRET_KEY, region=BENCH_REGION
    ).start()
    connection = admin_connection(plane)
    try:
        with sim.state.lock:
            autoscaled = [p for p in sim.state.pools.values() if p.autoscaling]
            unmanaged = [p.id for p in sim.state.pools.values() if p.name == UNMANAGED_POOL]
        filled = [p.id for p in autoscaled if p.size > 0]
        machines = machines_of(sim, args.labels)
        cluster = Cluster(plane, sim, connection, machines, len(autoscaled), filled, filled[0], workdir)
        created_s = create_nodes(connection, machines, cluster.joining)
        sample = connection.request_bytes("GET", core_path("nodes", name=machines[-1].name))
        result: dict[str, Any] = {
            "nodes": len(machines),
            "groups": len(autoscaled),
            "groups_at_zero": len(autoscaled) - len(filled),
            "unmanaged_nodes": sum(1 for m in machines if m.pool_id in unmanaged),
            "node_json_bytes": len(sample),
            "nfd_labels_per_node": args.labels,
            "nodes_created_s": round(created_s, 1),
            "load_average_at_start": load_average(),
            "runs": {},
        }
        for label, code in codes.items():
            result["runs"][label] = measure(cluster, label, code, args)
        return result
    finally:
        connection.close()
        sim.stop()
        plane.stop()


def measure(cluster: Cluster, label: str, code: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """Every feature set of one server code on the cluster: start each, measure them idle together (with
    ``--tracemalloc``, then their heaps), then the time to learn a template after a Node turns Ready."""
    servers: dict[str, ServerProcess] = {}
    measured: dict[str, Measured] = {}
    prefix = "".join(c if c.isalnum() else "-" for c in label.lower())
    try:
        for name in args.sets:
            process, startup = start_server(
                cluster.sim,
                cluster.plane,
                cluster.connection,
                f"{prefix} {name}",
                FEATURE_SETS[name],
                cluster.groups,
                cluster.workdir,
                code,
                args.tracemalloc,
            )
            servers[name] = process
            entry = measured[name] = Measured(name, startup_s=round(startup.node_groups_s, 2))
            if "learned_templates" in FEATURE_SETS[name]:
                expected = len(cluster.filled) - 1  # every group with Ready nodes: all but the joining one
                try:
                    done = wait_until(f"{name}: {expected} templates learned", _learned_at_least(process, expected))
                    entry.templates_learned_s = round(done - process.started_at, 2)
                except TimeoutError as err:
                    entry.extra["templates_learned"] = str(err)
        time.sleep(args.settle)
        before = {name: process_cpu_seconds(p.pid) for name, p in servers.items()}
        started = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - started
        load = load_average()
        for name, process in servers.items():
            entry = measured[name]
            entry.idle_millicores = round((process_cpu_seconds(process.pid) - before[name]) / elapsed * 1000, 1)
            memory = process.memory()
            entry.rss_mib, entry.peak_rss_mib = round(memory["rss_mib"], 1), round(memory["peak_rss_mib"], 1)
            entry.threads = thread_count(process.pid)
        heaps = (
            {name: heap.take_snapshot(p.pid, Path(p.env[heap.SNAPSHOT_ENV])) for name, p in servers.items()}
            if args.tracemalloc
            else {}
        )
        # One node of the joining pool turns Ready: how long until each learner serves its template.
        learners = {n: p for n, p in servers.items() if "learned_templates" in FEATURE_SETS[n]}
        teacher = next(m.name for m in cluster.machines if m.pool_id == cluster.joining)
        if learners:
            turned = time.monotonic()
            set_ready(cluster.connection, teacher, True)
            try:
                for name, process in learners.items():
                    try:
                        seen = wait_until(
                            f"{name}: the joining pool's template learned from {teacher}",
                            _learned_from(process, cluster.joining, teacher),
                        )
                        measured[name].learn_after_ready_s = round(seen - turned, 3)
                    except TimeoutError as err:
                        measured[name].extra["learn_after_ready"] = str(err)
            finally:
                set_ready(cluster.connection, teacher, False)  # the next code finds the pool joining again
        for name, process in servers.items():
            if process.process.poll() is not None:
                raise RuntimeError(f"{name} exited during the run:\n{process.log_tail()}")
        return {
            "code": str(code or "this checkout"),
            "load_average_in_window": load,
            "servers": {name: vars(m) for name, m in measured.items()},
            "over_none": over_none(measured),
            **({"heap": heap.summary(heaps)} if heaps else {}),
        }
    finally:
        for process in servers.values():
            process.stop()


# ---------------------------------------------------------------------------------------- report
def over_none(measured: Mapping[str, Measured]) -> dict[str, dict[str, float]]:
    """What each feature set costs over the server without features (MiB of RSS and of peak RSS)."""
    base = measured.get("none")
    if base is None:
        return {}
    return {
        name: {
            "rss_mib": round(m.rss_mib - base.rss_mib, 1),
            "peak_rss_mib": round(m.peak_rss_mib - base.peak_rss_mib, 1),
        }
        for name, m in measured.items()
        if name != "none"
    }


def summary_table(results: Mapping[str, Any]) -> list[str]:
    """One row per size and code: RSS (and peak) without features, with all four, and the difference."""
    rows = []
    for key, size in results.items():
        if not key.startswith("nodes_"):
            continue
        for label, run in size["runs"].items():
            servers, extra = run["servers"], run["over_none"].get("all four")
            if extra is None:
                continue
            none, four = servers["none"], servers["all four"]
            rows.append(
                f"| {size['nodes']:,} | {size.get('nfd_labels_per_node', 0)} | {label} "
                f"| {none['rss_mib']:.1f} / {none['peak_rss_mib']:.1f} "
                f"| {four['rss_mib']:.1f} / {four['peak_rss_mib']:.1f} "
                f"| {extra['rss_mib']:+.1f} / {extra['peak_rss_mib']:+.1f} | {run['load_average_in_window']} |"
            )
    if not rows:
        return []
    return [
        "\n### RSS without features and with all four (MiB, RSS / peak)\n",
        "| nodes | NFD labels per node | code | none | all four | all four - none | load average |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def targets(results: Mapping[str, Any], label: str) -> list[str]:
    """Issue 26's targets checked against one code's run, one line each (for the sizes that ran)."""
    lines = []
    by_size = {
        int(key.split("_")[1]): value["runs"][label]["servers"]
        for key, value in results.items()
        if key.startswith("nodes_") and label in value["runs"]
    }
    five = by_size.get(5000)
    if five and "all four" in five and "none" in five:
        extra = five["all four"]["rss_mib"] - five["none"]["rss_mib"]
        peak = five["all four"]["peak_rss_mib"] - five["none"]["peak_rss_mib"]
        cpu = five["all four"]["idle_millicores"]
        lines.append(f"- RSS of all four over none at 5,000 nodes: {extra:+.1f} MiB (target <= +25)")
        lines.append(f"- peak RSS of all four over none at 5,000 nodes: {peak:+.1f} MiB (target <= +25)")
        lines.append(f"- idle CPU of all four at 5,000 nodes: {cpu:.1f} millicores (target <= 10)")
    sizes = sorted(n for n, servers in by_size.items() if "all four" in servers and "none" in servers)
    if len(sizes) >= 2:
        low, high = sizes[0], sizes[-1]

        def over(n: int, key: str) -> float:
            return float(by_size[n]["all four"][key] - by_size[n]["none"][key])

        for key in ("rss_mib", "peak_rss_mib"):
            growth = (over(high, key) - over(low, key)) * 1024 / (high - low)
            lines.append(
                f"- {key} of all four over none, {low:,} -> {high:,} nodes: {growth:+.2f} KiB per node (target <= 2)"
            )
    return lines


def markdown(results: Mapping[str, Any]) -> str:
    out = []
    labels: list[str] = []
    for key, size in results.items():
        if not key.startswith("nodes_"):
            continue
        for label, run in size["runs"].items():
            labels += [label] if label not in labels else []
            out.append(
                f"\n### {label}: {size['nodes']:,} nodes ({size['groups']} groups, {size['groups_at_zero']} at zero, "
                f"{size['unmanaged_nodes']} in no group; a Node is {size['node_json_bytes'] / 1024:.1f} KiB of "
                f"JSON; load average {run['load_average_in_window']})\n"
            )
            out.append(
                "| configuration | RSS MiB | peak RSS MiB | threads | idle CPU millicores | start-up s "
                "| templates learned s | learned after Ready s |"
            )
            out.append("|---|---|---|---|---|---|---|---|")
            for name, s in run["servers"].items():
                learned = "" if s["templates_learned_s"] is None else f"{s['templates_learned_s']:.1f}"
                after = "" if s["learn_after_ready_s"] is None else f"{s['learn_after_ready_s']:.3f}"
                out.append(
                    f"| {name} | {s['rss_mib']:.1f} | {s['peak_rss_mib']:.1f} | {s['threads']} | "
                    f"{s['idle_millicores']:.1f} | {s['startup_s']:.2f} | {learned} | {after} |"
                )
            if "heap" in run:
                out += heap.markdown(run["heap"], "all four")
    out += summary_table(results)
    for label in labels:
        checks = targets(results, label)
        if checks:
            out.append(f"\nTargets of issue 26, {label}:\n" + "\n".join(checks))
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.kube_features", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 20000], help="cluster sizes")
    parser.add_argument("--pools", type=int, default=50, help="node pools (groups) in the cloud")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of idle measured (CPU)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between the last start and the window")
    parser.add_argument("--sets", nargs="+", choices=list(FEATURE_SETS), default=list(FEATURE_SETS))
    parser.add_argument(
        "--labels",
        type=int,
        default=0,
        help="also give every Node this many node-feature-discovery labels (learned: the cost per label)",
    )
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="trace every server's Python heap (FRAMES frames per allocation) and report, after the window, "
        "what each feature set holds more than none, by package (tests/bench/heap.py); the RSS of a traced "
        "run is not the plain run's",
    )
    parser.add_argument(
        "--code",
        action="append",
        metavar="LABEL=PATH",
        help="also run the server code of another checkout, on the same cluster (e.g. before=/tmp/main-copy); "
        "repeatable. This checkout runs as 'this' unless --code names it ('this=')",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for results and logs")
    return parser.parse_args(argv)


def code_labels(given: Sequence[str] | None) -> dict[str, Path | None]:
    """``LABEL=PATH`` arguments -> label: server code root (None: this checkout)."""
    codes: dict[str, Path | None] = {}
    for item in given or []:
        label, _, path = item.partition("=")
        if not label:
            raise SystemExit(f"--code {item!r}: give LABEL=PATH, e.g. before=/tmp/main-copy")
        codes[label] = Path(path) if path else None
    return codes or {"this": None}


def byte_compile(code: Path | None) -> None:
    """Write the .pyc files of the server code, as the image does at build time: without them (this
    environment may set PYTHONDONTWRITEBYTECODE) every start compiles the sources, and the compiler's
    memory would count in the figures."""
    root = code or Path(__file__).resolve().parents[2]
    folders = [str(root / name) for name in ("server", "providers", "protos")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    codes = code_labels(args.code)
    for code in codes.values():
        byte_compile(code)
    results: dict[str, Any] = {
        "environment": {
            "cpus": os.cpu_count(),
            "codes": {label: str(path or "this checkout") for label, path in codes.items()},
            "load_average_at_start": load_average(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    }
    for nodes in args.nodes:
        results[f"nodes_{nodes}"] = run_size(nodes, args, codes)
        (args.out / "bench-kube-results.json").write_text(json.dumps(results, indent=2))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    print(markdown(results))
    print(f"\nresults: {args.out / 'bench-kube-results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
