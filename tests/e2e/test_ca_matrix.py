"""The compatibility matrix: every cluster-autoscaler minor upstream maintains, and HEAD, run as the real
binary against our server, unchanged, each with the control plane of the Kubernetes release it pins.

Per release: scale-up on both clouds then the emptied nodes removed, with the CA's status ConfigMap read
back at both ends; scale-from-zero on both clouds; a failed creation backed off on each cloud (a refused
resize on Scaleway, a machine in error on Bizfly). ``make e2e-ca-matrix`` runs only these (``-k
ca_matrix``), ``make e2e`` runs them with the rest; docs/reference/compatibility.md has the table and
docs/evidence/ca-matrix.md the runs.

The release is a parameter of the ``programs`` fixture, which every scenario's ``start_environment``
takes: the same harness as every other scenario, with another CA binary and control plane.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from devstack.harness import server_config
from tests.deploy.chart import CHARTS, helm_template
from tests.deploy.rendering import render
from tests.deploy.test_helm_chart import VALUES_FILES, flags
from tests.deploy.test_manifests import WITH_CA
from tests.e2e.autoscaler import BASE_FLAGS, unknown_flags
from tests.e2e.conftest import resolve_programs
from tests.e2e.environment import (
    CA_1_36_1,
    STATUS_CONFIGMAP,
    AutoscalerPrograms,
    CaRelease,
    E2EEnvironment,
    GroupStatus,
    OurServer,
    StartEnvironment,
    bizfly_pool,
    measure,
    measure_removal,
    scaleway_pool,
)
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, machines, pool_size, two_clouds
from tests.e2e.report import publish, record_timing
from tests.e2e.scenarios import failed_creation_backs_the_group_off

# Each scenario starts its own cluster (about 15 s) and waits for real loops on a shared machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

CLOUDS = ("scaleway", "bizfly")


@dataclass(frozen=True)
class Row:
    """One release of the matrix: its programs, and what its binaries say they are."""

    release: CaRelease
    ca_version: str  # what the CA logs at start ("Cluster Autoscaler <version>")
    generation: str  # the externalgrpc proto generation its client speaks (docs/reference/protocol.md)


# The control plane: the Kubernetes release each CA pins (its go.mod), etcd as that Kubernetes release
# pins it (build/dependencies.yaml) or, within the same etcd minor, the e2e's 3.6.8
# (tests/e2e/camatrix/*/build.toml; docs/reference/compatibility.md says which is which).
MATRIX = (
    Row(CaRelease("1.33.6", kubernetes="1.33.13", etcd="3.5.24"), "1.33.6", "<= 1.34.1"),
    Row(CaRelease("1.34.5", kubernetes="1.34.9", etcd="3.6.8"), "1.34.5", "1.34.2-1.34.5 (both)"),
    Row(CaRelease("1.35.2", kubernetes="1.35.6", etcd="3.6.8"), "1.35.2", ">= 1.35"),
    Row(CA_1_36_1, "1.36.1", ">= 1.35"),
    Row(CaRelease("head", kubernetes="1.36.2", etcd="3.6.8"), "dev", ">= 1.35"),
)


@pytest.fixture(scope="module", params=MATRIX, ids=[f"ca-{row.release.name}" for row in MATRIX])
def row(request: pytest.FixtureRequest) -> Row:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def programs(row: Row) -> AutoscalerPrograms:
    """This release's binaries: ``start_environment`` (conftest.py) runs the scenario with them."""
    return resolve_programs(row.release)


@pytest.fixture
def timed(row: Row, request: pytest.FixtureRequest) -> Iterator[None]:
    """The scenario's seconds, from before its cluster starts to its last check, for the matrix's table."""
    started = time.monotonic()
    yield
    name = request.node.originalname.removeprefix("test_ca_matrix_")
    if case := request.node.callspec.id.removeprefix(f"ca-{row.release.name}").lstrip("-"):
        name += f" [{case}]"
    publish(f"CA matrix {row.release.name:7} {name:45} passed in {time.monotonic() - started:5.1f}s")


def check_release(env: E2EEnvironment, row: Row) -> None:
    """The programs are the release the row names: the CA's own start line and the API server's /version."""
    said = [e.message for e in env.ca.log.matching(r"^Cluster Autoscaler \S+$")]
    assert said == [f"Cluster Autoscaler {row.ca_version}"], said
    assert k8s.VersionApi(env.api).get_code().git_version == f"v{row.release.kubernetes}"


