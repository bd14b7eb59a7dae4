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
will carry: ``LabelAgreement`` keeps it out of the group's template, until the group's nodes agree on
it again. A key a node does not carry yet says nothing (a DaemonSet labels a node some time after it
joined).

When a key comes back (``LABEL_SETTLE``): once every node of the group that carries it and was seen in
the last ``LABEL_SETTLE`` has shown one value, without a change on any node and without another value on
any other, for ``LABEL_SETTLE``. A node not seen for that long no longer counts (deleted, not Ready, moved
to another group), so a key also comes back once the node that disagreed is gone. A MIG reconfiguration
(every node of the pool then carries ``nvidia.com/gpu.product=...-MIG-1g.10gb``) brings the key back with
its new value ten minutes after the last node was reconfigured; a label that changes more often than that
on some node stays out. Ten minutes is twice the kubelet's default ``nodeStatusReportFrequency`` (5 min):
every live node's Node object changes, and is seen by the learner's watch, at least that often (the CA
asks NodeGroupForNode of every node each scan, every 10 s). Where each fact comes from is in
docs/explanation/kubernetes.md ("Labels that vary").
"""

from __future__ import annotations

from collections import Counter
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


#: how long the nodes of a group must agree on a key that varied before it comes back (see the module doc)
LABEL_SETTLE = 600.0
#: a key's nodes not seen for LABEL_SETTLE are forgotten at most this often (when they disagree)
FORGET_UNSEEN_EVERY = 60.0


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
class _Variance:
    """A key that varies: the value each node carrying it showed last and when, when each value was last
    shown by any node, and when a node last changed its own value."""

    changed_at: float  # a node changed its value (or the key was found varying, or first seen after a restart)
    seen: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> (value, when)
    counts: Counter[str] = field(default_factory=Counter)  # value -> nodes in ``seen`` showing it
    last_shown: dict[str, float] = field(default_factory=dict)  # value -> when a node last showed it
    forgotten_at: float = 0.0

    def observe(self, node: str, value: str, now: float) -> None:
        before = self.seen.get(node)
        if before is not None:
            self._uncount(before[0])
            if before[0] != value:
                self.changed_at = now
        self.seen[node] = (value, now)
        self.counts[value] += 1
        self.last_shown[value] = now

    def agreed(self, now: float) -> str | None:
        """The one value the nodes seen in the last LABEL_SETTLE show, if no node has shown another, nor
        changed its own, for LABEL_SETTLE; else None."""
        if len(self.counts) > 1 and now - self.forgotten_at >= FORGET_UNSEEN_EVERY:
            self._forget_unseen(now)
        if len(self.counts) != 1:
            return None
        value = next(iter(self.counts))
        since = max([self.changed_at, *(t for other, t in self.last_shown.items() if other != value)])
        return value if now - since >= LABEL_SETTLE else None

    def _forget_unseen(self, now: float) -> None:
        """Nodes not seen for LABEL_SETTLE count no more (gone, not Ready, in another group)."""
        self.forgotten_at = now
        for node, (value, when) in list(self.seen.items()):
            if now - when > LABEL_SETTLE:
                del self.seen[node]
                self._uncount(value)
        for value, when in list(self.last_shown.items()):
            if value not in self.counts and now - when > LABEL_SETTLE:
                del self.last_shown[value]  # shown too long ago to matter

    def _uncount(self, value: str) -> None:
        self.counts[value] -= 1
        if not self.counts[value]:
            del self.counts[value]


@dataclass(frozen=True)
class Seen:
    """What one node's labels changed in a group's agreement."""

    varied: frozenset[str]  # keys found to vary by them
    agreed_again: Mapping[str, str]  # keys that varied, back with the value the nodes agree on


@dataclass
class LabelAgreement:
    """What the nodes of one group agree on, label by label (labels already cut by ``GroupLabels``).

    The first value seen for a key stands until a node shows another one, on another node or on the same
    node later: the key then *varies* and stays out of the group's template until its nodes agree again
    (the module doc says when). A node without the key says nothing. The machine type
    (``MACHINE_TYPE_LABELS``) is never held to agreement: a new value means new machines. Not
    thread-safe: its owner locks."""

    values: dict[str, str] = field(default_factory=dict)
    varying: set[str] = field(default_factory=set)
    # Per varying key, what its nodes show (a key adopted as varying, after a restart, starts empty).
    variances: dict[str, _Variance] = field(default_factory=dict)

    def observe(self, labels: Mapping[str, str], node: str, now: float) -> Seen:
        """Take one node's labels in, seen at ``now`` (seconds, monotonic)."""
        varied: set[str] = set()
        back: dict[str, str] = {}
        for key, value in labels.items():
            if key in MACHINE_TYPE_LABELS:
                continue
            if key not in self.varying:
                if self.values.setdefault(key, value) != value:
                    varied.add(key)
                    self.varying.add(key)
                    del self.values[key]
                    self.variances[key] = _Variance(now)
                    self.variances[key].observe(node, value, now)
                continue
            variance = self.variances.setdefault(key, _Variance(now))
            variance.observe(node, value, now)
            agreed = variance.agreed(now)
            if agreed is not None:
                back[key] = self.values[key] = agreed
                self.varying.discard(key)
                del self.variances[key]
        return Seen(frozenset(varied), back)

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
