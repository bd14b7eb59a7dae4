"""Checks of config values that every cloud package (and the server) shares."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from providers.config_errors import ConfigError


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (v4 and v6)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_base_url(key: str, value: str, example: str) -> str:
    """An http(s) base URL without query or fragment; plain http only to a loopback address.

    Credentials travel in every request to a cloud API, so plaintext is only for a local simulator.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"{value!r} is not an http(s) URL", f"write it like {example}")
    if parts.query or parts.fragment:
        raise ConfigError(key, f"{value!r} has a query or fragment", "give only scheme, host, port and path")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigError(
            key,
            f"{value!r} would send credentials unencrypted",
            "use https:// (http is allowed only for loopback test servers)",
        )
    return value.rstrip("/")
