"""Encode a NodeTemplate as the raw ``v1.Node`` protobuf bytes the CA decodes (no k8s envelope).

See docs/reference/protocol.md, "Templates for scale-from-zero": allocatable must carry ``pods``, quantities
must be valid Kubernetes quantities, conditions say Ready, and the bytes are sent in both fields.
"""

from __future__ import annotations

import re
import time

from protos import k8s_core_v1_pb2 as k8s
from providers.model import NodeTemplate

READY_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("NetworkUnavailable", "False", "RouteCreated", "template node"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "template node"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "template node"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "template node"),
)
DEFAULT_PODS = "110"
# Kubernetes resource.Quantity grammar: signed decimal number with an optional binary/decimal suffix.
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def is_valid_quantity(value: str) -> bool:
    return bool(_QUANTITY.match(value))


def encode_template(group_id: str, template: NodeTemplate, now: float | None = None) -> bytes:
    """Serialise ``template`` to ``v1.Node`` bytes; raises ValueError on an invalid quantity."""
    now = time.time() if now is None else now
    node = k8s.Node()
    name = f"template-node-for-{group_id}"
    node.metadata.name = name
    node.metadata.labels.update(template.labels)
    node.metadata.labels.setdefault("kubernetes.io/hostname", name)
    node.spec.unschedulable = False
    node.spec.SetInParent()
    for taint in template.taints:
        node.spec.taints.add(key=taint.key, value=taint.value, effect=taint.effect)
    allocatable = dict(template.allocatable)
    allocatable.setdefault("pods", template.capacity.get("pods", DEFAULT_PODS))
    capacity = dict(template.capacity)
    for key, value in allocatable.items():
        capacity.setdefault(key, value)
    for target, values in ((node.status.capacity, capacity), (node.status.allocatable, allocatable)):
        for key, value in values.items():
            if not is_valid_quantity(value):
                raise ValueError(f"template of node group {group_id!r}: {key}={value!r} is not a valid quantity")
            target[key].string = value
    transition = int(now) - 60
    for ctype, status, reason, message in READY_CONDITIONS:
        cond = node.status.conditions.add(type=ctype, status=status, reason=reason, message=message)
        cond.lastHeartbeatTime.seconds = int(now)
        cond.lastTransitionTime.seconds = transition
    node.status.phase = "Running"
    info = node.status.nodeInfo
    info.operatingSystem = template.labels.get("kubernetes.io/os", "linux")
    info.architecture = template.labels.get("kubernetes.io/arch", "amd64")
    return node.SerializeToString(deterministic=True)
