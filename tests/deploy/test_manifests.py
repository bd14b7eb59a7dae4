"""The Kubernetes manifests under deploy/kubernetes: they render, they are valid Kubernetes objects,
and the pieces that must agree with each other (ports, addresses, certificate names, mounts, flags,
the server's config) do agree."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from server.config import parse_address
from tests.deploy.rendering import (
    KUBERNETES,
    OVERLAYS,
    container,
    mounted_volume,
    objects,
    one,
    pod_containers,
    render,
)

#: Kubernetes API versions the manifests must be valid for: the oldest minor still commonly run
#: and the minors matching the two CA releases the conformance suite exercises (1.34.1, 1.36.1).
KUBERNETES_VERSIONS = ("1.30.0", "1.34.0", "1.36.0")
#: CA images that run against our server in the compatibility matrix (tests/e2e/test_ca_matrix.py); the
#: manifests must pin one of them.
TESTED_CA_TAGS = {"v1.33.6", "v1.34.5", "v1.35.2", "v1.36.1"}
CA_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
CERT_MANAGER_GROUP = "cert-manager.io"
SIDECAR_OVERLAYS = ("overlays/scaleway", "overlays/bizfly")
WITH_CA = ("overlays/scaleway", "overlays/bizfly", "overlays/mtls-service")


def _deployments(overlay: str) -> list[dict[str, Any]]:
    return list(objects(render(overlay), "Deployment"))


def _configmap_file(docs: Any, name: str, key: str) -> dict[str, Any]:
    data = one(docs, "ConfigMap", name)["data"]
    assert key in data, f"ConfigMap {name} has no key {key!r}: {sorted(data)}"
    return yaml.safe_load(data[key])


def _ca_cloud_config(overlay: str) -> dict[str, Any]:
    return _configmap_file(render(overlay), "cluster-autoscaler-cloud-config", "cloud-config")


def _server_config(overlay: str) -> dict[str, Any]:
    return _configmap_file(render(overlay), "ca-externalgrpc-config", "config.yaml")


def _server_deployment(overlay: str) -> dict[str, Any]:
    """The Deployment running the ca-externalgrpc container (the CA pod in the sidecar layout)."""
    found = [d for d in _deployments(overlay) if any(c["name"] == "ca-externalgrpc" for c in pod_containers(d))]
    assert len(found) == 1, f"{overlay}: expected one Deployment running ca-externalgrpc, found {len(found)}"
    return found[0]


def _flag(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def _port_number(ctr: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    assert port in named, f"{ctr['name']} has no port named {port!r}"
    return int(named[port])


# ---------------------------------------------------------------------------------------------------
# Rendering and schema validation


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_kustomization_renders_into_kube_system(overlay: str) -> None:
    docs = render(overlay)
    assert docs, f"{overlay} rendered nothing"
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == "kube-system", f"{doc['kind']} {doc['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_objects_are_valid_kubernetes_objects(overlay: str, version: str) -> None:
    checked = 0
    for doc in render(overlay):
        if doc["apiVersion"].startswith(CERT_MANAGER_GROUP + "/"):
            continue  # CRDs: no schema in kubernetes-validate; see test_cert_manager_resources_*
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{overlay}: {doc['kind']} {doc['metadata']['name']} invalid for {version}: {err.message}")
        checked += 1
    assert checked >= 5


# ---------------------------------------------------------------------------------------------------
# Pod security and resources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_non_root_read_only_without_capabilities(overlay: str) -> None:
    for deployment in _deployments(overlay):
        pod = deployment["spec"]["template"]["spec"]
        pod_ctx = pod.get("securityContext", {})
        assert pod_ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        for ctr in pod_containers(deployment):
            ctx = {**pod_ctx, **ctr.get("securityContext", {})}
            where = f"{overlay}: {deployment['metadata']['name']}/{ctr['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert isinstance(ctx.get("runAsUser"), int) and ctx["runAsUser"] > 0, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not ctx.get("capabilities", {}).get("add"), where
            resources = ctr.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_writes_only_to_a_tmp_volume(overlay: str) -> None:
    deployment = _server_deployment(overlay)
    tmp = mounted_volume(deployment, "ca-externalgrpc", "/tmp")
    assert "emptyDir" in tmp
    for mount in container(deployment, "ca-externalgrpc")["volumeMounts"]:
        if mount["mountPath"] != "/tmp":
            assert mount.get("readOnly") is True, mount


# ---------------------------------------------------------------------------------------------------
# The server container: image contract, config, probes


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_container_uses_the_image_entrypoint_with_the_mounted_config(overlay: str) -> None:
    deployment = _server_deployment(overlay)
    ctr = container(deployment, "ca-externalgrpc")
    assert "command" not in ctr, "the image's ENTRYPOINT (ca-externalgrpc) must stay in charge"
    assert ctr["args"][0] == "serve"
    config_path = _flag(ctr["args"], "config")
    assert config_path is not None and config_path.endswith("/config.yaml")
    config_volume = mounted_volume(deployment, "ca-externalgrpc", config_path.rsplit("/", 1)[0])
    assert (
        one(render(overlay), "ConfigMap", "ca-externalgrpc-config")["metadata"]["name"]
        == (config_volume["configMap"]["name"])
    )
    assert ctr["image"].startswith("ca-externalgrpc-server:")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_hit_the_servers_http_port_on_an_address_the_kubelet_can_reach(overlay: str) -> None:
    deployment = _server_deployment(overlay)
    ctr = container(deployment, "ca-externalgrpc")
    host, port = parse_address("http_listen", _server_config(overlay)["http_listen"])
    # The kubelet probes the pod IP, so a loopback-only probe listener would fail every probe.
    assert host in ("0.0.0.0", "::"), f"http_listen {host} is not reachable from the kubelet"
    paths = {}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        http = ctr[probe]["httpGet"]
        assert _port_number(ctr, http["port"]) == port, probe
        paths[probe] = http["path"]
    assert paths["livenessProbe"] == "/healthz"
    assert paths["readinessProbe"] == "/readyz"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_reads_credentials_from_a_secret_the_tree_does_not_ship(overlay: str) -> None:
    """`kubectl apply -k` must never overwrite the operator's real Secret with example values."""
    docs = render(overlay)
    ctr = container(_server_deployment(overlay), "ca-externalgrpc")
    names = [ref["secretRef"]["name"] for ref in ctr["envFrom"]]
    assert names == ["ca-externalgrpc-credentials"]
    assert not list(objects(docs, "Secret")), "a kustomize tree applied by default ships no Secret"
    example = KUBERNETES / _credentials_example(overlay)
    keys = [line.split("=", 1)[0] for line in example.read_text().splitlines() if line and not line.startswith("#")]
    assert keys, f"{example} must list the keys of the Secret to create"
    server_backends = _server_config(overlay)["backends"]
    assert all(b.get(b["type"]) == {} for b in server_backends), "credentials come only from the Secret"


