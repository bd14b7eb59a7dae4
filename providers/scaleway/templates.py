"""Scale-from-zero templates for Kapsule pools: labels, taints and resources from the pool record (private
mode), or from the pool and the Instance product catalog (public mode, ``Machine``).

Units: the autoscaler endpoint's ``capacity``/``allocatable`` are WHOLE units, as upstream decodes
them (``resource.NewQuantity(v, DecimalSI)``; Scaleway has not confirmed the unit, see
docs/reference/scaleway.md, "The simulator"): ``cpu`` in cores, ``memory`` and ``ephemeral-storage`` in bytes,
``pods`` and GPU resources as counts. They become Kubernetes quantity strings unchanged ("4",
"17179869184"); no unit is guessed.

Labels, lowest precedence first:
1. what a Kapsule node of the pool is known to carry: ``kubernetes.io/os=linux``, ``kubernetes.io/arch``
   (arm64 for the COPARM1/AMP2 families, else amd64), ``node.kubernetes.io/instance-type``,
   ``topology.kubernetes.io/region``/``zone``, ``k8s.scaleway.com/pool`` (pool id; NodePrice looks the
   pool up by it) and ``k8s.scaleway.com/pool-name``, and the GPU label on GPU pools;
2. labels seen on a real node of the group that describe it (the Backend passes them, filtered by
   providers/node_labels.py), minus node-specific ones;
3. the labels of the pool's ``tags``: Kapsule copies a pool's tags onto its servers, and turns each into a
   node label or taint as Scaleway's cloud-controller-manager documents it (``tag_labels``, ``tag_taints``);
4. the pool's own ``labels`` from the API (what Kapsule says it will put on new nodes).
``kubernetes.io/hostname`` is never copied: one fixed hostname for every hypothetical node would make
the CA's scheduling simulation wrong; the server names the template node itself.

The instance type is spelled as real nodes carry it, whatever the pool says: the pools API answers its
``node_type`` in lower case with underscores (``pro2_xxs``), while Scaleway's cloud-controller-manager
labels each node with the Instance API's commercial type (``PRO2-XXS``); see instance_type() and
docs/reference/scaleway.md, "Evidence". No other source (a pool label, a node's label) can change it, as the
cloud-controller-manager rewrites that label on every node it initialises.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from providers.model import NodeTemplate, Taint
from providers.scaleway.client import Pool, ServerType

log = logging.getLogger(__name__)

GPU_LABEL = "k8s.scw.cloud/gpu"
POOL_ID_LABEL = "k8s.scaleway.com/pool"
POOL_NAME_LABEL = "k8s.scaleway.com/pool-name"
# Extended resources the CA core recognises as GPUs (gpu.GetNodeGPUFromCloudProvider).
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "habana.ai/gaudi", "gpu.intel.com/xe", "microsoft.com/directx")
TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
# Labels that describe one machine, not the pool: never part of a template.
NODE_SPECIFIC_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "k8s.scaleway.com/node",
        "k8s.scaleway.com/node-id",
        "node.kubernetes.io/exclude-from-external-load-balancers",
    }
)
_ARM_NODE_TYPE_PREFIXES = ("COPARM1", "AMP2")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

# Pool tags as node labels and taints, as Scaleway's cloud-controller-manager documents them (docs/tags.md
# of its repository): ``foo=bar`` -> label ``k8s.scaleway.com/foo=bar``; ``noprefix=foo=bar`` -> ``foo=bar``
# (``noprefix=example.com/foo=bar`` -> ``example.com/foo=bar``); ``taint=foo=bar:Effect`` -> taint
# ``k8s.scaleway.com/foo=bar:Effect``, ``taint=noprefix=...`` without the prefix. Key and value split at
# any run of ``=``, ``:`` or spaces. A tag that makes no valid label is skipped, as the controller skips it.
TAG_PREFIX = "k8s.scaleway.com/"
_TAG_SPLIT = re.compile(r"[:= ]+")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$")

# Public mode: what a Kapsule node keeps back from its machine is not published. Our reading, chosen so a
# template never promises more than a node gives (docs/reference/scaleway.md, "Public mode"): the tiered reservation
# managed Kubernetes services commonly apply, plus the kubelet's default hard eviction thresholds.
_CPU_TIERS = ((1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025))  # (cores, share reserved)
_MEMORY_TIERS = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (math.inf, 0.02))  # (GiB, share reserved)
EVICTION_MEMORY = 100 * 1024**2  # kubelet default: memory.available<100Mi
EVICTION_NODEFS_SHARE = 0.10  # kubelet default: nodefs.available<10%
KUBELET_MAX_PODS = 110  # the kubelet's default; a pool's kubelet_args.maxPods replaces it
# The catalog's architecture names -> Kubernetes' (kubernetes.io/arch).
_ARCHITECTURES = {"x86_64": "amd64", "arm64": "arm64", "arm": "arm"}


def instance_type(node_type: str) -> str:
    """A pool's ``node_type`` in the spelling a real Kapsule node's ``node.kubernetes.io/instance-type``
    label has: the commercial type of the Instance API, upper case with dashes (``pro2_xxs`` and
    ``PRO2_XXS`` -> ``PRO2-XXS``; ``pop2_hc_2c_4g`` -> ``POP2-HC-2C-4G``)."""
    return node_type.strip().upper().replace("_", "-")


def same_instance_type(first: str, second: str) -> bool:
    """Whether two spellings name one node type (the pools API's ``dev1_m``, a node's ``DEV1-M``)."""
    return instance_type(first) == instance_type(second)


def parse_taints(raw: Mapping[str, str]) -> tuple[Taint, ...]:
    """``{key: "value:Effect" | "Effect"}`` -> taints, as upstream ``parseTaints``.

    The LAST ``:``-separated part is the effect and must be a valid one (else the taint is skipped,
    with a log line); the value is kept only for exactly two parts, so ``"a:b:NoSchedule"`` has value
    "" like upstream. Sorted by key so the template is the same on every sync.
    """
    taints: list[Taint] = []
    for key in sorted(raw):
        parts = raw[key].split(":")
        effect = parts[-1]
        if effect not in TAINT_EFFECTS:
            log.warning(
                "pool taint %s=%r skipped: effect %r is not NoSchedule, PreferNoSchedule or NoExecute",
                key,
                raw[key],
                effect,
                extra={"taint_key": key},
            )
            continue
        taints.append(Taint(key=key, value=parts[0] if len(parts) == 2 else "", effect=effect))
    return tuple(taints)


def quantities(raw: Mapping[str, int]) -> dict[str, str]:
    """Whole-unit integers -> quantity strings; negative values are dropped (not a valid resource).

    A bare ``gpu`` count (the field name of the pre-2025 autoscaler API) becomes ``nvidia.com/gpu``,
    the resource the CA core looks for first.
    """
    values = dict(raw)
    if "gpu" in values:
        values.setdefault("nvidia.com/gpu", values["gpu"])
        del values["gpu"]
    return {name: str(value) for name, value in sorted(values.items()) if value >= 0}


def gpu_count(pool: Pool, machine: Machine | None = None) -> int:
    if machine is not None:
        return sum(int(machine.capacity.get(name, "0")) for name in GPU_RESOURCES)
    return sum(pool.capacity.get(name, 0) for name in (*GPU_RESOURCES, "gpu"))


def gpu_type(pool: Pool, machine: Machine | None = None) -> str | None:
    """The GPU label value new nodes of ``pool`` carry, or None for a pool without GPUs."""
    if pool.labels.get(GPU_LABEL):
        return pool.labels[GPU_LABEL]
    if gpu_count(pool, machine) == 0:
        return None
    # No label from the API: name the GPU type after the node type (e.g. "l4-1-24g").
    return instance_type(pool.node_type).lower() or "gpu"


@dataclass(frozen=True, slots=True)
class Machine:
    """What one new node of a pool is made of and costs, from the Instance product catalog (public mode)."""

    capacity: Mapping[str, str]  # quantity strings
    allocatable: Mapping[str, str]
    arch: str  # Kubernetes spelling: amd64, arm64
    price_per_hour: float | None


def _tiered(amount: float, tiers: Iterable[tuple[float, float]]) -> float:
    reserved, left = 0.0, amount
    for size, share in tiers:
        part = min(left, size)
        reserved += part * share
        left -= part
        if left <= 0:
            break
    return reserved


def reserved_millicores(cpus: int) -> int:
    return math.ceil(_tiered(cpus, _CPU_TIERS) * 1000)


def reserved_memory(memory: int) -> int:
    """Bytes kept back from ``memory`` bytes: the tiers, plus the kubelet's memory eviction threshold."""
    return math.ceil(_tiered(memory / 1024**3, _MEMORY_TIERS) * 1024**3) + EVICTION_MEMORY


