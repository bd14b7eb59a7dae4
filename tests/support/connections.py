"""Which TCP connections this test process holds to a server port, read from /proc (no tooling needed)."""

from __future__ import annotations


def client_ports(server_port: int) -> set[int]:
    """Local ports of this process's established TCP connections to ``server_port`` (its clients' side)."""
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, remote, state = fields[1], fields[2], fields[3]
                if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports
