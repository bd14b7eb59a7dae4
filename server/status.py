"""``ca-externalgrpc status``: a table of node groups, sizes and instances from a running server."""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc

STATES = {1: "running", 2: "creating", 3: "deleting", 0: "unknown"}


class UnreadableFile(Exception):
    """A certificate or key file named on the command line cannot be read."""


def _read(flag: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise UnreadableFile(f"cannot read {flag} {path}: {err.strerror or err}") from None


def open_channel(
    address: str, cert: str | None, key: str | None, cacert: str | None, server_name: str | None = None
) -> grpc.Channel:
    if not cert and not cacert:
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read("--cacert", cacert),
        private_key=_read("--key", key),
        certificate_chain=_read("--cert", cert),
    )
    # Through `kubectl port-forward` the address is localhost, which the server certificate does not name.
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, creds, options=options)


def collect(channel: grpc.Channel, timeout: float) -> tuple[list[dict[str, object]], list[tuple[str, str]]]:
    stub = pb_grpc.CloudProviderStub(channel)
    rows: list[dict[str, object]] = []
    for group in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=timeout).nodeGroups:
        target = stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group.id), timeout=timeout).targetSize
        instances = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group.id), timeout=timeout).instances
        states = Counter(STATES.get(i.status.instanceState, "unknown") for i in instances)
        errors = sum(1 for i in instances if i.status.errorInfo.errorCode)
        rows.append(
            {
                "id": group.id,
                "min": group.minSize,
                "max": group.maxSize,
                "target": target,
                "instances": len(instances),
                **states,
                "errors": errors,
                "backend": _field(group.debug, "backend") or "?",
                "snapshot_age": _age(group.debug),
                "template": _template_source(group.debug),
                "debug": _strip_known(group.debug),
            }
        )
    health = health_pb2_grpc.HealthStub(channel)
    backends: list[tuple[str, str]] = []
    try:
        names = _backend_health_names(channel, timeout)
        for name in names:
            status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=timeout).status
            backends.append((name.rsplit(".", 1)[-1], health_pb2.HealthCheckResponse.ServingStatus.Name(status)))
    except grpc.RpcError:
        pass
    return rows, backends


def _field(debug: str, key: str) -> str:
    for word in debug.split():
        if word.startswith(key + "="):
            return word.split("=", 1)[1]
    return ""


def _age(debug: str) -> str:
    """How old the server's view of the group is, from the ``synced=`` time in the debug string."""
    synced = _field(debug, "synced")
    if not synced:
        return "?"
    try:
        at = dt.datetime.strptime(synced, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "?"
    return f"{max((dt.datetime.now(dt.UTC) - at).total_seconds(), 0):.0f}s"


TEMPLATE_MARK = " template="


def _template_source(debug: str) -> str:
    """Where the group's scale-from-zero template comes from: the server puts it last in the debug string
    (``override``, ``learned from node <name> at <time>``, ``cloud``, ``override over ...`` or ``none``)."""
    _, found, source = debug.rpartition(TEMPLATE_MARK)
    return source.strip() if found else "?"


def _strip_known(debug: str) -> str:
    debug = debug.rpartition(TEMPLATE_MARK)[0] if TEMPLATE_MARK in debug else debug
    return " ".join(w for w in debug.split() if not w.startswith(("backend=", "synced="))) or "-"


def _backend_health_names(channel: grpc.Channel, timeout: float) -> list[str]:
    """Backend names come from the 'debug' strings; each starts with 'backend=<name>'."""
    stub = pb_grpc.CloudProviderStub(channel)
    names = []
    for group in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=timeout).nodeGroups:
        if group.debug.startswith("backend="):
            name = group.debug.split()[0].split("=", 1)[1]
            full = f"ca-externalgrpc.backend.{name}"
            if full not in names:
                names.append(full)
    return names


def render(rows: list[dict[str, object]], backends: list[tuple[str, str]]) -> str:
    cols = [
        "id",
        "backend",
        "min",
        "max",
        "target",
        "instances",
        "running",
        "creating",
        "deleting",
        "errors",
        "snapshot_age",
        "template",
        "debug",
    ]
    table = [[str(row.get(c, 0)) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in table]
    if backends:
        lines.append("")
        for name, status in backends:
            ages = sorted({str(r["snapshot_age"]) for r in rows if r.get("backend") == name})
            lines.append(f"backend {name}: {status}" + (f" (snapshot age {', '.join(ages)})" if ages else ""))
    return "\n".join(lines)


def print_status(
    address: str,
    cert: str | None = None,
    key: str | None = None,
    cacert: str | None = None,
    timeout: float = 5.0,
    server_name: str | None = None,
) -> int:
    try:
        channel = open_channel(address, cert, key, cacert, server_name)
    except UnreadableFile as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with channel:
        try:
            rows, backends = collect(channel, timeout)
        except grpc.RpcError as err:
            print(f"error: {address}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    print(render(rows, backends))
    return 0
