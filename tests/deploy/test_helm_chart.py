"""deploy/helm/values-*.yaml rendered by the real Helm CLI with the official cluster-autoscaler chart
(from the CA 1.36.1 module and from CA HEAD), and what comes out: the CA's flags, the volumes, the
native sidecar, the probes, the security contexts, schema validity for Kubernetes 1.30, 1.34 and
1.36, and the names shared with deploy/kubernetes. Also: our ClusterRole and Role against the
chart's at HEAD."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from server.config import parse_address
from tests.deploy.chart import CA_HEAD, CHARTS, ChartSource, chart_values, chart_version, helm_template
from tests.deploy.rendering import DEPLOY, KUBERNETES, objects, one, permissions, render
from tests.deploy.test_manifests import KUBERNETES_VERSIONS, TESTED_CA_TAGS

SIDECAR = DEPLOY / "helm" / "values-sidecar.yaml"
MTLS = DEPLOY / "helm" / "values-mtls-service.yaml"
VALUES_FILES = (SIDECAR, MTLS)
CREDENTIALS_SECRET = "ca-externalgrpc-credentials"
#: what the ServiceMonitor of deploy/monitoring selects and scrapes
METRICS_LABEL = ("ca-externalgrpc/metrics", "true")
METRICS_PORT = "server-metrics"
#: klog flags the JSON log format does not honour (the CA would warn or refuse)
KLOG_ONLY_FLAGS = ("logtostderr", "stderrthreshold", "alsologtostderr", "log-dir", "log-file")


def rendered(source: ChartSource, values: Path, kube: str = "1.34.0") -> tuple[dict[str, Any], ...]:
    return helm_template(source, (values,), kube)


def deployment(docs: Any) -> dict[str, Any]:
    (found,) = list(objects(docs, "Deployment"))
    return found


def pod(docs: Any) -> dict[str, Any]:
    return deployment(docs)["spec"]["template"]["spec"]


def ca_container(docs: Any) -> dict[str, Any]:
    (ctr,) = pod(docs)["containers"]
    return ctr


def flags(ctr: dict[str, Any]) -> dict[str, str | None]:
    """``--name=value`` / ``--name`` of the CA's command line (the chart puts them in ``command``)."""
    out: dict[str, str | None] = {}
    for arg in [*ctr.get("command", []), *ctr.get("args", [])]:
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            out[name] = value if _ else None
    return out


def mounted(docs: Any, ctr: dict[str, Any], path: str) -> dict[str, Any]:
    mounts = {m["mountPath"]: m["name"] for m in ctr.get("volumeMounts", [])}
    assert path in mounts, f"{ctr['name']} mounts nothing at {path}: {sorted(mounts)}"
    volumes = {v["name"]: v for v in pod(docs).get("volumes", [])}
    return volumes[mounts[path]]


def configmap_file(docs: Any, volume: dict[str, Any], key: str) -> dict[str, Any]:
    data = one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    assert key in data, f"ConfigMap {volume['configMap']['name']} has no {key}"
    return yaml.safe_load(data[key])


def sidecar(docs: Any) -> dict[str, Any]:
    (ctr,) = [c for c in pod(docs).get("initContainers", []) if c["name"] == "ca-externalgrpc"]
    return ctr


