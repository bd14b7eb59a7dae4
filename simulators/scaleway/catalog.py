"""Node types the simulated Kapsule knows, and the per-pool template data derived from them.

Units (not confirmed by Scaleway; docs/scaleway.md, "The simulator"): ``capacity`` and ``allocatable``
are in WHOLE units, exactly as the upstream provider decodes them (``resource.NewQuantity(v,
DecimalSI)``): ``cpu`` in cores, ``memory`` and ``ephemeral-storage`` in bytes, ``pods`` and GPUs as
counts. Prices are approximate list prices in EUR per hour; they only need to be plausible and distinct.
"""

from __future__ import annotations

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


def default_labels(
    node_type: NodeType | None, *, pool_id: str, pool_name: str, cluster_id: str, region: str, zone: str
) -> dict[str, str]:
    """Well-known labels Kapsule puts on a pool's nodes (our pick: the real set is not published)."""
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
    return NODE_TYPES.get(name) or NODE_TYPES.get(name.upper().replace("_", "-"))
