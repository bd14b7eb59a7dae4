"""A loopback HTTPS proxy the tests put in front of the real kube-apiserver (or a cloud simulator) to make it
slow, failing or cut off, request by request, while the server under test keeps its real client.

It terminates TLS with a certificate of the cluster CA (so the server's kubeconfig, with the proxy's address,
trusts it as it trusts the API server) and forwards each HTTP/1.1 request on a connection of its own to the
upstream, as one user: the API server sees the client certificate the proxy was given, so RBAC applies as
without the proxy. What it does to each request is read when the request arrives:

- ``delay``: seconds the request waits before it is forwarded (its answer comes that much later);
- ``response_delay``: seconds the answer waits before it is relayed (the request has had its effect);
- ``handshake_delay``: seconds a new connection waits before its TLS handshake (a slow connect);
- ``mode``: ``"pass"``; ``"error"`` answers ``error_status`` with a Kubernetes Status body and forwards
  nothing; ``"hang"`` accepts and never answers (until the mode changes back or the proxy stops);
  ``"reset"`` closes connections as soon as they send anything, and new ones at once;
- ``before_forward``: a hook called with (method, path) just before a request is forwarded, so a test can
  change the object the request is about in between (a guaranteed 409);
- ``drop_connections()`` closes every client connection now (the client's pool must open new ones).

Every request is logged with when it arrived, when it was forwarded and its answer's status.

Written on the standard library's ``http.server`` and ``http.client`` (about 200 lines): toxiproxy works
on TCP alone (no HTTP error answers, no hook between a read and a write, a Go binary more to build), and
mitmproxy, which could do all of it with addons, brings an event loop and some forty packages into the
test process for what a threaded server does here in a few lines per behaviour.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from devstack.certs import new_leaf, write_cert, write_key

# Headers that describe one hop, not the request: the proxy sets its own.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@dataclass
class ProxiedRequest:
    method: str
    path: str
    arrived: float  # time.monotonic() when the request was read
    forwarded: float | None = None  # when it was sent upstream (None: never)
    status: int | None = None  # the answer's status (None: no answer)


class HttpsProxy:
    """See the module docstring. ``upstream`` is an https:// or http:// URL; ``client_cert``/``client_key``
    the identity presented to an https upstream, ``upstream_ca`` the CA it is verified with."""

    def __init__(
        self,
        upstream: str,
        ca_cert: Path,
        ca_key: Path,
        workdir: Path,
        *,
        client_cert: Path | None = None,
        client_key: Path | None = None,
        upstream_ca: Path | None = None,
        name: str = "proxy",
    ) -> None:
        parts = urlsplit(upstream)
        self._upstream_tls = parts.scheme == "https"
        self._upstream_host = parts.hostname or "127.0.0.1"
        self._upstream_port = parts.port or (443 if self._upstream_tls else 80)
        self._upstream_context: ssl.SSLContext | None = None
        if self._upstream_tls:
            context = ssl.create_default_context(cafile=str(upstream_ca or ca_cert))
            if client_cert is not None and client_key is not None:
                context.load_cert_chain(str(client_cert), str(client_key))
            self._upstream_context = context
        key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        authority = x509.load_pem_x509_certificate(ca_cert.read_bytes())
        serving_key, serving_cert = new_leaf(
            key, authority, name, ExtendedKeyUsageOID.SERVER_AUTH, ("127.0.0.1", "localhost")
        )
        workdir.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = workdir / f"{name}.crt", workdir / f"{name}.key"
        write_cert(serving_cert, cert_path)
        write_key(serving_key, key_path)
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(str(cert_path), str(key_path))
        self.workdir = workdir
        self.name = name
        self.delay = 0.0
        self.response_delay = 0.0
        self.handshake_delay = 0.0
        self.mode = "pass"
        self.error_status = 503
        self.before_forward: Callable[[str, str], None] | None = None
        self.requests: list[ProxiedRequest] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopped = False
        self._clients: set[socket.socket] = set()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"{name}-accept", daemon=True)

    # ------------------------------------------------------------------ control
    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, ca_key: Path, workdir: Path, name: str = "apiserver-proxy") -> HttpsProxy:
        """A proxy in front of the API server of ``kubeconfig``, as its user (client certificate)."""
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        proxy = cls(
            cluster["server"],
            Path(cluster["certificate-authority"]),
            ca_key,
            workdir,
            client_cert=Path(user["client-certificate"]),
            client_key=Path(user["client-key"]),
            name=name,
        )
        proxy._kubeconfig_text = kubeconfig.read_text().replace(cluster["server"], "@PROXY@")
        return proxy

    _kubeconfig_text = ""

    def start(self) -> HttpsProxy:
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self) -> Path:
        """The kubeconfig it was made from, pointing at the proxy."""
        assert self._kubeconfig_text, "made with for_kubeconfig"
        path = self.workdir / f"{self.name}.kubeconfig"
        path.write_text(self._kubeconfig_text.replace("@PROXY@", self.url))
        return path

    def set(
        self,
        *,
        mode: str | None = None,
        delay: float | None = None,
        response_delay: float | None = None,
        handshake_delay: float | None = None,
    ) -> None:
        with self._changed:
            if mode is not None:
                assert mode in ("pass", "error", "hang", "reset"), mode
                self.mode = mode
            if delay is not None:
                self.delay = delay
            if response_delay is not None:
                self.response_delay = response_delay
            if handshake_delay is not None:
                self.handshake_delay = handshake_delay
            self._changed.notify_all()
        if mode == "reset":
            self.drop_connections()

    def drop_connections(self) -> None:
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self.drop_connections()

    def log(self, method: str = "", path_part: str = "") -> list[ProxiedRequest]:
        with self._lock:
            return [r for r in self.requests if (not method or r.method == method) and path_part in r.path]

    # ------------------------------------------------------------------ per connection (server threads)
    def _wait(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        """Sleep ``seconds`` (or, with ``seconds`` < 0, forever) unless stopped or ``until()`` turns true."""
        end = time.monotonic() + seconds
        with self._changed:
            while not self._stopped and not until():
                left = end - time.monotonic() if seconds >= 0 else 1.0
                if left <= 0:
                    return
                self._changed.wait(left)

    def _serve_connection(self, raw: socket.socket, address: Any) -> None:
        with self._lock:
            self._clients.add(raw)
        try:
            if self.handshake_delay:
                self._wait(self.handshake_delay)
            if self.mode == "reset" or self._stopped:
                return
            try:
                tls = self._context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                return
            with self._lock:
                self._clients.add(tls)
            try:
                _Handler(tls, address, self._server)
            finally:
                with self._lock:
                    self._clients.discard(tls)
                with contextlib.suppress(OSError):
                    tls.close()
        finally:
            with self._lock:
                self._clients.discard(raw)
            with contextlib.suppress(OSError):
                raw.close()

    def _upstream(self) -> http.client.HTTPConnection:
        if self._upstream_context is not None:
            return http.client.HTTPSConnection(
                self._upstream_host, self._upstream_port, timeout=120, context=self._upstream_context
            )
        return http.client.HTTPConnection(self._upstream_host, self._upstream_port, timeout=120)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, proxy: HttpsProxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler, bind_and_activate=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, in the connection's own thread, never in the accept loop.
        self.proxy._serve_connection(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with contextlib.suppress(OSError):
            request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-request is expected here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _conn: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - fixed by the base class
        pass

    def handle(self) -> None:
        try:
            super().handle()
        finally:
            if self._conn is not None:
                self._conn.close()

    def _forward(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        entry = ProxiedRequest(self.command, self.path, time.monotonic())
        with proxy._lock:
            proxy.requests.append(entry)
            delay, response_delay = proxy.delay, proxy.response_delay
        if delay:
            proxy._wait(delay)
        mode = proxy.mode
        if mode == "reset" or proxy._stopped:
            self.close_connection = True
            return
        if mode == "hang":
            proxy._wait(-1, lambda: proxy.mode != "hang")
            self.close_connection = True
            return
        if mode == "error":
            self._error(entry, proxy.error_status)
            return
        if proxy.before_forward is not None:
            proxy.before_forward(self.command, self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            if self._conn is None:
                self._conn = proxy._upstream()
            entry.forwarded = time.monotonic()
            self._conn.request(self.command, self.path, body=body, headers=headers)
            answer = self._conn.getresponse()
        except (OSError, http.client.HTTPException):
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self.close_connection = True
            return
        entry.status = answer.status
        if response_delay:
            proxy._wait(response_delay)
        streaming = "watch=" in self.path and answer.getheader("Transfer-Encoding", "") == "chunked"
        self.send_response_only(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        if streaming:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := answer.read1(65536):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        data = answer.read()
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, entry: ProxiedRequest, status: int) -> None:
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"injected by the test proxy: HTTP {status}",
                "reason": "ServiceUnavailable" if status == 503 else "InternalError",
                "code": status,
            }
        ).encode()
        entry.status = status
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


for _method in _METHODS:
    setattr(_Handler, f"do_{_method}", _Handler._forward)
