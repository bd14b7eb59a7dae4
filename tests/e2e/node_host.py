"""What the real node (tests/e2e/node.py) changes on the machine, kept in namespaces the run creates,
and the check that it all went away.

**Namespaces.** One process, the *holder* (``sleep`` under ``unshare --net --mount``), owns a network
namespace and a private mount namespace; every program of the node (containerd and its shims, the
kubelet, kube-proxy, CoreDNS) is started inside both with ``nsenter``. So:

- the node's address, its pod bridge, every pod's veth, every iptables chain of the kubelet, the bridge
  plugin and kube-proxy, and every per-namespace sysctl they set live in the node's network namespace.
  It has no interface to the outside at all: its only ways out are the listeners this module opens
  inside it (``NodeNamespaces.relay``), each relaying to one loopback port of this machine (the API
  server, the cloud interception proxy). Nothing a pod sends can reach another host. The one way in is
  the API server's (``NodeNamespaces.connect_proxy``), as konnectivity is on a cluster whose control
  plane cannot route to its nodes: an HTTP CONNECT proxy on a Unix socket of this machine whose
  connections start inside the node, for ``kubectl logs`` and ``exec``;
- every mount (image layers, secret and ConfigMap volumes, the kubelet's own binds) is made in the
  private mount namespace, where ``/var/lib`` and ``/var/log`` are the run's folders and ``/run`` a
  small tmpfs: nothing of the node shows in the machine's own mount table or directories.

The namespaces end with their last process. What stays on the machine's side is global by nature: the
node's cgroup tree (``CGROUP_ROOT`` in every hierarchy), the kernel settings the kubelet changes
(``KUBELET_SYSCTLS``, restored at teardown) and the processes themselves.

**One node at a time.** The machine-wide lock ``LOCK_PATH`` serialises node runs (the kubelet's kernel
settings and the cgroup root are machine-wide); ``STATE_PATH`` records what a running node holds, so
that the next run undoes what a killed run left (``sweep_previous``).

**The teardown check.** ``leftovers`` lists everything still there after a node stopped: processes in
its namespaces or cgroups or running its programs, mounts of its folders in any mount namespace, its
cgroup directories, a namespace still alive, links, addresses and iptables rules of the node on the
machine's side, changed kernel settings. The node scenarios fail on any finding.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from tests.e2e.readiness_proxy import _pump

T = TypeVar("T")

#: the node's cgroup parent (the kubelet's cgroupRoot) in every cgroup hierarchy
CGROUP_ROOT = "ca-externalgrpc-node"
CGROUP_FS = Path("/sys/fs/cgroup")
#: one node at a time on this machine
LOCK_PATH = Path(tempfile.gettempdir()) / "ca-externalgrpc-node.lock"
#: what the running node holds (holder pid, namespaces, saved kernel settings), for sweep_previous
STATE_PATH = Path(tempfile.gettempdir()) / "ca-externalgrpc-node.json"
#: the kernel settings the kubelet sets when protectKernelDefaults is off (its container manager):
#: machine-wide, so saved before the node starts and written back after it stopped
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: machine-wide settings kube-proxy would change unless told not to (its conntrack options are zero)
#: and the machine's own network namespace's settings the node must not touch (its own live inside)
WATCHED_SYSCTLS = (
    *KUBELET_SYSCTLS,
    "net/netfilter/nf_conntrack_max",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
)
NSENTER = "nsenter"
UNSHARE = "unshare"
CLONE_NEWNET = 0x40000000
#: how many connections one relay into the node holds at most (each is two threads)
RELAY_MAX_CONNECTIONS = 128


class NodeHostError(RuntimeError):
    """The node's namespaces could not be made, or something of a previous node is in the way."""


def read_sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    (Path("/proc/sys") / name).write_text(value + "\n")


