"""A real Kubernetes node for the e2e control plane: containerd 2.3 with runc and the bridge CNI plugin,
the kubelet 1.36, kube-proxy and CoreDNS, registered to the run's kube-apiserver.

The programs come from the Go build step (tests/e2e/nodegomod, group ``node``); runc and the CNI plugins
from Debian (``runc``, ``containernetworking-plugins``). Everything runs in the namespaces of
tests/e2e/node_host.py, so the node is a small machine of its own inside this one:

====================  ===========================================================================
node address          ``10.250.0.2`` (and ``fd34:ca:250::2``) on ``canode0``, one end of a veth pair
                      that never leaves the namespace; the default routes say unreachable
pods                  bridge ``cabr0``, ``10.244.0.0/24`` and ``fd34:ca:244::/64`` (host-local IPAM)
Services              ``10.96.0.0/24`` (the API server's range), kube-proxy in iptables mode
cluster DNS           CoreDNS on the node address, port 53: ``cluster.local`` from the API server,
                      nothing forwarded
the API server        reached at the node address on the API server's own port, relayed to its
                      loopback listener; it advertises that address, so the ``kubernetes`` Service
                      (``10.96.0.1:443``) leads there through kube-proxy, from any pod
what else the test    each one relayed the same way (``Node(relays=...)``), e.g. the cloud
serves                interception proxy the server pods use as ``HTTPS_PROXY``
====================  ===========================================================================

With ``ipv6_primary`` the node's first address is its IPv6 one: the kubelet then reports each pod's
IPv6 address first (``status.podIP``) and probes that one.

The node's own settings, where they differ from a kubelet's defaults: cgroupfs under ``CGROUP_ROOT``
(no systemd here; on a cgroup v1 machine ``failCgroupV1: false``, which Kubernetes 1.35 and later ask
for), images never garbage-collected (they come from podman, not a registry), eviction only when the
disk is really full (a shared CI disk), a 10 s sync period (ConfigMap and Secret updates reach the
mounts within it), and for containerd ``restrict_oom_score_adj`` (these machines lack CAP_SYS_RESOURCE,
so runc could not give the pause container the -998 it asks for, and every sandbox would fail).

The API server cannot reach the kubelet (no route into the node), so ``kubectl logs`` and ``exec`` do not
work; the scenarios read container logs from the node's log folder (``container_log``) and reach a
container's files through ``/proc`` (``container_file``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from devstack.container import podman_env, qualified
from tests.e2e.node_host import (
    CGROUP_ROOT,
    KUBELET_SYSCTLS,
    HostSnapshot,
    HostState,
    NodeHostError,
    NodeNamespaces,
    cgroup_dirs,
    cgroup_v1,
    leftovers,
    make_cgroups,
    node_lock,
    read_sysctl,
    remove_cgroups,
    restore_sysctls,
    stop_processes,
    sweep_previous,
)
from tests.e2e.processes import ManagedProcess
from tests.support.gobuild import binary_path

#: what the node's programs are called in the build.toml files of tests/e2e/nodegomod
KUBELET = "kubelet-1.36.2"
KUBE_PROXY = "kube-proxy-1.36.2"
CONTAINERD = "containerd-2.3.7"
SHIM = "containerd-shim-runc-v2-2.3.7"
CTR = "ctr-2.3.7"
COREDNS = "coredns-1.14.2"
#: the CNI plugins the node's network uses, from Debian's containernetworking-plugins
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
#: host paths the node's programs use by default, all behind the node's own mounts: none may appear
WATCHED_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
)
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
#: the node's /var/lib is memory (module docstring): the images (about 320 MB unpacked twice) and volumes
NODE_VAR_LIB_SIZE = "3g"
#: containerd's namespace for the images and containers of the CRI (what the kubelet sees)
CRI_NAMESPACE = "k8s.io"
NODE_LOCK_WAIT = 900.0


@dataclass(frozen=True)
class NodePrograms:
    kubelet: Path
    kube_proxy: Path
    containerd: Path
    shim: Path
    ctr: Path
    coredns: Path

    def all(self) -> list[Path]:
        return [self.kubelet, self.kube_proxy, self.containerd, self.shim, self.ctr, self.coredns]


def find_node_programs() -> NodePrograms:
    """The binaries ``make build`` produced; GoBuildError naming what is missing and how to build it."""
    return NodePrograms(
        kubelet=binary_path(KUBELET),
        kube_proxy=binary_path(KUBE_PROXY),
        containerd=binary_path(CONTAINERD),
        shim=binary_path(SHIM),
        ctr=binary_path(CTR),
        coredns=binary_path(COREDNS),
    )


def why_no_node() -> str | None:
    """One line saying why a real node cannot run on this machine, or None when it can."""
    if not Path("/proc/self/ns/net").exists():
        return "a real node needs Linux namespaces"
    if os.geteuid() != 0:
        return "a real node needs root (it makes namespaces, mounts and cgroups)"
    for command, package in (
        ("runc", "runc"),
        ("podman", "podman"),
        ("iptables", "iptables"),
        ("nsenter", "util-linux"),
        ("unshare", "util-linux"),
        ("ip", "iproute2"),
    ):
        if shutil.which(command) is None:
            return f"a real node needs {command} (apt-get install -y {package})"
    missing = [p for p in CNI_PLUGINS if not (CNI_BIN / p).is_file()]
    if missing:
        return (
            f"a real node needs the CNI plugins {missing} in {CNI_BIN} (apt-get install -y containernetworking-plugins)"
        )
    return None


@dataclass(frozen=True)
class NodeNetwork:
    """The node's addresses (module docstring)."""

    name: str = "node-1"
    ipv6_primary: bool = False
    ipv4: str = "10.250.0.2"
    ipv6: str = "fd34:ca:250::2"
    pods_ipv4: str = "10.244.0.0/24"
    pods_ipv6: str = "fd34:ca:244::/64"
    services: str = "10.96.0.0/24"
    bridge: str = "cabr0"
    link: str = "canode0"

    @property
    def node_ips(self) -> list[str]:
        return [self.ipv6, self.ipv4] if self.ipv6_primary else [self.ipv4, self.ipv6]

    @property
    def kubernetes_service_ip(self) -> str:
        """The first address of the Service range: the ``kubernetes`` Service's."""
        return self.services.rsplit(".", 1)[0] + ".1"