def port_number(ctr: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return int({p["name"]: p["containerPort"] for p in ctr["ports"]}[port])


# ---------------------------------------------------------------------------------------------------
# The chart itself


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_the_chart_is_the_one_of_the_pinned_module(source: ChartSource) -> None:
    assert chart_version(source) == {"ca-1.36.1": "9.58.0", "ca-head": "9.59.0"}[source.label]


def _key_paths(values: dict[str, Any], defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of ``values`` that the chart's values.yaml does not have (free-form maps excepted)."""
    unknown = []
    for key, value in values.items():
        if key not in defaults:
            unknown.append(prefix + key)
        elif isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key]:
            unknown += _key_paths(value, defaults[key], f"{prefix}{key}.")
    return unknown


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_values_use_only_keys_the_chart_has(source: ChartSource, values: Path) -> None:
    # Free-form maps (extraArgs, podAnnotations...) are empty in the chart's defaults or hold
    # examples; only keys of maps with a fixed shape (image, autoDiscovery, ...) are compared.
    free_form = {"extraArgs", "podAnnotations", "podLabels", "securityContext", "containerSecurityContext"}
    ours = {k: v for k, v in yaml.safe_load(values.read_text()).items() if k not in free_form}
    assert _key_paths(ours, chart_values(source)) == []


# ---------------------------------------------------------------------------------------------------
# Both layouts


@pytest.mark.parametrize("kube", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_rendered_objects_are_valid_kubernetes_objects(source: ChartSource, values: Path, kube: str) -> None:
    docs = rendered(source, values, kube)
    assert {"Deployment", "ServiceAccount", "ClusterRole", "Role"} <= {d["kind"] for d in docs}
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{values.name}: {doc['kind']} {doc['metadata']['name']} invalid for {kube}: {err.message}")


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_ca_runs_a_tested_release_with_externalgrpc_flags_and_json_logs(source: ChartSource, values: Path) -> None:
    docs = rendered(source, values)
    ctr = ca_container(docs)
    image, _, tag = ctr["image"].rpartition(":")
    assert image == "registry.k8s.io/autoscaling/cluster-autoscaler" and tag in TESTED_CA_TAGS
    args = flags(ctr)
    assert args["cloud-provider"] == "externalgrpc"
    assert args["logging-format"] == "json"
    assert not set(KLOG_ONLY_FLAGS) & set(args), "klog flags mean nothing with the JSON format"
    assert "nodes" not in args and "node-group-auto-discovery" not in args, "node groups come from the server"
    assert deployment(docs)["spec"]["replicas"] == 1
    directory, key = str(args["cloud-config"]).rsplit("/", 1)
    assert mounted(docs, ctr, directory)["configMap"]["name"] == "cluster-autoscaler-cloud-config"
    assert key == "cloud-config"


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_every_container_runs_non_root_read_only_without_capabilities(source: ChartSource, values: Path) -> None:
    spec = pod(rendered(source, values))
    pod_ctx = spec["securityContext"]
    assert pod_ctx["seccompProfile"]["type"] == "RuntimeDefault"
    for ctr in [*spec.get("initContainers", []), *spec["containers"]]:
        ctx = {**pod_ctx, **ctr.get("securityContext", {})}
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0, ctr["name"]
        assert ctx["readOnlyRootFilesystem"] is True, ctr["name"]
        assert ctx["allowPrivilegeEscalation"] is False, ctr["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, ctr["name"]
        assert {"cpu", "memory"} <= set(ctr["resources"]["requests"]) and "memory" in ctr["resources"]["limits"]


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_nothing_rendered_is_a_secret(source: ChartSource, values: Path) -> None:
    """Credentials live in a Secret the operator creates; an install or upgrade can never overwrite it."""
    assert not list(objects(rendered(source, values), "Secret"))


# ---------------------------------------------------------------------------------------------------
# Native sidecar layout


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_sidecar_is_a_native_sidecar_the_ca_reaches_over_loopback(source: ChartSource) -> None:
    docs = rendered(source, SIDECAR)
    server = sidecar(docs)
    assert server["restartPolicy"] == "Always", "an init container with restartPolicy Always is a sidecar"
    assert "command" not in server and server["args"][0] == "serve"
    config_path = next(a.split("=", 1)[1] for a in server["args"] if a.startswith("--config="))
    directory, key = config_path.rsplit("/", 1)
    config = configmap_file(docs, mounted(docs, server, directory), key)
    cloud_config = configmap_file(docs, mounted(docs, ca_container(docs), "/config"), "cloud-config")
    assert parse_address("address", cloud_config["address"]) == parse_address("listen", config["listen"])
    assert parse_address("listen", config["listen"])[0] == "127.0.0.1"
    assert "tls" not in config and not cloud_config.get("cert")
    assert [ref["secretRef"]["name"] for ref in server["envFrom"]] == [CREDENTIALS_SECRET]
    assert deployment(docs)["spec"]["strategy"]["type"] == "Recreate", "never two servers with their own view"


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_sidecar_probes_use_the_servers_http_port_reachable_by_the_kubelet(source: ChartSource) -> None:
    docs = rendered(source, SIDECAR)
    server = sidecar(docs)
    config_path = next(a.split("=", 1)[1] for a in server["args"] if a.startswith("--config="))
    config = configmap_file(docs, mounted(docs, server, config_path.rsplit("/", 1)[0]), "config.yaml")
    host, port = parse_address("http_listen", config["http_listen"])
    assert host == "::", "every address of both families: the kubelet probes the pod IP, IPv4 or IPv6"
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert port_number(server, server[probe]["httpGet"]["port"]) == port, probe
        paths[probe] = server[probe]["httpGet"]["path"]
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    ca = ca_container(docs)
    assert ca["livenessProbe"]["httpGet"] == {"path": "/health-check", "port": 8085}


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_sidecar_writes_only_to_its_tmp_volume(source: ChartSource) -> None:
    docs = rendered(source, SIDECAR)
    server = sidecar(docs)
    assert "emptyDir" in mounted(docs, server, "/tmp")
    for ctr in (server, ca_container(docs)):
        for mount in ctr["volumeMounts"]:
            assert mount["mountPath"] == "/tmp" or mount.get("readOnly") is True, (ctr["name"], mount)
    names = {v["name"] for v in pod(docs)["volumes"]}
    used = {m["name"] for c in (server, ca_container(docs)) for m in c["volumeMounts"]}
    assert names == used, "every volume is mounted, every mount has a volume"


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_sidecar_metrics_are_scraped_from_the_server(source: ChartSource) -> None:
    docs = rendered(source, SIDECAR)
    server = sidecar(docs)
    template = deployment(docs)["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port_number(server, "http-probes")
    assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"
    service = one(docs, "Service", "ca-externalgrpc-metrics")
    assert service["metadata"]["labels"][METRICS_LABEL[0]] == METRICS_LABEL[1]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == METRICS_PORT and port_number(server, port["targetPort"]) == 8087


# ---------------------------------------------------------------------------------------------------
# mTLS Service layout


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_mtls_ca_mounts_what_server_mtls_creates_and_passes_its_network_policy(source: ChartSource) -> None:
    docs = rendered(source, MTLS)
    server_mtls = render("server-mtls")
    ca = ca_container(docs)
    assert "initContainers" not in pod(docs)
    directory, key = str(flags(ca)["cloud-config"]).rsplit("/", 1)
    name = mounted(docs, ca, directory)["configMap"]["name"]
    cloud_config = yaml.safe_load(one(server_mtls, "ConfigMap", name)["data"][key])
    assert one(server_mtls, "ConfigMap", name)["metadata"]["name"] == name  # a chart cannot follow hashes
    for field in ("cert", "key", "cacert"):
        cert_dir = cloud_config[field].rsplit("/", 1)[0]
        secret = mounted(docs, ca, cert_dir)["secret"]["secretName"]
        certificates = [c for c in objects(server_mtls, "Certificate") if c["spec"]["secretName"] == secret]
        assert len(certificates) == 1 and "client auth" in certificates[0]["spec"]["usages"]
    policy = one(server_mtls, "NetworkPolicy", "ca-externalgrpc-server")
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    allowed = [r["from"][0]["podSelector"]["matchLabels"] for r in policy["spec"]["ingress"] if r.get("from")]
    assert any(rule.items() <= labels.items() for rule in allowed)
    annotations = deployment(docs)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8085", "this pod runs only the CA"


# ---------------------------------------------------------------------------------------------------
# RBAC: ours is the chart's at HEAD


def test_our_roles_grant_exactly_what_the_chart_at_head_grants_with_every_optional_feature() -> None:
    # expander=priority turns on the chart's optional Role rules; the ClusterRole already carries
    # the rules of every CA flag (provisioning requests, capacity buffers and quotas, DRA).
    chart = helm_template(CA_HEAD, (SIDECAR,), "1.34.0", ("extraArgs.expander=priority",))
    ours = list(yaml.safe_load_all((KUBERNETES / "base" / "rbac.yaml").read_text()))
    for kind in ("ClusterRole", "Role"):
        (theirs,) = list(objects(chart, kind))
        (mine,) = [d for d in ours if d["kind"] == kind]
        missing = permissions(theirs["rules"]) - permissions(mine["rules"])
        extra = permissions(mine["rules"]) - permissions(theirs["rules"])
        assert not missing and not extra, f"{kind}: missing {sorted(missing)}, beyond the chart {sorted(extra)}"


def test_every_rbac_rule_says_why() -> None:
    lines = (KUBERNETES / "base" / "rbac.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if re.match(r"^  - apiGroups:", line)]
    assert len(rules) >= 20
    for i in rules:
        assert lines[i - 1].lstrip().startswith("#"), f"rule at line {i + 1} has no comment above it"


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
def test_the_ca_deployment_uses_the_strategy_the_docs_name(source: ChartSource, values: Path) -> None:
    # docs/how-to/upgrading.md: "The Deployments use the Recreate strategy".
    upgrading = DEPLOY.parent / "docs" / "how-to" / "upgrading.md"
    assert "The Deployments use the `Recreate` strategy" in upgrading.read_text()
    assert deployment(rendered(source, values))["spec"].get("strategy") == {"type": "Recreate"}
