"""A minimal real Kubernetes control plane: etcd, kube-apiserver and kube-scheduler on loopback.

There is no kubelet, no controller-manager and no container runtime: the node agent plays the parts of
those that the cluster-autoscaler depends on (Node objects, their readiness, pod phases). The API server
authenticates clients by certificates signed by a CA generated for the run and authorizes them by RBAC,
as a real cluster does: the admin certificate is in system:masters, and ``user_kubeconfig`` mints a
certificate for any other user, who can do only what Roles bound to it allow. Everything (certificates,
service-account key, etcd data) lives in the run's work folder. Admission plugins that need a
controller-manager (ServiceAccount tokens) are disabled, unless the plane is started for a real node
(``NodeAccess``, tests/e2e/node_cluster.py), which runs kube-controller-manager beside it.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from devstack.certs import new_ca, new_leaf, write_cert, write_key
from tests.e2e.processes import ManagedProcess, ProcessFailed, free_port

START_ATTEMPTS = 3  # a free port can be taken by another program between choosing and binding it
# With ``audit=True``: one audit event per request of any user but the API server's own, at Metadata level
# (who, verb, object; no bodies), written when the answer is complete.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "users": ["system:apiserver"]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]},
        {"level": "Metadata"},
    ],
}


@dataclass(frozen=True)
class ControlPlanePrograms:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path


@dataclass(frozen=True)
class NodeAccess:
    """What a control plane with a real node (tests/e2e/node.py) needs besides the defaults: the address
    its pods reach the API server at (advertised as the ``kubernetes`` Service's endpoint), and the names
    and addresses its serving certificate must carry for them. With it the ServiceAccount admission
    plugin stays on: pods get their projected token, issued through the TokenRequest API."""

    advertise_address: str
    serving_hosts: tuple[str, ...]
    #: the Unix socket of an HTTP CONNECT proxy into the node (tests/e2e/node_host.py): the API server's
    #: egress to the cluster (kubelets, pods), for ``kubectl logs``, ``exec`` and the proxy subresources,
    #: as konnectivity carries it where a control plane cannot route to its nodes. It authenticates to
    #: the kubelet with the admin's client certificate.
    egress_proxy: str = ""


@dataclass(frozen=True)
class ClusterPki:
    ca_key: Path
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_pub: Path


def make_cluster_pki(directory: Path, serving_hosts: tuple[str, ...] = ()) -> ClusterPki:
    """A cluster CA, the API server's serving certificate (for loopback and ``serving_hosts``) and an admin
    client certificate (system:masters)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = new_ca("e2e cluster CA")
    serving_key, serving_cert = new_leaf(
        ca_key, ca_cert, "kube-apiserver", ExtendedKeyUsageOID.SERVER_AUTH, ("localhost", "127.0.0.1", *serving_hosts)
    )
    # system:masters: the group kube-apiserver grants everything, so the admin needs no RBAC objects.
    admin_key, admin_cert = new_leaf(
        ca_key, ca_cert, "e2e-admin", ExtendedKeyUsageOID.CLIENT_AUTH, organization="system:masters"
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    pki = ClusterPki(
        ca_key=directory / "ca.key",
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
    )
    write_cert(ca_cert, pki.ca_cert)
    write_key(ca_key, pki.ca_key)
    write_cert(serving_cert, pki.serving_cert)
    write_key(serving_key, pki.serving_key)
    write_cert(admin_cert, pki.admin_cert)
    write_key(admin_key, pki.admin_key)
    write_key(sa_key, pki.service_account_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def write_kubeconfig(
    path: Path, server: str, pki: ClusterPki, cert: Path | None = None, key: Path | None = None
) -> Path:
    """A kubeconfig for the admin, or for the user of the client certificate ``cert``/``key``."""
    user = {"client-certificate": str(cert or pki.admin_cert), "client-key": str(key or pki.admin_key)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler, started in that order, stopped in reverse."""

    def __init__(
        self,
        programs: ControlPlanePrograms,
        workdir: Path,
        scheduler: bool = True,
        audit: bool | Mapping[str, Any] = False,
        nodes: NodeAccess | None = None,
    ) -> None:
        self.programs = programs
        self.nodes = nodes
        self.with_scheduler = scheduler
        # The audit log: which requests each user made (``audit_events``), e.g. to count a client's reads.
        # ``audit`` is True (AUDIT_POLICY) or an audit policy of the scenario's own.
        self.audit_policy: Mapping[str, Any] | None = (
            (audit if isinstance(audit, Mapping) else AUDIT_POLICY) if audit else None
        )
        self.audit_log: Path | None = workdir / "logs" / "audit.jsonl" if audit else None
        self.workdir = workdir
        self.pki = make_cluster_pki(workdir / "pki", nodes.serving_hosts if nodes else ())
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.scheduler: ManagedProcess | None = None
        self.server_url = ""
        self._apiserver_log: Path | None = None
        self.kubeconfig = workdir / "kubeconfig.yaml"

    def start(self) -> ControlPlane:
        try:
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            write_kubeconfig(self.kubeconfig, self.server_url, self.pki)
            if self.with_scheduler:
                self._start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> str:
        last: ProcessFailed | None = None
        for attempt in range(START_ATTEMPTS):
            client, peer = free_port(), free_port()
            url = f"http://127.0.0.1:{client}"
            self.etcd = ManagedProcess(
                "etcd",
                [
                    str(self.programs.etcd),
                    "--name=e2e",
                    f"--data-dir={self.workdir / 'etcd-data'}",
                    f"--listen-client-urls={url}",
                    f"--advertise-client-urls={url}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                    "--log-level=warn",
                    # A test cluster lives minutes: no need to fsync every write on a busy shared disk.
                    "--unsafe-no-fsync",
                ],
                self.workdir / "logs" / f"etcd-{attempt}.log",
            ).start()
            try:
                self.etcd.wait_until(lambda url=url: _http_ok(f"{url}/health"), 30, "healthy")  # type: ignore[misc]
                return url
            except ProcessFailed as exc:
                last = exc
                self.etcd.stop()
        raise ProcessFailed(f"etcd did not start in {START_ATTEMPTS} attempts: {last}")

    def _start_apiserver(self, etcd_url: str) -> None:
        pki = self.pki
        last: ProcessFailed | None = None
        for attempt in range(START_ATTEMPTS):
            port = free_port()
            self.server_url = f"https://127.0.0.1:{port}"
            self.apiserver = ManagedProcess(
                "kube-apiserver",
                [
                    str(self.programs.kube_apiserver),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    f"--advertise-address={self.nodes.advertise_address if self.nodes else '127.0.0.1'}",
                    f"--secure-port={port}",
                    f"--tls-cert-file={pki.serving_cert}",
                    f"--tls-private-key-file={pki.serving_key}",
                    f"--client-ca-file={pki.ca_cert}",
                    "--authorization-mode=RBAC",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={pki.service_account_pub}",
                    f"--service-account-signing-key-file={pki.service_account_key}",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    *([] if self.nodes else ["--disable-admission-plugins=ServiceAccount"]),
                    f"--cert-dir={self.workdir / 'apiserver-certs'}",
                    "--v=1",
                    *self._audit_flags(),
                    *self._egress_flags(),
                ],
                self.workdir / "logs" / f"kube-apiserver-{attempt}.log",
            ).start()
            try:
                self.apiserver.wait_until(lambda: self._https_ok("/readyz"), 90, "ready")
                self._apiserver_log = self.workdir / "logs" / f"kube-apiserver-{attempt}.log"
                return
            except ProcessFailed as exc:
                last = exc
                self.apiserver.stop()
        raise ProcessFailed(f"kube-apiserver did not start in {START_ATTEMPTS} attempts: {last}")

    def restart_apiserver(self, down: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM), wait ``down`` seconds, start it again on the same address with the
        same flags (its log goes on in the same file); returns once it is ready. Clients keep their
        kubeconfig: they see connections refused, then the same server back."""
        assert self.apiserver is not None and self._apiserver_log is not None
        argv = self.apiserver.argv
        self.apiserver.stop()
        time.sleep(down)
        self.apiserver = ManagedProcess("kube-apiserver", argv, self._apiserver_log).start()
        self.apiserver.wait_until(lambda: self._https_ok("/readyz"), 90, "ready again")

    def _audit_flags(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(dict(self.audit_policy or AUDIT_POLICY)))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        # The log backend writes each event before the answer is sent ("blocking"), so a test that reads
        # the file after a request returned finds it there.
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-mode=blocking"]

    def _egress_flags(self) -> list[str]:
        if self.nodes is None or not self.nodes.egress_proxy:
            return []
        config = self.workdir / "egress-selector.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.k8s.io/v1beta1",
                    "kind": "EgressSelectorConfiguration",
                    "egressSelections": [
                        {
                            "name": "cluster",
                            "connection": {
                                "proxyProtocol": "HTTPConnect",
                                "transport": {"uds": {"udsName": self.nodes.egress_proxy}},
                            },
                        }
                    ],
                }
            )
        )
        return [
            f"--egress-selector-config-file={config}",
            # The node's name resolves nowhere; its address is what the proxy connects to.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={self.pki.admin_cert}",
            f"--kubelet-client-key={self.pki.admin_key}",
        ]

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The audit events so far (``audit=True``), of ``user`` only when given."""
        if self.audit_log is None:
            raise RuntimeError("this control plane was started without audit=True")
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        return [e for e in events if user is None or e.get("user", {}).get("username") == user]

    def _start_scheduler(self) -> None:
        self.scheduler = ManagedProcess(
            "kube-scheduler",
            [
                str(self.programs.kube_scheduler),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--v=2",
            ],
            self.workdir / "logs" / "kube-scheduler.log",
        ).start()
        # The scheduler serves nothing here; give it a moment to fail on a bad flag before going on.
        self.scheduler.wait_until(lambda: True, 5, "started")

    def user_kubeconfig(self, user: str, group: str | None = None) -> Path:
        """A kubeconfig for a new client certificate of ``user`` (in ``group``): what RBAC grants it, no more."""
        directory = self.workdir / "users"
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = serialization.load_pem_private_key(self.pki.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.pki.ca_cert.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key, cert = new_leaf(ca_key, ca_cert, user, ExtendedKeyUsageOID.CLIENT_AUTH, organization=group)
        cert_path, key_path = directory / f"{user}.crt", directory / f"{user}.key"
        write_cert(cert, cert_path)
        write_key(key, key_path)
        return write_kubeconfig(directory / f"{user}.kubeconfig", self.server_url, self.pki, cert_path, key_path)

    def _https_ok(self, path: str) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        with urllib.request.urlopen(self.server_url + path, context=context, timeout=5) as answer:
            return bool(answer.status == 200)

    def check_running(self) -> None:
        for process in (self.etcd, self.apiserver, self.scheduler):
            if process is not None:
                process.check_running()

    def stop(self) -> None:
        for process in (self.scheduler, self.apiserver, self.etcd):
            if process is not None:
                process.stop()


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return bool(answer.status == 200)
