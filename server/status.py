"""``ca-externalgrpc status``: a table of node groups, sizes and instances from a running server."""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import diagnostics_pb2 as dpb
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from protos.diagnostics_pb2_grpc import DiagnosticsStub
from providers.errors import printable

STATES = {1: "running", 2: "creating", 3: "deleting", 0: "unknown"}
#: exit status when the server answers but a backend is unhealthy (1: the server could not be asked, 2: usage)
UNHEALTHY = 3
BACKEND_HEALTH = "ca-externalgrpc.backend."


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


@dataclass(frozen=True)
class BackendLine:
    name: str
    cloud: str
    healthy: bool
    state: str
    groups: int
    age: str
    last_error: str
    check: str


def collect(channel: grpc.Channel, timeout: float) -> tuple[list[dict[str, object]], list[BackendLine]]:
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
                "name": _field(group.debug, "name") or "-",
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
    return rows, backend_lines(channel, rows, timeout)


def backend_lines(channel: grpc.Channel, rows: list[dict[str, object]], timeout: float) -> list[BackendLine]:
    """Every configured backend, from the server's Diagnostics service (protos/diagnostics.proto); a server
    without it (an older release) is asked the gRPC health of the backends its groups name."""
    try:
        answer = DiagnosticsStub(channel).Backends(dpb.BackendsRequest(), timeout=timeout)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        return _backends_from_health(channel, rows, timeout)
    return [
        BackendLine(
            b.name,
            b.cloud,
            b.healthy,
            b.state,
            b.groups,
            f"{b.snapshot_age_seconds:.0f}s" if b.HasField("snapshot_age_seconds") else "-",
            b.last_error,
            b.check,
        )
        for b in answer.backends
    ]


def _backends_from_health(channel: grpc.Channel, rows: list[dict[str, object]], timeout: float) -> list[BackendLine]:
    health = health_pb2_grpc.HealthStub(channel)
    found: list[BackendLine] = []
    for name in dict.fromkeys(str(r["backend"]) for r in rows if r.get("backend") != "?"):
        try:
            status = health.Check(health_pb2.HealthCheckRequest(service=BACKEND_HEALTH + name), timeout=timeout).status
        except grpc.RpcError:
            continue
        serving = status == health_pb2.HealthCheckResponse.SERVING
        ages = sorted({str(r["snapshot_age"]) for r in rows if r.get("backend") == name})
        groups = sum(1 for r in rows if r.get("backend") == name)
        state = "serving" if serving else "stale"
        found.append(BackendLine(name, "?", serving, state, groups, ", ".join(ages), "", ""))
    return found


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
    return " ".join(w for w in debug.split() if not w.startswith(("backend=", "synced=", "name="))) or "-"


def render(rows: list[dict[str, object]], backends: list[BackendLine]) -> str:
    cols = [
        "id",
        "name",
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
    # Everything shown comes from the server, which may quote a cloud or a proxy (or be an older release
    # that did not escape): nothing a terminal would act on is printed as it is.
    table = [[printable(str(row.get(c, 0))) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in table]
    if not rows:
        if backends and all(b.healthy for b in backends):
            lines.append("(no node group: no pool of the configured clusters has autoscaling enabled)")
        else:
            lines.append("(no node group)")
    lines.append("")
    for b in backends:
        word = "healthy" if b.healthy else "UNHEALTHY"
        cloud = f" ({b.cloud})" if b.cloud and b.cloud != "?" else ""
        line = f"backend {b.name}{cloud}: {word}, {b.state}, {b.groups} group(s), snapshot age {b.age}"
        lines.append(printable(line))
        if b.last_error:
            lines.append(f"  last error: {printable(b.last_error)}")
        if b.check:
            lines.append(f"  check: {printable(b.check)}")
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
            print(f"error: {address}: {err.code().name}: {printable(err.details() or '')}", file=sys.stderr)
            return 1
    print(render(rows, backends))
    if any(not b.healthy for b in backends):
        unhealthy = printable(", ".join(b.name for b in backends if not b.healthy))
        print(f"error: unhealthy backend(s): {unhealthy}", file=sys.stderr)
        return UNHEALTHY
    return 0
