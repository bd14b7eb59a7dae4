"""Learned templates, the pure parts: what a Node teaches, the ConfigMap record, and the order
override > learned > cloud in the Backend (with an in-memory adapter: no cloud is involved)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from providers.backend import Backend
from providers.deadline import Deadline
from providers.model import (
    CloudListing,
    GroupState,
    Instance,
    InstanceState,
    LearnedTemplate,
    NodeRef,
    NodeTemplate,
    Taint,
)
from providers.node_labels import LABEL_SETTLE, GroupLabels, LabelAgreement
from providers.registry import Registry
from server.config import TemplateOverride
from server.kube.settings import LearnedTemplatesConfig
from server.kube.templates import (
    BadRecord,
    LearningRules,
    NodeFields,
    TemplateLearner,
    decode_learned,
    encode_learned,
    fit_in_budget,
    node_fields,
    template_from_node,
)
from tests.support.gfd import A100_NODE, PER_MACHINE_OR_MOMENT, relabelled

NAME = "big-ke1m4ea3-node-1b7o259o"
PHYSICAL = "380208a9-ad45-423d-bb1a-11df587fd280"


def node(ready: str = "True", deleting: bool = False, **labels: str) -> NodeFields:
    """A Node's JSON as the API server sends it, read the way the learner reads it."""
    return node_fields(
        {
            "metadata": {
                "name": NAME,
                "labels": {
                    "kubernetes.io/hostname": NAME,
                    "bke.bizflycloud.vn/node-id": "37730edf",
                    "bke.bizflycloud.vn/pool-name": "big",
                    "node.kubernetes.io/instance-type": "nix.4c_16g",
                    "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
                    "feature.node.kubernetes.io/machine-uuid": PHYSICAL,  # names the machine by its id: per node
                    "maintenance": "planned",  # put on this node by hand: not a property of the group
                    **labels,
                },
                **({"deletionTimestamp": "2026-12-03T18:00:00Z"} if deleting else {}),
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {
                "providerID": f"bizflycloud://{PHYSICAL}",
                "taints": [
                    {"key": "dedicated", "value": "big", "effect": "NoSchedule"},
                    {"key": "storage.example.com/local-ssd", "value": "pending", "effect": "PreferNoSchedule"},
                    {"key": "maintenance.example.com/drain", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "ToBeDeletedByClusterAutoscaler", "value": "1764780000", "effect": "NoSchedule"},
                    {"key": "DeletionCandidateOfClusterAutoscaler", "value": "1", "effect": "PreferNoSchedule"},
                    {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
                    {"key": "startup-taint.cluster-autoscaler.kubernetes.io/csi", "effect": "NoSchedule"},
                ],
            },
            "status": {
                "capacity": {"cpu": "4", "memory": "16384Mi", "pods": "110"},
                "allocatable": {"cpu": "3900m", "memory": "14645Mi", "pods": "110"},
                "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 1}],
            },
        }
    )


# Learning the taint a DaemonSet adds at join, besides the default labels and the operator's own prefix.
RULES = LearningRules.of(
    LearnedTemplatesConfig(labels=["example.com/tier"], taints=["storage.example.com/", "node.kubernetes.io/"])
)


def test_a_ready_node_teaches_the_allowlisted_labels_and_the_configured_taints_and_its_resources() -> None:
    template = template_from_node(node(**{"example.com/tier": "gold", "example.com/owner": "alice"}), RULES)
    assert template is not None
    assert template.labels == {
        "bke.bizflycloud.vn/pool-name": "big",
        "node.kubernetes.io/instance-type": "nix.4c_16g",
        "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true",
        "example.com/tier": "gold",
    }
    # Configured taint prefixes never bring back a condition's taint, and a hand-put taint stays out.
    assert template.taints == (Taint("storage.example.com/local-ssd", "pending", "PreferNoSchedule"),)
    assert template.allocatable == {"cpu": "3900m", "memory": "14645Mi", "pods": "110"}
    assert template.capacity["memory"] == "16384Mi"


def test_without_configuration_a_node_teaches_no_taint_and_no_label_outside_the_allowlist() -> None:
    template = template_from_node(node())
    assert template is not None
    assert template.taints == ()
    assert "maintenance" not in template.labels and "kubernetes.io/hostname" not in template.labels


def test_a_record_stored_with_junk_is_cut_down_to_what_the_rules_learn() -> None:
    junk = NodeTemplate(
        {"maintenance": "planned", "kubernetes.io/arch": "amd64"},
        (Taint("maintenance.example.com/drain", "", "NoSchedule"), Taint("storage.example.com/x", "", "NoSchedule")),
        {"cpu": "4", "memory": "1Gi"},
        {"cpu": "4", "memory": "1Gi"},
    )
    kept = RULES.filter(junk)
    assert kept.labels == {"kubernetes.io/arch": "amd64"}
    assert kept.taints == (Taint("storage.example.com/x", "", "NoSchedule"),)


def test_records_beyond_the_configmap_limit_leave_out_groups_with_nodes_first() -> None:
    records = {f"g{i}": "x" * 100 for i in range(10)}
    kept, left_out = fit_in_budget(records, lambda gid: gid in ("g7", "g8"), budget=330)
    assert set(kept) >= {"g7", "g8"} and len(kept) == 3
    assert len(left_out) == 7 and sum(len(k) + len(v) for k, v in kept.items()) <= 330
    assert fit_in_budget(records, lambda gid: False) == (records, [])


@pytest.mark.parametrize(("ready", "deleting"), [("False", False), ("Unknown", False), ("True", True)])
def test_a_node_not_ready_or_being_deleted_teaches_nothing(ready: str, deleting: bool) -> None:
    assert template_from_node(node(ready=ready, deleting=deleting)) is None


def test_the_record_round_trips_and_bad_records_are_refused() -> None:
    learned = LearnedTemplate(template_from_node(node()), NAME, "2026-12-03T18:00:00Z")  # type: ignore[arg-type]
    assert decode_learned(encode_learned(learned)) == learned
    for bad in ("{", '{"format": 2}', encode_learned(learned).replace('"3900m"', '"lots"')):
        with pytest.raises(BadRecord):
            decode_learned(bad)


# ------------------------------------------------------------------------------------------ the Backend
CLOUD = NodeTemplate(
    {"node.kubernetes.io/instance-type": "nix.4c_16g", "workload": "big"},
    (),
    {"cpu": "4", "memory": "16384Mi"},
    {"cpu": "3920m", "memory": "13622Mi"},
)


class InMemoryAdapter:
    """The Backend's template rules need a group and the cloud's template, nothing else."""

    cloud = "memory"
    gpu_label = "gpu"

    def __init__(self, template: NodeTemplate) -> None:
        self.cloud_template = template
        self.observed: Mapping[str, str] | None = None  # the node labels the Backend last gave

    def list_groups(self, deadline: Deadline) -> CloudListing:
        return CloudListing((GroupState("big", 0, 3, 0, ()),))

    def template(self, group: GroupState, observed: Mapping[str, str] | None) -> NodeTemplate | None:
        self.observed = observed
        return self.cloud_template

    def same_machine_type(self, first: str, second: str) -> bool:
        return first == second

    def read_group(self, group_id: str, deadline: Deadline) -> GroupState: ...
    def set_target_size(self, group: GroupState, new_size: int, deadline: Deadline) -> None: ...
    def delete_instance(self, group: GroupState, inst: Instance, node: NodeRef, deadline: Deadline) -> None: ...
    def close(self) -> None: ...


def backend(overrides: dict[str, Any] | None = None, cloud: NodeTemplate = CLOUD) -> tuple[Backend, InMemoryAdapter]:
    adapter = InMemoryAdapter(cloud)
    built = Backend("memory", adapter, template_overrides=overrides)  # type: ignore[arg-type]
    built.start(background=False)
    return built, adapter


LEARNED = LearnedTemplate(
    NodeTemplate(
        {"node.kubernetes.io/instance-type": "nix.4c_16g", "workload": "big", "nfd": "yes"},
        (Taint("dedicated", "big", "NoSchedule"),),
        {"cpu": "4", "memory": "16384Mi"},
        {"cpu": "3900m", "memory": "14645Mi"},
    ),
    NAME,
    "2026-12-03T18:00:00Z",
)


def test_learned_beats_cloud_and_a_change_changes_the_cache_key() -> None:
    b, _ = backend()
    assert b.template("big") == CLOUD and b.template_source("big") == "cloud"
    key = b.template_key("big")
    b.set_learned_template("big", LEARNED)
    assert b.template_key("big") != key
    assert b.template("big") == LEARNED.template
    assert b.template_source("big") == f"learned from node {NAME} at 2026-12-03T18:00:00Z"
    same = b.template_key("big")
    b.set_learned_template("big", LEARNED)  # the same record again: nothing to rebuild
    assert b.template_key("big") == same


def test_the_labels_the_ca_shows_of_a_node_pass_the_same_rule_as_a_learned_nodes() -> None:
    # One rule (providers/node_labels.py) for the labels NodeGroupForNode shows and for a learned node's:
    # the allowlist plus the configured keys, never a label naming the machine or put on it by hand.
    rules = LearningRules.of(LearnedTemplatesConfig(labels=["example.com/tier"]))
    adapter = InMemoryAdapter(CLOUD)
    b = Backend("memory", adapter, group_labels=rules.labels)  # type: ignore[arg-type]
    b.start(background=False)
    shown = node(**{"example.com/tier": "gold", "example.com/rack": "r12"})
    assert b.observe_node("big", shown.metadata.labels, shown.metadata.name, shown.spec.providerID)
    b.template("big")
    learned = template_from_node(shown, rules)
    assert learned is not None and adapter.observed == learned.labels
    assert adapter.observed["example.com/tier"] == "gold"
    assert not {"maintenance", "example.com/rack", "feature.node.kubernetes.io/machine-uuid"} & adapter.observed.keys()
    # A node showing nothing of its group's changes nothing.
    assert not b.observe_node("big", {"maintenance": "planned", "kubernetes.io/hostname": NAME}, NAME)
    assert b.template_source("big") == "cloud"


def test_override_keys_win_over_the_learned_template_key_by_key() -> None:
    b, _ = backend({"big": TemplateOverride(allocatable={"cpu": "1500m"}, labels={"tier": "gold"})})
    b.set_learned_template("big", LEARNED)
    template = b.template("big")
    assert template is not None
    assert template.allocatable == {"cpu": "1500m", "memory": "14645Mi"}
    assert template.labels["tier"] == "gold" and template.labels["nfd"] == "yes"
    assert template.taints == LEARNED.template.taints
    assert b.template_source("big") == f"override over learned from node {NAME} at 2026-12-03T18:00:00Z"


def test_the_pools_own_labels_and_taints_win_over_the_learned_ones_and_follow_the_pool_at_zero() -> None:
    pool = NodeTemplate(
        {"node.kubernetes.io/instance-type": "nix.4c_16g", "workload": "huge"},  # the pool's label changed
        (Taint("dedicated", "huge", "NoExecute"), Taint("gpu", "", "NoSchedule")),
        {"cpu": "4", "memory": "16384Mi"},
        {"cpu": "3920m", "memory": "13622Mi"},
    )
    b, _ = backend(cloud=pool)
    b.set_learned_template("big", LEARNED)
    template = b.template("big")
    assert template is not None
    assert template.labels == {"node.kubernetes.io/instance-type": "nix.4c_16g", "workload": "huge", "nfd": "yes"}
    assert template.taints == pool.taints  # the pool defines "dedicated": its value wins
    assert template.allocatable == LEARNED.template.allocatable  # what the real node reported
    assert b.template_source("big").startswith("learned from node")


def test_a_pool_that_now_makes_another_machine_type_falls_back_to_the_cloud() -> None:
    other = NodeTemplate({"node.kubernetes.io/instance-type": "nix.8c_32g"}, (), {"cpu": "8"}, {"cpu": "7900m"})
    b, _ = backend(cloud=other)
    b.set_learned_template("big", LEARNED)
    assert b.template("big") == other and b.template_source("big") == "cloud"


# ------------------------------------------------------------------------------------------ labels that vary
def test_labels_that_name_a_machine_or_a_moment_are_never_kept_under_a_kept_prefix() -> None:
    # GPU feature discovery's real label set (tests/support/gfd.py): all under nvidia.com/, which is kept.
    kept = GroupLabels().keep(A100_NODE)
    assert kept.keys() == A100_NODE.keys() - PER_MACHINE_OR_MOMENT
    assert kept["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB" and kept["nvidia.com/gpu.count"] == "8"
    clique = {"nvidia.com/gpu.clique": "7b1f3c2e-uuid.1", "nvidia.com/gpu.imex-domain": "9a7c-uuid.1"}
    assert GroupLabels().keep({**A100_NODE, **clique}) == kept
    assert GroupLabels().keep({"nvidia.com/network-driver-upgrade-state": "upgrade-required"}) == {}


def test_a_label_that_differs_between_nodes_or_changes_on_one_varies_until_they_agree_again() -> None:
    agreement = LabelAgreement()
    first = {"zone": "a", "disk": "ssd", "node.kubernetes.io/instance-type": "t1"}
    assert agreement.observe(first, "n1", 0.0).varied == set()
    # Another node: the same zone, another disk; a key it lacks says nothing (not labelled yet).
    assert agreement.observe({"zone": "a", "disk": "hdd"}, "n2", 1.0).varied == {"disk"}
    # The first node again, a label changed on it over time; a machine type that changes is no variance.
    changed = {"zone": "b", "disk": "ssd", "node.kubernetes.io/instance-type": "t2"}
    assert agreement.observe(changed, "n1", 2.0).varied == {"zone"}
    assert agreement.varying == {"disk", "zone"}
    assert agreement.agreed({"zone": "a", "disk": "ssd", "gpu": "1", "node.kubernetes.io/instance-type": "t2"}) == {
        "gpu": "1",
        "node.kubernetes.io/instance-type": "t2",
    }
    # Both nodes now show zone b and keep their disks: zone comes back once they agreed for LABEL_SETTLE.
    back = {}
    for at in range(60, int(LABEL_SETTLE) + 180, 60):
        back[at] = dict(agreement.observe({"zone": "b", "disk": "ssd"}, "n1", float(at)).agreed_again)
        back[at] |= agreement.observe({"zone": "b", "disk": "hdd"}, "n2", float(at)).agreed_again
    assert {at: keys for at, keys in back.items() if keys} == {660: {"zone": "b"}}  # the first report 600 s on
    assert agreement.varying == {"disk"} and agreement.agreed({"zone": "b", "disk": "ssd"}) == {"zone": "b"}


def test_the_labels_the_ca_shows_vary_the_same_way() -> None:
    b, adapter = backend()
    gpu = {**A100_NODE, "node.kubernetes.io/instance-type": "nix.4c_16g"}
    assert b.observe_node("big", gpu, "gpu-1")
    # GFD relabels the node: only its timestamp changes, which is never kept, so nothing changes.
    for at in range(10):
        assert not b.observe_node("big", relabelled(gpu, 1764780060 + 60 * at), "gpu-1")
    # Another node of the group with another driver: the driver's labels vary from now on.
    upgraded = {**gpu, "nvidia.com/cuda.driver.minor": "127", "nvidia.com/cuda.driver-version.full": "550.127.05"}
    assert b.observe_node("big", upgraded, "gpu-2")
    b.template("big")
    assert adapter.observed is not None
    assert "nvidia.com/cuda.driver.minor" not in adapter.observed
    assert "nvidia.com/cuda.driver-version.full" not in adapter.observed
    assert adapter.observed["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"


def test_a_record_keeps_the_keys_found_varying_across_a_restart() -> None:
    learned = LearnedTemplate(
        template_from_node(node()),  # type: ignore[arg-type]
        NAME,
        "2026-12-03T18:00:00Z",
        frozenset({"nvidia.com/cuda.driver.minor"}),
    )
    text = encode_learned(learned)
    assert json.loads(text)["varying_labels"] == ["nvidia.com/cuda.driver.minor"]
    assert decode_learned(text) == learned
    plain = replace(learned, varying_labels=frozenset())
    assert "varying_labels" not in encode_learned(plain), "a record without any is written as before"
    with pytest.raises(BadRecord):
        decode_learned(text.replace('["nvidia.com/cuda.driver.minor"]', '"nvidia.com/cuda.driver.minor"'))


# ------------------------------------------------------------------- labels that vary, then agree (issue 40)
PRODUCT = "nvidia.com/gpu.product"
MIG = "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
GPU_NODES = {"gpu-1": "openstack:///9e1f0c5a-0001", "gpu-2": "openstack:///9e1f0c5a-0002"}


class ListedAdapter(InMemoryAdapter):
    """The group with the two machines behind GPU_NODES, so that the learner maps their Nodes to it."""

    def list_groups(self, deadline: Deadline) -> CloudListing:
        machines = tuple(Instance(pid, InstanceState.RUNNING, pid) for pid in GPU_NODES.values())
        return CloudListing((GroupState("big", 0, 3, 2, machines),))


def gpu_node(name: str, product: str) -> NodeFields:
    """A Ready GPU node of the group as the learner reads it from the watch."""
    return node_fields(
        {
            "metadata": {"name": name, "labels": {**A100_NODE, PRODUCT: product}},
            "spec": {"providerID": GPU_NODES[name]},
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gpu_learner() -> tuple[TemplateLearner, Backend, Clock]:
    adapter = ListedAdapter(CLOUD)
    built = Backend("memory", adapter)  # type: ignore[arg-type]
    built.start(background=False)
    clock = Clock()
    learner = TemplateLearner(None, Registry([built]), LearnedTemplatesConfig(), clock=clock)  # type: ignore[arg-type]
    return learner, built, clock


def kubelet_reports(learner: TemplateLearner, clock: Clock, minutes: int, **products: str) -> None:
    """Each node's status written every minute (kubelet's reports, seen by the watch) for ``minutes``."""
    for _ in range(minutes):
        clock.now += 60
        for name, product in products.items():
            learner.observe(gpu_node(name, product))


def served_product(learner: TemplateLearner, backend: Backend) -> str | None:
    record = learner.learned("memory")["big"]
    assert backend.learned_template("big") == record
    product = record.template.labels.get(PRODUCT)
    assert (product is None) == (PRODUCT in record.varying_labels), record
    return product


def test_a_label_comes_back_once_the_groups_nodes_agree_again() -> None:
    """Issue 40, item 3: after a MIG reconfiguration every node of the group carries the new
    nvidia.com/gpu.product, but the key stayed "varying" for good (and in the ConfigMap), so a pod selecting
    it could not scale the pool from zero. It comes back once the nodes have agreed for LABEL_SETTLE."""
    learner, backend, clock = gpu_learner()
    kubelet_reports(learner, clock, 1, **{"gpu-1": A100_NODE[PRODUCT], "gpu-2": A100_NODE[PRODUCT]})
    assert served_product(learner, backend) == A100_NODE[PRODUCT]
    kubelet_reports(learner, clock, 1, **{"gpu-1": MIG, "gpu-2": A100_NODE[PRODUCT]})  # one node reconfigured
    assert served_product(learner, backend) is None
    kubelet_reports(learner, clock, 9, **{"gpu-1": MIG, "gpu-2": MIG})  # both: agreed, not long enough yet
    assert served_product(learner, backend) is None
    kubelet_reports(learner, clock, 2, **{"gpu-1": MIG, "gpu-2": MIG})
    assert served_product(learner, backend) == MIG


def test_a_label_comes_back_once_the_node_that_disagreed_is_gone() -> None:
    """Issue 40, item 3: the node that showed another value was deleted; the nodes left agree."""
    learner, backend, clock = gpu_learner()
    kubelet_reports(learner, clock, 1, **{"gpu-1": A100_NODE[PRODUCT], "gpu-2": MIG})
    assert served_product(learner, backend) is None
    learner.forget("gpu-2")
    kubelet_reports(learner, clock, 12, **{"gpu-1": A100_NODE[PRODUCT]})
    assert served_product(learner, backend) == A100_NODE[PRODUCT]


def test_a_label_that_keeps_changing_stays_out() -> None:
    """A value that changes on a node again and again (relabelled every few minutes) never settles."""
    learner, backend, clock = gpu_learner()
    kubelet_reports(learner, clock, 1, **{"gpu-1": "a", "gpu-2": "a"})
    for turn in range(12):
        kubelet_reports(learner, clock, 4, **{"gpu-1": "ba"[turn % 2], "gpu-2": "ba"[turn % 2]})
        assert served_product(learner, backend) is None
