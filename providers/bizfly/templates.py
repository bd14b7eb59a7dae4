"""Scale-from-zero node templates for Bizfly worker pools.

Upstream has no template at all, so the CA can never scale a Bizfly pool up from 0 nodes
(docs/reference/bizfly.md, "Templates"). A template is built here
from, in increasing priority:

1. well-known labels: ``kubernetes.io/os=linux``, ``kubernetes.io/arch=amd64``, and what the Bizfly
   cloud-controller-manager puts on every node through Kubernetes' cloud node controller, under both
   the GA and the older beta keys: the instance type (the server's flavor name, which is the pool's
   ``flavor``), the zone (the server's availability zone, the pool's ``availability_zone``) and the region
   (the controller's own region setting, ``HN`` by default: ``region_label`` in the config, never the
   catalog's ``HaNoi``); then ``bke.bizflycloud.vn/pool-name=<pool name>``;
2. the labels a real node of the pool carried when the CA last asked NodeGroupForNode about it
   (kept by the Backend, so a pool scaled to 0 keeps them, and only those that describe the pool:
   providers/node_labels.py), minus per-node labels (hostname, node id);
3. the pool's own ``labels`` and ``taints`` when the API returns them (newer API versions do).

Explicit per-group config overrides are applied by the Backend on top of this result.

Capacity comes from the pool's ``flavor_detail`` (``vcpus``, ``ram`` in MiB) when the API sends it,
else from the flavor name. Spellings accepted (case-insensitive):
``nix.2c_4g``, ``2c_4g``, ``4c_8g_basic``, ``nix.8c_16g_enterprise``, ``premium.2c_4g``,
``2c-4g`` and memory given in MiB as ``1c_512m``; i.e. an optional ``<family>.`` prefix,
``<cpus>c``, ``_`` or ``-``, ``<memory>g`` (GiB) or ``<memory>m`` (MiB), then an optional
``_<tier>`` suffix. When the pool's flavor does not parse, the ``node.kubernetes.io/instance-type``
label of an observed node is tried. If neither parses there is no template (the server answers
UNIMPLEMENTED, and a config ``template.capacity`` can still supply one).

Allocatable assumes kubelet reservations like the widely used GKE/AKS tiers, because Bizfly does
not publish BKE's: CPU reserved 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25%
above; memory reserved 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next
112, 2% above 128 GiB (255 MiB minimum on nodes under 1 GiB), plus a 100 MiB hard eviction
threshold; 110 pods; ephemeral storage = the pool's volume_size with a 10% eviction threshold.
Overestimating allocatable would make the CA add nodes pods do not fit on, so these err low.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from providers.model import NodeTemplate, Taint

log = logging.getLogger(__name__)

NODE_ID_LABEL = "bke.bizflycloud.vn/node-id"
POOL_NAME_LABEL = "bke.bizflycloud.vn/pool-name"
GPU_LABEL = "bke.bizflycloud.vn/gpu-node"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
# The cloud node controller writes each of these next to its GA key, with the same value.
BETA_INSTANCE_TYPE_LABEL = "beta.kubernetes.io/instance-type"
BETA_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION_LABEL = "failure-domain.beta.kubernetes.io/region"

# Labels that identify one machine rather than the pool: never copied into a template.
PER_NODE_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        NODE_ID_LABEL,
        "node.kubernetes.io/instance-id",
        "bke.bizflycloud.vn/physical-id",
        "bke.bizflycloud.vn/node-name",
    }
)

MAX_PODS = 110
EVICTION_HARD_MEMORY_MIB = 100
EPHEMERAL_EVICTION_FRACTION = 0.10
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_FLAVOR = re.compile(
    r"^(?:[a-z][a-z0-9]*\.)?(?P<cpu>\d+)c[_-](?P<mem>\d+(?:\.\d+)?)(?P<unit>gb|g|mb|m)(?:[_-][a-z0-9_-]+)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Flavor:
    cpus: int
    memory_mib: int


def parse_flavor(name: str | None) -> Flavor | None:
    """CPU count and memory of a flavor name, or None when the spelling is not understood."""
    if not isinstance(name, str):
        return None
    match = _FLAVOR.match(name.strip())
    if match is None:
        return None
    cpus = int(match["cpu"])
    amount = float(match["mem"])
    memory_mib = int(amount * 1024) if match["unit"].lower().startswith("g") else int(amount)
    if cpus <= 0 or memory_mib <= 0:
        return None
    return Flavor(cpus, memory_mib)


def flavor_from_detail(detail: Any) -> Flavor | None:
    """Sizes from the ``flavor_detail`` object newer API versions return (``vcpus``, ``ram`` in MiB).

    The API's own numbers are preferred over parsing the name when both are present.
    """
    if not isinstance(detail, Mapping):
        return None
    cpus, ram = detail.get("vcpus"), detail.get("ram")
    if isinstance(cpus, bool) or isinstance(ram, bool) or not isinstance(cpus, int) or not isinstance(ram, int):
        return None
    return Flavor(cpus, ram) if cpus > 0 and ram > 0 else None


def reserved_cpu_millis(cpus: int) -> int:
    """Kubelet CPU reservation in millicores for a node with ``cpus`` cores (tiers in the module doc)."""
    millis = 0.0
    left = cpus
    for cores, share in ((1, 0.06), (1, 0.01), (2, 0.005)):
        used = min(left, cores)
        millis += used * 1000 * share
        left -= used
    millis += left * 1000 * 0.0025
    return int(round(millis))


def reserved_memory_mib(memory_mib: int) -> int:
    """Kubelet memory reservation (without the eviction threshold) in MiB (tiers in the module doc)."""
    if memory_mib < 1024:
        return 255
    gib = 1024
    reserved = 0.0
    lower = 0
    for upper, share in ((4 * gib, 0.25), (8 * gib, 0.20), (16 * gib, 0.10), (128 * gib, 0.06)):
        reserved += max(min(memory_mib, upper) - lower, 0) * share
        lower = upper
    reserved += max(memory_mib - 128 * gib, 0) * 0.02
    return int(round(reserved))


def resources(flavor: Flavor, volume_gib: int | None) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) as Kubernetes quantity strings."""
    capacity = {"cpu": str(flavor.cpus), "memory": f"{flavor.memory_mib}Mi", "pods": str(MAX_PODS)}
    alloc_cpu = flavor.cpus * 1000 - reserved_cpu_millis(flavor.cpus)
    alloc_mem = flavor.memory_mib - reserved_memory_mib(flavor.memory_mib) - EVICTION_HARD_MEMORY_MIB
    allocatable = {"cpu": f"{alloc_cpu}m", "memory": f"{max(alloc_mem, 0)}Mi", "pods": str(MAX_PODS)}
    if volume_gib is not None and volume_gib > 0:
        capacity["ephemeral-storage"] = f"{volume_gib}Gi"
        usable_mib = int(volume_gib * 1024 * (1 - EPHEMERAL_EVICTION_FRACTION))
        allocatable["ephemeral-storage"] = f"{usable_mib}Mi"
    return capacity, allocatable


