"""The cloud types the config may name: each cloud package exports a ``CLOUD_TYPE``."""

from __future__ import annotations

import importlib

from providers.cloud import CloudType

__all__ = ["CloudType", "cloud_type"]


def cloud_type(kind: str) -> CloudType:
    module = importlib.import_module(f"providers.{kind}")
    return module.CLOUD_TYPE  # type: ignore[no-any-return]
