"""The cloud types the config may name, and how to build each one's adapter."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.cloud import CloudAdapter


@dataclass(frozen=True)
class CloudType:
    name: str
    # parse_config(key_prefix, raw_mapping, env, env_applies) -> validated cloud config
    parse_config: Callable[[str, Mapping[str, Any], Mapping[str, str], bool], Any]
    build_adapter: Callable[[Any], CloudAdapter]
    default_sync_interval: float


def cloud_type(kind: str) -> CloudType:
    module = importlib.import_module(f"providers.{kind}")
    return module.CLOUD_TYPE  # type: ignore[no-any-return]
