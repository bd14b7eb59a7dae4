"""Which labels of a real node describe its node group: the one rule for a template built from a node.

Two paths take a real node's labels into its group's template for scale-from-zero: the labels the CA
shows in NodeGroupForNode (``Backend.observe_node``, filling in the cloud's template) and learned
templates (server/kube/templates.py, from the Node objects). A label is kept only when it describes
every node of the group, so that a new node of the group would carry it too:

- its key is in ``GROUP_LABELS`` (what describes the machine type, the zone and the pool) or among the
  keys and prefixes the config adds (``kubernetes.learned_templates.labels``);
- it does not name one machine: not in ``PER_NODE_LABELS``, and its value is not the node's name, its
  providerID or the machine id at the providerID's end (a pod selecting on it would land on a copy).

A label an operator puts on one node for a while (``maintenance=true``) is therefore never served for
the group, where it would outlive that node.

Under a kept prefix some labels still say something about one machine or one moment, not the group:
``VOLATILE_LABELS`` are known to (GPU feature discovery's timestamp, rewritten every minute; the NVLink
clique a machine sits in; the GPU operator's per-node progress labels). And whatever the key, a label
whose value differs between two nodes of one group, or changes on one node, cannot tell what a new node
will carry: ``LabelAgreement`` keeps it out of the group's template from then on. A key a node does not
carry yet says nothing (a DaemonSet labels a node some time after it joined). Where each fact comes from
is in docs/explanation/kubernetes.md ("Labels that vary").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from providers.bizfly.templates import PER_NODE_LABELS as BIZFLY_PER_NODE_LABELS
from providers.scaleway.templates import NODE_SPECIFIC_LABELS as SCALEWAY_PER_NODE_LABELS

# Labels that name one machine, never its group: the node's own name, and the per-machine labels each
# cloud package already keeps out of its templates (Bizfly's node and server ids, Kapsule's node id).
PER_NODE_LABELS = frozenset(
    {"kubernetes.io/hostname", "node.kubernetes.io/instance-id"} | BIZFLY_PER_NODE_LABELS | SCALEWAY_PER_NODE_LABELS
)
# The labels kept without configuration: the same on every node of a group. Keys, and prefixes ending in "/".
GROUP_LABELS = (
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/",  # the deprecated os/arch/instance-type the kubelet still sets
    "topology.kubernetes.io/",  # region, zone
    "failure-domain.beta.kubernetes.io/",
    "topology.csi.scaleway.com/",  # the CSI driver's zone: volume node affinity is checked against it
    "feature.node.kubernetes.io/",  # node-feature-discovery: CPU, kernel, PCI features of the machine type
    "nvidia.com/",  # GPU feature discovery: product, memory, count
    "k8s.scaleway.com/",  # Kapsule's pool labels on every node (its per-node ones are dropped above)
    "bke.bizflycloud.vn/",  # Bizfly's pool labels (likewise)
)
# Labels under a kept prefix that describe one machine or one moment (docs/reference/kubernetes-features.md, "Labels
# known to vary").
VOLATILE_LABELS = frozenset(
    {
        "nvidia.com/gfd.timestamp",  # GPU feature discovery: when it last labelled the node (every minute)
        "nvidia.com/gpu.clique",  # GFD: the NVLink fabric clique of this machine's GPUs (its rack, not its pool)
        "nvidia.com/gpu.imex-domain",  # GFD: the IMEX domain of that clique
        "nvidia.com/mig.config.state",  # the GPU operator's MIG manager: pending, success, failed on this node
    }
)
# The GPU operator's driver upgrade state machine, one label per component on each node it upgrades
# (nvidia.com/gpu-driver-upgrade-state: upgrade-required, cordon-required, ..., upgrade-done).
VOLATILE_LABEL_SUFFIXES = ("-driver-upgrade-state",)
# The machine type: a node of the group with another one means the group's machines changed (the newest
# node teaches it, and a pool the cloud now describes with another type drops the learned template),
# never that the label varies.
MACHINE_TYPE_LABELS = frozenset({"node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"})


def is_volatile(key: str) -> bool:
    return key in VOLATILE_LABELS or (key.startswith("nvidia.com/") and key.endswith(VOLATILE_LABEL_SUFFIXES))


@dataclass(frozen=True)
class KeyPatterns:
    """Label or taint keys: exact ones, and prefixes ending in "/" standing for every key under them."""

    keys: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, patterns: Iterable[str]) -> KeyPatterns:
        items = list(patterns)
        return cls(frozenset(p for p in items if not p.endswith("/")), tuple(p for p in items if p.endswith("/")))

    def match(self, key: str) -> bool:
        return key in self.keys or key.startswith(self.prefixes)


@dataclass(frozen=True)
class GroupLabels:
    """The rule: ``GROUP_LABELS`` plus the configured keys and prefixes, never a label naming one machine."""

    patterns: KeyPatterns = KeyPatterns.of(GROUP_LABELS)

    @classmethod
    def with_extra(cls, extra: Iterable[str]) -> GroupLabels:
        """The rule with the keys and prefixes of ``kubernetes.learned_templates.labels`` added."""
        return cls(KeyPatterns.of((*GROUP_LABELS, *extra)))

    def keep(self, labels: Mapping[str, str], machine: Iterable[str] = ()) -> dict[str, str]:
        """The labels of a node that describe its group; ``machine``: the values that name this one node
        (``machine_names``)."""
        names = frozenset(machine)
        return {
            k: v
            for k, v in labels.items()
            if self.patterns.match(k) and k not in PER_NODE_LABELS and v not in names and not is_volatile(k)
        }


@dataclass
class LabelAgreement:
    """What the nodes of one group agree on, label by label (labels already cut by ``GroupLabels``).

    The first value seen for a key stands until a node shows another one, on another node or on the same
    node later: the key then *varies* and stays out of the group's template for good (a later value could
    change again; a new node may carry either). A node without the key says nothing. The machine type
    (``MACHINE_TYPE_LABELS``) is never held to agreement: a new value means new machines. Not thread-safe:
    its owner locks."""

    values: dict[str, str] = field(default_factory=dict)
    varying: set[str] = field(default_factory=set)

    def observe(self, labels: Mapping[str, str]) -> set[str]:
        """Take one node's labels in; the keys found to vary by them."""
        held = (key for key in labels if key not in self.varying and key not in MACHINE_TYPE_LABELS)
        found = {key for key in held if self.values.setdefault(key, labels[key]) != labels[key]}
        for key in found:
            self.varying.add(key)
            del self.values[key]
        return found

    def agreed(self, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` without the keys that vary."""
        return {k: v for k, v in labels.items() if k not in self.varying}


def machine_names(node_name: str, provider_id: str) -> set[str]:
    """Values that identify one machine: its node name, its providerID and the id at the providerID's end."""
    names = {node_name}
    if provider_id:
        names.add(provider_id)
        names.add(provider_id.rstrip("/").rsplit("/", 1)[-1])
    return {n for n in names if n}