def catalog_machine(server: ServerType, pool: Pool) -> Machine:
    """A node of ``pool`` as the catalog describes its commercial type: capacity as sold, allocatable after our
    reading of Kapsule's reservations; ephemeral storage from the pool's root volume; GPUs as ``nvidia.com/gpu``
    (every GPU type of the catalog is NVIDIA's, recorded)."""
    pods = str(pool.max_pods or KUBELET_MAX_PODS)
    capacity = {"cpu": str(server.cpus), "memory": str(server.memory), "pods": pods}
    allocatable = {
        "cpu": f"{max(server.cpus * 1000 - reserved_millicores(server.cpus), 0)}m",
        "memory": str(max(server.memory - reserved_memory(server.memory), 0)),
        "pods": pods,
    }
    if pool.root_volume_size:
        capacity["ephemeral-storage"] = str(pool.root_volume_size)
        allocatable["ephemeral-storage"] = str(math.floor(pool.root_volume_size * (1 - EVICTION_NODEFS_SHARE)))
    if server.gpus:
        capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(server.gpus)
    return Machine(
        capacity=capacity,
        allocatable=allocatable,
        arch=_ARCHITECTURES.get(server.arch, "") or architecture(pool.node_type),
        price_per_hour=server.hourly_price,
    )


def _tag_label(tag: str) -> tuple[str, str] | None:
    prefix, text = TAG_PREFIX, tag
    if tag.startswith("noprefix="):
        prefix, text = "", tag[len("noprefix=") :]
        if text.count("/") > 1:
            return None
        if "/" in text:
            domain, text = text.split("/")
            if not _DNS_SUBDOMAIN.match(domain) or len(domain) > 253:
                return None
            prefix = domain + "/"
    parts = _TAG_SPLIT.split(text)
    key, value = parts[0], (parts[1] if len(parts) > 1 else "")
    if not _LABEL_NAME.match(key) or not _LABEL_VALUE.match(value):
        return None
    return prefix + key, value


