"""Which host a port binds for the address the config gives (server/http_server.py, ``bindable_host``).

``[::]`` is what the shipped layouts say; on a machine whose kernel has no IPv6 at all it must still
serve, on every IPv4 address, and say so once. The machine's IPv6 is the one thing replaced here.
"""

from __future__ import annotations

import logging

import pytest

from server import http_server


@pytest.mark.parametrize("host", ["::", "[::]", ""])
def test_every_address_stays_both_families_where_the_machine_has_ipv6(monkeypatch, caplog, host: str) -> None:
    monkeypatch.setattr(http_server, "ipv6_available", lambda: True)
    assert http_server.bindable_host(host, "http_listen") == host
    assert not caplog.records


@pytest.mark.parametrize("host", ["::", "[::]"])
def test_every_address_is_every_ipv4_address_where_the_machine_has_no_ipv6(monkeypatch, caplog, host: str) -> None:
    monkeypatch.setattr(http_server, "ipv6_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert http_server.bindable_host(host, "http_listen") == "0.0.0.0"
    (record,) = caplog.records
    assert record.getMessage() == (
        "http_listen: this machine has no IPv6; listening on every IPv4 address (0.0.0.0) instead of [::]"
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1", "[::1]", "::1", "10.1.2.3", "localhost"])
def test_any_other_address_is_bound_as_written(monkeypatch, host: str) -> None:
    monkeypatch.setattr(http_server, "ipv6_available", lambda: False)
    assert http_server.bindable_host(host, "listen") == host


def test_a_machine_with_ipv6_loopback_has_ipv6() -> None:
    if not _can_bind_ipv6():
        pytest.skip("this machine has no IPv6 loopback address to bind")
    assert http_server.ipv6_available()


def _can_bind_ipv6() -> bool:
    try:
        with http_server.socket.create_server(("::1", 0), family=http_server.socket.AF_INET6):
            return True
    except OSError:
        return False
