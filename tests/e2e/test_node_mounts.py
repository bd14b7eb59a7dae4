"""Mounts as the kubelet makes them, on a real node: a ConfigMap update, a Secret rotation and the
ServiceAccount token's rotation, with the server's Kubernetes features on (deploy/kubernetes/overlays/
scaleway with components/kubernetes-features, the layout an operator edits in place).

What the server does, and what the operator must do (docs/how-to/rotating-credentials.md;
the run: docs/evidence/real-node.md, "The mounts and rotations"):

- **ConfigMap update** (an operator edits the live ConfigMap): the kubelet swaps the mounted file
  within its sync period; the server read its config once at start and goes on with it, the same
  process, neither reloading nor restarting. ``kubectl rollout restart`` applies the new config.
- **Secret rotation** of the cloud credentials (``envFrom``): a container's environment is fixed when it
  starts. With the old key revoked, the running server's calls are refused by the cloud and it says so;
  ``kubectl rollout restart`` starts it with the new key.
- **Token rotation**: the pod asks for a ServiceAccount token of 10 minutes (the shortest the API
  server issues; an operator's patch of the layout, as a cluster with short token lifetimes has), so
  that the kubelet rotates the file within the scenario; the server's Kubernetes client reads the file
  again and its next writes authenticate with the new token, as the API server's audit log shows.

Bounded: the token rotation is waited for at most ``TOKEN_ROTATION_WAIT`` (the kubelet renews at 80 %
of the token's life, 8 minutes). ``make node-e2e`` runs it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.node_cluster import NAMESPACE, NodeEnvironment, PodLog, node_environments
from tests.e2e.node_layouts import (
    CA_SELECTOR,
    TOLERATE_SIMULATED,
    apply_overlay,
    ca_pod,
    operator_overlay,
)
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, SCALE_UP, machines
from tests.e2e.report import publish

TOKEN_SECONDS = 600
TOKEN_ROTATION_WAIT = 660.0
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CONFIG_PATH = "/etc/ca-externalgrpc/config.yaml"
#: the operator's patch: the pod's API access from a 10-minute token, at the path the clients read
SHORT_TOKEN = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "cluster-autoscaler"},
    "spec": {
        "template": {
            "spec": {
                "automountServiceAccountToken": False,
                "volumes": [
                    {
                        "name": "kube-api-access-short",
                        "projected": {
                            "sources": [
                                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
                                {
                                    "configMap": {
                                        "name": "kube-root-ca.crt",
                                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                    }
                                },
                                {
                                    "downwardAPI": {
                                        "items": [
                                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                                        ]
                                    }
                                },
                            ]
                        },
                    }
                ],
                **{
                    kind: [
                        {
                            "name": name,
                            "volumeMounts": [
                                {
                                    "name": "kube-api-access-short",
                                    "mountPath": str(Path(TOKEN_PATH).parent),
                                    "readOnly": True,
                                }
                            ],
                        }
                    ]
                    for kind, name in (("initContainers", "ca-externalgrpc"), ("containers", "cluster-autoscaler"))
                },
            }
        }
    },
}


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Any]:
    with node_environments(tmp_path) as start:
        yield start


def jwt_id(token: bytes) -> str:
    payload = token.split(b".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))["jti"])


def sidecar(env: NodeEnvironment) -> tuple[Any, str]:
    pod = ca_pod(env)
    return pod, env.container_id(pod, "ca-externalgrpc")


def server_writes(env: NodeEnvironment, since: float) -> list[dict[str, Any]]:
    """The server's own write requests (its Python client; the sidecar shares the CA's account) since ``since``."""
    assert env.control_plane is not None
    account = "system:serviceaccount:kube-system:cluster-autoscaler"
    return [
        e
        for e in env.control_plane.audit_events(account)
        if e.get("userAgent", "").startswith("OpenAPI-Generator/")
        and e.get("verb") in ("create", "update", "patch")
        and _when(e) >= since
    ]


def _when(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")).timestamp()


def credential_ids(events: list[dict[str, Any]]) -> set[str]:
    return {
        i
        for e in events
        for i in e.get("user", {}).get("extra", {}).get("authentication.kubernetes.io/credential-id", [])
    }


@pytest.mark.e2e
@pytest.mark.node
@pytest.mark.timeout(1200)
def test_configmap_update_secret_rotation_and_token_rotation_on_a_real_node(start_node: Any) -> None:
    env: NodeEnvironment = start_node(SCALE_UP)
    env.create_credentials_secret()
    overlay = operator_overlay(env, "overlays/scaleway", features=True, name="short-token")
    (overlay / "short-token.yaml").write_text(yaml.safe_dump(SHORT_TOKEN, sort_keys=False))
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["patches"].append({"path": "short-token.yaml"})
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    apply_overlay(env, "kustomize: overlays/scaleway + features + 10-minute token", overlay)
    node = env.real_node

    # 1. ConfigMap update: log.level info -> debug, edited in place as with kubectl edit.
    pod, container = sidecar(env)
    pids = node.container_pids(container)
    (volume,) = [v for v in pod.spec.volumes if v.name == "server-config"]
    configmap = json.loads(env.kubectl("-n", NAMESPACE, "get", "configmap", volume.config_map.name, "-o", "json"))
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert config["log"]["level"] == "info"
    configmap["data"]["config.yaml"] = yaml.safe_dump({**config, "log": {**config["log"], "level": "debug"}})
    edited = time.time()
    env.kubectl("replace", "-f", "-", stdin=json.dumps(configmap))
    env.wait_for(lambda: b"level: debug" in node.container_file(container, CONFIG_PATH), 90, "the mount to change")
    swapped = time.time() - edited
    time.sleep(5)  # a few of the CA's calls, which a debug level would log
    log = PodLog(env, pod, "ca-externalgrpc")
    assert node.container_pids(container) == pids, "the server was restarted by the ConfigMap update"
    assert [s.restart_count for s in ca_pod(env).status.init_container_statuses] == [0]
    assert not [e for e in log.entries(since=edited) if e.fields.get("v") == 4], "the server reloaded its config"

    # 2. Secret rotation: a new key, the old one revoked at the cloud; the Secret updated.
    new_key = "rotated-" + env.scw.secret_key[8:]
    env.scw.api.secret_key = new_key
    credentials = env.cloud_credentials("scaleway")
    secret_file = env.workdir / "credentials-rotated.env"
    secret_file.write_text("".join(f"{k}={new_key if k == 'SCW_SECRET_KEY' else v}\n" for k, v in credentials.items()))
    rotated = time.time()
    env.kubectl(
        "apply",
        "-f",
        "-",
        stdin=env.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "ca-externalgrpc-credentials",
            f"--from-env-file={secret_file}", "--dry-run=client", "-o", "yaml",
        ),
    )  # fmt: skip
    refused = env.wait_for(
        lambda: log.matching(r"refused|401|403|unauthori", since=rotated), 120, "the running server's calls refused"
    )
    assert node.container_pids(container) == pids

    # The operator's part: restart. The new pod has the new key and the edited config.
    restarted = time.time()
    before = pod.metadata.uid
    env.kubectl("-n", NAMESPACE, "rollout", "restart", "deployment/cluster-autoscaler")
    env.wait_for(
        lambda: [p for p in env.pods(CA_SELECTOR) if p.metadata.uid != before and _ready(p)], 180, "the new pod Ready"
    )
    pod, container = sidecar(env)
    back = time.time() - restarted
    log = PodLog(env, pod, "ca-externalgrpc")
    env.wait_for(lambda: [e for e in log.entries() if e.fields.get("v") == 4], 60, "debug records (the new config)")
    # The new key is in use: the cloud answers the restarted server (its sync reads the pools).
    synced = env.wait_for(
        lambda: [r for r in env.scw.requests.filter(route="list_pools") if r.at > restarted],
        60,
        "a sync with the new key",
    )

    # 3. Token rotation by the kubelet, and the server's writes with the new token.
    first = node.container_file(container, TOKEN_PATH)
    waited = time.time()
    env.wait_for(lambda: node.container_file(container, TOKEN_PATH) != first, TOKEN_ROTATION_WAIT, "the token rotated")
    rotation = time.time()
    second = node.container_file(container, TOKEN_PATH)
    time.sleep(65)  # the client reads the token file again at most a minute after its last read
    written = time.time()
    (first_machine,) = machines(env, "scaleway", "general")
    env.create_pod(
        "filler", cpu=FILLER_CPU["scaleway"], node_name=first_machine["name"], tolerations=[TOLERATE_SIMULATED]
    )
    env.create_pod(
        "app",
        cpu=APP_CPU["scaleway"],
        node_selector={POOL_LABEL["scaleway"]: "general"},
        tolerations=[TOLERATE_SIMULATED],
    )
    env.wait_pod_running("app", 120)
    writes = env.wait_for(lambda: server_writes(env, written), 60, "the server's writes after the rotation")
    assert all(200 <= e["responseStatus"]["code"] < 300 for e in writes), writes
    assert credential_ids(writes) == {f"JTI={jwt_id(second)}"}, (credential_ids(writes), jwt_id(first), jwt_id(second))

    publish(
        f"mounts on a real node: ConfigMap edit -> mounted file changed in {swapped:.1f} s, the server kept its "
        f"process and config; Secret rotated -> the running server refused by the cloud "
        f"({refused[0].text()[:200]}); rollout restart -> new pod Ready and the new key in use in {back:.1f} s "
        f"({len(synced)} list calls); token rotated by the kubelet {rotation - waited:.0f} s after the new pod's "
        f"first read (TTL {TOKEN_SECONDS} s), the server's next {len(writes)} writes with the new token"
    )
    env.stop()
    assert env.real_node.leftovers == [], env.real_node.leftovers


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
