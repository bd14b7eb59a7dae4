"""``ca-externalgrpc validate --online`` against the simulators over real HTTP: each mistake an operator makes
with a cloud's settings is one line naming the setting and its fix, the exit code says whether any was found,
and the clouds see nothing but reads (and Bizfly's login).

The simulators answer as the real APIs do where public evidence shows it (docs/reference/scaleway.md and
docs/reference/bizfly.md, "Evidence"); where none does (the private endpoints' answer to an ordinary key) the
simulator's setting is named.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.clouds import bizfly_backend, scaleway_backend
from devstack.harness import CLOUD_ENV_PREFIXES, REPO_ROOT, child_env, server_config, write_config
from providers.deadline import Deadline
from providers.errors import NotLeader
from providers.model import GroupState
from providers.scaleway import ScalewayConfig, build_adapter
from server.cli import main
from server.online import refuse_writes
from simulators.bizfly import DEMO_CLUSTER_UID, BizflySimulator
from simulators.bizfly import demo_scenario as bizfly_demo
from simulators.common import ManualClock
from simulators.common.faults import Fault
from simulators.scaleway import ScalewaySimulator
from simulators.scaleway.api import permissions_denied
from simulators.scaleway.catalog import NODE_TYPES

CONFIGURE = REPO_ROOT / "docs" / "how-to" / "configure.md"
SECRET = "3f6c2a9e-1b7d-4e2a-9c1f-5a8b7d6e4c21"
CLUSTER = "9a1d6c2e-4b3f-4e8a-8d2c-1f0e9b8a7c61"
GENERAL = "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e01"
BATCH = "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e02"
KAPSULE = {
    "clusters": [
        {
            "id": CLUSTER,
            "name": "prod",
            "region": "fr-par",
            "pools": [
                {"id": GENERAL, "name": "general", "node_type": "PRO2-XXS", "size": 2, "min_size": 1, "max_size": 5},
                {"id": BATCH, "name": "batch", "node_type": "PRO2-XXS", "size": 0, "min_size": 0, "max_size": 3},
                {"id": "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e03", "name": "system", "node_type": "PRO2-XXS", "size": 1,
                 "min_size": 1, "max_size": 1, "autoscaling": False},
            ],
        }
    ]
}  # fmt: skip
# The same cluster as the public mode sees it: two pools with Kapsule autoscaling off (in two zones) for our CA,
# one with it on (Kapsule's managed autoscaler's).
MANAGED = "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e04"
KAPSULE_PUBLIC = {
    "clusters": [
        {
            "id": CLUSTER,
            "name": "prod",
            "region": "fr-par",
            "pools": [
                {"id": GENERAL, "name": "general", "node_type": "PRO2-XXS", "size": 2, "autoscaling": False,
                 "zone": "fr-par-1"},
                {"id": BATCH, "name": "batch", "node_type": "DEV1-M", "size": 0, "autoscaling": False,
                 "zone": "fr-par-2", "tags": ["taint=dedicated=batch:NoSchedule"]},
                {"id": MANAGED, "name": "managed", "node_type": "PRO2-XXS", "size": 1, "min_size": 1, "max_size": 3},
            ],
        }
    ]
}  # fmt: skip
# One pool named by its name, one by its id; the bounds are the config's.
PUBLIC_POOLS = {"general": {"min_size": 2, "max_size": 8}, BATCH: {"min_size": 0, "max_size": 4}}
SCW = "backends[0].scaleway"
BZ = "backends[0].bizfly"


@pytest.fixture(autouse=True)
def no_cloud_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upstream variables of this shell would override the configs these tests write."""
    for name in [name for name in os.environ if name.startswith(CLOUD_ENV_PREFIXES)]:
        monkeypatch.delenv(name)


@pytest.fixture
def kapsule() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=KAPSULE, clock=ManualClock(), secret_key=SECRET) as sim:
        yield sim


@pytest.fixture
def public_kapsule() -> Iterator[ScalewaySimulator]:
    with ScalewaySimulator(scenario=KAPSULE_PUBLIC, clock=ManualClock(), secret_key=SECRET) as sim:
        yield sim


