"""The tutorials of docs/tutorials/, every command taken from the page and run on the real node
(tests/e2e/tutorial_walk.py says what stands in for the reader's world and the only changes made):
from the image pushed to a private registry, the pull secret and the credentials, through ``helm
install`` of the official chart (Kapsule) or ``kubectl apply -k`` of the reader's overlay (Bizfly), the
``status`` the pages ask for, the CA scaling the reader's pool up and down through our server, to the
upgrade and the rollback in two lines. The migration tutorial starts from the in-tree Scaleway CA
installed with the official chart, and ends with the rollback to it.

``make node-e2e`` runs them (root, podman and runc; the images ``make image`` and ``make node-images``
build). The offline parts of the same pages (what their Helm and kustomize commands render, their
lengths) are in ``make test``: tests/integration/test_docs_walk.py.
"""

from __future__ import annotations

import json
import shlex
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.clouds import BIZFLY_REGION, bizfly_cluster_uid
from devstack.container import default_image, image_problem
from simulators.bizfly import DEFAULT_APP_CREDENTIALS
from tests.e2e.environment import Layout, bizfly_pool, scaleway_pool
from tests.e2e.node_cluster import NAMESPACE, NodeEnvironment, node_environments
from tests.e2e.node_layouts import CA_SELECTOR, ca_pod
from tests.e2e.report import publish
from tests.e2e.tutorial_walk import (
    WALK_TIMINGS,
    ChartRepository,
    PrivateRegistry,
    Walk,
    deployment_revision,
    status_lines,
    wait_pool,
    with_chart_repository,
    with_timings,
)
from tests.support.docpages import Tutorial, checked, commands
from tests.support.release import save_image

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = REPO / "docs" / "tutorials"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
POOL = "autoscaled"
#: the reader's pool starts empty here (tests/e2e/node_cluster.py: an untainted pool must), min 0, max 3
LAYOUTS = {
    "scaleway": Layout(scaleway_pools=[scaleway_pool(POOL, "DEV1-M", 0, 0, 3)]),
    # the self-managed mode: Kapsule's autoscaling off on the pool, its bounds in our config (the page's)
    "scaleway-public": Layout(scaleway_pools=[scaleway_pool(POOL, "DEV1-M", 0, 0, 0, autoscaling=False)]),
    "bizfly": Layout(bizfly_pools=[bizfly_pool(POOL, "nix.2c_4g", 0, 0, 3)]),
}
#: the Kapsule tutorial's two modes: the section whose block writes values.yaml for each
KAPSULE_MODES = {"public": "### Self-managed", "private": "### Private endpoints"}
SERVER_REPOSITORY = "ca-tutorial/ca-externalgrpc-server"
#: the migrated release's pods: the chart names them after the cloud provider (no nameOverride)
RELEASE_SELECTOR = "app.kubernetes.io/instance=cluster-autoscaler"


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


def push_image(walk: Walk, tutorial: Tutorial, registry: PrivateRegistry) -> None:
    """Step 2: ``make image`` (the build step's), the release archive loaded, the image pushed."""
    walk.built_by_the_build_step(tutorial.block("## 2.", "make image"), lambda: image_problem(default_image()) is None)
    archive = walk.cwd / f"ca-externalgrpc-server-{VERSION}-image.tar"
    save_image(default_image(), archive)  # what make release writes (tests/support/release.py)
    walk.run(tutorial.block("## 2.", "podman load"))
    walk.run(tutorial.block("## 2.", "podman push"))
    archive.unlink()


