"""PEM files named by a config (the server's TLS files, the CA's client files): there, readable, loadable.

Both the server (grpcio) and the CA (Go's crypto/tls) read these once at start-up and stop on a bad
one, so the checks here run before either does and say which file is wrong in one line.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file, or None."""
    if not path.exists():
        return f"file {path} does not exist"
    if not path.is_file():
        return f"{path} is not a file"
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as err:
        return f"cannot read {path}: {err.strerror}"
    return None


def key_pair_problem(cert: Path, key: Path) -> str | None:
    """Why the certificate and the private key do not load as one pair (not PEM, or not matching)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as err:
        return f"{cert} and {key} do not load as a PEM certificate and its private key ({err.reason or err})"
    except OSError as err:
        return f"cannot load {cert} and {key}: {err.strerror or err}"
    return None


def ca_bundle_problem(path: Path) -> str | None:
    """Why ``path`` holds no usable PEM CA certificate, or None."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as err:
        return f"{path} holds no PEM CA certificate ({getattr(err, 'reason', None) or err})"
    return None
