"""Bizfly region names: one canonical spelling for the many the config and the catalog use.

The service catalog has been seen to say ``HN``, ``hn`` and ``HaNoi`` for the same region, and the
upstream client compared strings exactly, silently falling back to a wrong URL on a mismatch
(docs/reference/bizfly.md, "Regions"). Both sides are normalised here before
they are compared.
"""

from __future__ import annotations

import re

HANOI = "HaNoi"
HOCHIMINH = "HoChiMinh"
VC_HANOI = "VC-HaNoi"

# Keys are the spelling with case, spaces, dashes, dots and underscores removed.
_ALIASES: dict[str, str] = {
    "hn": HANOI,
    "hanoi": HANOI,
    "hcm": HOCHIMINH,
    "hochiminh": HOCHIMINH,
    "hochiminhcity": HOCHIMINH,
    "saigon": HOCHIMINH,
    "vchanoi": VC_HANOI,
    "vchn": VC_HANOI,
}
_SEPARATORS = re.compile(r"[\s._-]+")

KNOWN_REGIONS = (HANOI, HOCHIMINH, VC_HANOI)

# Bizfly's own short code of a region (its regions answer pairs region_name HaNoi with short_name HN and
# HoChiMinh with HCM; zones are HN1, HN2, HCM1). The cloud-controller-manager's default region is HN, and
# it writes its region into the topology.kubernetes.io/region label of every node (docs/reference/bizfly.md,
# "Templates"). VC-HaNoi has no public short code: its canonical name is used.
_CODES = {HANOI: "HN", HOCHIMINH: "HCM"}


def _squash(region: str) -> str:
    return _SEPARATORS.sub("", region.strip()).lower()


def normalize_region(region: str) -> str:
    """The canonical name of ``region``; an unknown region is kept as written (trimmed).

    Unknown names are not rejected: Bizfly may open regions after this code was written, and the
    catalog comparison (``same_region``) still ignores case and separators for them.
    """
    return _ALIASES.get(_squash(region), region.strip())


def region_code(region: str) -> str:
    """The short code of ``region`` (``HN`` for any spelling of Ha Noi, ``HCM`` for Ho Chi Minh), else its
    canonical name: the value real nodes carry in ``topology.kubernetes.io/region``."""
    canonical = normalize_region(region)
    return _CODES.get(canonical, canonical)


def same_region(left: str, right: str) -> bool:
    """True when two spellings name the same region (``HN`` == ``hn`` == ``HaNoi`` == ``ha-noi``)."""
    return _squash(normalize_region(left)) == _squash(normalize_region(right))
