"""A tutorial of docs/tutorials/ walked on the real node (tests/e2e/test_node_tutorials.py): every command
the page shows, taken from the page, run by bash in the run's cluster as a reader runs it.

What stands in for the reader's world, and the only changes the walk makes to what the page says:

- **the values** of the page's first step (tests/support/docpages.py): the simulated cloud's cluster,
  credentials and pool, and the registry below;
- **a private registry** (``PrivateRegistry``): go-containerregistry's registry behind a login
  (tests/e2e/nodegomod/registry), on this machine's loopback and, at the same address, on the node's own
  loopback (a relay), so that the image name the reader pushes is the one the node pulls. It speaks
  plain HTTP: podman is told so by a registries.conf of the walk's own (``CONTAINERS_REGISTRIES_CONF``),
  containerd allows it for a loopback registry. It refuses any request without the page's login, so a
  pull without the pull secret fails;
- **the chart repository**: the URL of ``helm repo add`` names a repository the walk serves on loopback,
  holding the official chart at the version the page pins, packaged from the CA module (the chart
  tests/deploy renders);
- **the way to the simulated cloud**: added to the credentials Secret right after the page creates it
  (``NodeEnvironment.cloud_way``), and, for a ``validate --online`` the page runs on the reader's
  machine, ``SCW_API_URL`` in the shell's environment (Scaleway), or the interception proxy's
  ``HTTPS_PROXY`` and CA bundle exported before that one block (Bizfly);
- **the CA's loop timings** (``WALK_TIMINGS``): the e2e suite's short ones (tests/e2e/node_layouts.py),
  and a short recheck of nodes found unremovable (the CA sets a node aside for 5 minutes when it sees
  its pods' ReplicaSet gone before the pods, as deleting the page's deployment does), added to each
  ``helm install`` and ``upgrade`` of the chart, or patched into a kustomize release after it rolled
  out, so that a scale-down takes seconds rather than the 10 minutes the page announces.

``Walk`` records each block it ran; ``finish`` fails when a block of the page was not run, or an
inline ``kubectl``/``helm`` command of its text, so a command added to a page without its walk fails.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devstack.container import podman_env
from tests.deploy.chart import CA_1_36_1, chart_dir, chart_version
from tests.e2e.node import Relay
from tests.e2e.node_cluster import NodeEnvironment
from tests.e2e.node_layouts import CA_TIMING_FLAGS
from tests.e2e.processes import ManagedProcess
from tests.support.docpages import VALUES_HEADING, Tutorial, checked, commands
from tests.support.gobuild import binary_path

REPO = Path(__file__).resolve().parents[2]
WALK_TIMINGS = {**CA_TIMING_FLAGS, "unremovable-node-recheck-timeout": "5s"}
REGISTRY_PROGRAM = "node-registry"
CHART_REPOSITORY = "https://kubernetes.github.io/autoscaler"


class PrivateRegistry:
    """A registry that wants ``user`` and ``password``, on this machine and on the node at one address."""

    def __init__(self, env: NodeEnvironment, user: str, password: str) -> None:
        self.env, self.user = env, user
        self.log_path = env.workdir / "logs" / "registry.log"
        self.process = ManagedProcess(
            "registry",
            [str(binary_path(REGISTRY_PROGRAM)), "-listen", "127.0.0.1:0"],
            self.log_path,
            env={**os.environ, "REGISTRY_USER": user, "REGISTRY_PASSWORD": password},
        ).start()
        self.process.wait_until(lambda: "listening on" in self.log_path.read_text(), 30, "listening")
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log_path.read_text())
        assert found, self.log_path.read_text()
        self.port = int(found.group(1))
        relay = env.real_node.add_relay(Relay("registry", self.port, listen_host="127.0.0.1"))
        assert relay.port == self.port, f"the node's loopback has port {self.port} taken"
        self.address = f"127.0.0.1:{self.port}"
        conf = env.workdir / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{self.address}"\ninsecure = true\n')
        self.podman = podman_env(
            {"CONTAINERS_REGISTRIES_CONF": str(conf), "REGISTRY_AUTH_FILE": str(env.workdir / "home" / "auth.json")}
        )

    def pulls(self, repository: str, user: str) -> list[str]:
        """The manifest requests of ``repository`` served to ``user`` by containerd (the node's pulls)."""
        return [
            line
            for line in self.log_path.read_text().splitlines()
            if f"served GET /v2/{repository}/manifests/" in line and f'(user "{user}")' in line and "containerd" in line
        ]

    def stop(self) -> None:
        self.process.stop()


class ChartRepository:
    """The official chart at the pinned version, packaged and served as a Helm repository on loopback."""

    def __init__(self, env: NodeEnvironment) -> None:
        self.folder = env.workdir / "chart-repository"
        self.folder.mkdir(parents=True, exist_ok=True)
        handler = functools.partial(_QuietFiles, directory=str(self.folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        env.helm("package", str(chart_dir(CA_1_36_1)), "--destination", str(self.folder))
        env.helm("repo", "index", str(self.folder), "--url", self.url)
        assert (self.folder / f"cluster-autoscaler-{chart_version(CA_1_36_1)}.tgz").is_file()
        threading.Thread(target=self.server.serve_forever, name="chart-repository", daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass


class Walk:
    """One page's blocks, run in order in one working folder with the page's values (module docstring)."""

    def __init__(
        self, tutorial: Tutorial, env: NodeEnvironment, values: Mapping[str, str], extra_env: Mapping[str, str]
    ) -> None:
        self.tutorial, self.env, self.values = tutorial, env, dict(values)
        # The reader's checkout of this repository: the folders the pages name, with what the commands
        # write kept out of the real one.
        self.cwd = env.workdir / "reader"
        if not self.cwd.exists():
            self.cwd.mkdir(parents=True)
            shutil.copytree(REPO / "deploy", self.cwd / "deploy")
            (self.cwd / ".venv").symlink_to(REPO / ".venv")
        self.shell_env = {**env.operator_env(), **extra_env}
        # the blocks run, as the page has them: the values block runs before every other one
        self.ran: list[str] = [tutorial.block(VALUES_HEADING)]
        self.inline: list[str] = []  # the inline commands run
        self.label = tutorial.path.name  # for the run's summary
        self.took: dict[str, float] = {}  # seconds, per section of the page
        self.started = time.monotonic()

    def run(self, block: str, *, edit: Callable[[str], str] | None = None, timeout: float = 600) -> str:
        """The page's ``block`` (``edit``: the walk's one change to it, module docstring); its output."""
        assert block in self.tutorial.all_blocks(), f"not a block of {self.tutorial.path.name}: {block}"
        started = time.monotonic()
        output = self._shell(edit(block) if edit else block, block.strip(), timeout)
        heading = self.tutorial.heading_of(block)
        self.took[heading] = self.took.get(heading, 0.0) + time.monotonic() - started
        self.ran.append(block)
        return output

    def run_inline(self, command: str, timeout: float = 300) -> str:
        """A command the page shows in its text, run as shown."""
        assert f"`{command}`" in self.tutorial.path.read_text(), command
        output = self._shell(command, command, timeout)
        self.inline.append(command)
        return output

    def _shell(self, script: str, what: str, timeout: float) -> str:
        """``script`` as the reader's one shell runs it: the variables earlier blocks set are still set (the
        page's ``NAME=...`` lines, kept in a file from one block to the next)."""
        state = self.cwd / ".walk-variables.sh"
        names = sorted(set(re.findall(r"(?m)^([A-Z][A-Z0-9_]*)=", "\n".join([*self.ran, script]))))
        carried = f"source {state}\n" if state.exists() else ""
        kept = f"\ndeclare -p {' '.join(names)} > {state} 2> /dev/null || true" if names else ""
        script = carried + script + kept
        done = self.tutorial.run(script, self.values, cwd=self.cwd, env=self.shell_env, timeout=timeout)
        return checked(done, f"{self.tutorial.path.name}: {what}")

    def built_by_the_build_step(self, block: str, check: Callable[[], bool]) -> None:
        """A block the build step runs (``make image``: tests never build), checked by what it made."""
        assert check(), f"{block.strip()}: what it makes is missing"
        self.ran.append(block)

    def summary(self) -> str:
        """One line for the run's summary: the seconds of each section, and of the whole walk."""
        sections = "; ".join(f"{heading} {seconds:.1f} s" for heading, seconds in self.took.items())
        return f"{self.label} walked in {time.monotonic() - self.started:.0f} s: {sections}"

    def finish(self, elsewhere: Sequence[str] = ()) -> None:
        """``elsewhere``: blocks of a choice the page offers, which another walk of the page takes."""
        missed = [b.strip() for b in self.tutorial.all_blocks() if b not in self.ran and b not in elsewhere]
        assert not missed, f"{self.tutorial.path.name}: blocks no walk ran: {missed}"
        unrun = self.tutorial.inline_commands() - set(self.inline)
        assert not unrun, f"{self.tutorial.path.name}: inline commands no walk ran: {sorted(unrun)}"


def with_timings(block: str) -> str:
    """``block`` with ``WALK_TIMINGS`` added to its ``helm install`` or ``upgrade`` of the chart."""
    out = []
    for command in commands(block):
        if re.match(r"helm (-n kube-system )?(install|upgrade) \S+ autoscaler/cluster-autoscaler ", command):
            command = " ".join([command, *(f"--set=extraArgs.{k}={v}" for k, v in WALK_TIMINGS.items())])
        out.append(command)
    edited = "\n".join(out)
    assert edited != "\n".join(commands(block)), f"no helm install or upgrade in {block}"
    return edited


def with_chart_repository(block: str, repository: ChartRepository) -> str:
    assert CHART_REPOSITORY in block
    return block.replace(CHART_REPOSITORY, repository.url)


def deployment_revision(env: NodeEnvironment) -> str:
    found = env.kubectl(
        "-n",
        "kube-system",
        "get",
        "deployment",
        "cluster-autoscaler",
        "-o",
        "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
    )
    return found.strip()


def status_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("backend ")]


def pool_sizes(env: NodeEnvironment, cloud: str, pool: str) -> int:
    if cloud == "scaleway":
        return int(env.scaleway_pool(pool)["size"])
    return int(env.bizfly_pool(pool)["desired_size"])


def wait_pool(env: NodeEnvironment, cloud: str, pool: str, size: int, timeout: float = 300) -> Any:
    return env.wait_for(lambda: pool_sizes(env, cloud, pool) == size, timeout, f"pool {pool} at size {size}")
