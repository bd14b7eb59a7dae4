"""The labels NVIDIA GPU feature discovery (GFD) writes on a GPU node, as its labellers build them, for the
learned-template tests (issue 30). Sources, in NVIDIA/k8s-device-plugin (where GFD lives since v0.15):
docs/gfd_labels.md (the documented set), internal/lm/nvml.go (driver and CUDA versions, MIG and MPS
capability, GPU mode), internal/lm/resource.go (product, count, replicas, memory, family, compute
capability), internal/lm/machine-type.go, internal/lm/timestamp.go and internal/lm/imex.go; the GPU
operator adds ``nvidia.com/gpu.present`` (through an NFD rule), its per-component ``gpu.deploy.*`` switches,
and per-node progress labels (NVIDIA/k8s-operator-libs pkg/upgrade/consts.go:
``nvidia.com/<component>-driver-upgrade-state``; the MIG manager's ``nvidia.com/mig.config.state``).

GFD relabels every ``sleepInterval`` (60 s by default); on an unchanged node only the timestamp changes.
"""

from __future__ import annotations

# An 8 x A100 80 GB machine as GFD labels it (values as its labellers format them).
A100_NODE = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.driver.rev": "07",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "90",
    "nvidia.com/cuda.driver-version.revision": "07",
    "nvidia.com/cuda.driver-version.full": "550.90.07",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gfd.timestamp": "1764780000",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.machine": "H8-A100-80G",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
    "nvidia.com/mig.config.state": "success",
}

# What describes the machine type and so a new node of its group: everything above but what names one
# machine or one moment.
PER_MACHINE_OR_MOMENT = frozenset(
    {"nvidia.com/gfd.timestamp", "nvidia.com/gpu-driver-upgrade-state", "nvidia.com/mig.config.state"}
)


def relabelled(labels: dict[str, str], at: int) -> dict[str, str]:
    """The same node's labels after a GFD pass at Unix time ``at``: only the timestamp changes."""
    return {**labels, "nvidia.com/gfd.timestamp": str(at)}
