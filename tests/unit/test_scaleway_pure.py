"""Pure Scaleway logic: status mapping, taints, templates and units, prices, config, error texts.

Fixtures follow the CA's own Scaleway provider tests where one exists.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from providers.config_errors import ConfigError
from providers.deadline import Deadline
from providers.errors import CloudAuthFailed, CloudUnavailable
from providers.http_transport import JsonResponse
from providers.model import ErrorClass, InstanceState, NodeRef, Taint
from providers.scaleway import CLOUD_TYPE
from providers.scaleway.adapter import (
    SYNTHETIC_ID_PREFIX,
    AutoscaledPools,
    ScalewayAdapter,
    debug_line,
    node_price,
    to_groups,
    to_instances,
)
from providers.scaleway.client import (
    Node,
    Pool,
    ScalewayClient,
    ServerType,
    _parse_node,
    _parse_pool,
    is_auth_failure,
    parse_cache_control,
    scaleway_error_message,
)
from providers.scaleway.config import ScalewayConfig, parse_config
from providers.scaleway.statuses import instance_status
from providers.scaleway.templates import (
    GPU_LABEL,
    catalog_machine,
    instance_type,
    parse_taints,
    pool_template,
    reserved_memory,
    reserved_millicores,
    same_instance_type,
    tag_labels,
    tag_taints,
)
from server.diagnosis import Advisor

SECRET = "11111111-2222-3333-4444-555555555555"
KEY = "backends[0].scaleway"


def make_pool(**changes: Any) -> Pool:
    """The pool fixture of the CA's own Scaleway provider tests (createTestPool)."""
    pool = Pool(
        id="pool-1",
        name="default",
        status="ready",
        version="1.27.0",
        node_type="DEV1-M",
        autoscaling=True,
        size=5,
        min_size=1,
        max_size=10,
        zone="fr-par-1",
        node_price_per_hour=0.05,
        capacity={"cpu": 2000, "memory": 4096000000, "ephemeral-storage": 20000000000, "pods": 110},
        allocatable={"cpu": 1800, "memory": 3500000000, "ephemeral-storage": 18000000000, "pods": 110},
        labels={"kubernetes.io/hostname": "node-1"},
        taints={},
    )
    return replace(pool, **changes)


def make_node(node_id: str, pool_id: str = "pool-1", status: str = "ready", provider_id: str | None = None) -> Node:
    pid = f"scaleway://instance/fr-par-1/{node_id}" if provider_id is None else provider_id
    return Node(id=node_id, pool_id=pool_id, provider_id=pid, name=f"scw-{node_id}", status=status, error_message="")


# -------------------------------------------------------- status mapping (docs/reference/scaleway.md, "Status mapping")


@pytest.mark.parametrize(
    ("status", "state", "code"),
    [
        ("ready", InstanceState.RUNNING, None),
        ("creating", InstanceState.CREATING, None),
        ("starting", InstanceState.CREATING, None),
        ("registering", InstanceState.CREATING, None),
        ("not_ready", InstanceState.CREATING, None),
        ("upgrading", InstanceState.CREATING, None),
        ("rebooting", InstanceState.CREATING, None),
        ("deleting", InstanceState.DELETING, None),
        ("creation_error", InstanceState.CREATING, "creation_error"),
        ("deleted", InstanceState.UNSPECIFIED, "deleted"),
        ("locked", InstanceState.UNSPECIFIED, "locked"),
        ("unknown", InstanceState.UNSPECIFIED, "unknown"),
        ("teleporting", InstanceState.UNSPECIFIED, "teleporting"),
        ("", InstanceState.UNSPECIFIED, "unknown"),
    ],
)
def test_node_status_maps_to_instance_state(status, state, code):
    got_state, error = instance_status(status)
    assert got_state == state
    if code is None:
        assert error is None
    else:
        assert error is not None
        assert error.code == code
        assert error.message
        assert error.error_class in (ErrorClass.OTHER, ErrorClass.OUT_OF_RESOURCES)


@pytest.mark.parametrize(
    "message",
    [
        "quotas_exceeded: k8s_nodes",
        "scaleway node could not be created: insufficient capacity for node type",
        "resource is out of stock",
        "Out of stock for L4-1-24G in fr-par-2",
    ],
)
def test_quota_like_creation_errors_are_out_of_resources(message):
    state, error = instance_status("creation_error", message)
    assert state == InstanceState.CREATING
    assert error.error_class == ErrorClass.OUT_OF_RESOURCES
    assert error.message == message