def public_backend(sim: ScalewaySimulator, pools: dict[str, Any] | None = None) -> dict[str, Any]:
    return scaleway_backend(sim, name="kapsule", settings={"mode": "public", "pools": pools or dict(PUBLIC_POOLS)})


@pytest.fixture
def bke() -> Iterator[BizflySimulator]:
    with BizflySimulator(bizfly_demo(), clock=ManualClock()) as sim:
        yield sim


def validate_online(tmp_path: Path, capsys: pytest.CaptureFixture[str], *backends: dict[str, Any]) -> tuple[int, str]:
    config = write_config(tmp_path / "config.yaml", server_config(list(backends)))
    code = main(["validate", "--online", "--config", str(config)])
    return code, capsys.readouterr().out


def reads_only(sim: ScalewaySimulator | BizflySimulator) -> list[tuple[str, str]]:
    """What the simulator was sent, by method and route, after checking nothing but reads and logins came."""
    sent = [(entry.method, entry.route) for entry in sim.requests.all()]
    assert all(method == "GET" or route == "token" for method, route in sent), sent
    return sent


def problems(output: str) -> list[str]:
    return [line.removeprefix("  - ") for line in output.splitlines() if line.startswith("  - ")]


# ---------------------------------------------------------------------------------------------- Kapsule
def test_kapsule_right_key_passes_and_lists_the_groups_with_their_bounds(
    kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate_online(tmp_path, capsys, scaleway_backend(kapsule, name="kapsule"))
    assert code == 0, out
    lines = out.splitlines()
    assert "kapsule (scaleway): online: OK" in lines
    also = "also scaled by Kapsule's managed autoscaler (autoscaling is on)"
    assert f"  group {GENERAL} (general): min 1, max 5, target 2; {also}" in lines
    assert f"  group {BATCH} (batch): min 0, max 3, target 0; {also}" in lines
    assert not [line for line in lines if "(system)" in line]  # autoscaling off: not a group
    assert (
        f"  proved: the key reads cluster {CLUSTER} (prod, ready, Kubernetes 1.31.2) in fr-par: "
        "GET /k8s/v1/regions/{region}/clusters/{cluster_id}"
    ) in lines
    assert any(line.startswith("  WARNING: Kapsule's managed autoscaler acts on every pool") for line in lines)
    assert reads_only(kapsule) == [("GET", "public_get_cluster"), ("GET", "list_pools"), ("GET", "list_nodes")]


Change = Callable[[dict[str, Any], ScalewaySimulator], object]  # edits the backend entry or the simulator
# The checks every mode shares (the key's shape, then the public cluster read): the same line in either mode.
SHARED_CASES: dict[str, tuple[Change, str]] = {
    "wrong secret key": (
        lambda raw, sim: raw.update(secret_key="0b6d0c2e-4b3f-4e8a-8d2c-1f0e9b8a7c60"),
        f"{SCW}.secret_key: the Scaleway API refused this key (401 denied_authentication: no such key, or it was "
        "deleted or has expired). Fix: set the secret key (a UUID) of a current IAM API key (Scaleway console > "
        "IAM > API keys)",
    ),
    "access key in place of the secret key": (
        lambda raw, sim: raw.update(secret_key="SCWXN4R3T8Q2Y5K7M9PA"),
        f"{SCW}.secret_key: an access key (SCW and 17 more letters or digits) is set, not the secret key; nothing "
        "was sent to the API. Fix: set the secret key of that API key (a UUID, shown once when the key was made: "
        "Scaleway console > IAM > API keys)",
    ),
    "wrong cluster id": (
        lambda raw, sim: raw.update(cluster_id="0d2c1f0e-4b3f-4e8a-8d2c-9a1d6c2e7c61"),
        f"{SCW}.cluster_id: no cluster 0d2c1f0e-4b3f-4e8a-8d2c-9a1d6c2e7c61 in fr-par, nl-ams, pl-waw, it-mil for "
        "this key (404 not_found). Fix: copy the cluster ID from the Scaleway console (Kubernetes > the cluster); a "
        "cluster of another Project needs a key with access to that Project",
    ),
    "wrong region": (
        lambda raw, sim: raw.update(region="nl-ams"),
        f"{SCW}.region: cluster {CLUSTER} is in fr-par, not in nl-ams. Fix: set it to fr-par",
    ),
}


def refuse(route: str) -> Change:
    """The recorded IAM refusal (403 permissions_denied) on every request to ``route``."""
    return lambda raw, sim: sim.inject(Fault(route=route, status=403, body=permissions_denied()))


CLUSTER_READ_403 = (
    f"{SCW}.secret_key: this key may not read Kubernetes clusters (403 permissions_denied on GET "
    "/k8s/v1/regions/{region}/clusters/{cluster_id}). Fix: give the key's IAM user or application a policy with "
)
KAPSULE_CASES: dict[str, tuple[Change, str]] = {
    **SHARED_CASES,
    "403 on the cluster read": (
        refuse("public_get_cluster"),
        CLUSTER_READ_403 + "KubernetesFullAccess on the cluster's Project",
    ),
    "403 on the private autoscaler endpoints": (
        lambda raw, sim: sim.set_behaviour(private_endpoints="refused"),
        f"{SCW}.mode (not set: the default): this key cannot use Kapsule's private autoscaler endpoints (GET "
        "/k8s/v1/regions/{region}/autoscaler/clusters/{cluster_id}/pools answered 403), though it reads the cluster "
        "through the public API. Fix: set mode: public, the self-managed mode on Kapsule's public API",
    ),
}


# ---------------------------------------------------------------------------------------------- Kapsule, public mode
PUBLIC_CASES: dict[str, tuple[Change, str]] = {
    **SHARED_CASES,
    "403 on the cluster read": (
        refuse("public_get_cluster"),
        CLUSTER_READ_403 + "KubernetesFullAccess and InstancesReadOnly on the cluster's Project (the public mode "
        "changes pools and reads the Instance product catalog)",
    ),
    "a named pool with Kapsule autoscaling on": (
        lambda raw, sim: raw["pools"].update(managed={"min_size": 0, "max_size": 3}),
        f"{SCW}.pools.managed: pool 'managed' ({MANAGED}) is left untouched: its Kapsule autoscaling is on, so "
        "Kapsule's managed autoscaler also manages it. Fix: switch its autoscaling off (console: the pool's settings, "
        f"or `scw k8s pool update {MANAGED} autoscaling=false region=fr-par`), or remove 'managed' from scaleway.pools",
    ),
    "a name that matches no pool": (
        lambda raw, sim: raw["pools"].update(gpu={"min_size": 0, "max_size": 2}),
        f"{SCW}.pools.gpu: the cluster has no pool of that name or id, so no node group comes of it. Fix: name a pool "
        f"as `scw k8s pool list cluster-id={CLUSTER} region=fr-par` shows it (its name or its id), or remove 'gpu' "
        "from scaleway.pools",
    ),
    "a name that matches two pools": (
        lambda raw, sim: sim.add_pool("general", pool_id="1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e05", autoscaling=False),
        f"{SCW}.pools.general: 2 pools of the cluster are named 'general' ({GENERAL}, "
        "1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e05), so none of them is a node group. Fix: name the pool by its id instead",
    ),
    "a pool named twice": (
        lambda raw, sim: raw["pools"].update({GENERAL: {"min_size": 0, "max_size": 3}}),
        f"{SCW}.pools.{GENERAL}: names pool {GENERAL}, which 'general' names too (one by name, one by id); the bounds "
        "of 'general' are used. Fix: remove one of the two entries",
    ),
    "403 on the product catalog": (
        refuse("list_server_types"),
        f"{SCW}.secret_key: this key may not read the Instance product catalog of fr-par-1, fr-par-2 (403 "
        "permissions_denied on GET /instance/v1/zones/{zone}/products/servers), where the public mode finds each "
        "node type's CPUs, memory, GPUs and price. Fix: add InstancesReadOnly on the cluster's Project to the key's "
        "IAM policy (next to KubernetesFullAccess)",
    ),
}


def test_kapsule_public_right_key_passes_and_lists_the_named_pools_with_the_configs_bounds(
    public_kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate_online(tmp_path, capsys, public_backend(public_kapsule))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1:] == [
        "kapsule (scaleway): online: OK",
        f"  proved: the key reads cluster {CLUSTER} (prod, ready, Kubernetes 1.31.2) in fr-par: "
        "GET /k8s/v1/regions/{region}/clusters/{cluster_id}",
        "  proved: the public pool and node endpoints answer: GET /k8s/v1/regions/{region}/clusters/{cluster_id}/pools "
        "and GET /k8s/v1/regions/{region}/clusters/{cluster_id}/nodes (2 of the 2 pools named in scaleway.pools are "
        "node groups, 2 nodes in them)",
        "  proved: the Instance product catalog answers for fr-par-1: GET /instance/v1/zones/{zone}/products/servers "
        f"({len(NODE_TYPES)} commercial types)",
        "  proved: the Instance product catalog answers for fr-par-2: GET /instance/v1/zones/{zone}/products/servers "
        f"({len(NODE_TYPES)} commercial types)",
        f"  group {GENERAL} (general): min 2, max 8, target 2",  # the config's bounds; nobody else scales it
        f"  group {BATCH} (batch): min 0, max 4, target 0",
        "  not checked: the writes the server makes (PATCH /k8s/v1/regions/{region}/pools/{pool_id}, DELETE "
        "/k8s/v1/regions/{region}/nodes/{node_id}): validate --online never writes; the key's IAM policy must allow "
        "them (KubernetesFullAccess)",
    ]
    assert reads_only(public_kapsule) == [
        ("GET", "public_get_cluster"),
        ("GET", "public_list_pools"),
        ("GET", "public_list_nodes"),
        ("GET", "list_server_types"),
        ("GET", "list_server_types"),
    ]


# Each mode's cases: its scenario, its backend entry and its mistakes.
Entry = Callable[[ScalewaySimulator], dict[str, Any]]
MODES: dict[str, tuple[dict[str, Any], Entry, dict[str, tuple[Change, str]]]] = {
    "private": (KAPSULE, lambda sim: scaleway_backend(sim, name="kapsule"), KAPSULE_CASES),
    "public": (KAPSULE_PUBLIC, public_backend, PUBLIC_CASES),
}


@pytest.mark.parametrize(("mode", "case"), [(mode, case) for mode, (_, _, cases) in MODES.items() for case in cases])
def test_kapsule_mistake_is_one_line_naming_the_setting_and_exit_1(
    mode: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, entry, cases = MODES[mode]
    change, line = cases[case]
    with ScalewaySimulator(scenario=scenario, clock=ManualClock(), secret_key=SECRET) as sim:
        backend = entry(sim)
        change(backend["scaleway"], sim)
        code, out = validate_online(tmp_path, capsys, backend)
        sent = reads_only(sim)
    assert code == 1
    assert "kapsule (scaleway): online: INVALID: 1 problem" in out.splitlines()
    assert problems(out) == [line]
    if case.startswith("access key"):
        assert sent == []  # recognised before any call
    if mode == "public":  # the public routes and the catalog, never the private autoscaler endpoints
        assert all(route.startswith("public_") or route == "list_server_types" for _, route in sent), sent


def test_kapsule_public_pool_the_catalog_lacks_is_a_warning(
    public_kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node type the zone's catalog does not list: the group is served, without template or price."""
    public_kapsule.add_pool(
        "arm", pool_id="1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e06", node_type="NEW1-S", autoscaling=False,
        capacity={"cpu": 2, "memory": 4 << 30}, node_price_per_hour=0.1,
    )  # fmt: skip
    pools = {**PUBLIC_POOLS, "arm": {"min_size": 0, "max_size": 2}}
    code, out = validate_online(tmp_path, capsys, public_backend(public_kapsule, pools))
    assert code == 0, out
    assert (
        "  WARNING: the product catalog of fr-par-1 has no NEW1-S, the node type of pool 'arm': the CA gets no "
        "template for it (no scale-from-zero unless node_groups.1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e06.template "
        "gives one) and no price"
    ) in out.splitlines()


def test_kapsule_key_from_the_environment_is_named_by_its_variable(
    kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCW_SECRET_KEY", "SCWXN4R3T8Q2Y5K7M9PA")
    backend = scaleway_backend(kapsule, name="kapsule")
    del backend["scaleway"]["secret_key"]
    code, out = validate_online(tmp_path, capsys, backend)
    assert code == 1
    assert problems(out)[0].startswith(
        f"environment variable SCW_SECRET_KEY (for {SCW}.secret_key): an access key (SCW and 17 more letters"
    )


# ---------------------------------------------------------------------------------------------- Bizfly
def test_bizfly_right_login_passes_and_lists_the_groups_with_their_bounds(
    bke: BizflySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate_online(tmp_path, capsys, bizfly_backend(bke))
    assert code == 0, out
    lines = out.splitlines()
    assert "bizfly (bizfly): online: OK" in lines
    also = "also scaled by BKE's own cluster-autoscaler (autoscaling is enabled)"
    assert [line for line in lines if line.startswith("  group ")] == [
        f"  group 5f959e0ac0b18944d0a4f13a (general): min 1, max 5, target 2; {also}",
        f"  group 5f959e0ac0b18944d0a4f13b (compute): min 0, max 4, target 1; {also}",
        f"  group 5f959e0ac0b18944d0a4f13c (batch): min 0, max 3, target 0; {also}",
    ]
    assert any(line.startswith("  WARNING: BKE installs its own cluster-autoscaler") for line in lines)
    assert reads_only(bke) == [
        ("POST", "token"),
        ("GET", "service_catalog"),
        ("GET", "get_cluster"),
        *[("GET", "get_pool")] * 3,
    ]


OTHER_PROJECT = "0123456789abcdef0123456789abcdef"


BIZFLY_CASES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, str]] = {
    "wrong password": (
        {"password": "not-the-password"},
        None,
        f"{BZ}.password: Bizfly refused the password login of 'user@example.com' (401). Fix: check it and "
        f"{BZ}.email (the account's login e-mail and password)",
    ),
    "wrong cluster UID": (
        {"cluster_name": "ke0000000000wrong"},
        None,
        f"{BZ}.cluster_name: no cluster ke0000000000wrong in project c4c0aa4a2b3f4c86a9d7c8b0c5bd6f11 in HN (404; the "
        f"project's clusters there: {DEMO_CLUSTER_UID} (demo-cluster)). Fix: set it to the cluster UID from the "
        "Bizfly dashboard; for a cluster of another project, set project_id",
    ),
    "display name in place of the UID": (
        {"cluster_name": "demo-cluster"},
        None,
        f"{BZ}.cluster_name: 'demo-cluster' is the display name of cluster {DEMO_CLUSTER_UID}; the API takes the UID. "
        f"Fix: set it to {DEMO_CLUSTER_UID}",
    ),
    "project the account lacks": (
        {"project_id": OTHER_PROJECT},
        None,
        f"{BZ}.project_id: the login works, but Bizfly refuses it for project {OTHER_PROJECT} (401): the account has "
        "no such project. Fix: set it to a project of the account (Bizfly dashboard > projects), or leave it unset "
        "for the account's default project",
    ),
    "cluster in another region": (
        {},
        {"region": "HCM"},
        f"{BZ}.region: cluster {DEMO_CLUSTER_UID} is in region HCM, not in HN. Fix: set it to HCM",
    ),
    "region the catalog does not offer": (
        {"region": "VC-HaNoi"},
        None,
        f"{BZ}.region: the service catalog offers no Kubernetes Engine in 'VC-HaNoi' (it offers: HCM, HN). Fix: set "
        "it to the cluster's region, one of those",
    ),
}


@pytest.mark.parametrize("case", list(BIZFLY_CASES))
def test_bizfly_mistake_is_one_line_naming_the_setting_and_exit_1(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, cluster, line = BIZFLY_CASES[case]
    scenario = bizfly_demo()
    scenario["clusters"][0].update(cluster or {})
    with BizflySimulator(scenario, clock=ManualClock()) as sim:
        backend = bizfly_backend(sim)
        backend["bizfly"].update(settings)
        code, out = validate_online(tmp_path, capsys, backend)
        assert code == 1
        assert "bizfly (bizfly): online: INVALID: 1 problem" in out.splitlines()
        assert problems(out) == [line]
        reads_only(sim)


def test_bizfly_wrong_kubernetes_engine_url_is_told_apart_from_a_wrong_cluster(
    bke: BizflySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{bke.url}/api/kubernetes"
    backend = bizfly_backend(bke)
    backend["bizfly"]["kubernetes_engine_url"] = url
    code, out = validate_online(tmp_path, capsys, backend)
    assert code == 1
    (line,) = problems(out)
    assert line.startswith(f"{BZ}.kubernetes_engine_url: {url} does not answer like Bizfly's Kubernetes Engine (GET ")
    assert line.endswith("Fix: leave it to the service catalog (unset kubernetes_engine_url) or fix it")
    reads_only(bke)


def test_bizfly_api_url_that_is_not_bizfly_is_named_at_the_login(
    bke: BizflySimulator, kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = bizfly_backend(bke)
    del backend["bizfly"]["token_url"]  # it follows api_url
    backend["bizfly"]["api_url"] = kapsule.url
    code, out = validate_online(tmp_path, capsys, backend)
    assert code == 1
    (line,) = problems(out)
    assert line.startswith(f"{BZ}.api_url: the login at {kapsule.url}/api/token got no token (")
    assert line.endswith("Fix: point it at Bizfly's API (https://manage.bizflycloud.vn, the default)")
    assert [entry.method for entry in kapsule.requests.all()] == ["POST"]  # the login, refused as an unknown route


# ---------------------------------------------------------------------------------------------- across backends
def test_an_override_for_a_pool_that_is_no_group_is_named(
    kapsule: ScalewaySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = scaleway_backend(kapsule, name="kapsule", node_groups={"1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e03": {}})
    code, out = validate_online(tmp_path, capsys, backend)
    assert code == 1
    assert problems(out) == [
        "backends[0].node_groups.1b6f1b0e-7f63-4c1c-9a55-2b8e3c4d5e03: names no node group of this backend (it "
        f"serves {GENERAL}, {BATCH}). Fix: use a group id listed here, or remove the entry"
    ]


def test_two_backends_on_one_cluster_are_named(
    bke: BizflySimulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate_online(tmp_path, capsys, bizfly_backend(bke), bizfly_backend(bke, name="again"))
    assert code == 1
    assert problems(out) == [
        "backends[1]: serves the same node group(s) as backends[0] (5f959e0ac0b18944d0a4f13a, "
        "5f959e0ac0b18944d0a4f13b, 5f959e0ac0b18944d0a4f13c): one cluster twice. Fix: remove one of the two backends"
    ]


def test_the_adapters_of_validate_online_cannot_write(kapsule: ScalewaySimulator) -> None:
    adapter = build_adapter(ScalewayConfig(cluster_id=CLUSTER, secret_key=SECRET, api_url=kapsule.url))
    adapter.guard_writes(refuse_writes)
    group = adapter.read_group(GENERAL, Deadline.after(10))
    with pytest.raises(NotLeader, match="validate --online never writes to the cloud"):
        adapter.set_target_size(group, 3, Deadline.after(10))
    adapter.close()
    assert [entry.method for entry in kapsule.requests.all()] == ["GET"]
    assert isinstance(group, GroupState) and kapsule.pool(GENERAL).size == 2


# ---------------------------------------------------------------------------------------------- the docs
def test_configure_guide_validate_online_command_prints_what_the_docs_show(
    kapsule: ScalewaySimulator, tmp_path: Path
) -> None:
    text = CONFIGURE.read_text().split("## Check it against the cloud", 1)[1]
    command = next(line for line in text.split("```sh\n", 1)[1].splitlines() if "--online" in line)
    assert command == "ca-externalgrpc validate --online --config config.yaml"
    shown = text.split("With a wrong secret key in `SCW_SECRET_KEY` it prints", 1)[1].split("```\n", 2)[1]
    backend = scaleway_backend(kapsule, name="scaleway", secret_key_env="SCW_SECRET_KEY")
    write_config(tmp_path / "config.yaml", server_config([backend], http=False, listen="127.0.0.1:8086"))
    done = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "ca-externalgrpc"), *command.split()[1:]],
        cwd=tmp_path,
        env=child_env({"SCW_SECRET_KEY": "0b6d0c2e-4b3f-4e8a-8d2c-1f0e9b8a7c60"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == shown
    reads_only(kapsule)