def check_status(walk: Walk, block: str, backend: str) -> str:
    """``status`` through ``kubectl exec``, as the pages ask after every rollout: the reader's pool and a
    healthy backend, exit 0. Run again while the server has not finished its first sync (the pages'
    point: Ready comes before it), as a reader would."""
    shown = f"backend {backend} ({backend}): healthy, serving, "
    assert f"`{shown}" in walk.tutorial.path.read_text(), f"the page no longer shows {shown}"
    expected = f"{shown}1 group(s)"
    deadline = time.monotonic() + 30
    while True:
        try:
            output = walk.run(block)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
            continue
        lines = status_lines(output)
        if (len(lines) == 1 and lines[0].startswith(expected)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert len(lines) == 1 and lines[0].startswith(expected), output
    group = pool_id(walk.env, "scaleway" if backend == "scaleway" else "bizfly")
    assert any(line.startswith(f"{group} ") for line in output.splitlines()), output
    return output


def scale_the_pool(walk: Walk, tutorial: Tutorial, cloud: str, heading: str) -> None:
    """Step 8: the demo deployment scales the empty pool to two nodes; deleted, the pool goes back to 0."""
    scale, delete = tutorial.blocks(heading)
    output = walk.run(scale)
    env = walk.env
    wait_pool(env, cloud, POOL, 2, timeout=10)
    group = pool_id(env, cloud)
    nodes = [line for line in output.splitlines() if line and not line.startswith("NAME")]
    assert sum(1 for line in nodes if " Ready " in line) == 2, output
    assert f"Scale-up: setting group {group} size to" in output, output
    walk.run(delete)
    wait_pool(env, cloud, POOL, 0, timeout=240)


def pool_id(env: NodeEnvironment, cloud: str) -> str:
    """The reader's pool's id: its node group's id."""
    return str(env.scaleway_pool(POOL)["id"] if cloud == "scaleway" else env.bizfly_pool(POOL)["id"])


def restart_and_wait(walk: Walk) -> None:
    """The restart a page tells the reader to make after fixing the Secret (the Deployments are Recreate)."""
    env, before = walk.env, ca_pod(walk.env).metadata.uid
    walk.run_inline("kubectl -n kube-system rollout restart deployment/cluster-autoscaler")
    env.wait_for(lambda: all(p.metadata.uid != before for p in env.pods(CA_SELECTOR)), 240, "the old CA pod gone")
    env.wait_pods_ready(CA_SELECTOR, 1, 240)


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", KAPSULE_MODES)
def test_the_kapsule_tutorial_on_a_real_node(start_node: Any, mode: str) -> None:
    tutorial = Tutorial(TUTORIALS / "kapsule.md")
    layout = LAYOUTS["scaleway-public" if mode == "public" else "scaleway"]
    env: NodeEnvironment = start_node(layout, untainted=[POOL])
    registry = PrivateRegistry(env, "nologin", env.scw.secret_key)
    charts = ChartRepository(env)
    values = {
        "CLUSTER_ID": env.scw.cluster_id,
        "SCW_REGION": env.scw.region,
        "REGISTRY": f"{registry.address}/ca-tutorial",
        "POOL": POOL,
        "CA_VERSION": "v1.36.1",
        "SCW_SECRET_KEY": env.scw.secret_key,
    }
    # step 4's validate --online runs on this machine: SCW_API_URL is its way to the simulated cloud
    walk = Walk(tutorial, env, values, {**registry.podman, "SCW_API_URL": env.scw.url})

    push_image(walk, tutorial, registry)
    walk.run(tutorial.block("## 3."))
    add_the_way_to_the_cloud(env, "scaleway")

    walk.label += f" ({mode} mode)"
    (choice,) = tutorial.blocks(KAPSULE_MODES[mode])
    walk.run(choice)
    online = walk.run(tutorial.block("### Check it against Scaleway"))
    assert "scaleway (scaleway): online: OK" in online, online
    assert f"({POOL}): min 0, max 3, target 0" in online, online
    version = walk.run(tutorial.block("## 5."))
    assert "Server Version: v1.36." in version and values["CA_VERSION"].startswith("v1.36."), version

    walk.run(tutorial.block("## 6."), edit=lambda b: with_timings(with_chart_repository(b, charts)))
    pod = ca_pod(env)
    (sidecar,) = [c for c in pod.spec.init_containers if c.name == "ca-externalgrpc"]
    assert sidecar.image == f"{values['REGISTRY']}/ca-externalgrpc-server:{VERSION}"
    assert [s.name for s in pod.spec.image_pull_secrets] == ["ca-externalgrpc-pull"]
    assert registry.pulls(SERVER_REPOSITORY, "nologin"), "the node did not pull the image with the pull secret"

    status = tutorial.block("## 7.")
    check_status(walk, status, "scaleway")
    restart_and_wait(walk)
    check_status(walk, status, "scaleway")

    scale_the_pool(walk, tutorial, "scaleway", "## 8.")

    upgrade, rollback = tutorial.blocks("## Upgrade")
    walk.run(upgrade, edit=with_timings)
    walk.run(rollback)
    history = yaml.safe_load(env.helm("-n", NAMESPACE, "history", "cluster-autoscaler", "-o", "yaml"))
    assert [h["revision"] for h in history] == [1, 2, 3] and "Rollback to 1" in history[-1]["description"]
    check_status(walk, status, "scaleway")
    walk.run_inline("helm -n kube-system uninstall cluster-autoscaler")
    env.wait_for(lambda: not env.pods(CA_SELECTOR), 120, "the CA's pod gone")
    other = [b for m, heading in KAPSULE_MODES.items() if m != mode for b in tutorial.blocks(heading)]
    end_walk(walk, registry, charts, elsewhere=other)


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(900)
def test_the_bizfly_tutorial_on_a_real_node(start_node: Any) -> None:
    tutorial = Tutorial(TUTORIALS / "bizfly.md")
    env: NodeEnvironment = start_node(LAYOUTS["bizfly"], untainted=[POOL])
    ((credential_id, credential_secret),) = DEFAULT_APP_CREDENTIALS.items()
    registry = PrivateRegistry(env, f"APPCRED_{credential_id}", credential_secret)
    values = {
        "CLUSTER_NAME": bizfly_cluster_uid(env.bz),
        "BIZFLYCLOUD_REGION": BIZFLY_REGION,
        "BIZFLYCLOUD_PROJECT_ID": "",  # the account's default project, as the page's example
        "BIZFLYCLOUD_APP_CREDENTIAL_ID": credential_id,
        "REGISTRY": f"{registry.address}/ca-tutorial",
        "POOL": POOL,
        "CA_VERSION": "v1.36.1",
        "BIZFLYCLOUD_APP_CREDENTIAL_SECRET": credential_secret,
    }
    walk = Walk(tutorial, env, values, registry.podman)

    push_image(walk, tutorial, registry)
    walk.run(tutorial.block("## 3."))
    add_the_way_to_the_cloud(env, "bizfly")
    deployments = walk.run(tutorial.block("## 4.", "get deployments"))
    assert "cluster-autoscaler" not in deployments, deployments
    # step 4's validate --online runs on this machine: the production host the catalog names, through the
    # interception proxy (tests/support/https_intercept.py) and trusting it, is its way to the simulated cloud
    assert env.proxy is not None
    way = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.proxy.env().items())
    online = walk.run(tutorial.block("## 4.", "validate --online"), edit=lambda b: f"export {way}\n{b}")
    assert "bizfly (bizfly): online: OK" in online and f"({POOL}): min 0, max 3" in online, online
    version = walk.run(tutorial.block("## 5."))
    assert "Server Version: v1.36." in version, version

    walk.run(tutorial.block("## 6."))
    assert deployment_revision(env) == "1"
    rendered = walk.run_inline("kubectl kustomize my-bizfly")
    assert f"image: {values['REGISTRY']}/ca-externalgrpc-server:{VERSION}" in rendered
    assert registry.pulls(SERVER_REPOSITORY, f"APPCRED_{credential_id}"), "no pull with the pull secret"
    # The walk's CA timings (module docstring of tutorial_walk.py): revision 2 of the Deployment.
    env.kubectl(
        "-n", NAMESPACE, "patch", "deployment", "cluster-autoscaler", "--type=json", "-p",
        yaml.safe_dump([
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": f"--{k}={v}"}
            for k, v in WALK_TIMINGS.items()
        ]),
    )  # fmt: skip
    env.wait_for(lambda: deployment_revision(env) == "2", 30, "revision 2")
    env.kubectl("-n", NAMESPACE, "rollout", "status", "deployment/cluster-autoscaler", "--timeout=240s", timeout=250)

    status = tutorial.block("## 7.")
    check_status(walk, status, "bizfly")
    before_restart = pod_template(env)
    restart_and_wait(walk)  # a new revision: the one the rollback leaves
    check_status(walk, status, "bizfly")

    scale_the_pool(walk, tutorial, "bizfly", "## 8.")

    walk.run_inline("kubectl apply -k my-bizfly")  # the upgrade's apply: nothing changed, nothing rolls
    (rollback,) = tutorial.blocks("## Upgrade")
    walk.run(rollback)
    assert pod_template(env) == before_restart, "the undo did not go back to the revision before the last"
    check_status(walk, status, "bizfly")
    walk.run_inline("kubectl delete -k my-bizfly")
    env.wait_for(lambda: not env.pods(CA_SELECTOR), 120, "the CA's pod gone")
    end_walk(walk, registry)


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(900)
def test_the_migration_tutorial_on_a_real_node(start_node: Any) -> None:
    tutorial = Tutorial(TUTORIALS / "migrate-from-in-tree.md")
    kapsule = Tutorial(TUTORIALS / "kapsule.md")
    env: NodeEnvironment = start_node(LAYOUTS["scaleway"], untainted=[POOL])
    registry = PrivateRegistry(env, "nologin", env.scw.secret_key)
    charts = ChartRepository(env)
    values = {
        "RELEASE": "cluster-autoscaler",
        "CLOUD_PROVIDER": "scaleway",
        "SECRET": "scaleway-secret",
        "REGISTRY": f"{registry.address}/ca-tutorial",
        "POOL": POOL,
        "POOL_LABEL": "k8s.scaleway.com/pool-name",
    }
    walk = Walk(tutorial, env, values, registry.podman)

    # The reader's cluster: the in-tree Scaleway CA, installed with the official chart from the same
    # repository, its variables in the Secret its values name (with the way to the simulated cloud).
    in_tree = {**env.cloud_credentials("scaleway")}
    env.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", values["SECRET"],
        *[f"--from-literal={k}={v}" for k, v in in_tree.items()],
    )  # fmt: skip
    release = env.workdir / "in-tree-values.yaml"
    release.write_text(
        yaml.safe_dump(
            {
                "cloudProvider": "scaleway",
                "autoDiscovery": {"clusterName": "e2e"},
                "envFromSecret": values["SECRET"],
                "image": {"tag": "v1.36.1"},  # the chart's own default is 1.35.0
                "extraArgs": {**WALK_TIMINGS, "logging-format": "json"},
            }
        )
    )
    env.helm("repo", "add", "autoscaler", charts.url)
    env.helm(
        "install", "cluster-autoscaler", "autoscaler/cluster-autoscaler", "--version", "9.58.0",
        "-n", NAMESPACE, "-f", str(release),
    )  # fmt: skip
    env.wait_pods_ready(RELEASE_SELECTOR, 1, 240)

    # What the page asks to have first: the image in the registry and the pull secret (the Kapsule
    # tutorial's step 2 and the first command of its step 3), and the release's values in my-values.yaml.
    first = {**kapsule.values(), "REGISTRY": values["REGISTRY"], "SCW_SECRET_KEY": env.scw.secret_key}
    push_image(Walk(kapsule, env, first, registry.podman), kapsule, registry)
    pull_secret = commands(kapsule.block("## 3."))[0]
    assert pull_secret.startswith("kubectl -n kube-system create secret docker-registry ca-externalgrpc-pull ")
    checked(kapsule.run(pull_secret, first, cwd=walk.cwd, env=walk.shell_env), pull_secret)
    assert "cluster-autoscaler" in walk.run_inline("helm -n kube-system list")
    walk.run_inline("helm -n kube-system get values cluster-autoscaler -o yaml > my-values.yaml")

    before = walk.run(tutorial.block("## 2."))
    assert (walk.cwd / "status-before.yaml").read_text().strip(), before
    convert, patch = tutorial.blocks("## 3.")
    shown = walk.run(convert)
    assert "--cloud-provider=scaleway  ->  --cloud-provider=externalgrpc" in shown, shown
    assert not (walk.cwd / "credentials.env").exists()
    # The kustomize variant's Secret, from the same keys: step 3's first command again, then the one the
    # page names for it (the helm path does not use that Secret; the command is checked all the same).
    reread = commands(convert)[0]
    assert reread.endswith("> credentials.env"), reread
    checked(tutorial.run(reread, values, cwd=walk.cwd, env=walk.shell_env), reread)
    walk.run_inline(
        "kubectl -n kube-system create secret generic ca-externalgrpc-credentials --from-env-file=credentials.env"
    )
    (walk.cwd / "credentials.env").unlink()
    assert "CLUSTER_ID" in env.kubectl("-n", NAMESPACE, "get", "secret", "ca-externalgrpc-credentials", "-o", "yaml")
    walk.run(patch)

    walk.run(tutorial.block("## 4."))
    (pod,) = env.wait_pods_ready(RELEASE_SELECTOR, 1, 60)
    assert "--cloud-provider=externalgrpc" in (pod.spec.containers[0].command or [])
    assert registry.pulls(SERVER_REPOSITORY, "nologin"), "the node did not pull the image with the pull secret"

    status, compare = tutorial.blocks("## 5.")
    check_status(walk, status, "scaleway")
    assert walk.run(compare, timeout=120) == ""  # diff: no output (else it exits 1 and the block fails)

    scale_the_pool(walk, tutorial, "scaleway", "## 6.")

    listed = walk.run(tutorial.block("## Roll back"))
    (pod,) = env.wait_pods_ready(RELEASE_SELECTOR, 1, 60)
    assert pod.metadata.name in listed, listed
    assert "--cloud-provider=scaleway" in (pod.spec.containers[0].command or [])
    assert not pod.spec.init_containers
    end_walk(walk, registry, charts)


def end_walk(walk: Walk, *parts: PrivateRegistry | ChartRepository, elsewhere: Sequence[str] = ()) -> None:
    """Every block run (but ``elsewhere``'s, Walk.finish); the walk's parts and the cluster stopped, nothing
    left on the machine."""
    walk.finish(elsewhere)
    for part in parts:
        part.stop()
    walk.env.stop()
    assert walk.env.real_node.leftovers == [], walk.env.real_node.leftovers
    publish(walk.summary())


def pod_template(env: NodeEnvironment) -> Any:
    """The CA Deployment's pod template, as the API server holds it."""
    found = env.kubectl("-n", NAMESPACE, "get", "deployment", "cluster-autoscaler", "-o", "jsonpath={.spec.template}")
    return json.loads(found)


def add_the_way_to_the_cloud(env: NodeEnvironment, cloud: str) -> None:
    """The walk's addition to the Secret the page created (tests/e2e/tutorial_walk.py)."""
    env.kubectl(
        "-n", NAMESPACE, "patch", "secret", "ca-externalgrpc-credentials", "--type=merge",
        "-p", yaml.safe_dump({"stringData": env.cloud_way(cloud)}),
    )  # fmt: skip
