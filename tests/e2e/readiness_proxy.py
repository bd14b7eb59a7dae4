"""A TCP proxy that plays a Kubernetes Service in front of server replicas: new connections go only to
a replica whose /readyz answers 200, as kube-proxy sends them only to Ready endpoints.

Readiness is probed every ``probe_interval`` seconds (the kubelet's periodSeconds) with a one-second
timeout. A connection already open stays with its replica until either side closes it; when a replica
dies its connections close, and the client's reconnection lands on whichever replica is Ready then.
With no Ready replica a new connection is closed at once (a Service without endpoints refuses it).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class Endpoint:
    name: str
    grpc_address: str  # host:port the proxy forwards to
    readyz_url: str
    ready: bool = False
    ready_since: float | None = None  # wall-clock time it last turned Ready


@dataclass
class ProxyRecord:
    """What the proxy did, for the scenario's figures."""

    routed: list[tuple[float, str]] = field(default_factory=list)  # (wall time, endpoint) per connection
    refused: list[float] = field(default_factory=list)  # wall times of connections with no Ready endpoint
    readiness: list[tuple[float, str, bool]] = field(default_factory=list)  # (wall time, endpoint, ready) changes


class ReadinessProxy:
    def __init__(self, endpoints: list[Endpoint], probe_interval: float = 0.5) -> None:
        self.endpoints = endpoints
        self.probe_interval = probe_interval
        self.record = ProxyRecord()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [
            threading.Thread(target=self._probe_loop, name="proxy-probes", daemon=True),
            threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True),
        ]

    def start(self) -> ReadinessProxy:
        self._probe_all()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def ready_endpoint(self) -> Endpoint | None:
        with self._lock:
            ready = [e for e in self.endpoints if e.ready]
        return ready[0] if ready else None

    # What a fail-over scenario asks of the Service, whatever plays it (tests/e2e/failover.py, ``Service``).
    def ready(self) -> str | None:
        """The replica new connections go to now (None: no Ready endpoint)."""
        endpoint = self.ready_endpoint()
        return endpoint.name if endpoint is not None else None

    def ready_since(self, replica: str) -> float | None:
        """Wall-clock time ``replica`` last became a Ready endpoint (None: it is not one)."""
        with self._lock:
            found = [e for e in self.endpoints if e.name == replica and e.ready]
        return found[0].ready_since if found else None

    # ------------------------------------------------------------------ readiness
    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval):
            self._probe_all()

    def _probe_all(self) -> None:
        for endpoint in self.endpoints:
            ok = _answers_200(endpoint.readyz_url)
            with self._lock:
                if ok and not endpoint.ready:
                    endpoint.ready_since = time.time()
                if ok != endpoint.ready:
                    self.record.readiness.append((time.time(), endpoint.name, ok))
                endpoint.ready = ok

    # ------------------------------------------------------------------ forwarding
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            endpoint = self.ready_endpoint()
            if endpoint is None:
                self.record.refused.append(time.time())
                client.close()
                continue
            host, port = endpoint.grpc_address.rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                self.record.refused.append(time.time())
                client.close()
                continue
            upstream.settimeout(None)
            self.record.routed.append((time.time(), endpoint.name))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy bytes one way until either side closes; then close both (the other pump ends too)."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False