def test_other_creation_errors_are_class_other_with_a_default_message():
    state, error = instance_status("creation_error", "")
    assert (state, error.code, error.error_class) == (InstanceState.CREATING, "creation_error", ErrorClass.OTHER)
    assert error.message == "scaleway node could not be created"
    assert instance_status("creation_error", "image pull failed")[1].error_class == ErrorClass.OTHER


# --------------------------------------------------------------------- taints (docs/reference/scaleway.md, "Templates")


def test_parse_taints_upstream_table():
    taints = parse_taints(
        {
            "k1": "value1:NoSchedule",
            "k2": "value2:NoExecute",
            "k3": "value3:PreferNoSchedule",
            "k4": "NoSchedule",
            "k5": "invalid:InvalidEffect",
        }
    )
    assert taints == (
        Taint("k1", "value1", "NoSchedule"),
        Taint("k2", "value2", "NoExecute"),
        Taint("k3", "value3", "PreferNoSchedule"),
        Taint("k4", "", "NoSchedule"),
    )


def test_parse_taints_empty_and_many_colons():
    assert parse_taints({}) == ()
    assert parse_taints({"k": "value:with:colons:NoSchedule"}) == (Taint("k", "", "NoSchedule"),)


# ---------------------------------------------------------------------- templates and units


def test_template_resources_are_whole_units_as_upstream_fixture():
    template = pool_template(make_pool(), "fr-par")
    assert template.capacity == {
        "cpu": "2000",
        "memory": "4096000000",
        "ephemeral-storage": "20000000000",
        "pods": "110",
    }
    assert template.allocatable == {
        "cpu": "1800",
        "memory": "3500000000",
        "ephemeral-storage": "18000000000",
        "pods": "110",
    }


def test_template_carries_well_known_labels_and_not_the_hostname():
    template = pool_template(make_pool(labels={"kubernetes.io/hostname": "test-node", "team": "a"}), "fr-par")
    assert template.labels["kubernetes.io/os"] == "linux"
    assert template.labels["kubernetes.io/arch"] == "amd64"
    assert template.labels["node.kubernetes.io/instance-type"] == "DEV1-M"
    assert template.labels["topology.kubernetes.io/zone"] == "fr-par-1"
    assert template.labels["topology.kubernetes.io/region"] == "fr-par"
    assert template.labels["k8s.scaleway.com/pool"] == "pool-1"
    assert template.labels["k8s.scaleway.com/pool-name"] == "default"
    assert template.labels["team"] == "a"
    assert "kubernetes.io/hostname" not in template.labels
    assert GPU_LABEL not in template.labels


def test_template_taints_from_the_pool_map():
    template = pool_template(make_pool(taints={"key1": "value1:NoSchedule", "key2": "NoExecute"}), "fr-par")
    assert template.taints == (Taint("key1", "value1", "NoSchedule"), Taint("key2", "", "NoExecute"))


def test_arm_node_types_get_arm64():
    assert pool_template(make_pool(node_type="COPARM1-4C-16G"), "fr-par").labels["kubernetes.io/arch"] == "arm64"


def test_gpu_pool_gets_gpu_label_and_resource():
    pool = make_pool(node_type="L4-1-24G", capacity={"cpu": 8, "memory": 1, "nvidia.com/gpu": 1}, allocatable={})
    template = pool_template(pool, "fr-par")
    assert template.labels[GPU_LABEL] == "l4-1-24g"
    assert template.capacity["nvidia.com/gpu"] == "1"
    assert template.allocatable["nvidia.com/gpu"] == "1"  # allocatable falls back to capacity


def test_legacy_gpu_count_becomes_nvidia_resource_and_api_label_wins():
    pool = make_pool(capacity={"cpu": 8, "gpu": 2}, labels={GPU_LABEL: "nvidia-h100"})
    template = pool_template(pool, "fr-par")
    assert template.capacity == {"cpu": "8", "nvidia.com/gpu": "2"}
    assert template.labels[GPU_LABEL] == "nvidia-h100"


