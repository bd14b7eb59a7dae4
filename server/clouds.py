"""The clouds a backend may name (its ``type``): each cloud package exports a ``CLOUD_TYPE``."""

from __future__ import annotations

import importlib

from providers.cloud import CloudType

__all__ = ["CloudType", "cloud_type"]


def cloud_type(cloud: str) -> CloudType:
    module = importlib.import_module(f"providers.{cloud}")
    return module.CLOUD_TYPE  # type: ignore[no-any-return]