def check_status(env: E2EEnvironment, sizes: dict[str, int], timeout: float = 60) -> dict[str, GroupStatus]:
    """The CA's status ConfigMap, once it shows every group of our server with the bounds our server
    answers, ``sizes`` as target and as many ready nodes as that, all healthy."""
    groups = set(env.ours.group_ids())
    bounds = {g.id: (g.minSize, g.maxSize) for g in env.ours.node_groups()}

    def agreed() -> dict[str, GroupStatus]:
        document, found = env.status_document(), env.status()
        healthy = (document.get("clusterWide") or {}).get("health", {}).get("status") == "Healthy"
        ok = healthy and set(found) == groups
        ok = ok and all((g.min_size, g.max_size) == bounds[n] and g.health == "Healthy" for n, g in found.items())
        ok = ok and all(found[n].target == found[n].ready == found[n].registered == s for n, s in sizes.items())
        return found if ok else {}

    return env.wait_for(agreed, timeout, f"the CA's status ConfigMap with every group healthy and sizes {sizes}")


# One busy machine per cloud in "general" (a pinned pod takes most of its CPU), so a pod selecting that
# pool needs a new machine; and an idle machine per cloud in "spare", whose group our server answers
# NodeGroupGetOptions for with a scale-down-unneeded-time of an hour: the CA keeps it only if it read
# that duration in its own generation of the options message (meta.v1.Duration in field 3 up to 1.34.1,
# google.protobuf.Duration in field 8 from 1.34.2), and a release that finds a duration missing panics.
SCALE_UP_DOWN = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 4), scaleway_pool("spare", "DEV1-M", 1, 0, 2)],
    [bizfly_pool("general", "nix.2c_4g", 1, 1, 4), bizfly_pool("spare", "nix.2c_4g", 1, 0, 2)],
)
SPARE_OPTIONS = {"options": {"scale_down_unneeded_time": "1h"}}


def spare_options(env: E2EEnvironment, backends: list[dict[str, Any]]) -> OurServer:
    """Our server as every scenario runs it, with options configured for each cloud's "spare" pool."""
    spare = {"scaleway": env.scaleway_pool("spare")["id"], "bizfly": env.bizfly_pool("spare")["id"]}
    configured = [{**b, "node_groups": {str(spare[b["type"]]): SPARE_OPTIONS}} for b in backends]
    return OurServer(server_config(configured), env.workdir)


def test_ca_matrix_scale_up_then_scale_down_on_both_clouds_with_the_status_read_back(
    start_environment: StartEnvironment, row: Row, timed: None
) -> None:
    first: dict[str, dict[str, str]] = {}

    def fill(env: E2EEnvironment) -> None:
        for cloud in CLOUDS:
            (first[cloud],) = machines(env, cloud, "general")
            env.create_pod(f"filler-{cloud}", cpu=FILLER_CPU[cloud], node_name=first[cloud]["name"])
            env.wait_pod_running(f"filler-{cloud}", 30)

    env = start_environment(SCALE_UP_DOWN, prepare=fill, serve=spare_options)
    check_release(env, row)
    group = {cloud: env.group_id(cloud, "general") for cloud in CLOUDS}
    spares = {m["name"] for cloud in CLOUDS for m in machines(env, cloud, "spare")}
    check_status(env, {group[cloud]: 1 for cloud in CLOUDS})

    created = {}
    for cloud in CLOUDS:
        pod = f"app-{cloud}"
        created[cloud] = env.create_pod(pod, cpu=APP_CPU[cloud], node_selector={POOL_LABEL[cloud]: "general"})
    new = {}
    for cloud in CLOUDS:
        pod = env.wait_pod_running(f"app-{cloud}", 120)
        what = f"CA {row.release.name}: scale-up ({cloud})"
        record_timing(measure(env, what, pod.metadata.name, created[cloud], cloud))
        assert len(env.cloud_requests(cloud, "update_pool", since=created[cloud])) == 1
        assert pool_size(env, cloud, "general") == 2
        (new[cloud],) = [m for m in machines(env, cloud, "general") if m["id"] != first[cloud]["id"]]
        assert pod.spec.node_name == new[cloud]["name"]
        assert env.nodes()[new[cloud]["name"]].spec.provider_id == new[cloud]["provider_id"]
        assert env.ca.log.matching(rf"^Scale-up: setting group {group[cloud]} size to 2", since=created[cloud])
    check_status(env, {group[cloud]: 2 for cloud in CLOUDS})
    # Kept in the run's folder as the CA wrote it: its format is the release's (see compatibility.md).
    raw = env.core.read_namespaced_config_map(STATUS_CONFIGMAP, "kube-system").data["status"]
    (env.workdir / "logs" / "cluster-autoscaler-status.yaml").write_text(raw)

    # The new nodes emptied: the CA removes them, and only them, through NodeGroupDeleteNodes.
    emptied = max(env.delete_pod_at(f"app-{cloud}") for cloud in CLOUDS)
    names = {new[cloud]["name"] for cloud in CLOUDS}
    env.wait_for(lambda: not names & set(env.nodes()), 120, "the two emptied nodes removed")
    record_timing(measure_removal(env, f"CA {row.release.name}: scale-down (1 node per cloud)", names, emptied))
    for cloud in CLOUDS:
        deleted = [r.path.rsplit("/", 1)[-1] for r in env.cloud_requests(cloud, "delete_node")]
        assert deleted == [new[cloud]["id"]], (cloud, deleted)
        assert [m["id"] for m in machines(env, cloud, "general")] == [first[cloud]["id"]]
    calls = env.ours.rpc_log("NodeGroupDeleteNodes")
    assert sorted(p for c in calls for p in c["nodes"]) == sorted(new[cloud]["provider_id"] for cloud in CLOUDS)
    assert all(c["grpcCode"] == "OK" for c in calls), calls
    check_status(env, {group[cloud]: 1 for cloud in CLOUDS})
    # The spare machines, idle since the CA started, outlived the emptied ones by the options' hour.
    env.ca.wait_for_loops(3, since=time.time(), timeout=30)
    assert spares <= set(env.nodes()), f"the CA removed {spares - set(env.nodes())} despite our options"
    assert all(pool_size(env, cloud, "spare") == 1 for cloud in CLOUDS)
    assert not env.events("ScaleDownFailed")
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()