def cgroup_dirs() -> list[Path]:
    """The node's cgroup root in every hierarchy (v1: one per controller; v2: the unified tree)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS / CGROUP_ROOT]
    hierarchies = sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())
    return [h / CGROUP_ROOT for h in hierarchies if (h / "cgroup.procs").exists()]


def cgroup_v1() -> bool:
    return not (CGROUP_FS / "cgroup.controllers").exists()


# ------------------------------------------------------------------------------------ namespaces
_libc = ctypes.CDLL(None, use_errno=True)


def _in_thread(call: Callable[[], T]) -> T:
    """Run ``call`` on a fresh thread and return its result (or raise its exception)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="node-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class NodeNamespaces:
    """The node's network and mount namespaces, held by one ``sleep`` process (module docstring)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.holder: subprocess.Popen[bytes] | None = None
        self.net_inode = 0
        self.mnt_inode = 0
        self._relays: list[_Relay] = []

    @property
    def pid(self) -> int:
        assert self.holder is not None, "the node's namespaces are not made"
        return self.holder.pid

    def start(self) -> NodeNamespaces:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.holder = subprocess.Popen(
                [UNSHARE, "--net", "--mount", "--propagation", "private", "--", "sleep", "infinity"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        own_net = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + 10
        while True:
            if self.holder.poll() is not None:
                raise NodeHostError(f"unshare exited with {self.holder.returncode}: {self.log_path.read_text()}")
            with contextlib.suppress(OSError):
                net = os.stat(f"/proc/{self.pid}/ns/net").st_ino
                if net != own_net and Path(f"/proc/{self.pid}/exe").resolve().name == "sleep":
                    self.net_inode = net
                    self.mnt_inode = os.stat(f"/proc/{self.pid}/ns/mnt").st_ino
                    return self
            if time.monotonic() > deadline:
                raise NodeHostError("the node's namespaces were not made within 10 s")
            time.sleep(0.02)

    def command(self, argv: Sequence[str], *, mount: bool = True) -> list[str]:
        """``argv`` run inside the node's network namespace (and its mount namespace)."""
        return [NSENTER, f"--target={self.pid}", "--net", *(["--mount"] if mount else []), "--", *argv]

    def run(self, *argv: str, mount: bool = True, timeout: float = 60, stdin: IO[bytes] | None = None) -> str:
        """Run a command inside (``stdin``: a file or pipe to read from); its output, or NodeHostError with it."""
        done = subprocess.run(
            self.command(argv, mount=mount),
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise NodeHostError(
                f"{' '.join(argv)} in the node's namespaces exited with {done.returncode}: "
                f"{(done.stderr or done.stdout).decode(errors='replace').strip()}"
            )
        return done.stdout.decode(errors="replace")

    def inside(self, call: Callable[[], T]) -> T:
        """Run ``call`` on a thread that has joined the node's network namespace: sockets it makes live there."""

        def joined() -> T:
            with open(f"/proc/{self.pid}/ns/net") as namespace:
                if _libc.setns(namespace.fileno(), CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into the node's network namespace: {os.strerror(code)}")
            return call()

        return _in_thread(joined)

    def relay(self, listen_host: str, listen_port: int, target_port: int, name: str) -> _Relay:
        """Listen on ``listen_host:listen_port`` inside the node's network namespace and relay each connection
        to ``127.0.0.1:target_port`` on this machine: how the node and its pods reach what the test serves."""
        family = socket.AF_INET6 if ":" in listen_host else socket.AF_INET
        listener = self.inside(lambda: socket.create_server((listen_host, listen_port), family=family, backlog=64))
        relay = _Relay(listener, name, lambda _: socket.create_connection(("127.0.0.1", target_port), timeout=5))
        self._relays.append(relay)
        return relay.start()

    def connect_proxy(self, listener: socket.socket) -> _Relay:
        """An HTTP CONNECT proxy on ``listener`` (a socket of this machine) whose connections are opened
        inside the node's network namespace: the API server's way to the kubelet and the pods (its egress
        selector, tests/e2e/control_plane.py). It may be made before the namespaces are: a connection that
        arrives before them is refused."""
        relay = _Relay(listener, "node-dialer", self._dial_connect)
        self._relays.append(relay)
        return relay.start()

    def _dial_connect(self, client: socket.socket) -> socket.socket:
        client.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk or len(head) > 8192:
                raise OSError("no complete CONNECT request")
            head += chunk
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or not port.isdigit() or self.holder is None or self.holder.poll() is not None:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            raise OSError(f"cannot connect {target} into the node")
        upstream = self.inside(lambda: socket.create_connection((host.strip("[]"), int(port)), timeout=5))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        client.settimeout(None)
        return upstream

    def stop(self) -> None:
        for relay in self._relays:
            relay.stop()
        self._relays.clear()
        if self.holder is not None and self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
            self.holder.wait(timeout=10)


@dataclass
class _Relay:
    """One listening socket and its accept loop (``NodeNamespaces.relay``, ``connect_proxy``): each
    connection's other end comes from ``upstream``, which raises OSError when there is none."""

    listener: socket.socket
    name: str
    upstream: Callable[[socket.socket], socket.socket]
    connections: int = 0
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _open: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(RELAY_MAX_CONNECTIONS))

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> _Relay:
        threading.Thread(target=self._accept, name=f"relay-{self.name}", daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._open.acquire(blocking=False):
                self.refused += 1
                client.close()
                continue
            threading.Thread(target=self._connect, args=(client,), name=f"relay-{self.name}", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = self.upstream(client)
        except OSError:
            self._open.release()
            self.refused += 1
            client.close()
            return
        upstream.settimeout(None)
        self.connections += 1
        done = threading.Barrier(2, action=self._open.release)
        for source, target in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, target, done), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, done: threading.Barrier) -> None:
        try:
            _pump(source, target)
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait(timeout=60)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept loop (close alone would not)
        with contextlib.suppress(OSError):
            self.listener.close()


# ------------------------------------------------------------------------------------ the lock and state
@contextlib.contextmanager
def node_lock(timeout: float, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the machine-wide node lock (waiting up to ``timeout`` for another run's node)."""
    with open(LOCK_PATH, "a") as handle:
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    say(f"waiting for another run's node to stop ({LOCK_PATH})")
                    announced = True
                if time.monotonic() > deadline:
                    raise NodeHostError(
                        f"another run kept the node lock {LOCK_PATH} for {timeout:.0f} s; one node runs at a time"
                    ) from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class HostState:
    """What a running node holds on the machine: written at start, removed at the end of teardown."""

    holder_pid: int = 0
    net_inode: int = 0
    mnt_inode: int = 0
    state_dir: str = ""
    programs: list[str] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)  # the machine's values before the kubelet ran

    def save(self) -> None:
        STATE_PATH.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load() -> HostState | None:
        try:
            return HostState(**json.loads(STATE_PATH.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def clear() -> None:
        STATE_PATH.unlink(missing_ok=True)


def sweep_previous(say: Callable[[str], None]) -> None:
    """Undo what a node left when its run was killed before its teardown (under the node lock)."""
    previous = HostState.load()
    if previous is None and not any(d.exists() for d in cgroup_dirs()):
        return
    previous = previous or HostState()
    say("a previous run's node was not torn down: removing what it left")
    stop_processes(previous, say)
    remove_cgroups(say)
    restore_sysctls(previous.sysctls, say)
    HostState.clear()


# ------------------------------------------------------------------------------------ teardown steps
def node_processes(state: HostState) -> dict[int, str]:
    """Every process of the node: in its namespaces, in its cgroups, or running one of its programs."""
    found: dict[int, str] = {}
    programs = {Path(p).name for p in state.programs}
    for cgroup in cgroup_dirs():
        for procs in cgroup.rglob("cgroup.procs") if cgroup.exists() else ():
            with contextlib.suppress(OSError):
                for number in procs.read_text().split():
                    found[int(number)] = f"in cgroup {procs.parent}"
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            if state.net_inode and os.stat(entry / "ns" / "net").st_ino == state.net_inode:
                found.setdefault(pid, "in the node's network namespace")
            elif state.mnt_inode and os.stat(entry / "ns" / "mnt").st_ino == state.mnt_inode:
                found.setdefault(pid, "in the node's mount namespace")
            elif programs and Path(os.readlink(entry / "exe")).name in programs:
                found.setdefault(pid, "running a node program")
    return {pid: f"{why}: {_cmdline(pid)}" for pid, why in found.items()}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "(gone)"


def stop_processes(state: HostState, say: Callable[[str], None], grace: float = 10.0) -> None:
    """SIGKILL every process of the node (its programs were stopped gracefully before) until none is left."""
    deadline = time.monotonic() + grace
    while True:
        found = node_processes(state)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            say(f"processes of the node still alive after SIGKILL: {found}")
            return
        time.sleep(0.1)


def remove_cgroups(say: Callable[[str], None]) -> None:
    """Remove the node's cgroup tree, deepest first (each must hold no process)."""
    for root in cgroup_dirs():
        if not root.exists():
            continue
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_cgroup(directory, say)
        _rmdir_cgroup(root, say)


def _rmdir_cgroup(directory: Path, say: Callable[[str], None]) -> None:
    for _ in range(50):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                say(f"could not remove cgroup {directory}: {exc}")
                return
            time.sleep(0.1)  # the last process of it is exiting
    say(f"cgroup {directory} stayed busy")


def make_cgroups() -> None:
    """The kubelet's cgroupRoot must exist in every hierarchy before it starts (it creates the rest)."""
    for directory in cgroup_dirs():
        directory.mkdir(exist_ok=True)
        if not cgroup_v1():
            # v2: the kubelet's cgroups below need the controllers delegated to this one's children
            wanted = (CGROUP_FS / "cgroup.subtree_control").read_text().split()
            (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))


def restore_sysctls(saved: dict[str, str], say: Callable[[str], None]) -> None:
    for name, value in saved.items():
        if read_sysctl(name) != value:
            try:
                write_sysctl(name, value)
            except OSError as exc:
                say(f"could not restore {name}={value}: {exc}")


# ------------------------------------------------------------------------------------ the check
@dataclass(frozen=True)
class HostSnapshot:
    """The machine's side before the node started, for ``leftovers`` to compare against."""

    sysctls: dict[str, str | None]
    links: frozenset[str]
    rules: frozenset[str]
    paths: frozenset[str]

    @staticmethod
    def take(paths: Sequence[str]) -> HostSnapshot:
        return HostSnapshot(
            sysctls={name: read_sysctl(name) for name in WATCHED_SYSCTLS},
            links=frozenset(_links()),
            rules=frozenset(_node_rules()),
            paths=frozenset(p for p in paths if os.path.lexists(p)),
        )


#: the names the node gives its links (all inside its namespace: one on the machine's side is a leak)
NODE_LINK_PREFIXES = ("canode", "cabr")
#: the node's address ranges (node, pods, Services), never on the machine's own interfaces
NODE_ADDRESS = re.compile(r"\b(10\.250\.0\.|10\.244\.|10\.96\.0\.|fd34:ca)")


def _ours(link: str) -> bool:
    return link.startswith(NODE_LINK_PREFIXES)


def _addresses() -> list[str]:
    found = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10, check=False)
    return [" ".join(line.split()[1:4]) for line in found.stdout.splitlines()]


def _links() -> list[str]:
    found = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10, check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in found.stdout.splitlines() if ":" in line]


#: a rule or chain in the machine's own tables that only the node's programs would write
NODE_RULE = re.compile(r"KUBE-|CNI-|kube-proxy|ca-externalgrpc-node|10\.244\.|10\.96\.0\.|10\.250\.0\.|fd34:ca")


def _node_rules() -> list[str]:
    rules = []
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool) is None:
            continue
        done = subprocess.run([tool], capture_output=True, text=True, timeout=30, check=False)
        rules += [f"{tool}: {line}" for line in done.stdout.splitlines() if NODE_RULE.search(line)]
    return rules