def test_observed_labels_fill_in_but_pool_labels_win():
    pool = make_pool(labels={"team": "from-pool"})
    observed = {"team": "observed", "extra": "x", "kubernetes.io/hostname": "scw-abc", "k8s.scaleway.com/pool": "other"}
    labels = pool_template(pool, "fr-par", observed).labels
    assert labels["team"] == "from-pool"
    assert labels["extra"] == "x"
    assert "kubernetes.io/hostname" not in labels
    assert labels["k8s.scaleway.com/pool"] == "pool-1"


@pytest.mark.parametrize(
    ("node_type", "label"),
    [
        ("pro2_xxs", "PRO2-XXS"),  # the pools API's spelling (recorded), the node's label (recorded)
        ("dev1_m", "DEV1-M"),
        ("pop2_hc_2c_4g", "POP2-HC-2C-4G"),
        ("l4_1_24g", "L4-1-24G"),
        ("PRO2_XXS", "PRO2-XXS"),
        ("DEV1-M", "DEV1-M"),  # already the commercial spelling: unchanged
    ],
)
def test_the_instance_type_label_is_the_commercial_type_real_nodes_carry(node_type, label):
    assert instance_type(node_type) == label
    template = pool_template(make_pool(node_type=node_type), "fr-par")
    assert template.labels["node.kubernetes.io/instance-type"] == label


def test_no_other_source_changes_the_instance_type_label():
    # Scaleway's cloud-controller-manager rewrites the label on every node: a pool label or a node's
    # label with another spelling does not make the template's.
    pool = make_pool(node_type="pro2_xxs", labels={"node.kubernetes.io/instance-type": "pro2_xxs"})
    observed = {"node.kubernetes.io/instance-type": "pro2-xxs"}
    assert pool_template(pool, "fr-par", observed).labels["node.kubernetes.io/instance-type"] == "PRO2-XXS"


def test_spellings_of_one_node_type_are_the_same_machine_type():
    assert same_instance_type("pro2_xxs", "PRO2-XXS")
    assert same_instance_type("PRO2_XXS", "pro2-xxs")
    assert not same_instance_type("pro2_xxs", "PRO2-XS")
    adapter = ScalewayAdapter(ScalewayConfig(cluster_id="c", secret_key=SECRET))
    try:
        assert adapter.same_machine_type("dev1_m", "DEV1-M") and not adapter.same_machine_type("dev1_m", "DEV1-L")
    finally:
        adapter.close()


def test_the_arch_and_gpu_type_read_the_pools_api_spelling_too():
    assert pool_template(make_pool(node_type="coparm1_4c_16g"), "fr-par").labels["kubernetes.io/arch"] == "arm64"
    gpu = make_pool(node_type="l4_1_24g", capacity={"cpu": 8, "nvidia.com/gpu": 1})
    assert pool_template(gpu, "fr-par").labels[GPU_LABEL] == "l4-1-24g"


def test_pool_without_resources_has_no_template():
    assert pool_template(make_pool(capacity={}, allocatable={}), "fr-par") is None


# ---------------------------------------------------------------------- groups and instances


def test_only_autoscaled_pools_become_groups_and_orphan_nodes_are_dropped():
    pools = [
        make_pool(id="p1", size=3, min_size=1, max_size=10),
        make_pool(id="p2", size=2, min_size=1, max_size=5),
        make_pool(id="p3", autoscaling=False),
    ]
    nodes = [make_node("n1", "p1"), make_node("n2", "p1"), make_node("n3", "p2"), make_node("n4", "p3")]
    nodes.append(make_node("n5", "missing-pool"))
    selected, problems = AutoscaledPools().select(pools)
    groups = {g.id: g for g in to_groups(selected, nodes, "fr-par")}
    assert problems == []
    assert set(groups) == {"p1", "p2"}
    assert len(groups["p1"].instances) == 2
    assert len(groups["p2"].instances) == 1
    assert (groups["p1"].min_size, groups["p1"].max_size, groups["p1"].target_size) == (1, 10, 3)


def test_instances_use_provider_id_and_keep_the_node_id_for_deletion():
    (instance,) = to_instances([make_node("n1")])
    assert instance.id == "scaleway://instance/fr-par-1/n1"
    assert instance.cloud_id == "n1"
    assert instance.state == InstanceState.RUNNING
    assert instance.cloud_status == "ready"