def pool_labels(pool: Mapping[str, Any]) -> dict[str, str]:
    raw = pool.get("labels")
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items() if v is not None}


def pool_taints(pool: Mapping[str, Any]) -> tuple[Taint, ...]:
    """Taints of the pool in the API's ``[{key, value, effect}]`` form; malformed entries are skipped."""
    raw = pool.get("taints")
    if not isinstance(raw, list):
        return ()
    taints = []
    for item in raw:
        if not isinstance(item, Mapping) or not item.get("key"):
            continue
        effect = _effect(item.get("effect"))
        if effect is None:
            log.warning(
                "ignoring a pool taint with an unknown effect",
                extra={"cloud": "bizfly", "taint_key": str(item.get("key")), "effect": str(item.get("effect"))},
            )
            continue
        taints.append(Taint(str(item["key"]), str(item.get("value") or ""), effect))
    return tuple(taints)


def _effect(value: Any) -> str | None:
    text = str(value or "").replace("_", "").replace("-", "").lower()
    for effect in _EFFECTS:
        if effect.lower() == text:
            return effect
    return None


def pool_level_labels(observed: Mapping[str, str] | None) -> dict[str, str]:
    """The observed labels of a real node that describe its pool (per-node ones dropped)."""
    if not observed:
        return {}
    return {k: v for k, v in observed.items() if k not in PER_NODE_LABELS}


def build_template(
    pool: Mapping[str, Any], region_label: str, observed_labels: Mapping[str, str] | None
) -> NodeTemplate | None:
    """The template of a new node of ``pool``; None when its size cannot be known.

    ``region_label`` is the value real nodes carry in ``topology.kubernetes.io/region`` (config
    ``region_label``, default the region's short code such as ``HN``)."""
    observed = pool_level_labels(observed_labels)
    flavor_name = str(pool.get("flavor") or "")
    flavor = flavor_from_detail(pool.get("flavor_detail")) or parse_flavor(flavor_name)
    if flavor is None and observed.get(INSTANCE_TYPE_LABEL):
        flavor = parse_flavor(observed[INSTANCE_TYPE_LABEL])
    if flavor is None:
        return None
    labels: dict[str, str] = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    if flavor_name:
        labels[INSTANCE_TYPE_LABEL] = labels[BETA_INSTANCE_TYPE_LABEL] = flavor_name
    zone = pool.get("availability_zone")
    if isinstance(zone, str) and zone:
        labels[ZONE_LABEL] = labels[BETA_ZONE_LABEL] = zone
    if region_label:
        labels[REGION_LABEL] = labels[BETA_REGION_LABEL] = region_label
    name = pool.get("name")
    if isinstance(name, str) and name:
        labels[POOL_NAME_LABEL] = name
    labels.update(observed)
    labels.update(pool_labels(pool))
    volume = pool.get("volume_size")
    volume_gib = volume if isinstance(volume, int) and not isinstance(volume, bool) else None
    capacity, allocatable = resources(flavor, volume_gib)
    return NodeTemplate(labels=labels, taints=pool_taints(pool), capacity=capacity, allocatable=allocatable)