def tag_labels(tags: Iterable[str]) -> dict[str, str]:
    """The node labels of a pool's tags (taint tags and the load-balancer exclusion excepted)."""
    labels: dict[str, str] = {}
    for tag in tags:
        if tag.startswith("taint=") or tag == "node.kubernetes.io/exclude-from-external-load-balancers":
            continue
        label = _tag_label(tag)
        if label is not None:
            labels[label[0]] = label[1]
    return labels


def tag_taints(tags: Iterable[str]) -> dict[str, str]:
    """The node taints of a pool's ``taint=`` tags, in the pool record's map form ``key -> "value:Effect"``."""
    taints: dict[str, str] = {}
    for tag in tags:
        if not tag.startswith("taint="):
            continue
        *rest, effect = tag[len("taint=") :].split(":")
        if effect not in TAINT_EFFECTS or not rest:
            continue
        # The controller glues what stood between the colons back together before reading key=value.
        label = _tag_label("".join(rest))
        if label is not None:
            taints[label[0]] = f"{label[1]}:{effect}" if label[1] else effect
    return taints


def architecture(node_type: str) -> str:
    return "arm64" if node_type.upper().startswith(_ARM_NODE_TYPE_PREFIXES) else "amd64"


def well_known_labels(pool: Pool, region: str, machine: Machine | None = None) -> dict[str, str]:
    labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": machine.arch if machine is not None else architecture(pool.node_type),
        "topology.kubernetes.io/region": region,
        POOL_ID_LABEL: pool.id,
    }
    if pool.node_type:
        labels[INSTANCE_TYPE_LABEL] = instance_type(pool.node_type)
    if pool.zone:
        labels["topology.kubernetes.io/zone"] = pool.zone
    if pool.name:
        labels[POOL_NAME_LABEL] = pool.name
    gpu = gpu_type(pool, machine)
    if gpu:
        labels[GPU_LABEL] = gpu
    return labels


def pool_template(
    pool: Pool, region: str, observed_labels: Mapping[str, str] | None = None, machine: Machine | None = None
) -> NodeTemplate | None:
    """The template of a new node of ``pool``; None when neither the API nor ``machine`` (the catalog's
    description of the pool's type, public mode) gave resources for it."""
    if machine is None and not pool.capacity and not pool.allocatable:
        return None
    labels = well_known_labels(pool, region, machine)
    for source in (observed_labels or {}, tag_labels(pool.tags), pool.labels):
        labels.update({k: v for k, v in source.items() if k not in NODE_SPECIFIC_LABELS})
    # The pool identity labels must name THIS pool even if observed labels came from elsewhere, and the
    # instance type is the one the cloud-controller-manager puts on every node of it.
    labels[POOL_ID_LABEL] = pool.id
    if pool.node_type:
        labels[INSTANCE_TYPE_LABEL] = instance_type(pool.node_type)
    if machine is not None:
        capacity, allocatable = dict(machine.capacity), dict(machine.allocatable)
    else:
        capacity = quantities(pool.capacity or pool.allocatable)
        allocatable = quantities(pool.allocatable or pool.capacity)
    return NodeTemplate(
        labels=labels,
        taints=parse_taints({**tag_taints(pool.tags), **pool.taints}),
        capacity=capacity,
        allocatable=allocatable,
    )
