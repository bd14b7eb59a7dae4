"""The Scaleway Kapsule cloud: autoscaled pools of one cluster as node groups (see adapter.py)."""

from __future__ import annotations

from providers.cloud import CloudType
from providers.scaleway.adapter import ScalewayAdapter
from providers.scaleway.config import ScalewayConfig, parse_config
from providers.scaleway.preflight import preflight

# Upstream refreshes every 60 s unless the pools answer carries Cache-Control max-age. Reads are
# served from memory and mutations trigger their own early sync, so 30 s keeps the view fresh at
# 2+ requests per sync. When the config sets no interval, the Backend follows the cloud's max-age.
DEFAULT_SYNC_INTERVAL = 30.0


def build_adapter(config: ScalewayConfig) -> ScalewayAdapter:
    return ScalewayAdapter(config)


CLOUD_TYPE = CloudType(
    name="scaleway",
    config_model=ScalewayConfig,
    build_adapter=build_adapter,
    default_sync_interval=DEFAULT_SYNC_INTERVAL,
    preflight=preflight,
)

__all__ = ["CLOUD_TYPE", "DEFAULT_SYNC_INTERVAL", "ScalewayAdapter", "ScalewayConfig", "build_adapter", "parse_config"]