def _credentials_example(overlay: str) -> str:
    """Where the keys of the Secret an overlay needs are listed."""
    return {"overlays/mtls-service": "server-mtls"}.get(overlay, overlay) + "/credentials.env.example"


# ---------------------------------------------------------------------------------------------------
# The cluster-autoscaler container


@pytest.mark.parametrize("overlay", WITH_CA)
def test_ca_runs_a_tested_release_with_the_externalgrpc_provider(overlay: str) -> None:
    deployment = one(render(overlay), "Deployment", "cluster-autoscaler")
    ctr = container(deployment, "cluster-autoscaler")
    image, _, tag = ctr["image"].rpartition(":")
    assert image == CA_IMAGE
    assert tag in TESTED_CA_TAGS
    args = ctr["args"]
    assert _flag(args, "cloud-provider") == "externalgrpc"
    assert _flag(args, "logging-format") == "json", "the same JSON log lines as the server's"
    cloud_config = _flag(args, "cloud-config")
    assert cloud_config is not None
    directory, key = cloud_config.rsplit("/", 1)
    configmap = mounted_volume(deployment, "cluster-autoscaler", directory)["configMap"]["name"]
    assert one(render(overlay), "ConfigMap", "cluster-autoscaler-cloud-config")["metadata"]["name"] == configmap
    assert key == "cloud-config"
    assert deployment["spec"]["replicas"] == 1


