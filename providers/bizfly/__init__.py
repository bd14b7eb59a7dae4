"""The Bizfly Cloud Kubernetes Engine cloud (see adapter.py for the facts it follows)."""

from __future__ import annotations

from providers.bizfly.adapter import BizflyAdapter, build_adapter
from providers.bizfly.config import BizflyConfig, parse_config
from providers.bizfly.preflight import preflight
from providers.cloud import CloudType

# Each sync costs 1 + (autoscaled pools) requests; the CA loops every 10 s and reads from memory,
# so syncing every 30 s keeps the API load at a third of upstream's without slowing scale decisions
# (mutations re-read the pool and trigger an early sync themselves).
DEFAULT_SYNC_INTERVAL = 30.0

CLOUD_TYPE = CloudType(
    name="bizfly",
    config_model=BizflyConfig,
    build_adapter=build_adapter,
    default_sync_interval=DEFAULT_SYNC_INTERVAL,
    preflight=preflight,
)

__all__ = ["CLOUD_TYPE", "DEFAULT_SYNC_INTERVAL", "BizflyAdapter", "BizflyConfig", "build_adapter", "parse_config"]