def test_nodes_without_provider_id_get_distinct_stable_synthetic_ids():
    nodes = [make_node("a", status="creating", provider_id=""), make_node("b", status="creating", provider_id="")]
    first = to_instances(nodes)
    again = to_instances(list(reversed(nodes)))
    assert [i.id for i in first] == [SYNTHETIC_ID_PREFIX + "a", SYNTHETIC_ID_PREFIX + "b"]
    assert first == again


def test_duplicate_provider_ids_do_not_collapse_instances():
    nodes = [make_node("a", provider_id="scaleway://instance/x"), make_node("b", provider_id="scaleway://instance/x")]
    assert len({i.id for i in to_instances(nodes)}) == 2


def test_debug_line_matches_upstream_format():
    line = debug_line(make_pool())
    for part in ("pool-1", "ready", "1.27.0", "true", "size:5", "min_size:1", "max_size:10"):
        assert part in line


# ------------------------------------------------------------- prices (docs/reference/scaleway.md, "Templates", prices)


def test_node_price_rounds_hours_up():
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert node_price(0.10, start, start + dt.timedelta(hours=2, minutes=30)) == pytest.approx(0.30)
    assert node_price(0.10, start, start + dt.timedelta(seconds=1)) == pytest.approx(0.10)
    assert node_price(0.10, start, start) == 0.0
    assert node_price(0.10, start, start - dt.timedelta(hours=1)) == 0.0


def test_pricing_group_comes_from_the_pool_label():
    adapter = ScalewayAdapter(ScalewayConfig(cluster_id="c", secret_key=SECRET))
    try:
        assert adapter.group_for_price_node(NodeRef("x", labels={"k8s.scaleway.com/pool": "pool-1"})) == "pool-1"
        assert adapter.group_for_price_node(NodeRef("x", labels={})) is None
        assert adapter.gpu_label == "k8s.scw.cloud/gpu"
        assert adapter.available_gpu_types() == ()
        start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        assert adapter.pod_price(b"", start, start + dt.timedelta(hours=3)) == 0.0
    finally:
        adapter.close()


# ---------------------------------------------------------------------- client pure parts


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("max-age=30", 30.0),
        ("public, max-age=60, must-revalidate", 60.0),
        ("no-cache", None),
        ("", None),
        (None, None),
        ("max-age=", None),
        ("max-age=invalid", None),
        ("max-age=0", 0.0),
    ],
)
def test_cache_control_max_age(header, expected):
    assert parse_cache_control(header) == expected


def test_error_messages_read_the_scaleway_body():
    assert scaleway_error_message(404, {"message": "resource is not found", "type": "not_found"}) == (
        "not_found: resource is not found"
    )
    invalid = {
        "message": "invalid argument(s)",
        "type": "invalid_arguments",
        "details": [{"argument_name": "size", "reason": "constraint", "help_message": "size must be <= 5"}],
    }
    assert "argument size: constraint size must be <= 5" in scaleway_error_message(400, invalid)
    transient = {"message": "in transient state", "type": "transient_state", "resource": "k8s_pool"}
    assert "k8s_pool is upgrading" in scaleway_error_message(409, {**transient, "current_state": "upgrading"})
    quota = {
        "type": "quotas_exceeded",
        "message": "q",
        "details": [{"resource": "k8s_nodes", "quota": 3, "current": 3}],
    }
    assert "quota of k8s_nodes: 3 used of 3 allowed" in scaleway_error_message(403, quota)
    assert scaleway_error_message(502, "<html>bad gateway</html>") == "<html>bad gateway</html>"


def test_quota_403_is_not_an_auth_failure():
    assert is_auth_failure(401, {"type": "denied_authentication"})
    assert is_auth_failure(403, {"type": "permissions_denied"})
    assert not is_auth_failure(403, {"type": "quotas_exceeded"})


def test_list_form_taints_of_the_public_pool_shape_are_read():
    # The public pool endpoint answers a list of {key, value, effect}; the autoscaler one a map.
    raw = {"id": "p", "size": 0, "min_size": 0, "max_size": 2}
    listed = [{"key": "a", "value": "x", "effect": "NoSchedule"}, {"key": "b", "value": "", "effect": "NoExecute"}]
    assert _parse_pool({**raw, "taints": listed}).taints == {"a": "x:NoSchedule", "b": "NoExecute"}