@pytest.mark.parametrize("overlay", WITH_CA)
def test_ca_service_account_is_bound_to_the_autoscaler_roles(overlay: str) -> None:
    docs = render(overlay)
    deployment = one(docs, "Deployment", "cluster-autoscaler")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    one(docs, "ServiceAccount", account)
    for binding_kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(docs, binding_kind, "cluster-autoscaler")
        assert binding["roleRef"]["kind"] == role_kind
        one(docs, role_kind, binding["roleRef"]["name"])
        assert {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"} in binding["subjects"]
    granted = {
        (group, resource, verb)
        for rule in one(docs, "ClusterRole", "cluster-autoscaler")["rules"]
        if not rule.get("resourceNames")
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # What the CA core cannot work without: watch and cordon/taint nodes, list pods, evict them.
    for needed in (
        ("", "nodes", "update"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "list"),
        ("coordination.k8s.io", "leases", "create"),
    ):
        assert needed in granted, needed


# ---------------------------------------------------------------------------------------------------
# Sidecar layout


@pytest.mark.parametrize("overlay", SIDECAR_OVERLAYS)
def test_sidecar_ca_dials_the_server_in_its_own_pod_over_loopback(overlay: str) -> None:
    cloud_config = _ca_cloud_config(overlay)
    server = _server_config(overlay)
    assert parse_address("address", cloud_config["address"]) == parse_address("listen", server["listen"])
    assert parse_address("listen", server["listen"])[0] in ("127.0.0.1", "::1", "localhost")
    assert "tls" not in server
    assert not cloud_config.get("cert"), "plaintext on loopback: the CA must not be given a client cert"
    assert _server_deployment(overlay)["metadata"]["name"] == "cluster-autoscaler"


@pytest.mark.parametrize("overlay", SIDECAR_OVERLAYS)
def test_sidecar_pod_is_scraped_on_the_servers_port_and_has_a_metrics_service(overlay: str) -> None:
    """The pod's scrape annotations and the ServiceMonitor's Service point at the server's /metrics."""
    docs = render(overlay)
    deployment = _server_deployment(overlay)
    ctr = container(deployment, "ca-externalgrpc")
    http_port = parse_address("http_listen", _server_config(overlay)["http_listen"])[1]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(http_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    service = one(docs, "Service", "ca-externalgrpc-metrics")
    assert service["metadata"]["labels"]["ca-externalgrpc/metrics"] == "true"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "server-metrics" and _port_number(ctr, port["targetPort"]) == http_port


@pytest.mark.parametrize(("overlay", "cloud"), [("overlays/scaleway", "scaleway"), ("overlays/bizfly", "bizfly")])
def test_cloud_overlay_configures_one_backend_of_its_cloud(overlay: str, cloud: str) -> None:
    backends = _server_config(overlay)["backends"]
    assert [b["type"] for b in backends] == [cloud]


# ---------------------------------------------------------------------------------------------------
# mTLS service layout


def _certificate_for_secret(docs: Any, secret_name: str) -> dict[str, Any]:
    found = [c for c in objects(docs, "Certificate") if c["spec"]["secretName"] == secret_name]
    assert len(found) == 1, f"expected one Certificate writing Secret {secret_name}"
    return found[0]


def test_mtls_service_ca_pod_has_no_sidecar() -> None:
    deployment = one(render("overlays/mtls-service"), "Deployment", "cluster-autoscaler")
    names = [c["name"] for c in pod_containers(deployment)]
    assert names == ["cluster-autoscaler"]
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {"cloud-config", "client-cert"}
    # Annotation-based scraping reads one port per pod: with no server here, the CA's.
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8085"


@pytest.mark.parametrize("overlay", ["overlays/mtls-service", "server-mtls"])
def test_mtls_server_metrics_are_scraped_from_its_pod_and_its_service(overlay: str) -> None:
    docs = render(overlay)
    server = one(docs, "Deployment", "ca-externalgrpc-server")
    ctr = container(server, "ca-externalgrpc")
    http_port = parse_address("http_listen", _server_config(overlay)["http_listen"])[1]
    assert server["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(http_port)
    service = one(docs, "Service", "ca-externalgrpc-server")
    assert service["metadata"]["labels"]["ca-externalgrpc/metrics"] == "true"
    metrics_port = next(p for p in service["spec"]["ports"] if p["name"] == "server-metrics")
    assert _port_number(ctr, metrics_port["targetPort"]) == http_port


@pytest.mark.parametrize("overlay", ["overlays/mtls-service", "server-mtls"])
def test_ca_address_names_the_service_and_a_dns_name_of_the_server_certificate(overlay: str) -> None:
    docs = render(overlay)
    host, port = parse_address("address", _ca_cloud_config(overlay)["address"])
    service = one(docs, "Service", "ca-externalgrpc-server")
    assert host.split(".")[:2] == [service["metadata"]["name"], service["metadata"]["namespace"]]
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["port"] == port
    server = one(docs, "Deployment", "ca-externalgrpc-server")
    tls_volume = mounted_volume(server, "ca-externalgrpc", "/etc/ca-externalgrpc/tls")
    certificate = _certificate_for_secret(docs, tls_volume["secret"]["secretName"])
    # The CA's Go client sets ServerName to the address host and checks the SAN, never the CN.
    assert host in certificate["spec"]["dnsNames"]
    assert "server auth" in certificate["spec"]["usages"]
    listen_port = parse_address("listen", _server_config(overlay)["listen"])[1]
    assert _port_number(container(server, "ca-externalgrpc"), grpc_port["targetPort"]) == listen_port


@pytest.mark.parametrize("overlay", ["overlays/mtls-service", "server-mtls"])
def test_server_requires_client_certificates_from_the_ca_that_issues_the_clients(overlay: str) -> None:
    docs = render(overlay)
    tls = _server_config(overlay)["tls"]
    assert {"cert", "key", "client_ca"} <= set(tls)
    server = one(docs, "Deployment", "ca-externalgrpc-server")
    for path in tls.values():
        directory, filename = path.rsplit("/", 1)
        secret = mounted_volume(server, "ca-externalgrpc", directory)["secret"]["secretName"]
        assert filename in ("tls.crt", "tls.key", "ca.crt"), path  # the keys cert-manager writes
        assert _certificate_for_secret(docs, secret)["spec"]["issuerRef"]["name"] == "ca-externalgrpc-ca"
    client = [c for c in objects(docs, "Certificate") if "client auth" in c["spec"].get("usages", [])]
    assert len(client) == 1 and client[0]["spec"]["issuerRef"]["name"] == "ca-externalgrpc-ca"


def test_mtls_service_ca_mounts_its_client_certificate_where_the_cloud_config_points() -> None:
    docs = render("overlays/mtls-service")
    cloud_config = _ca_cloud_config("overlays/mtls-service")
    assert cloud_config.get("cert") and cloud_config.get("key") and cloud_config.get("cacert")
    deployment = one(docs, "Deployment", "cluster-autoscaler")
    secrets = set()
    for key in ("cert", "key", "cacert"):
        directory, filename = cloud_config[key].rsplit("/", 1)
        assert filename in ("tls.crt", "tls.key", "ca.crt")
        secrets.add(mounted_volume(deployment, "cluster-autoscaler", directory)["secret"]["secretName"])
    assert len(secrets) == 1
    assert "client auth" in _certificate_for_secret(docs, secrets.pop())["spec"]["usages"]


@pytest.mark.parametrize("overlay", ["overlays/mtls-service", "server-mtls"])
def test_network_policy_lets_the_ca_reach_the_grpc_port(overlay: str) -> None:
    docs = render(overlay)
    policy = one(docs, "NetworkPolicy", "ca-externalgrpc-server")
    server = one(docs, "Deployment", "ca-externalgrpc-server")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
    )
    grpc_rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == 8086 for p in r.get("ports", []))]
    assert len(grpc_rules) == 1 and grpc_rules[0]["from"], "the gRPC port must not be open to every pod"
    allowed = grpc_rules[0]["from"][0]["podSelector"]["matchLabels"]
    if overlay == "overlays/mtls-service":
        ca_labels = one(docs, "Deployment", "cluster-autoscaler")["spec"]["template"]["metadata"]["labels"]
        assert allowed.items() <= ca_labels.items()


# ---------------------------------------------------------------------------------------------------
# cert-manager resources: no schema for CRDs in kubernetes-validate, so checked structurally here.

_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
#: KeyUsage values accepted by cert-manager.io/v1 (its API reference)
_USAGES = {
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
}
_ISSUER_TYPES = {"selfSigned", "ca", "acme", "vault", "venafi"}
_CERTIFICATE_FIELDS = {
    "secretName",
    "commonName",
    "dnsNames",
    "ipAddresses",
    "uris",
    "emailAddresses",
    "duration",
    "renewBefore",
    "usages",
    "privateKey",
    "issuerRef",
    "isCA",
    "subject",
    "secretTemplate",
}


def _check_issuer(issuer: dict[str, Any], secret_names: set[str]) -> None:
    spec = issuer["spec"]
    kinds = set(spec) & _ISSUER_TYPES
    assert len(kinds) == 1 and set(spec) == kinds, f"Issuer {issuer['metadata']['name']}: one issuer type"
    if "ca" in spec:
        assert spec["ca"]["secretName"] in secret_names, "a CA Issuer must sign with a Certificate's key pair"


def _check_certificate(cert: dict[str, Any], issuers: dict[str, dict[str, Any]]) -> None:
    name, spec = cert["metadata"]["name"], cert["spec"]
    assert set(spec) <= _CERTIFICATE_FIELDS, f"Certificate {name}: unknown fields {set(spec) - _CERTIFICATE_FIELDS}"
    assert re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", spec["secretName"]), name
    ref = spec["issuerRef"]
    assert ref.get("group", CERT_MANAGER_GROUP) == CERT_MANAGER_GROUP and ref.get("kind", "Issuer") == "Issuer"
    assert ref["name"] in issuers, f"Certificate {name}: Issuer {ref['name']} is not in the manifests"
    for field in ("duration", "renewBefore"):
        if field in spec:
            assert _GO_DURATION.match(spec[field]), f"Certificate {name}: {field} {spec[field]!r}"
    assert set(spec.get("usages", [])) <= _USAGES, f"Certificate {name}: {spec.get('usages')}"
    for dns in spec.get("dnsNames", []):
        assert _DNS_NAME.match(dns), f"Certificate {name}: {dns!r} is not a DNS name"
    key = spec.get("privateKey", {})
    assert key.get("algorithm", "RSA") in ("RSA", "ECDSA", "Ed25519")
    if key.get("algorithm") == "ECDSA":
        assert key.get("size", 256) in (256, 384, 521)
    assert key.get("rotationPolicy", "Never") in ("Never", "Always")
    assert spec.get("commonName") or spec.get("dnsNames"), f"Certificate {name} names no subject"
    if spec.get("isCA"):
        assert "selfSigned" in issuers[ref["name"]]["spec"], "the root must be self-signed"
    else:
        assert "ca" in issuers[ref["name"]]["spec"], "leaves must come from the private CA, not be self-signed"


@pytest.mark.parametrize("overlay", ["overlays/mtls-service", "server-mtls"])
def test_cert_manager_resources_are_well_formed_and_chain_to_one_private_root(overlay: str) -> None:
    docs = render(overlay)
    manager_docs = [d for d in docs if d["apiVersion"].startswith(CERT_MANAGER_GROUP + "/")]
    assert {d["apiVersion"] for d in manager_docs} == {"cert-manager.io/v1"}
    assert {d["kind"] for d in manager_docs} == {"Issuer", "Certificate"}
    issuers = {d["metadata"]["name"]: d for d in objects(docs, "Issuer")}
    certificates = list(objects(docs, "Certificate"))
    secret_names = {c["spec"]["secretName"] for c in certificates}
    assert len(secret_names) == len(certificates), "two Certificates write the same Secret"
    for issuer in issuers.values():
        _check_issuer(issuer, secret_names)
    for cert in certificates:
        _check_certificate(cert, issuers)
    assert sum(1 for c in certificates if c["spec"].get("isCA")) == 1


def test_structural_certificate_check_rejects_a_wrong_usage_and_a_dangling_issuer() -> None:
    """The hand-written cert-manager check is what stands in for a schema: make sure it can fail."""
    docs = render("server-mtls")
    issuers = {d["metadata"]["name"]: d for d in objects(docs, "Issuer")}
    cert = one(docs, "Certificate", "ca-externalgrpc-server")
    bad_usage = {**cert, "spec": {**cert["spec"], "usages": ["server-auth"]}}
    with pytest.raises(AssertionError):
        _check_certificate(bad_usage, issuers)
    dangling = {**cert, "spec": {**cert["spec"], "issuerRef": {"name": "nope", "kind": "Issuer"}}}
    with pytest.raises(AssertionError):
        _check_certificate(dangling, issuers)
