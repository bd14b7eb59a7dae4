"""Check a CA externalgrpc --cloud-config file the way the CA will read it (protocol doc section 6)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def check_cloud_config(path: Path) -> list[str]:
    """Return the problems a CA would hit (fatal at its start-up), or [] when the file is good."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        return [f"cannot read the file: {err.strerror}"]
    except yaml.YAMLError as err:
        return [f"not valid YAML: {err}"]
    if not isinstance(raw, dict):
        return ["the cloud-config must be a mapping with at least 'address'"]
    problems = []
    address = raw.get("address")
    if not isinstance(address, str) or not re.match(r"^(\[[^\]]+\]|[^:\[\]]+):\d+$", address):
        problems.append("'address' must be host:port (e.g. 127.0.0.1:8086) — the CA exits when it cannot split it")
    cert, key, cacert = raw.get("cert"), raw.get("key"), raw.get("cacert")
    if cert:
        for name, value in (("key", key), ("cacert", cacert)):
            if not value:
                problems.append(f"'cert' is set, so '{name}' is required (the CA exits without it)")
    elif key or cacert:
        problems.append("'key'/'cacert' are set but 'cert' is empty: the CA then connects in PLAINTEXT; set 'cert' too")
    timeout = raw.get("grpc_timeout")
    if timeout is not None and (not isinstance(timeout, str) or not _GO_DURATION.match(timeout)):
        problems.append("'grpc_timeout' must be a Go duration string such as \"10s\" (a bare number fails to parse)")
    elif isinstance(timeout, str) and re.fullmatch(r"0+(\.0+)?(ns|us|µs|ms|s|m|h)", timeout):
        problems.append("'grpc_timeout' of zero makes every CA call fail; use e.g. \"5s\"")
    unknown = sorted(set(raw) - {"address", "cert", "key", "cacert", "grpc_timeout"})
    if unknown:
        problems.append(f"unknown keys {unknown} are ignored by the CA; check their spelling")
    return problems
