"""Node types the simulated Kapsule knows, and the per-pool template data derived from them.

Units (not confirmed by Scaleway; docs/reference/scaleway.md, "The simulator"): ``capacity`` and ``allocatable``
are in WHOLE units, exactly as the upstream provider decodes them (``resource.NewQuantity(v,
DecimalSI)``): ``cpu`` in cores, ``memory`` and ``ephemeral-storage`` in bytes, ``pods`` and GPUs as
counts. Prices are approximate list prices in EUR per hour; they only need to be plausible and distinct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3
GPU_LABEL = "k8s.scw.cloud/gpu"  # the label the CA's Scaleway provider reports as GPULabel()
POOL_LABEL = "k8s.scaleway.com/pool"  # upstream NodePrice looks pools up by this node label
DEFAULT_MAX_PODS = 110


@dataclass(frozen=True)
class NodeType:
    name: str
    cpus: int
    memory_bytes: int
    storage_bytes: int
    price_per_hour: float
    gpus: int = 0
    gpu_model: str = ""  # value of the GPU label, e.g. "nvidia-l4"
    arch: str = "amd64"

    def capacity(self) -> dict[str, int]:
        result = {
            "cpu": self.cpus,
            "memory": self.memory_bytes,
            "ephemeral-storage": self.storage_bytes,
            "pods": DEFAULT_MAX_PODS,
        }
        if self.gpus:
            result["nvidia.com/gpu"] = self.gpus
        return result

    def allocatable(self) -> dict[str, int]:
        # Kapsule keeps memory and disk back for the kubelet and system daemons. CPU stays whole because
        # whole-unit quantities cannot express a fractional reservation.
        reserved_memory = 256 * 1024**2 + self.memory_bytes * 6 // 100
        result = self.capacity()
        result["memory"] = self.memory_bytes - reserved_memory
        result["ephemeral-storage"] = self.storage_bytes * 9 // 10
        return result


NODE_TYPES: dict[str, NodeType] = {
    node_type.name: node_type
    for node_type in (
        NodeType("DEV1-M", 3, 4 * GIB, 40 * GIB, 0.0198),
        NodeType("DEV1-L", 4, 8 * GIB, 80 * GIB, 0.042),
        NodeType("GP1-XS", 4, 16 * GIB, 150 * GIB, 0.091),
        NodeType("GP1-S", 8, 32 * GIB, 300 * GIB, 0.187),
        NodeType("PRO2-XXS", 2, 8 * GIB, 100 * GIB, 0.055),
        NodeType("PRO2-XS", 4, 16 * GIB, 100 * GIB, 0.11),
        NodeType("PRO2-S", 8, 32 * GIB, 100 * GIB, 0.22),
        NodeType("PRO2-M", 16, 64 * GIB, 100 * GIB, 0.44),
        NodeType("POP2-2C-8G", 2, 8 * GIB, 100 * GIB, 0.0735),
        NodeType("POP2-4C-16G", 4, 16 * GIB, 100 * GIB, 0.147),
        NodeType("COPARM1-4C-16G", 4, 16 * GIB, 100 * GIB, 0.085, arch="arm64"),
        NodeType("GPU-3070-S", 8, 16 * GIB, 100 * GIB, 0.98, gpus=1, gpu_model="nvidia-rtx-3070"),
        NodeType("L4-1-24G", 8, 48 * GIB, 100 * GIB, 0.75, gpus=1, gpu_model="nvidia-l4"),
        NodeType("H100-1-80G", 24, 240 * GIB, 100 * GIB, 2.73, gpus=1, gpu_model="nvidia-h100"),
    )
}


def api_node_type(name: str) -> str:
    """A node type as the pools API answers it: lower case with underscores, whatever spelling was sent
    (recorded: ``DEV1-M`` and ``PRO2_XXS`` come back as ``dev1_m`` and ``pro2_xxs``)."""
    return name.strip().lower().replace("-", "_")


def commercial_type(name: str) -> str:
    """A node type as the Instance API names the machine (``commercial_type``), and so as Scaleway's
    cloud-controller-manager labels the node: upper case with dashes (``pro2_xxs`` -> ``PRO2-XXS``)."""
    return name.strip().upper().replace("_", "-")


# Kapsule copies a pool's tags onto its servers and labels and taints the nodes from them as Scaleway's
# cloud-controller-manager documents (its docs/tags.md). Written here apart from the server's reading
# (providers/scaleway/templates.py) on purpose: the simulator plays Kapsule, and a reading the two shared
# could not be caught wrong by a scenario.
_SEPARATORS = re.compile(r"[ :=]+")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _label_of_tag(tag: str) -> tuple[str, str] | None:
    prefix = "k8s.scaleway.com/"
    if tag.startswith("noprefix="):
        tag = tag.removeprefix("noprefix=")
        domain, slash, rest = tag.rpartition("/")
        if slash and (not domain or "/" in domain):
            return None
        prefix, tag = (domain + "/" if slash else ""), rest
    key, *values = _SEPARATORS.split(tag)
    value = values[0] if values else ""
    if not (0 < len(key) <= 63 and _NAME.match(key)) or (value and not (len(value) <= 63 and _NAME.match(value))):
        return None
    return prefix + key, value


def tag_node_labels(tags: list[str]) -> dict[str, str]:
    """The labels a node of a pool with these tags gets (``k8s.scaleway.com/<key>``, or as is after ``noprefix=``)."""
    found = (_label_of_tag(t) for t in tags if not t.startswith("taint="))
    return dict(label for label in found if label is not None)


def tag_node_taints(tags: list[str]) -> dict[str, str]:
    """The taints (``key -> "value:Effect"``) a node of a pool with these tags gets, from ``taint=`` tags."""
    taints = {}
    for tag in tags:
        body, _, effect = tag.removeprefix("taint=").rpartition(":")
        if not tag.startswith("taint=") or effect not in _EFFECTS:
            continue
        label = _label_of_tag(body.replace(":", ""))
        if label is not None:
            taints[label[0]] = f"{label[1]}:{effect}" if label[1] else effect
    return taints


def kubernetes_labels(
    *,
    node_type: str,
    node_name: str,
    node_id: str,
    pool_id: str,
    pool_name: str,
    cluster_id: str,
    region: str,
    zone: str,
    pool_labels: dict[str, str],
    pool_tags: list[str] | None = None,
) -> dict[str, str]:
    """The labels of a real Kapsule node's Kubernetes Node, from who puts them there:

    - the pool's own ``labels`` (Kapsule hands them to the kubelet);
    - the labels of the pool's ``tags`` (``tag_node_labels``);
    - the kubelet: hostname, os and arch (and their ``beta.`` twins);
    - Scaleway's cloud-controller-manager: the instance type (the machine's commercial type, in the
      stable and ``beta.`` keys), region and zone (stable and ``failure-domain.beta.`` keys), and one
      ``k8s.scaleway.com/<key>`` label per ``<key>=<value>`` tag of the server; Kapsule tags its servers
      ``kapsule`` (cluster id), ``pool`` (pool id), ``pool-name``, ``runtime``, ``managed`` and ``node``
      (Kapsule node id), as a recorded server of a Kapsule pool shows;
    - the GPU label the CA's Scaleway provider names, on GPU types (its value is our pick: not public).
    """
    entry = lookup(node_type)
    arch = (
        entry.arch
        if entry is not None
        else ("arm64" if commercial_type(node_type).startswith(("COPARM1", "AMP2")) else "amd64")
    )
    instance = commercial_type(node_type)
    labels = {**tag_node_labels(pool_tags or []), **pool_labels}
    labels.update(
        {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": arch,
            "node.kubernetes.io/instance-type": instance,
            "beta.kubernetes.io/instance-type": instance,
            "topology.kubernetes.io/region": region,
            "topology.kubernetes.io/zone": zone,
            "failure-domain.beta.kubernetes.io/region": region,
            "failure-domain.beta.kubernetes.io/zone": zone,
            "k8s.scaleway.com/kapsule": cluster_id,
            POOL_LABEL: pool_id,
            "k8s.scaleway.com/pool-name": pool_name,
            "k8s.scaleway.com/runtime": "containerd",
            "k8s.scaleway.com/managed": "true",
            "k8s.scaleway.com/node": node_id,
        }
    )
    if entry is not None and entry.gpus:
        labels[GPU_LABEL] = entry.gpu_model
    return labels


def default_labels(
    node_type: NodeType | None, *, pool_id: str, pool_name: str, cluster_id: str, region: str, zone: str
) -> dict[str, str]:
    """Well-known node labels a pool's ``labels`` carry with ``default_labels: true`` (our earlier model,
    close to the CA provider's own test data; recorded pools carry only what their owner set)."""
    labels = {
        POOL_LABEL: pool_id,
        "k8s.scaleway.com/pool-name": pool_name,
        "k8s.scaleway.com/cluster": cluster_id,
        "kubernetes.io/os": "linux",
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
    }
    if node_type is not None:
        labels["node.kubernetes.io/instance-type"] = node_type.name
        labels["kubernetes.io/arch"] = node_type.arch
        if node_type.gpus:
            labels[GPU_LABEL] = node_type.gpu_model
    return labels


def lookup(name: str) -> NodeType | None:
    """The catalog entry of a node type in any spelling (``DEV1-M``, ``dev1_m``)."""
    return NODE_TYPES.get(name) or NODE_TYPES.get(commercial_type(name))