def test_pool_json_type_clash_is_a_malformed_answer():
    good = {"id": "p", "size": 1, "min_size": 0, "max_size": 2, "taints": {"a": "NoSchedule"}, "created_at": None}
    assert _parse_pool(good).taints == {"a": "NoSchedule"}
    with pytest.raises(CloudUnavailable, match="malformed"):
        _parse_pool({**good, "taints": "a=NoSchedule"})
    with pytest.raises(CloudUnavailable, match="malformed"):
        _parse_pool({**good, "taints": [{"value": "x", "effect": "NoSchedule"}]})  # a taint without a key
    with pytest.raises(CloudUnavailable, match="size"):
        _parse_pool({**good, "size": "3"})
    with pytest.raises(CloudUnavailable, match="'id' is missing"):
        _parse_node({"status": "ready"})


# ---------------------------------------------------------------------- config


def parse(raw: dict[str, Any], env: dict[str, str] | None = None, env_applies: bool = True) -> ScalewayConfig:
    return parse_config(KEY, raw, env or {}, env_applies)


def test_config_defaults():
    config = parse({"cluster_id": "c-1", "secret_key": SECRET})
    assert (config.region, config.api_url, config.request_timeout, config.max_attempts) == (
        "fr-par",
        "https://api.scaleway.com",
        30.0,
        4,
    )
    assert CLOUD_TYPE.name == "scaleway"
    assert CLOUD_TYPE.config_model is ScalewayConfig
    assert CLOUD_TYPE.default_sync_interval > 0


def test_upstream_environment_overrides_the_file_when_it_applies():
    env = {"CLUSTER_ID": "env-c", "SCW_SECRET_KEY": "env-secret", "SCW_REGION": "nl-ams", "SCW_API_URL": ""}
    raw = {"cluster_id": "file-c", "secret_key": SECRET, "region": "fr-par", "api_url": "https://api.example.com/"}
    config = parse(raw, env)
    assert (config.cluster_id, config.secret_key, config.region) == ("env-c", "env-secret", "nl-ams")
    assert config.api_url == "https://api.example.com"  # empty variable = unset; trailing slash removed
    untouched = parse(raw, env, env_applies=False)
    assert (untouched.cluster_id, untouched.secret_key, untouched.region) == ("file-c", SECRET, "fr-par")


def test_secret_key_from_a_named_environment_variable():
    config = parse({"cluster_id": "c", "secret_key_env": "MY_SCW_KEY"}, {"MY_SCW_KEY": SECRET})
    assert config.secret_key == SECRET


@pytest.mark.parametrize(
    ("raw", "env", "key", "fix_word"),
    [
        ({"secret_key": SECRET}, {}, f"{KEY}.cluster_id", "CLUSTER_ID"),
        ({"cluster_id": "c"}, {}, f"{KEY}.secret_key", "SCW_SECRET_KEY"),
        ({"cluster_id": "c", "secret_key_env": "MISSING"}, {}, f"{KEY}.secret_key_env", "MISSING"),
        ({"cluster_id": "c", "secret_key_env": SECRET}, {}, f"{KEY}.secret_key_env", "NAME"),
        ({"cluster_id": "c", "secret_key": SECRET, "secret_key_env": "X"}, {"X": "y"}, f"{KEY}.secret_key_env", "only"),
        ({"cluster_id": "c/../x", "secret_key": SECRET}, {}, f"{KEY}.cluster_id", "id"),
        ({"cluster_id": "c", "secret_key": SECRET, "region": "paris"}, {}, f"{KEY}.region", "fr-par"),
        (
            {"cluster_id": "c", "secret_key": SECRET},
            {"SCW_REGION": "Paris!"},
            f"environment variable SCW_REGION (for {KEY}.region)",
            "fr-par",
        ),
        ({"cluster_id": "c", "secret_key": SECRET, "api_url": "http://api.example.com"}, {}, f"{KEY}.api_url", "https"),
        ({"cluster_id": "c", "secret_key": SECRET, "api_url": "ftp://x"}, {}, f"{KEY}.api_url", "https"),
        ({"cluster_id": "c", "secret_key": SECRET, "request_timeout": "soon"}, {}, f"{KEY}.request_timeout", "30s"),
        ({"cluster_id": "c", "secret_key": SECRET, "request_timeout": 30}, {}, f"{KEY}.request_timeout", "30s"),
        ({"cluster_id": "c", "secret_key": SECRET, "request_timeout": 0}, {}, f"{KEY}.request_timeout", "100ms"),
        ({"cluster_id": "c", "secret_key": SECRET, "max_attempts": 0}, {}, f"{KEY}.max_attempts", "from 1 to 10"),
        ({"cluster_id": "c", "secret_key": SECRET, "secret": "x"}, {}, f"{KEY}.secret", "spelling"),
    ],
)
def test_bad_config_names_the_key_and_the_fix(raw, env, key, fix_word):
    with pytest.raises(ConfigError) as info:
        parse(raw, env)
    [problem] = info.value.problems
    assert problem.key == key
    assert fix_word in problem.fix
    assert SECRET not in str(info.value)