# Scale from zero: a 10 GiB pod for each cloud, which only that cloud's empty "big" pool can hold (its
# pool label selects the cloud); the CA knows the pool's machines only from our server's template.
FROM_ZERO = two_clouds(
    [scaleway_pool("general", "DEV1-M", 1, 1, 4), scaleway_pool("big", "POP2-4C-16G", 0, 0, 3)],
    [bizfly_pool("general", "nix.2c_4g", 1, 1, 4), bizfly_pool("big", "nix.4c_16g", 0, 0, 3)],
)


def test_ca_matrix_scale_from_zero_on_both_clouds(start_environment: StartEnvironment, row: Row, timed: None) -> None:
    env = start_environment(FROM_ZERO)
    check_release(env, row)
    created = {}
    for cloud in CLOUDS:
        assert machines(env, cloud, "big") == []
        selector = {POOL_LABEL[cloud]: "big"}
        created[cloud] = env.create_pod(f"big-{cloud}", cpu="500m", memory="10Gi", node_selector=selector)
    for cloud in CLOUDS:
        pod = env.wait_pod_running(f"big-{cloud}", 120)
        what = f"CA {row.release.name}: scale-from-zero ({cloud})"
        record_timing(measure(env, what, pod.metadata.name, created[cloud], cloud))
        group = env.group_id(cloud, "big")
        (new,) = machines(env, cloud, "big")
        assert pod.spec.node_name == new["name"]
        assert env.nodes()[new["name"]].spec.provider_id == new["provider_id"]
        assert pool_size(env, cloud, "big") == 1 and env.ours.target(group) == 1
        assert len(env.cloud_requests(cloud, "update_pool")) == 1
        assert env.ca.log.matching(rf"^Scale-up: setting group {group} size to 1", since=created[cloud])
    assert not env.ca.log.provider_errors(), env.ca.log.provider_errors()


# A refused resize (Scaleway's quota answer) and a machine that ends in error (Bizfly): two ways the
# CA learns of a failed creation, each from a different answer of ours.
FAILED = [("scaleway", "quota"), ("bizfly", "creation_error")]


@pytest.mark.parametrize(("cloud", "mode"), FAILED, ids=[f"{c}-{m}" for c, m in FAILED])
def test_ca_matrix_failed_creation_is_backed_off(
    start_environment: StartEnvironment, row: Row, timed: None, cloud: str, mode: str
) -> None:
    title = f"CA {row.release.name}: failed creation ({cloud} {mode})"
    env = failed_creation_backs_the_group_off(start_environment, cloud, mode, title)
    check_release(env, row)
    assert not env.ca.log.matching(r"panic|nil pointer dereference"), "the CA logged a panic"


def test_ca_matrix_every_flag_we_pass_or_ship_is_known(row: Row, programs: AutoscalerPrograms) -> None:
    """A CA exits at start on a flag it does not know. Every flag the harness passes and every flag the
    shipped layouts give the CA (both Helm values files with the official chart, each kustomize overlay
    that runs the CA) is one this release's own ``--help`` lists."""
    shipped: dict[str, set[str]] = {"the e2e harness": {*BASE_FLAGS, "kubeconfig", "cloud-config", "address"}}
    for source in CHARTS:
        for values in VALUES_FILES:
            docs = helm_template(source, (values,), "1.34.0")
            (ctr,) = [c for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
            shipped[f"{values.name} with chart {source.label}"] = set(flags(ctr))
    for overlay in WITH_CA:
        docs = render(overlay)
        ctrs = [c for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
        (ctr,) = [c for c in ctrs if c["name"] == "cluster-autoscaler"]
        shipped[overlay] = set(flags(ctr))
    program = programs.cluster_autoscaler
    unknown = {where: bad for where, names in shipped.items() if (bad := unknown_flags(program, dict.fromkeys(names)))}
    assert not unknown, f"CA {row.release.name} would refuse: {unknown}"
