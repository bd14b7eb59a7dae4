"""Scale-from-zero templates for Kapsule pools: labels, taints and resources from the pool record.

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
3. the pool's own ``labels`` from the API (what Kapsule says it will put on new nodes).
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
from collections.abc import Mapping

from providers.model import NodeTemplate, Taint
from providers.scaleway.client import Pool

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


def gpu_count(pool: Pool) -> int:
    return sum(pool.capacity.get(name, 0) for name in (*GPU_RESOURCES, "gpu"))


def gpu_type(pool: Pool) -> str | None:
    """The GPU label value new nodes of ``pool`` carry, or None for a pool without GPUs."""
    if pool.labels.get(GPU_LABEL):
        return pool.labels[GPU_LABEL]
    if gpu_count(pool) == 0:
        return None
    # No label from the API: name the GPU type after the node type (e.g. "l4-1-24g").
    return instance_type(pool.node_type).lower() or "gpu"


def architecture(node_type: str) -> str:
    return "arm64" if node_type.upper().startswith(_ARM_NODE_TYPE_PREFIXES) else "amd64"


def well_known_labels(pool: Pool, region: str) -> dict[str, str]:
    labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": architecture(pool.node_type),
        "topology.kubernetes.io/region": region,
        POOL_ID_LABEL: pool.id,
    }
    if pool.node_type:
        labels[INSTANCE_TYPE_LABEL] = instance_type(pool.node_type)
    if pool.zone:
        labels["topology.kubernetes.io/zone"] = pool.zone
    if pool.name:
        labels[POOL_NAME_LABEL] = pool.name
    gpu = gpu_type(pool)
    if gpu:
        labels[GPU_LABEL] = gpu
    return labels


def pool_template(pool: Pool, region: str, observed_labels: Mapping[str, str] | None = None) -> NodeTemplate | None:
    """The template of a new node of ``pool``; None when the API gave no resources for it."""
    if not pool.capacity and not pool.allocatable:
        return None
    labels = well_known_labels(pool, region)
    for source in (observed_labels or {}, pool.labels):
        labels.update({k: v for k, v in source.items() if k not in NODE_SPECIFIC_LABELS})
    # The pool identity labels must name THIS pool even if observed labels came from elsewhere, and the
    # instance type is the one the cloud-controller-manager puts on every node of it.
    labels[POOL_ID_LABEL] = pool.id
    if pool.node_type:
        labels[INSTANCE_TYPE_LABEL] = instance_type(pool.node_type)
    capacity = quantities(pool.capacity or pool.allocatable)
    allocatable = quantities(pool.allocatable or pool.capacity)
    return NodeTemplate(
        labels=labels,
        taints=parse_taints(pool.taints),
        capacity=capacity,
        allocatable=allocatable,
    )
