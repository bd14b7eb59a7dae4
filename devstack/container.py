"""Our server as a container: the image ``make image`` builds, run by podman as the manifests run it.

``ContainerServer`` is the harness's ``ServerProcess`` with ``podman run`` in place of the child
process: a non-root user (the image's 65532), a read-only root filesystem, every capability dropped,
the config mounted read-only at ``/etc/ca-externalgrpc`` (the ConfigMap's place), the credentials
given as environment variables from an env file (the Secret's ``envFrom``) and a writable ``/tmp``
(the manifests' ``emptyDir``), on host networking so that it reaches the simulators on 127.0.0.1 and
the host reaches it. It learns its bound addresses from the ``--ready-file`` it writes into that
``/tmp``, as the child process does.

Every podman call goes through ``podman_env``: ``CONTAINERS_CONF`` points at ``deploy/containers.conf``
unless it is set already. An image is marked with a digest of the sources it was built from
(``SOURCE_LABEL``), so a test can tell a missing or stale image ("run make image") from a failure.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import tomllib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from devstack.harness import REPO_ROOT, START_TIMEOUT_SECONDS, ChildProcess, ServerProcess, write_config

PODMAN_CONF = REPO_ROOT / "deploy" / "containers.conf"
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
#: the variable naming the image the container tests run (make passes IMAGE through it)
IMAGE_ENV = "CA_EXTERNALGRPC_IMAGE"
#: the image label holding the digest of the sources the image was built from
SOURCE_LABEL = "io.github.ca-externalgrpc.source-digest"
#: the image's user (deploy/Dockerfile USER), which owns the writable /tmp
RUN_AS_UID = 65532
#: where the manifests mount the server config, and the path the image's CMD reads
CONFIG_DIR = "/etc/ca-externalgrpc"


class PodmanError(RuntimeError):
    """podman failed; the message has its output."""


def default_image() -> str:
    """``localhost/ca-externalgrpc-server:<version>``, or what $CA_EXTERNALGRPC_IMAGE names."""
    if os.environ.get(IMAGE_ENV):
        return qualified(os.environ[IMAGE_ENV])
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"localhost/ca-externalgrpc-server:{version}"


def qualified(image: str) -> str:
    """An image name as podman stores a local build: ``name:tag`` becomes ``localhost/name:tag``."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"localhost/{image}"


def podman_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("CONTAINERS_CONF", str(PODMAN_CONF))
    return env


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise PodmanError(f"podman {' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


# ---------------------------------------------------------------------------------------------- sources
def build_inputs() -> Iterator[Path]:
    """The files the image is built from: the Dockerfile, .dockerignore, and what .dockerignore lets into
    the build context, except the native wheel (dist/), which is built from native/'s sources."""
    yield DOCKERFILE
    yield DOCKERIGNORE
    for line in DOCKERIGNORE.read_text().splitlines():
        if not line.startswith("!") or line.startswith("!dist/"):
            continue
        path = REPO_ROOT / line[1:].rstrip("/")
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        elif path.is_file():
            yield path


def source_digest() -> str:
    digest = hashlib.sha256()
    for path in build_inputs():
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def image_problem(image: str) -> str | None:
    """Why ``image`` cannot stand for this checkout (missing, or built from other sources), or None."""
    found = podman("image", "inspect", "--format", f'{{{{index .Labels "{SOURCE_LABEL}"}}}}', image, check=False)
    if found.returncode != 0:
        return f"there is no image {image}: run make image"
    if found.stdout.strip() != source_digest():
        return f"the image {image} was built from other sources than this checkout's: run make image"
    return None


# ---------------------------------------------------------------------------------------------- server
class ContainerServer(ServerProcess):
    """The server image run by podman like the manifests run it (module docstring); the reads, stops and
    addresses of ``ServerProcess``. ``credentials`` become the container's environment (the Secret)."""

    def __init__(
        self,
        image: str,
        raw_config: Mapping[str, Any],
        credentials: Mapping[str, str],
        workdir: Path,
        *,
        name: str = "ours",
        log_path: Path | None = None,
        start_timeout: float = START_TIMEOUT_SECONDS,
        extra_args: Sequence[str] = (),
    ) -> None:
        root = workdir / name
        config_dir, tmp = root / "config", root / "tmp"
        config_dir.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(exist_ok=True)
        os.chown(tmp, RUN_AS_UID, RUN_AS_UID)  # the emptyDir: writable by the image's user only
        tmp.chmod(0o700)
        self.config_path = write_config(config_dir / "config.yaml", raw_config)
        self.config_path.chmod(0o644)
        env_file = root / "credentials.env"
        env_file.write_text("".join(f"{key}={value}\n" for key, value in credentials.items()))
        env_file.chmod(0o600)
        self.ready_path = tmp / "ready.json"
        self.ready_path.unlink(missing_ok=True)
        self.image = image
        self.container_name = f"ca-externalgrpc-{name}-{uuid.uuid4().hex[:10]}"
        self.credentials = None  # plaintext gRPC on loopback, as in the sidecar
        self.start_timeout = start_timeout
        self.restarts = 0
        self.command = [
            "podman", "run", "--rm", "--pull=never", "--name", self.container_name,
            "--network=host", "--read-only", f"--user={RUN_AS_UID}:{RUN_AS_UID}",
            "--cap-drop=all", "--security-opt=no-new-privileges",
            f"--volume={config_dir}:{CONFIG_DIR}:ro", f"--volume={tmp}:/tmp",
            f"--env-file={env_file}", *extra_args, image,
        ]  # fmt: skip
        # The image's default command with the ready file added (in /tmp, which the host can read).
        argv = [*self.command, "serve", "--config", f"{CONFIG_DIR}/config.yaml", "--ready-file", "/tmp/ready.json"]
        ChildProcess.__init__(self, argv, env=podman_env(), log_path=log_path, name=name)
        self._await_ready()

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send ``sig`` to the server in the container (as the kubelet does) and wait; its exit status.

        The signal goes through ``podman kill``, not to the podman client: a SIGKILL to the client
        would leave the container running."""
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        if self.process.poll() is None:
            podman("kill", f"--signal={sig.name}", self.container_name, check=False)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                podman("kill", "--signal=KILL", self.container_name, check=False)
                self.process.wait(timeout=30)
        self._join_output()
        podman("rm", "--force", "--ignore", "--time=0", self.container_name, check=False)
        return int(self.process.returncode)