def test_loopback_http_and_durations_are_accepted():
    config = parse(
        {"cluster_id": "c", "secret_key": SECRET, "api_url": "http://127.0.0.1:8080", "request_timeout": "500ms"}
    )
    assert config.api_url == "http://127.0.0.1:8080"
    assert config.request_timeout == pytest.approx(0.5)


def test_secret_never_in_repr_or_str():
    config = parse({"cluster_id": "c", "secret_key": SECRET})
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    assert config.secrets == (SECRET,)


# ---------------------------------------------------------------------- public mode


@pytest.mark.parametrize(
    ("tag", "label"),
    [
        ("word", ("k8s.scaleway.com/word", "")),
        ("noprefix=word", ("word", "")),
        ("equal1=value", ("k8s.scaleway.com/equal1", "value")),
        ("noprefix=node.kubernetes.io/role=myrole", ("node.kubernetes.io/role", "myrole")),
        ("equal6= =value", ("k8s.scaleway.com/equal6", "value")),
        ("colon4: value", ("k8s.scaleway.com/colon4", "value")),
        ("two space word", ("k8s.scaleway.com/two", "space")),
        ("noprefix=a/b/c=d", None),  # two slashes
        ("noprefix=/b=c", None),  # an empty domain
        ("bad_=x", None),  # a key must end alphanumeric
        ("taint=k=v:NoSchedule", None),  # a taint, not a label
    ],
)
def test_pool_tags_become_node_labels_as_the_cloud_controller_manager_documents(tag, label):
    # The cases of the controller's own table (scaleway-cloud-controller-manager, scaleway/sync_test.go).
    assert tag_labels([tag]) == (dict([label]) if label else {})


@pytest.mark.parametrize(
    ("tag", "taint"),
    [
        ("taint=word=word:NoExecute", ("k8s.scaleway.com/word", "word:NoExecute")),
        ("taint=noprefix=dash-word=dash-word:PreferNoSchedule", ("dash-word", "dash-word:PreferNoSchedule")),
        ("taint=noprefix=node.k8s.io/dash=x:NoSchedule", ("node.k8s.io/dash", "x:NoSchedule")),
        ("taint=gpu:NoSchedule", ("k8s.scaleway.com/gpu", "NoSchedule")),
        ("taint=dash-word=dash-word:foo", None),  # not an effect
        ("taint=dash-word=dash-word", None),  # no effect
        ("taint=", None),
    ],
)
def test_taint_tags_become_node_taints(tag, taint):
    assert tag_taints([tag]) == (dict([taint]) if taint else {})


def test_the_reservations_of_our_reading_grow_slower_than_the_machine():
    assert [reserved_millicores(c) for c in (1, 2, 4, 8)] == [60, 70, 80, 90]
    mib = 1024**2
    assert reserved_memory(4 * 1024 * mib) == 1024 * mib + 100 * mib  # a quarter of 4 GiB, and the eviction 100 Mi
    assert reserved_memory(8 * 1024 * mib) < reserved_memory(16 * 1024 * mib) < 16 * 1024 * mib // 4


