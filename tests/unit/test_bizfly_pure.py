"""Pure logic of the Bizfly backend: statuses, flavors, templates, regions, config, token bodies."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from providers.bizfly.auth import parse_expiry, project_headers, token_request_body
from providers.bizfly.config import BizflyConfig, parse_config
from providers.bizfly.regions import normalize_region, region_code, same_region
from providers.bizfly.statuses import History, map_status
from providers.bizfly.templates import (
    Flavor,
    build_template,
    parse_flavor,
    reserved_cpu_millis,
    reserved_memory_mib,
    resources,
)
from providers.config_errors import ConfigError
from providers.model import ErrorClass, InstanceState, Taint

PASSWORD_RAW = {"email": "ops@example.com", "password": "pw-123456", "cluster_name": "ke1m4ea3j8w6kkvp"}


# ---------------------------------------------------------------- statuses
@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("ACTIVE", InstanceState.RUNNING),
        ("active", InstanceState.RUNNING),
        ("running", InstanceState.RUNNING),
        ("Running", InstanceState.RUNNING),
        ("PROVISIONING", InstanceState.CREATING),
        ("provisioning", InstanceState.CREATING),
        ("INIT", InstanceState.CREATING),
        ("CREATING", InstanceState.CREATING),
        ("WARNING", InstanceState.RUNNING),
        ("UPDATING", InstanceState.RUNNING),
        ("RECOVERING", InstanceState.RUNNING),
        ("OPERATING", InstanceState.RUNNING),
        ("PENDING_PROVISION", InstanceState.CREATING),
        ("", InstanceState.CREATING),
        ("DELETING", InstanceState.DELETING),
        ("deleting", InstanceState.DELETING),
        ("draining", InstanceState.DELETING),
        ("Draining", InstanceState.DELETING),
    ],
)
def test_known_statuses_map_in_any_case_without_error(status: str, state: InstanceState) -> None:
    mapped = map_status(status, "whatever")
    assert mapped.state == state
    assert mapped.error is None
    assert mapped.known


@pytest.mark.parametrize("status", ["SHUTOFF", "shutoff", "Shutdown", "SHUT_DOWN", "STOPPED", "stopped", "Paused"])
def test_a_stopped_vm_is_a_machine_that_exists_never_a_deleting_one(status: str) -> None:
    mapped = map_status(status, "Instance stopped by the user")
    assert mapped.state == InstanceState.RUNNING
    assert mapped.error is None and mapped.known


@pytest.mark.parametrize("status", ["ERROR", "error", "FAILED", "failed", "CREATE_FAILED", "creation_error"])
def test_failed_statuses_are_creating_with_an_error(status: str) -> None:
    mapped = map_status(status, "Creation failed: boot volume lost")
    assert mapped.state == InstanceState.CREATING
    assert mapped.error is not None and mapped.error.code
    assert mapped.error.error_class == ErrorClass.OTHER
    assert "boot volume lost" in mapped.error.message


@pytest.mark.parametrize(
    "reason", ["Creation failed: quota exceeded", "No valid host was found", "insufficient capacity"]
)
def test_failures_for_lack_of_room_are_out_of_resources(reason: str) -> None:
    mapped = map_status("ERROR", reason)
    assert mapped.error is not None
    assert mapped.error.error_class == ErrorClass.OUT_OF_RESOURCES


# Senlin's own status_reason strings (openstack/senlin engine/node.py and common/exception.py, in its words'
# shape): which of them mean a failed creation and which a machine that failed after it existed.
SENLIN_CREATION_FAILURES = [
    "Failed in creating server: Quota exceeded for cores: Requested 2, but already used 20 of 20 cores.",
    "Failed in creating server: No valid host was found.",
    "Failed in creating server: Server build timed out.",
]
SENLIN_LATER_FAILURES = [
    "Check: Node is not ACTIVE.",
    "Failed in found server 'de9cb2f0-c8f0-4bf0-a6ea-cf83d6b55ef7': Server not found.",
    "Recovery failed",
    "Failed in recovering server 'de9cb2f0': No valid host was found.",
    "Failed in rebooting server 'de9cb2f0': timed out.",
    "Failed in updating server 'de9cb2f0': image not found.",
    "Failed in deleting server 'de9cb2f0': conflict.",
    "Failed in adding node into lb pool.",
]


@pytest.mark.parametrize("history", list(History))
@pytest.mark.parametrize("reason", SENLIN_CREATION_FAILURES)
def test_senlins_failed_creation_is_a_failed_scale_up_whatever_was_seen(reason: str, history: History) -> None:
    mapped = map_status("ERROR", reason, history)
    assert mapped.state == InstanceState.CREATING and mapped.error is not None
    expected = ErrorClass.OUT_OF_RESOURCES if "Quota" in reason or "No valid host" in reason else ErrorClass.OTHER
    assert mapped.error.error_class == expected


@pytest.mark.parametrize("history", list(History))
@pytest.mark.parametrize("reason", SENLIN_LATER_FAILURES)
def test_a_node_that_failed_after_it_existed_is_never_a_failed_scale_up(reason: str, history: History) -> None:
    # A failed health check of a node that served for days: the CA must not back the pool off and delete it
    # as a failed creation; it is a machine that exists (its Kubernetes node shows NotReady).
    mapped = map_status("ERROR", reason, history)
    assert mapped.state == InstanceState.RUNNING and mapped.error is None


# Issue 40, item 2: a failed RECREATE recovery of a node that served. Senlin's profile recreates the
# server, and when the creation fails it raises an EResourceOperation wrapping the creation error's own
# text; Node.do_recover stores str() of it (openstack/senlin: profiles/base.py do_recover,
# common/exception.py EResourceOperation and EResourceCreation, engine/node.py do_recover). The outer
# "Failed in recovering node" says what failed: an existing machine, never a scale-up.
SENLIN_FAILED_RECOVERIES = [
    "Failed in recovering node 'f2a1c3d4-5b6e-4f70-8a9b-0c1d2e3f4a5b': Failed in creating server: No valid host "
    "was found. There are not enough hosts available.",
    "Failed in recovering node 'f2a1c3d4-5b6e-4f70-8a9b-0c1d2e3f4a5b': Failed in creating server: Quota exceeded "
    "for cores: Requested 4, but already used 20 of 20 cores.",
    "Failed in recovering node 'f2a1c3d4-5b6e-4f70-8a9b-0c1d2e3f4a5b': Failed in deleting server "
    "'de9cb2f0-c8f0-4bf0-a6ea-cf83d6b55ef7': conflict.",
]


@pytest.mark.parametrize("history", list(History))
@pytest.mark.parametrize("reason", SENLIN_FAILED_RECOVERIES)
def test_a_failed_recreate_recovery_is_not_taken_for_a_failed_creation(reason: str, history: History) -> None:
    """Issue 40, item 2: the creation-failure pattern inside the recovery's message used to win, so a node
    that served was reported as a failed scale-up (OUT_OF_RESOURCES for "No valid host"), deleted by the CA
    and its pool backed off."""
    mapped = map_status("ERROR", reason, history)
    assert mapped.state == InstanceState.RUNNING and mapped.error is None, mapped


@pytest.mark.parametrize(
    ("history", "state", "failed"),
    [
        (History.SERVING, InstanceState.RUNNING, False),  # it served: it failed later
        (History.CREATING, InstanceState.CREATING, True),  # seen being created, now ERROR: its creation failed
        (History.NEW, InstanceState.CREATING, True),  # new since the previous listing: a creation that failed
        (History.UNKNOWN, InstanceState.RUNNING, False),  # nothing seen: no evidence, never a guessed failure
    ],
)
def test_an_error_without_a_telling_reason_is_decided_by_what_was_seen(
    history: History, state: InstanceState, failed: bool
) -> None:
    mapped = map_status("ERROR", "something odd happened", history)
    assert mapped.state == state
    assert (mapped.error is not None) == failed


def test_an_unknown_status_of_a_node_that_served_is_not_creating() -> None:
    assert map_status("HIBERNATING-unit-test-2", None, History.SERVING).state == InstanceState.RUNNING
    assert map_status("HIBERNATING-unit-test-2", None, History.NEW).state == InstanceState.CREATING


def test_unknown_status_is_creating_and_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="providers.bizfly.statuses"):
        first = map_status("HIBERNATING-unit-test", None)
        second = map_status("HIBERNATING-unit-test", None)
    assert first.state == second.state == InstanceState.CREATING
    assert not first.known and first.error is None
    assert sum("HIBERNATING-unit-test" in r.getMessage() for r in caplog.records) == 1


def test_non_string_status_never_crashes() -> None:
    assert map_status(None).state == InstanceState.CREATING
    assert map_status(42, ["x"]).state == InstanceState.CREATING  # type: ignore[arg-type]


# ---------------------------------------------------------------- flavors
@pytest.mark.parametrize(
    ("name", "cpus", "memory_mib"),
    [
        ("nix.2c_4g", 2, 4096),
        ("2c_4g", 2, 4096),
        ("4c_8g_basic", 4, 8192),
        ("nix.8c_16g_enterprise", 8, 16384),
        ("premium.2c_4g", 2, 4096),
        ("NIX.2C_4G", 2, 4096),
        ("2c-4g", 2, 4096),
        ("1c_512m", 1, 512),
        ("1c_1.5g", 1, 1536),
    ],
)
def test_flavor_spellings_parse(name: str, cpus: int, memory_mib: int) -> None:
    assert parse_flavor(name) == Flavor(cpus, memory_mib)


@pytest.mark.parametrize("name", ["", "large", "nix.2cpu_4gb", "0c_4g", "2c_0g", None, 7])
def test_unparseable_flavors_give_none(name: object) -> None:
    assert parse_flavor(name) is None  # type: ignore[arg-type]


def test_reservations_grow_with_the_node_but_less_than_linearly() -> None:
    assert reserved_cpu_millis(1) == 60
    assert reserved_cpu_millis(2) == 70
    assert reserved_cpu_millis(4) == 80
    assert reserved_cpu_millis(8) == 90
    assert reserved_memory_mib(512) == 255
    assert reserved_memory_mib(4096) == 1024
    assert reserved_memory_mib(8192) == 1024 + 819


def test_allocatable_is_capacity_minus_reservations_and_eviction() -> None:
    capacity, allocatable = resources(Flavor(2, 4096), 40)
    assert capacity == {"cpu": "2", "memory": "4096Mi", "pods": "110", "ephemeral-storage": "40Gi"}
    assert allocatable == {
        "cpu": "1930m",
        "memory": f"{4096 - 1024 - 100}Mi",
        "pods": "110",
        "ephemeral-storage": "36864Mi",
    }


# ---------------------------------------------------------------- templates
POOL = {
    "id": "5f959e0ac0b18944d0a4f13a",
    "name": "general",
    "flavor": "nix.2c_4g",
    "availability_zone": "HN1",
    "volume_size": 40,
    "labels": {"tier": "web"},
    "taints": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}, {"key": "bad", "effect": "Sometimes"}],
}


def test_template_from_flavor_and_pool_has_well_known_labels_and_taints() -> None:
    template = build_template(POOL, "HN", None)
    assert template is not None
    assert template.capacity["cpu"] == "2" and template.capacity["memory"] == "4096Mi"
    assert template.labels["kubernetes.io/os"] == "linux"
    assert template.labels["kubernetes.io/arch"] == "amd64"
    # as the cloud node controller writes them for the Bizfly cloud-controller-manager: GA and beta keys
    for key in ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"):
        assert template.labels[key] == "nix.2c_4g"
    for key in ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"):
        assert template.labels[key] == "HN1"
    for key in ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region"):
        assert template.labels[key] == "HN"
    assert template.labels["bke.bizflycloud.vn/pool-name"] == "general"
    assert template.labels["tier"] == "web"
    assert template.taints == (Taint("dedicated", "web", "NoSchedule"),)


def test_template_keeps_pool_level_observed_labels_and_drops_per_node_ones() -> None:
    observed = {
        "kubernetes.io/hostname": "general-node-abc",
        "bke.bizflycloud.vn/node-id": "e365b68a",
        "bke.bizflycloud.vn/gpu-node": "true",
        "topology.kubernetes.io/region": "HCM-custom",
        "tier": "stale-value",
    }
    template = build_template(POOL, "HN", observed)
    assert template is not None
    assert "kubernetes.io/hostname" not in template.labels
    assert "bke.bizflycloud.vn/node-id" not in template.labels
    assert template.labels["bke.bizflycloud.vn/gpu-node"] == "true"
    assert template.labels["topology.kubernetes.io/region"] == "HCM-custom"  # what a real node carried wins
    assert template.labels["tier"] == "web"  # the pool's current labels win over what an older node carried


def test_flavor_detail_is_preferred_over_the_name() -> None:
    template = build_template({**POOL, "flavor": "custom-x", "flavor_detail": {"vcpus": 4, "ram": 8192}}, "HN", None)
    assert template is not None and template.capacity["cpu"] == "4" and template.capacity["memory"] == "8192Mi"


def test_unparseable_flavor_falls_back_to_observed_instance_type() -> None:
    observed = {"node.kubernetes.io/instance-type": "nix.4c_8g"}
    template = build_template({**POOL, "flavor": "mystery"}, "HN", observed)
    assert template is not None and template.capacity["cpu"] == "4"


def test_unparseable_flavor_without_observed_labels_gives_no_template() -> None:
    assert build_template({**POOL, "flavor": "mystery"}, "HN", None) is None
    assert build_template({**POOL, "flavor": "mystery"}, "HN", {"kubernetes.io/hostname": "n1"}) is None


# ---------------------------------------------------------------- regions
@pytest.mark.parametrize("spelling", ["HN", "hn", "HaNoi", "hanoi", "ha-noi", "Ha Noi", " HN "])
def test_hanoi_spellings_normalise_to_one_name(spelling: str) -> None:
    assert normalize_region(spelling) == "HaNoi"


@pytest.mark.parametrize("spelling", ["HCM", "hcm", "HoChiMinh", "ho-chi-minh", "hochiminh"])
def test_hochiminh_spellings_normalise_to_one_name(spelling: str) -> None:
    assert normalize_region(spelling) == "HoChiMinh"


@pytest.mark.parametrize(
    ("spelling", "code"), [("HN", "HN"), ("HaNoi", "HN"), ("ha-noi", "HN"), ("hcm", "HCM"), ("HoChiMinh", "HCM")]
)
def test_the_region_label_is_bizflys_short_code_whatever_the_spelling(spelling: str, code: str) -> None:
    assert region_code(spelling) == code
    assert _parse({**PASSWORD_RAW, "region": spelling}).region_label == code


def test_the_region_label_can_be_set_and_an_unknown_region_keeps_its_name() -> None:
    assert _parse({**PASSWORD_RAW, "region_label": "hanoi-1"}).region_label == "hanoi-1"
    assert _parse({**PASSWORD_RAW, "region": "VC-HaNoi"}).region_label == "VC-HaNoi"


def test_region_comparison_ignores_spelling_but_not_the_region() -> None:
    assert same_region("HN", "HaNoi") and same_region("hn", "ha-noi")
    assert not same_region("HN", "HCM")
    assert same_region("NewRegion", "new-region")  # unknown regions are compared loosely, not rejected
    assert normalize_region("NewRegion") == "NewRegion"


# ---------------------------------------------------------------- config
def _parse(raw: Mapping[str, object], env: dict[str, str] | None = None, env_applies: bool = True) -> BizflyConfig:
    return parse_config("backends[0].bizfly", raw, env or {}, env_applies)


def test_password_config_defaults() -> None:
    cfg = _parse(PASSWORD_RAW)
    assert cfg.auth_method == "password"
    assert cfg.region == "HaNoi"
    assert cfg.api_url == "https://manage.bizflycloud.vn"
    assert cfg.token_url == "https://manage.bizflycloud.vn/api/token"
    assert cfg.kubernetes_engine_url is None
    assert cfg.project_id == cfg.tenant_id == ""
    assert cfg.region_label == "HN"


def test_token_url_follows_api_url_with_or_without_api_suffix() -> None:
    assert _parse({**PASSWORD_RAW, "api_url": "https://x.test/"}).token_url == "https://x.test/api/token"
    assert _parse({**PASSWORD_RAW, "api_url": "https://x.test/api"}).token_url == "https://x.test/api/token"
    explicit = _parse({**PASSWORD_RAW, "token_url": "https://auth.test/v2/token"})
    assert explicit.token_url == "https://auth.test/v2/token"


def test_secrets_never_appear_in_repr() -> None:
    cfg = _parse({"app_credential_id": "cid", "app_credential_secret": "very-secret-value", "cluster_name": "c1"})
    assert cfg.auth_method == "application_credential"
    assert "very-secret-value" not in repr(cfg)
    assert "pw-123456" not in repr(_parse(PASSWORD_RAW))


def test_upstream_environment_overrides_the_file_when_it_applies() -> None:
    env = {
        "BIZFLYCLOUD_AUTH_METHOD": "application_credential",
        "BIZFLYCLOUD_APP_CREDENTIAL_ID": "env-id",
        "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": "env-secret",
        "BIZFLYCLOUD_REGION": "hcm",
        "BIZFLYCLOUD_API_URL": "https://env.test",
        "BIZFLYCLOUD_TENANT_ID": "0A1B2C3D4E5F60718293A4B5C6D7E8F9",
        "CLUSTER_NAME": "envcluster",
        "BIZFLYCLOUD_EMAIL": "env@example.com",
    }
    cfg = _parse(PASSWORD_RAW, env)
    assert cfg.auth_method == "application_credential"
    assert (cfg.app_credential_id, cfg.app_credential_secret) == ("env-id", "env-secret")
    assert cfg.password == ""  # the other flow's secret is not kept around
    assert cfg.region == "HoChiMinh"
    assert cfg.api_url == "https://env.test" and cfg.token_url == "https://env.test/api/token"
    assert cfg.project_id == "0a1b2c3d4e5f60718293a4b5c6d7e8f9"  # the older variable names the project
    assert cfg.cluster_name == "envcluster" and cfg.email == "env@example.com"


def test_the_project_comes_from_project_id_or_its_older_name() -> None:
    project = "fd109a330e1a4ffbb85c336972d5aed4"
    assert _parse({**PASSWORD_RAW, "project_id": project}).project_id == project
    assert _parse(PASSWORD_RAW, {"BIZFLYCLOUD_PROJECT_ID": project}).project_id == project
    assert _parse({**PASSWORD_RAW, "tenant_id": project, "project_id": project.upper()}).project_id == project


def test_environment_is_ignored_when_several_bizfly_backends_exist() -> None:
    cfg = _parse(PASSWORD_RAW, {"CLUSTER_NAME": "other", "BIZFLYCLOUD_PASSWORD": "x"}, env_applies=False)
    assert cfg.cluster_name == "ke1m4ea3j8w6kkvp" and cfg.password == "pw-123456"


def test_empty_environment_variable_counts_as_unset() -> None:
    assert _parse(PASSWORD_RAW, {"CLUSTER_NAME": ""}).cluster_name == "ke1m4ea3j8w6kkvp"


def test_secret_from_a_named_environment_variable() -> None:
    raw = {"email": "a@b.c", "password_env": "MY_PW", "cluster_name": "c1"}
    assert _parse(raw, {"MY_PW": "from-env"}).password == "from-env"
    with pytest.raises(ConfigError) as err:
        _parse(raw, {})
    [problem] = err.value.problems
    assert problem.key == "backends[0].bizfly.password_env" and "MY_PW" in problem.problem


@pytest.mark.parametrize(
    ("raw", "key", "words"),
    [
        ({**PASSWORD_RAW, "cluster_name": ""}, "backends[0].bizfly.cluster_name", "missing"),
        ({**PASSWORD_RAW, "cluster_name": "my cluster/x"}, "backends[0].bizfly.cluster_name", "not a cluster UID"),
        ({**PASSWORD_RAW, "auth_method": "token"}, "backends[0].bizfly.auth_method", "not a login method"),
        ({"email": "a@b.c", "cluster_name": "c"}, "backends[0].bizfly.password", "required"),
        (
            {"auth_method": "application_credential", "app_credential_id": "x", "cluster_name": "c"},
            "backends[0].bizfly.app_credential_secret",
            "required",
        ),
        ({"cluster_name": "c"}, "backends[0].bizfly.auth_method", "cannot tell"),
        ({**PASSWORD_RAW, "api_url": "http://api.example.com"}, "backends[0].bizfly.api_url", "unencrypted"),
        ({**PASSWORD_RAW, "api_url": "ftp://x"}, "backends[0].bizfly.api_url", "not an http"),
        ({**PASSWORD_RAW, "colour": "blue"}, "backends[0].bizfly.colour", "unknown key"),
        ({**PASSWORD_RAW, "request_timeout": 0}, "backends[0].bizfly.request_timeout", "out of range"),
        ({**PASSWORD_RAW, "request_timeout": 30}, "backends[0].bizfly.request_timeout", "no unit"),
        ({**PASSWORD_RAW, "max_attempts": 11}, "backends[0].bizfly.max_attempts", "out of range"),
        ({**PASSWORD_RAW, "project_id": "demo-project"}, "backends[0].bizfly.project_id", "not a Bizfly project id"),
        ({**PASSWORD_RAW, "tenant_id": "tenant-42"}, "backends[0].bizfly.tenant_id", "not a Bizfly project id"),
        (
            {**PASSWORD_RAW, "project_id": "a" * 32, "tenant_id": "b" * 32},
            "backends[0].bizfly.tenant_id",
            "while project_id names",
        ),
        ({**PASSWORD_RAW, "region_label": "Ha Noi"}, "backends[0].bizfly.region_label", "not a Kubernetes label"),
    ],
)
def test_config_errors_name_the_key_and_a_fix(raw: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _parse(raw)
    [problem] = err.value.problems
    assert problem.key == key
    assert words in problem.problem
    assert problem.fix
    assert "pw-123456" not in str(err.value)


def test_config_error_names_the_environment_variable_it_came_from() -> None:
    with pytest.raises(ConfigError) as err:
        _parse(PASSWORD_RAW, {"BIZFLYCLOUD_AUTH_METHOD": "magic"})
    [problem] = err.value.problems
    assert "environment variable BIZFLYCLOUD_AUTH_METHOD" in problem.key
    assert "backends[0].bizfly.auth_method" in problem.key


def test_http_is_allowed_for_a_loopback_simulator() -> None:
    assert _parse({**PASSWORD_RAW, "api_url": "http://127.0.0.1:8080"}).api_url == "http://127.0.0.1:8080"


# ---------------------------------------------------------------- token requests
def test_token_bodies_for_both_flows() -> None:
    assert token_request_body(_parse(PASSWORD_RAW)) == {
        "auth_method": "password",
        "username": "ops@example.com",
        "password": "pw-123456",
    }
    app = _parse({"app_credential_id": "cid", "app_credential_secret": "csecret", "cluster_name": "c"})
    body = token_request_body(app)
    assert body["auth_method"] == "application_credential"
    assert (body["credential_id"], body["credential_secret"]) == ("cid", "csecret")
    assert (body["application_credential_id"], body["application_credential_secret"]) == ("cid", "csecret")


def test_a_configured_project_scopes_the_login() -> None:
    project = "fd109a330e1a4ffbb85c336972d5aed4"
    assert token_request_body(_parse({**PASSWORD_RAW, "project_id": project}))["project_id"] == project
    assert "project_id" not in token_request_body(_parse(PASSWORD_RAW))


def test_the_project_header_is_the_current_vendor_clients_and_absent_without_a_project() -> None:
    assert project_headers("fd109a330e1a4ffbb85c336972d5aed4") == {"X-Project-ID": "fd109a330e1a4ffbb85c336972d5aed4"}
    assert project_headers("") == {}


def test_token_expiry_parsing() -> None:
    now = 1_700_000_000.0
    assert parse_expiry({"expires_at": "2023-11-14T23:13:20.000000Z"}, now) == pytest.approx(3600.0)
    assert parse_expiry({"expire_at": "2023-11-14T23:13:20+00:00"}, now) == pytest.approx(3600.0)
    assert parse_expiry({"expires_at": "2019-11-22T15:39:54.000000Z"}, now) is None  # clocks disagree
    assert parse_expiry({"expires_at": "soon"}, now) is None
    assert parse_expiry({}, now) is None


@pytest.mark.parametrize("flavor", ["nix.1c_1g", "1c_512m", "nix.2c_4g", "8c_32g_premium", "nix.48c_192g"])
def test_template_quantities_are_valid_kubernetes_quantities(flavor: str) -> None:
    from server.node_encoding import is_valid_quantity

    template = build_template({**POOL, "flavor": flavor}, "HN", None)
    assert template is not None
    for quantities in (template.capacity, template.allocatable):
        assert all(is_valid_quantity(q) for q in quantities.values()), quantities
    assert int(template.allocatable["cpu"].removesuffix("m")) < int(template.capacity["cpu"]) * 1000
    assert int(template.allocatable["memory"].removesuffix("Mi")) < int(template.capacity["memory"].removesuffix("Mi"))
