"""Plaintext HTTP for kubelet probes and Prometheus: /healthz, /readyz, /metrics.

Kubelet probes cannot present client certificates, so they never go to the (m)TLS gRPC port.
"""

from __future__ import annotations

from typing import Any


def serve_probes(host: str, port: int, running: Any) -> Any:
    from server.metrics import serve_http

    return serve_http(
        host, port, running.metrics, health_fn=lambda: not running._stopped.is_set(), ready_fn=running.ready
    )