def test_a_catalog_machine_carries_the_types_resources_and_the_pools_volume_and_pods():
    server = ServerType("L4-1-24G", 8, 48 * 1024**3, 1, "L4", "x86_64", 0.7875)
    machine = catalog_machine(server, make_pool(node_type="l4_1_24g", root_volume_size=100_000_000_000, max_pods=50))
    assert machine.capacity == {
        "cpu": "8",
        "memory": str(48 * 1024**3),
        "pods": "50",
        "ephemeral-storage": "100000000000",
        "nvidia.com/gpu": "1",
    }
    assert machine.allocatable["cpu"] == "7910m" and machine.allocatable["ephemeral-storage"] == "90000000000"
    assert (machine.arch, machine.price_per_hour) == ("amd64", 0.7875)
    arm = catalog_machine(replace(server, gpus=0, arch="arm64"), make_pool(node_type="coparm1_4c_16g"))
    assert arm.arch == "arm64" and "ephemeral-storage" not in arm.capacity and arm.capacity["pods"] == "110"


def test_public_mode_config_mistakes_are_named_with_their_fix():
    base = {"cluster_id": "c", "secret_key": SECRET, "mode": "public"}
    with pytest.raises(ConfigError) as info:
        parse_config(KEY, base, {}, True)
    assert f"{KEY}.pools: the public mode manages only the pools it is given" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config(
            KEY,
            {**base, "pools": {"Bad Name": {"min_size": 0, "max_size": 1}, "a": {"min_size": 4, "max_size": 2}}},
            {},
            True,
        )
    assert "is not a Kapsule pool name or id" in str(info.value) and "min_size 4 is above max_size 2" in str(info.value)
    with pytest.raises(ConfigError, match=r"pools is read only in the public mode.*set mode: public, or remove pools"):
        parse_config(KEY, {**base, "mode": "private", "pools": {"a": {"min_size": 0, "max_size": 1}}}, {}, True)
    config = parse_config(KEY, {**base, "pools": {"workers": {"min_size": 0, "max_size": 4}}}, {}, True)
    assert config.public and config.pools["workers"].max_size == 4
    assert not parse_config(KEY, {"cluster_id": "c", "secret_key": SECRET}, {}, True).public  # private by default


class _CatalogPages:
    """A transport answering the product list with fixed pages (the recorded shape: no total_count in the body)."""

    def __init__(self, pages: list[dict[str, Any]], total: int) -> None:
        self.pages, self.total, self.asked = pages, total, []

    def __call__(self, *args: Any, **kwargs: Any) -> _CatalogPages:
        return self

    def request(self, method: str, path: str, **options: Any) -> JsonResponse:
        self.asked.append(options["params"])
        page = options["params"]["page"]
        body = {"servers": self.pages[page - 1] if page <= len(self.pages) else {}}
        return JsonResponse(200, {"X-Total-Count": str(self.total)}, body)


def test_the_catalog_is_read_to_its_total_and_an_odd_entry_costs_only_that_type():
    entry = {"ncpus": 2, "ram": 8 * 1024**3, "gpu": 0, "arch": "x86_64", "hourly_price": 0.05}
    first = {f"T{i}": entry for i in range(99)} | {"ODD": {**entry, "ram": None}}
    pages = _CatalogPages([first, {"LAST": entry}], total=101)
    config = ScalewayConfig(
        cluster_id="c", secret_key=SECRET, mode="public", pools={"p": {"min_size": 0, "max_size": 1}}
    )
    types = ScalewayClient(config, transport_factory=pages).list_server_types("fr-par-1", Deadline.after(5))
    assert "ODD" not in types and {"T0", "T98", "LAST"} <= set(types) and len(types) == 100
    assert [p["page"] for p in pages.asked] == [1, 2]  # a full first page, then a short one ends it
    assert pages.asked[0]["per_page"] == 100


def test_a_403_in_the_public_mode_names_the_permission_sets_the_key_needs():
    public = parse_config(
        KEY,
        {"cluster_id": "c", "secret_key": SECRET, "mode": "public", "pools": {"p": {"min_size": 0, "max_size": 1}}},
        {},
        True,
    )
    refused = CloudAuthFailed("scaleway API GET /k8s/v1/regions/{region}/clusters/{cluster_id}/pools answered 403")
    check = Advisor("scaleway", public, {"cluster_id": f"{KEY}.cluster_id"}).diagnose(refused).check
    assert "KubernetesFullAccess and InstancesReadOnly on the project of" in check
    private = parse_config(KEY, {"cluster_id": "c", "secret_key": SECRET}, {}, True)
    assert "KubernetesFullAccess" not in Advisor("scaleway", private, {}).diagnose(refused).check
