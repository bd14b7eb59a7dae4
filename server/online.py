"""``validate --online``: every backend's read-only preflight against its cloud (providers/preflight.py).

Each backend gets the adapter the server would build from its settings, with a write gate that refuses every
cloud-changing request before it is sent, so nothing here can change the cloud whatever a check calls. What
spans backends is checked here: a ``node_groups`` override must name a group its backend lists, and no two
backends may serve the same group.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from providers.config_errors import ConfigProblem
from providers.errors import NotLeader
from providers.preflight import Preflight
from server.clouds import cloud_type
from server.config import BackendConfig, ServerConfig


@dataclass(frozen=True)
class BackendCheck:
    name: str
    cloud: str
    run: Preflight


def refuse_writes(what: str) -> float | None:
    """The adapters' write gate during ``validate --online``: no write leaves this process."""
    raise NotLeader(f"validate --online never writes to the cloud; {what} was not sent")


def setting_name(prefix: str, origins: Mapping[str, str], key: str) -> str:
    """``key`` of a backend's cloud mapping as ``validate`` names it: the variable that set it (and the key
    it set), the ``*_env`` key that named the variable, or the key itself."""
    origin = origins.get(key)
    if origin is None:
        return f"{prefix}.{key}"
    if origin.startswith("environment variable "):
        return f"{origin} (for {prefix}.{key})"
    return origin


def check_backend(index: int, backend: BackendConfig) -> BackendCheck:
    cloud = cloud_type(backend.type)
    run = Preflight(functools.partial(setting_name, f"backends[{index}].{backend.type}", backend._origins))
    if cloud.preflight is None:
        run.not_checked(f"{backend.type} has no online checks")
        return BackendCheck(backend.name, backend.type, run)
    adapter = cloud.build_adapter(backend.cloud)
    adapter.guard_writes(refuse_writes)
    try:
        cloud.preflight(adapter, run)
    finally:
        adapter.close()
    if run.ok:
        listed = {group.id for group in run.groups}
        for group_id in backend.node_groups:
            if group_id not in listed:
                run.problems.append(
                    ConfigProblem(
                        f"backends[{index}].node_groups.{group_id}",
                        f"names no node group of this backend (it serves {', '.join(sorted(listed)) or 'none'})",
                        "use a group id listed here, or remove the entry",
                    )
                )
    return BackendCheck(backend.name, backend.type, run)


def check_backends(config: ServerConfig) -> list[BackendCheck]:
    checks = [check_backend(index, backend) for index, backend in enumerate(config.backends)]
    owner: dict[str, int] = {}
    for index, check in enumerate(checks):
        shared = sorted({group.id for group in check.run.groups if owner.setdefault(group.id, index) != index})
        if shared:
            first = owner[shared[0]]
            check.run.problems.append(
                ConfigProblem(
                    f"backends[{index}]",
                    f"serves the same node group(s) as backends[{first}] ({', '.join(shared)}): one cluster twice",
                    "remove one of the two backends",
                )
            )
    return checks
