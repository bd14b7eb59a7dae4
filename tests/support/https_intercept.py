"""An HTTPS proxy on loopback that answers for a cloud's production host, so an unmodified client reaches a simulator.

The Bizfly client inside the CA (gobizfly) logs in at ``https://manage.bizflycloud.vn/api/token`` whatever
its configuration says. A test of that client (the in-tree CA of the migration scenario, the upstream
example server of the in-tree differential) does what a corporate TLS-inspecting proxy does: the client
runs with ``HTTPS_PROXY`` naming this proxy and ``SSL_CERT_FILE`` naming a throwaway CA (Go and Python's
OpenSSL both honour them); for ``CONNECT manage.bizflycloud.vn:443`` the proxy answers 200, terminates
TLS with a certificate for that host signed by the throwaway CA, and relays each decrypted HTTP request
to the simulator over plain HTTP on loopback. A CONNECT to any other host is refused (403), so nothing
leaves the machine. Loopback addresses are never proxied (Go skips the proxy for them; ``NO_PROXY``
says so to Python), so the calls the service catalog sends to the simulator's own address go direct.

A client that is given the API's address as a URL (``SCW_API_URL``) rather than a proxy gets a port of its
own (``direct``): TLS at once, as the host, with the same certificate, which also names the addresses
given as ``names`` (the real node's, where pods reach that port).
"""

from __future__ import annotations

import http.client
import http.server
import socketserver
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.x509.oid import ExtendedKeyUsageOID

from devstack.certs import new_ca, new_leaf, write_cert, write_key

# Where the in-tree Bizfly client always logs in (and fetches its service catalog).
BIZFLY_PRODUCTION_HOST = "manage.bizflycloud.vn"
# Headers of one hop, not passed on (RFC 9110, 7.6.1); the length is set again for the relayed body.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "content-length"}


@dataclass(frozen=True)
class Relayed:
    """One request the proxy relayed: to which production host, and what."""

    host: str
    method: str
    path: str
    status: int
    at: float  # wall-clock seconds when the answer came back


class InterceptingProxy:
    """``routes``: production host name -> the ``(host, port)`` of the simulator that plays it."""

    def __init__(self, routes: Mapping[str, tuple[str, int]], workdir: Path, names: tuple[str, ...] = ()) -> None:
        self.routes = dict(routes)
        self.relayed: list[Relayed] = []
        self.refused: list[str] = []
        self._direct: list[tuple[_ProxyServer, threading.Thread]] = []
        workdir.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = new_ca("ca-externalgrpc e2e interception CA")
        sans = (*self.routes, *names)
        key, cert = new_leaf(ca_key, ca_cert, "intercepted", ExtendedKeyUsageOID.SERVER_AUTH, sans)
        self.ca_file = workdir / "intercept-ca.pem"
        write_cert(ca_cert, self.ca_file)
        write_cert(cert, workdir / "intercept.pem")
        write_key(key, workdir / "intercept.key")
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(workdir / "intercept.pem", workdir / "intercept.key")
        self._server = _ProxyServer(("127.0.0.1", 0), _ConnectHandler, self)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def env(self) -> dict[str, str]:
        """What a client process needs to go through the proxy and trust it. Besides ``SSL_CERT_FILE`` (Go,
        OpenSSL), the bundles Python HTTP clients prefer when set (our server's among them), which a
        developer machine may already point at the system's bundle."""
        trust = str(self.ca_file)
        return {
            "HTTPS_PROXY": self.url,
            "https_proxy": self.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "SSL_CERT_FILE": trust,
            "REQUESTS_CA_BUNDLE": trust,
            "CURL_CA_BUNDLE": trust,
        }

    def start(self) -> InterceptingProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="https-intercept", daemon=True)
        self._thread.start()
        return self

    def direct(self, host: str) -> int:
        """A loopback port where each connection is TLS as ``host`` at once, its requests relayed to the
        simulator that plays ``host``: for a client that takes the API's URL instead of a proxy."""
        server = _ProxyServer(("127.0.0.1", 0), _DirectHandler, self, host=host)
        thread = threading.Thread(target=server.serve_forever, name=f"https-direct-{host}", daemon=True)
        thread.start()
        self._direct.append((server, thread))
        return int(server.server_address[1])

    def stop(self) -> None:
        for server, thread in [(self._server, self._thread), *self._direct]:
            server.shutdown()
            server.server_close()
            if thread is not None:
                thread.join(timeout=5)


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, proxy: InterceptingProxy, host: str = "") -> None:
        self.proxy = proxy
        self.host = host  # a direct port's host
        super().__init__(address, handler)


class _DirectHandler(socketserver.BaseRequestHandler):
    """One connection to a direct port: TLS as the server's host, then its requests relayed."""

    server: _ProxyServer

    def handle(self) -> None:
        host = self.server.host
        with self.server.proxy.tls.wrap_socket(self.request, server_side=True) as tls:
            _RelayHandler(tls, self.client_address, self.server, host=host, target=self.server.proxy.routes[host])


class _ConnectHandler(http.server.BaseHTTPRequestHandler):
    """Takes the CONNECT; for an intercepted host, speaks TLS as that host on the same connection."""

    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def do_CONNECT(self) -> None:  # noqa: N802 - the stdlib's handler naming
        proxy = self.server.proxy
        host = self.path.rsplit(":", 1)[0]
        target = proxy.routes.get(host)
        if target is None:
            proxy.refused.append(self.path)
            self.send_error(403, f"{host} is not intercepted here")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        # The client waits for the 200 before its ClientHello, so nothing of TLS sits in rfile's buffer.
        with proxy.tls.wrap_socket(self.connection, server_side=True) as tls:
            _RelayHandler(tls, self.client_address, self.server, host=host, target=target)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    """The decrypted requests of one tunnel, each relayed to the simulator (keep-alive as the client asks)."""

    protocol_version = "HTTP/1.1"

    def __init__(
        self, sock: ssl.SSLSocket, client: object, server: _ProxyServer, *, host: str, target: tuple[str, int]
    ) -> None:
        self.host, self.target, self.proxy = host, target, server.proxy
        # The constructor handles the connection to its end (every request of the tunnel).
        super().__init__(sock, client, server)  # type: ignore[arg-type]

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(*self.target, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.proxy.relayed.append(Relayed(self.host, self.command, self.path, answer.status, time.time()))
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay  # noqa: N815 - the stdlib's handler naming

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass
