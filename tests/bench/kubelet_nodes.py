"""Node objects shaped like the ones a real kubelet registers and keeps, for benchmarks at cluster scale.

The node agent of the e2e suite writes small Nodes (labels, taints, capacity, one condition). A kubelet's
Node is several times larger, and a watch or list of Nodes pays for every byte of it, so the Kubernetes
features are measured against Nodes with what a kubelet (v1.36, default flags) and the usual node
add-ons put there:

- ``status.images``: ``--node-status-max-images`` (50) images, each with a digest name and a tag name
  and a size, drawn from a fixed set of realistic repositories;
- the five kubelet conditions plus the node-problem-detector ones, with real reasons and messages;
- ``InternalIP``, ``ExternalIP`` and ``Hostname`` addresses, ``nodeInfo``, ``daemonEndpoints``,
  ``runtimeHandlers``, ``features``, attached volumes;
- the kubelet's and the cloud controller's labels and annotations (CSI node id, CNI addresses, TTL).

The API server adds ``metadata.managedFields`` itself, as it does for a real kubelet's writes.
Everything is derived from the node's index, so a run is reproducible.
"""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime
from typing import Any

KUBELET_VERSION = "v1.36.2"
MAX_IMAGES = 50  # the kubelet's --node-status-max-images default
# (repository, tag, size in MiB): the images of a typical cluster's system pods and workloads.
IMAGE_SET = [
    ("registry.k8s.io/kube-proxy", KUBELET_VERSION, 28),
    ("registry.k8s.io/pause", "3.10", 1),
    ("registry.k8s.io/coredns/coredns", "v1.12.1", 22),
    ("registry.k8s.io/metrics-server/metrics-server", "v0.8.0", 19),
    ("registry.k8s.io/sig-storage/csi-node-driver-registrar", "v2.14.0", 11),
    ("registry.k8s.io/sig-storage/livenessprobe", "v2.16.0", 10),
    ("registry.k8s.io/nfd/node-feature-discovery", "v0.17.3", 75),
    ("quay.io/cilium/cilium", "v1.18.1", 210),
    ("quay.io/cilium/operator-generic", "v1.18.1", 36),
    ("quay.io/prometheus/node-exporter", "v1.9.1", 12),
    ("quay.io/prometheus-operator/prometheus-config-reloader", "v0.84.0", 14),
    ("quay.io/jetstack/cert-manager-controller", "v1.18.2", 20),
    ("docker.io/grafana/promtail", "3.5.3", 88),
    ("docker.io/fluent/fluent-bit", "4.0.7", 45),
    ("docker.io/library/nginx", "1.29.1", 72),
    ("docker.io/library/redis", "8.2.0", 52),
    ("docker.io/library/postgres", "17.6", 160),
    ("docker.io/bitnami/kafka", "4.0.0", 340),
    ("ghcr.io/external-secrets/external-secrets", "v0.19.2", 42),
    ("ghcr.io/fluxcd/source-controller", "v1.6.2", 34),
    ("nvcr.io/nvidia/k8s-device-plugin", "v0.17.3", 120),
    ("rg.fr-par.scw.cloud/scaleway/scaleway-csi", "v0.3.5", 38),
    ("public.ecr.aws/karpenter/controller", "1.6.1", 51),
    ("gcr.io/distroless/static-debian12", "nonroot", 1),
]
WORKLOAD_REPOSITORIES = ("rg.fr-par.scw.cloud/acme/api", "rg.fr-par.scw.cloud/acme/worker", "ghcr.io/acme/frontend")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _split(digest: str) -> tuple[str, str, str]:
    return digest[:8], digest[8:12], digest[12:24]


def images(index: int) -> list[dict[str, Any]]:
    """The node's 50 largest images as the kubelet lists them: digest name first, then the tag."""
    rng = random.Random(index)
    chosen = list(IMAGE_SET)
    while len(chosen) < MAX_IMAGES:  # workload images: a few services, many releases of each
        repository = rng.choice(WORKLOAD_REPOSITORIES)
        chosen.append((repository, f"v2.{rng.randrange(400)}.{rng.randrange(30)}", rng.randrange(40, 900)))
    sized = []
    for repository, tag, mib in chosen[:MAX_IMAGES]:
        names = [f"{repository}@sha256:{_digest(repository + tag)}", f"{repository}:{tag}"]
        sized.append((mib * 1024 * 1024 + rng.randrange(1 << 20), names))
    sized.sort(key=lambda image: -image[0])
    return [{"names": names, "sizeBytes": size} for size, names in sized]


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def conditions(ready: bool, now: str) -> list[dict[str, str]]:
    """The kubelet's five conditions and node-problem-detector's, as a healthy node reports them."""
    ready_condition = (
        _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", now)
        if ready
        else _condition(
            "Ready",
            "False",
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
            "message:Network plugin returns error: cni plugin not initialized",
            now,
        )
    )
    return [
        _condition("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock", now),
        _condition("ReadonlyFilesystem", "False", "FilesystemIsNotReadOnly", "Filesystem is not read-only", now),
        _condition(
            "FrequentKubeletRestart", "False", "NoFrequentKubeletRestart", "kubelet is functioning properly", now
        ),
        _condition(
            "FrequentContainerdRestart",
            "False",
            "NoFrequentContainerdRestart",
            "containerd is functioning properly",
            now,
        ),
        _condition("NetworkUnavailable", "False", "CiliumIsUp", "Cilium is running on this node", now),
        _condition(
            "MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available", now
        ),
        _condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", now),
        _condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available", now),
        ready_condition,
    ]


def kubelet_node(
    index: int,
    name: str,
    provider_id: str,
    pool_labels: dict[str, str],
    capacity: dict[str, str],
    allocatable: dict[str, str],
    ready: bool = True,
    now: str | None = None,
) -> dict[str, Any]:
    """One Node as a kubelet registers it with its status, after the cloud controller completed it."""
    now = now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    machine = provider_id.rstrip("/").rsplit("/", 1)[-1]
    internal = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    external = f"51.15.{(index >> 8) & 255}.{index & 255}"
    zone = pool_labels.get("topology.kubernetes.io/zone", "fr-par-1")
    instance_type = pool_labels.get("node.kubernetes.io/instance-type", "PRO2-S")
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": instance_type,
        "failure-domain.beta.kubernetes.io/region": zone.rsplit("-", 1)[0],
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "k8s.scaleway.com/managed": "true",
        "k8s.scaleway.com/node": machine,
        "k8s.scaleway.com/runtime": "containerd",
        "topology.csi.scaleway.com/zone": zone,
        **pool_labels,
    }
    annotations = {
        "alpha.kubernetes.io/provided-node-ip": internal,
        "csi.volume.kubernetes.io/nodeid": '{"csi.scaleway.com":"' + f"{zone}/{machine}" + '"}',
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "network.cilium.io/ipv4-cilium-host": f"100.64.{(index >> 8) & 255}.{index & 255}",
        "network.cilium.io/ipv4-health-ip": f"100.64.{(index >> 8) & 255}.{(index + 1) & 255}",
        "network.cilium.io/ipv4-pod-cidr": f"100.64.{(index >> 8) & 255}.0/24",
        "nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX2,cpu-cpuid.AVX512F,cpu-hardware_multithreading,"
        "kernel-version.full,pci-1af4.present,system-os_release.ID",
        "nfd.node.kubernetes.io/master.version": "v0.17.3",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "podCIDR": f"100.64.{(index >> 8) & 255}.0/24",
            "podCIDRs": [f"100.64.{(index >> 8) & 255}.0/24"],
            "providerID": provider_id,
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions(ready, now),
            "addresses": [
                {"type": "InternalIP", "address": internal},
                {"type": "ExternalIP", "address": external},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": _digest(f"machine-{index}")[:32],
                "systemUUID": machine,
                "bootID": "{}-{}-4e1b-9c4d-{}".format(*_split(_digest(f"boot-{index}"))),
                "kernelVersion": "6.8.0-79-generic",
                "osImage": "Ubuntu 24.04.3 LTS",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images(index),
            "runtimeHandlers": [
                {"name": "runc", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
                {"name": "", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
            ],
            "features": {"supplementalGroupsPolicy": True},
            "volumesInUse": [f"kubernetes.io/csi/csi.scaleway.com^{zone}/{_digest(f'vol-{index}')[:36]}"],
            "volumesAttached": [
                {
                    "name": f"kubernetes.io/csi/csi.scaleway.com^{zone}/{_digest(f'vol-{index}')[:36]}",
                    "devicePath": "",
                }
            ],
        },
    }


# CPU flags node-feature-discovery reports on a recent x86 server, one label each.
_CPU_FLAGS_TEXT = (
    "ADX AESNI AMXBF16 AMXINT8 AMXTILE AVX AVX2 AVX512BF16 AVX512BITALG AVX512BW AVX512CD AVX512DQ "
    "AVX512F AVX512FP16 AVX512IFMA AVX512VBMI AVX512VBMI2 AVX512VL AVX512VNNI AVX512VPOPCNTDQ AVXVNNI "
    "BMI1 BMI2 CETIBT CETSS CLDEMOTE CLMUL CLWB CMPXCHG8 CX16 ENQCMD ERMS F16C FLUSH_L1D FMA3 FSRM FXSR "
    "FXSROPT GFNI HLE HYPERVISOR IA32_ARCH_CAP IBPB IBRS LAHF LZCNT MD_CLEAR MMX MOVBE MOVDIR64B MOVDIRI "
    "MPX NX OSXSAVE PCONFIG POPCNT RDRAND RDSEED RDTSCP RTM SERIALIZE SHA SPEC_CTRL_SSBD SSE SSE2 SSE3 "
    "SSE4 SSE42 SSSE3 STIBP SYSCALL SYSEE TSXLDTRK VAES VMX VPCLMULQDQ WAITPKG WBNOINVD X87 XGETBV1 XSAVE "
    "XSAVEC XSAVEOPT XSAVES"
)
NFD_CPU_FLAGS = tuple(_CPU_FLAGS_TEXT.split())


def nfd_labels(count: int = 150) -> dict[str, str]:
    """``count`` labels as node-feature-discovery puts on a node (CPU flags, kernel, PCI, OS): the same on
    every machine of a type, so they are part of what a learned template carries."""
    labels = {
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/cpu-model.family": "6",
        "feature.node.kubernetes.io/cpu-model.id": "143",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-79-generic",
        "feature.node.kubernetes.io/kernel-version.major": "6",
        "feature.node.kubernetes.io/kernel-version.minor": "8",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04",
        "feature.node.kubernetes.io/pci-1af4.present": "true",
        "feature.node.kubernetes.io/storage-nonrotationaldisk": "true",
    }
    for flag in NFD_CPU_FLAGS:
        labels[f"feature.node.kubernetes.io/cpu-cpuid.{flag}"] = "true"
    index = 0
    while len(labels) < count:  # kernel config options fill the rest, as NFD lists them
        labels[f"feature.node.kubernetes.io/kernel-config.OPTION_{index:03d}"] = "true"
        index += 1
    return dict(list(labels.items())[:count])