@dataclass
class Relay:
    """Something the test serves on loopback, reachable from the node and its pods at ``node address:port``
    (or, with ``listen_host``, at that address inside the node: ``127.0.0.1`` for the node's own
    programs alone, such as containerd pulling from a registry the test serves)."""

    name: str
    host_port: int
    port: int = 0  # the port inside the node (the same number unless it was taken)
    listen_host: str = ""  # default: the node's address


class Node:
    """One node (module docstring). ``start`` registers it and waits for it Ready; ``stop`` removes every
    trace and leaves ``self.leftovers`` for the teardown check."""

    def __init__(
        self,
        programs: NodePrograms,
        workdir: Path,
        *,
        api: k8s.ApiClient,
        api_port: int,
        kubeconfig_for: Callable[[str, Path], Path],
        pause_image: str,
        network: NodeNetwork | None = None,
        relays: Sequence[Relay] = (),
        kubelet_client_ca: Path | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.programs = programs
        self.workdir = workdir
        self.state = workdir / "node"
        self.root = self.state / "root"  # /var/lib, /var/log inside the node
        self.logs = workdir / "logs"
        self.api = api
        self.api_port = api_port
        self.kubeconfig_for = kubeconfig_for
        self.pause_image = pause_image
        self.net = network or NodeNetwork()
        self.relays = [Relay(r.name, r.host_port, r.port, r.listen_host) for r in relays]
        self.kubelet_client_ca = kubelet_client_ca
        self.say = say
        self.namespaces = NodeNamespaces(self.logs / "node-namespaces.log")
        self.processes: dict[str, ManagedProcess] = {}
        self.host = HostState()
        self.before: HostSnapshot | None = None
        self.leftovers: list[str] | None = None
        self.started_at = 0.0
        self.ready_at = 0.0
        self._lock: contextlib.ExitStack | None = None

    @property
    def name(self) -> str:
        return self.net.name

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def add_relay(self, relay: Relay) -> Relay:
        """Open one more relay into the running node (``Relay``); it closes with the node."""
        opened = self.namespaces.relay(
            relay.listen_host or self.net.ipv4, relay.port or relay.host_port, relay.host_port, relay.name
        )
        relay.port = opened.port
        self.relays.append(relay)
        return relay

    def relay_port(self, name: str) -> int:
        return next(r.port for r in self.relays if r.name == name)

    def address(self, name: str) -> str:
        """``node-address:port`` where pods reach the relayed service ``name``."""
        return f"{self.net.ipv4}:{self.relay_port(name)}"

    # ----------------------------------------------------------------------------------------- start
    def start(self) -> Node:
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(node_lock(NODE_LOCK_WAIT, self.say))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.started_at = time.time()
        sweep_previous(self.say)
        self.before = HostSnapshot.take(WATCHED_PATHS)
        self.namespaces.start()
        self.host = HostState(
            holder_pid=self.namespaces.pid,
            net_inode=self.namespaces.net_inode,
            mnt_inode=self.namespaces.mnt_inode,
            state_dir=str(self.state),
            programs=[str(p.resolve()) for p in self.programs.all()],
            sysctls={name: value for name in KUBELET_SYSCTLS if (value := read_sysctl(name)) is not None},
        )
        self.host.save()
        self._network()
        self._mounts()
        relays, self.relays = [Relay("kube-apiserver", self.api_port), *self.relays], []
        for relay in relays:
            self.add_relay(relay)
        self.kubeconfig = self.kubeconfig_for(f"https://{self.net.ipv4}:{self.api_port}", self.state / "kubeconfig")
        make_cgroups()
        self._write_configs()
        self._start_containerd()
        self.import_image(self.pause_image)
        self._start_kubelet()
        self._start_kube_proxy()
        self._start_coredns()
        self.ready_at = time.time()
        self.say(f"node {self.name} Ready in {self.ready_at - self.started_at:.1f} s")

    def _network(self) -> None:
        """The node's link: a veth pair inside the namespace (this kernel has no dummy links), the node's
        addresses on one end. Default routes are unreachable: only the pod bridge, the Service range (so
        that a process on the node reaches a Service through kube-proxy's rules) and the node's own
        addresses are reachable."""
        net, run = self.net, self.namespaces.run
        peer = f"{net.link[:-1]}1"
        run("ip", "link", "set", "lo", "up", mount=False)
        run("ip", "link", "add", net.link, "type", "veth", "peer", "name", peer, mount=False)
        run("ip", "addr", "add", f"{net.ipv4}/32", "dev", net.link, mount=False)
        run("ip", "-6", "addr", "add", f"{net.ipv6}/128", "dev", net.link, "nodad", mount=False)
        for link in (net.link, peer):
            run("ip", "link", "set", link, "up", mount=False)
        run("ip", "route", "add", "unreachable", "default", mount=False)
        run("ip", "-6", "route", "add", "unreachable", "default", mount=False)
        run("ip", "route", "add", net.services, "dev", net.link, mount=False)

    def _mounts(self) -> None:
        """The node's own /var/lib and /run (memory: image layers, volumes, the kubelet's state; gone with
        the namespace) and /var/log (the run's folder: container logs stay for a post-mortem), in its
        private mount namespace only."""
        (self.root / "var" / "log").mkdir(parents=True, exist_ok=True)
        self.namespaces.run(
            "mount", "-t", "tmpfs", "-o", f"size={NODE_VAR_LIB_SIZE},mode=0755", "node-var-lib", "/var/lib"
        )
        self.namespaces.run("mount", "--bind", str(self.root / "var" / "log"), "/var/log")
        self.namespaces.run("mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "node-run", "/run")
        bin_dir = self.state / "bin"  # containerd finds its shim by this name on PATH
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "containerd-shim-runc-v2"
        link.unlink(missing_ok=True)
        link.symlink_to(self.programs.shim)

    def _write_configs(self) -> None:
        config = self.state / "config"
        config.mkdir(parents=True, exist_ok=True)
        runc = shutil.which("runc")
        (config / "containerd.toml").write_text(
            "version = 3\n"
            "[plugins.'io.containerd.cri.v1.images']\n"
            "  snapshotter = 'overlayfs'\n"
            "  [plugins.'io.containerd.cri.v1.images'.pinned_images]\n"
            f"    sandbox = '{self.pause_image}'\n"
            "[plugins.'io.containerd.cri.v1.runtime']\n"
            "  restrict_oom_score_adj = true\n"
            "  [plugins.'io.containerd.cri.v1.runtime'.containerd]\n"
            "    default_runtime_name = 'runc'\n"
            "    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
            "      runtime_type = 'io.containerd.runc.v2'\n"
            "      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
            f"        BinaryName = '{runc}'\n"
            "        SystemdCgroup = false\n"
            "  [plugins.'io.containerd.cri.v1.runtime'.cni]\n"
            f"    bin_dirs = ['{CNI_BIN}']\n"
            f"    conf_dir = '{config / 'cni'}'\n"
            "    max_conf_num = 1\n"
        )
        (config / "cni").mkdir(exist_ok=True)
        net = self.net
        (config / "cni" / "10-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": net.bridge,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": net.pods_ipv4}], [{"subnet": net.pods_ipv6}]],
                                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                            },
                        }
                    ],
                },
                indent=1,
            )
        )
        kubelet: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "address": net.ipv4,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            # No anonymous access; the API server (``kubectl logs`` and ``exec``) shows a client certificate
            # of the cluster CA when the node has one (``kubelet_client_ca``).
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                **({"x509": {"clientCAFile": str(self.kubelet_client_ca)}} if self.kubelet_client_ca else {}),
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [net.node_ips[0]],
            "clusterDomain": "cluster.local",
            "resolvConf": str(config / "resolv.conf"),
            "syncFrequency": "10s",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            "failSwapOn": False,
            "protectKernelDefaults": False,
            "serializeImagePulls": False,
        }
        if cgroup_v1():
            kubelet["failCgroupV1"] = False
        (config / "kubelet.yaml").write_text(yaml.safe_dump(kubelet, sort_keys=False))
        # The node's own resolver list, for host-network pods of dnsPolicy Default: the cluster DNS only.
        (config / "resolv.conf").write_text(f"nameserver {net.node_ips[0]}\n")
        (config / "kube-proxy.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "hostnameOverride": self.name,
                    "mode": "iptables",
                    "clusterCIDR": f"{net.pods_ipv4},{net.pods_ipv6}",
                    "healthzBindAddress": "127.0.0.1:10256",
                    "metricsBindAddress": "127.0.0.1:10249",
                    # Zero: leave the machine-wide conntrack table size and timeouts alone.
                    "conntrack": {
                        "maxPerCore": 0,
                        "min": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                        "udpTimeout": "0s",
                        "udpStreamTimeout": "0s",
                    },
                    "iptables": {"localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
                },
                sort_keys=False,
            )
        )
        (config / "Corefile").write_text(
            ".:53 {\n"
            "    errors\n"
            "    health 127.0.0.1:18080\n"
            "    ready 127.0.0.1:18181\n"
            "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
            f"        kubeconfig {self.kubeconfig}\n"
            "        pods insecure\n"
            "        fallthrough in-addr.arpa ip6.arpa\n"
            "    }\n"
            "    cache 5\n"
            "}\n"
        )

    def _daemon(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> ManagedProcess:
        process = ManagedProcess(name, self.namespaces.command(argv), self.logs / f"{name}.log", env).start()
        self.processes[name] = process
        return process

    def _start_containerd(self) -> None:
        env = {**os.environ, "PATH": f"{self.state / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        process = self._daemon(
            "containerd",
            [str(self.programs.containerd), "--config", str(self.state / "config" / "containerd.toml")],
            env,
        )
        process.wait_until(lambda: bool(self.ctr("version")), 30, "answering on its socket")

    def ctr(self, *args: str, timeout: float = 300, stdin: IO[bytes] | None = None) -> str:
        """``ctr`` against the node's containerd, in its CRI namespace."""
        argv = [str(self.programs.ctr), "--address", CONTAINERD_SOCKET, "--namespace", CRI_NAMESPACE, *args]
        return self.namespaces.run(*argv, timeout=timeout, stdin=stdin)

    def _start_kubelet(self) -> None:
        config = self.state / "config"
        process = self._daemon(
            "kubelet",
            [
                str(self.programs.kubelet),
                f"--config={config / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={','.join(self.net.node_ips)}",
                "--v=2",
            ],
        )
        process.wait_until(self._ready, 120, f"registered and Ready as node {self.name}")
        # The API server's admission puts node.kubernetes.io/not-ready on every new Node; the node
        # lifecycle controller (off here, it would fight the node agent's Nodes) lifts it once Ready.
        node: Any = self.core.read_node(self.name)
        kept = [t for t in node.spec.taints or [] if t.key != "node.kubernetes.io/not-ready"]
        if len(kept) != len(node.spec.taints or []):
            self.core.patch_node(self.name, {"spec": {"taints": [t.to_dict() for t in kept] or None}})

    def _ready(self) -> bool:
        try:
            node: Any = self.core.read_node(self.name)
        except ApiException:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def _start_kube_proxy(self) -> None:
        process = self._daemon(
            "kube-proxy",
            [str(self.programs.kube_proxy), f"--config={self.state / 'config' / 'kube-proxy.yaml'}", "--v=2"],
        )
        # Ready once it programmed the kubernetes Service (a chain per Service in the nat table).
        process.wait_until(
            lambda: self.net.kubernetes_service_ip in self.namespaces.run("iptables-save", "-t", "nat", mount=False),
            60,
            "programming the Services",
        )

    def _start_coredns(self) -> None:
        process = self._daemon(
            "coredns", [str(self.programs.coredns), "-conf", str(self.state / "config" / "Corefile")]
        )
        process.wait_until(lambda: "Running" in process.tail(50) or "CoreDNS-" in process.tail(50), 60, "serving")

    # ----------------------------------------------------------------------------------------- images
    def import_image(self, podman_image: str, *names: str) -> float:
        """Copy an image from podman into the node (``podman save`` piped into ``ctr images import``), and
        tag it with ``names`` as a pod spec writes them (``name:tag`` is ``docker.io/library/name:tag``).
        Returns the seconds it took."""
        started = time.monotonic()
        save = subprocess.Popen(
            ["podman", "save", "--format", "docker-archive", podman_image],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=podman_env(),
        )
        try:
            self.ctr("images", "import", "-", stdin=save.stdout)
        finally:
            assert save.stdout is not None
            save.stdout.close()
            save.wait(timeout=60)
        if save.returncode != 0:
            assert save.stderr is not None
            raise NodeHostError(f"podman save {podman_image} failed: {save.stderr.read().decode(errors='replace')}")
        source = qualified(podman_image)  # the name a docker-archive of podman's carries
        for name in names:
            full = normalized(name)
            if full != source:
                self.ctr("images", "tag", "--force", source, full)
        return time.monotonic() - started

    # ----------------------------------------------------------------------------------------- reading
    def pod_log_dir(self, pod: Any) -> Path:
        meta = pod.metadata
        return self.root / "var" / "log" / "pods" / f"{meta.namespace}_{meta.name}_{meta.uid}"

    def container_log(self, pod: Any, container: str, restart: int | None = None) -> list[LogLine]:
        """Every line the container wrote, over all its restarts (or in its ``restart``-th run only), oldest
        first (the CRI log files)."""
        directory = self.pod_log_dir(pod) / container
        lines: list[LogLine] = []
        if not directory.is_dir():
            return lines
        files = sorted(directory.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
        for path in [f for f in files if restart is None or f.stem == str(restart)]:
            with contextlib.suppress(OSError):
                lines += [parse_cri_line(line) for line in path.read_text(errors="replace").splitlines() if line]
        return lines

    def container_pids(self, container_id: str) -> list[int]:
        """The processes of one container (its cgroup under the node's pods), ``containerd://`` id or bare."""
        bare = container_id.split("://")[-1]
        pids: set[int] = set()
        for root in cgroup_dirs():
            for procs in root.rglob(f"{bare}/cgroup.procs") if root.exists() else ():
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        return sorted(pids)

    def container_file(self, container_id: str, path: str) -> bytes:
        """A file as the container sees it, e.g. its ServiceAccount token: read through
        /proc/<pid>/root, with symlinks resolved inside the container (the image's /var/run -> /run)."""
        pids = self.container_pids(container_id)
        if not pids:
            raise FileNotFoundError(f"container {container_id} has no process")
        return inside_root(Path(f"/proc/{pids[0]}/root"), path).read_bytes()

    def kill_container(self, container_id: str, sig: signal.Signals = signal.SIGKILL) -> list[int]:
        pids = self.container_pids(container_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def check_running(self) -> None:
        for process in self.processes.values():
            process.check_running()

    # ----------------------------------------------------------------------------------------- stop
    def stop(self) -> None:
        """Stop the node's programs (the kubelet first), remove everything, and check nothing is left."""
        if self._lock is None:
            return  # stopped already (or never started)
        try:
            self._stop()
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _stop(self) -> None:
        for name in ("kubelet", "kube-proxy", "coredns", "containerd"):
            process = self.processes.pop(name, None)
            if process is not None:
                process.stop(grace=10)
        if self.host.holder_pid:
            stop_processes(self.host, self.say)
        self.namespaces.stop()
        remove_cgroups(self.say)
        restore_sysctls(self.host.sysctls, self.say)
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.name)
        if self.before is not None:
            self.leftovers = leftovers(self.host, self.before, WATCHED_PATHS)
            if self.leftovers:
                self.say("the node left behind:\n  " + "\n  ".join(self.leftovers))
        HostState.clear()


def inside_root(root: Path, path: str) -> Path:
    """``path`` under ``root`` as a process whose root that is sees it: absolute symlinks lead back to
    ``root``, never to this machine's own tree."""
    current, parts, hops = root, [p for p in path.split("/") if p], 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise FileNotFoundError(f"too many symlinks in {path}")
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            current = root if target.startswith("/") else current
        else:
            current = candidate
    return current


@dataclass(frozen=True)
class LogLine:
    at: float  # wall-clock seconds the runtime read the line
    stream: str
    text: str


CRI_LINE = re.compile(r"^(\S+) (stdout|stderr) [FP] ?(.*)$")


def parse_cri_line(line: str) -> LogLine:
    """One line of a CRI container log: ``<RFC 3339 time> <stream> <F|P> <text>``."""
    match = CRI_LINE.match(line)
    if not match:
        return LogLine(0.0, "", line)
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", match.group(1))
    return LogLine(datetime.fromisoformat(stamp).timestamp(), match.group(2), match.group(3))


def normalized(name: str) -> str:
    """An image reference as the kubelet and the CRI complete it: ``x:1`` is ``docker.io/library/x:1``."""
    first, _, rest = name.partition("/")
    if not rest:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if ":" not in name.rsplit("/", 1)[-1] and "@" not in name:
        name += ":latest"
    return name
