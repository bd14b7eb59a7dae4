"""Check a CA externalgrpc ``--cloud-config`` file the way the CA reads it at start-up.

The CA (1.29 and later) turns the YAML into JSON and decodes it into five string keys, matching key
names without regard to case and ignoring unknown ones: ``address`` (split as host:port), ``cert``,
``key``, ``cacert`` (file paths) and ``grpc_timeout`` (a Go duration string). With ``cert`` set it
reads all three files, loads the certificate with its key and the CA bundle, and exits on any
failure; with ``cert`` empty it connects in plaintext whatever ``key`` and ``cacert`` say. CA 1.28
and older match the lower-case names only and have no ``grpc_timeout``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from providers.config_values import parse_go_duration
from server.pem_files import ca_bundle_problem, key_pair_problem, unreadable

KEYS = ("address", "cert", "key", "cacert", "grpc_timeout")
# What Go's net.SplitHostPort accepts: host:port, [host]:port, [host%zone]:port; the host may be empty.
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>[^:\[\]]*)$")


@dataclass
class CloudConfigCheck:
    problems: list[str] = field(default_factory=list)  # each would stop the CA at start-up (or every call)
    unchecked: list[str] = field(default_factory=list)  # left out by --offline
    address: tuple[str, int] | None = None  # (host, port) the CA dials, when 'address' is valid
    tls: bool = False  # a non-empty 'cert': the CA dials with TLS (an empty one means plaintext)


def check_cloud_config(path: Path, *, offline: bool = False) -> CloudConfigCheck:
    result = CloudConfigCheck()
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        result.problems.append(f"cannot read the file: {err.strerror}")
        return result
    except yaml.YAMLError as err:
        result.problems.append(f"not valid YAML: {err}")
        return result
    if not isinstance(raw, dict):
        result.problems.append("the cloud-config must be a mapping with at least 'address'")
        return result
    values = _as_the_ca_reads_it(raw, result)
    _check_address(values.get("address"), result)
    result.tls = bool(values.get("cert"))
    _check_tls_files(values, offline, result)
    _check_timeout(values.get("grpc_timeout"), result)
    return result


def _as_the_ca_reads_it(raw: dict[Any, Any], result: CloudConfigCheck) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = str(name)
        known = next((k for k in KEYS if k == key.lower()), None)
        if known is None:
            result.problems.append(f"unknown key {key!r} is ignored by the CA; check its spelling ({', '.join(KEYS)})")
        elif known != key:
            result.problems.append(f"key {key!r}: CA 1.28 and older ignore it; write it as {known!r}")
            values[known] = value
        else:
            values[known] = value
    for key in ("address", "cert", "key", "cacert"):
        # Scalars become strings (the CA's YAML-to-JSON step does the same for string fields).
        if isinstance(values.get(key), bool | int | float):
            values[key] = str(values[key]).lower() if isinstance(values[key], bool) else str(values[key])
    return values


def _check_address(address: Any, result: CloudConfigCheck) -> None:
    match = _HOST_PORT.match(address) if isinstance(address, str) else None
    if match is None:
        result.problems.append(
            "'address' must be host:port (e.g. 127.0.0.1:8086 or [::1]:8086): the CA exits when it cannot split it"
        )
    elif not match.group("port").isdigit() or not 0 < int(match.group("port")) <= 65535:
        result.problems.append(f"'address' port {match.group('port')!r} is not a port number from 1 to 65535")
    else:
        result.address = (match.group("v6") or match.group("host") or "", int(match.group("port")))


_WILDCARDS = ("0.0.0.0", "::", "")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def listen_mismatch(listen: tuple[str, int], server_tls: bool, check: CloudConfigCheck) -> list[str]:
    """Why a CA with this cloud-config would not reach a server with this ``listen`` (and TLS or not)."""
    if check.address is None:
        return []
    host, port = check.address
    listen_host, listen_port = listen
    problems = []
    shown = f"{listen_host}:{listen_port}" if ":" not in listen_host else f"[{listen_host}]:{listen_port}"
    if listen_port != 0 and port != listen_port:
        problems.append(
            f"'address' port {port} is not the server's listen port ({shown}): the CA would dial a port nobody "
            f"serves. Fix: use port {listen_port} in 'address', or change listen"
        )
    loopback_dial = host in _LOOPBACK_NAMES or host.startswith("127.")
    loopback_listen = listen_host in _LOOPBACK_NAMES or listen_host.startswith("127.")
    if listen_host not in _WILDCARDS and loopback_listen and not loopback_dial:
        problems.append(
            f"'address' host {host!r} is not loopback but the server listens on {shown} only: a CA outside the "
            "server's pod cannot reach it. Fix: the sidecar layout dials 127.0.0.1; a separate server listens "
            "on 0.0.0.0 with tls"
        )
    elif loopback_dial and listen_host not in _WILDCARDS and not loopback_listen:
        problems.append(
            f"'address' dials loopback ({host}) but the server listens on {shown}, not on loopback. Fix: listen on "
            "127.0.0.1 for a sidecar"
        )
    if check.tls and not server_tls:
        problems.append(
            "'cert' is set, so the CA dials with TLS, but the server config has no tls: the handshake fails. Fix: "
            "empty cert, key and cacert for plaintext, or configure tls in the server config"
        )
    elif server_tls and not check.tls:
        problems.append(
            "'cert' is empty, so the CA dials plaintext, but the server config serves TLS: every call fails. Fix: "
            "set cert, key and cacert (the client certificate and the CA that signed the server's)"
        )
    return problems


def _check_tls_files(values: dict[str, Any], offline: bool, result: CloudConfigCheck) -> None:
    cert, key, cacert = (values.get(name) for name in ("cert", "key", "cacert"))
    if not cert:
        if key or cacert:
            result.problems.append(
                "'key'/'cacert' are set but 'cert' is empty: the CA then connects in PLAINTEXT; set 'cert' too"
            )
        return
    paths: dict[str, Path] = {}
    for name, value in (("cert", cert), ("key", key), ("cacert", cacert)):
        if not isinstance(value, str) or not value:
            result.problems.append(f"'cert' is set, so '{name}' is required (the CA exits without it)")
            continue
        # The CA opens the path as written, relative to its own working directory, not to this file.
        paths[name] = Path(value)
    if offline:
        result.unchecked += [f"'{name}': file {path} not read (offline)" for name, path in paths.items()]
        return
    for name, path in list(paths.items()):
        reason = unreadable(path)
        if reason:
            result.problems.append(f"'{name}': {reason} (the CA exits at start-up); mount it or fix the path")
            del paths[name]
    if "cert" in paths and "key" in paths:
        reason = key_pair_problem(paths["cert"], paths["key"])
        if reason:
            result.problems.append(f"'cert'/'key': {reason} (the CA exits at start-up)")
    if "cacert" in paths:
        reason = ca_bundle_problem(paths["cacert"])
        if reason:
            result.problems.append(f"'cacert': {reason} (the CA exits at start-up)")


def _check_timeout(timeout: Any, result: CloudConfigCheck) -> None:
    if timeout is None:
        return
    try:
        seconds = parse_go_duration(timeout) if isinstance(timeout, str) else None
    except ValueError:
        seconds = None
    if seconds is None:
        result.problems.append(
            "'grpc_timeout' must be a Go duration string such as \"10s\" "
            "(a bare number fails to parse and the CA exits)"
        )
    elif seconds <= 0:
        result.problems.append("'grpc_timeout' of zero or less makes every CA call fail at once; use e.g. \"10s\"")