def _mounts_of(paths: Sequence[str]) -> list[str]:
    """Mounts, in any process's mount namespace, at or below one of ``paths`` (or of overlays on them)."""
    found: set[str] = set()
    seen_namespaces: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            namespace = os.stat(entry / "ns" / "mnt").st_ino
            if namespace in seen_namespaces:
                continue
            seen_namespaces.add(namespace)
            for line in (entry / "mountinfo").read_text().splitlines():
                fields = line.split()
                where, options = fields[4], " ".join(fields[5:])
                if any(where == p or where.startswith(p.rstrip("/") + "/") or p in options for p in paths):
                    found.add(f"{where} (mount namespace {namespace})")
    return sorted(found)


def leftovers(state: HostState, before: HostSnapshot, watched_paths: Sequence[str]) -> list[str]:
    """Everything of a stopped node still on the machine (module docstring); empty when it all went."""
    found = [f"process {pid} {why}" for pid, why in sorted(node_processes(state).items())]
    found += [f"mount {m}" for m in _mounts_of([state.state_dir, *watched_paths]) if state.state_dir]
    found += [f"cgroup {d}" for d in cgroup_dirs() if d.exists()]
    for kind in ("net", "mnt"):
        inode = state.net_inode if kind == "net" else state.mnt_inode
        holders = [e.name for e in Path("/proc").iterdir() if e.name.isdigit() and _ns_inode(e, kind) == inode]
        if inode and holders:
            found.append(f"the node's {kind} namespace is still held by {holders}")
    found += [
        f"link {name} (the node's, on the machine's side)" for name in set(_links()) - before.links if _ours(name)
    ]
    found += [f"address {a} on the machine's side" for a in _addresses() if NODE_ADDRESS.search(a)]
    found += [f"rule {rule}" for rule in set(_node_rules()) - before.rules]
    for name, value in before.sysctls.items():
        now = read_sysctl(name)
        if now != value:
            found.append(f"kernel setting {name} is {now}, was {value}")
    found += [f"path {p} (created by the node)" for p in watched_paths if os.path.lexists(p) and p not in before.paths]
    return found


def _ns_inode(entry: Path, kind: str) -> int:
    try:
        return os.stat(entry / "ns" / kind).st_ino
    except OSError:
        return 0
