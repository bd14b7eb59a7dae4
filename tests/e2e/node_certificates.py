"""cert-manager's part for the mTLS layout on the real node: its CRDs, and the Secrets of the layout's
Certificates, issued as cert-manager's ``selfSigned`` and ``ca`` issuers issue them.

cert-manager's controller cannot be built here (its main packages are not on the Go module proxy, see
tests/support/nodeimages.py). Its CustomResourceDefinitions are cert-manager's own (v1.21.2), so the
API server checks deploy/kubernetes/server-mtls/certificates.yaml against cert-manager's real schema when
``kubectl apply -k`` sends it; ``issue`` then does what cert-manager's controller would do for those
objects, from what they say and nothing else:

- a Certificate whose Issuer is ``selfSigned`` gets a certificate signed by its own key;
- one whose Issuer is ``ca`` gets a certificate signed by the CA in the Issuer's ``secretName``;
- each with the Certificate's ``commonName``, ``dnsNames``, ``isCA``, ``usages`` (key usage and extended
  key usage as cert-manager maps them), ``duration`` and an ECDSA P-256 or RSA key as ``privateKey``
  asks, written as cert-manager writes it: a ``kubernetes.io/tls`` Secret with ``tls.crt``, ``tls.key``
  and ``ca.crt`` (the issuing CA; a self-signed certificate's own), annotated with the Certificate's
  name, and the Certificate's ``Ready`` condition set.

Any other issuer kind or field the layout does not use is refused, so a change to the layout that this
stand-in cannot honour fails loudly instead of being approximated.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import re
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s

from tests.support.nodeimages import CERT_MANAGER_CRDS, cert_manager_crds

GROUP, VERSION = "cert-manager.io", "v1"
#: the Certificate fields the stand-in reads (anything else in a spec is refused)
KNOWN_FIELDS = {
    "secretName", "commonName", "dnsNames", "ipAddresses", "isCA", "usages", "duration", "renewBefore",
    "privateKey", "issuerRef",
}  # fmt: skip
KEY_USAGES = {"digital signature", "key encipherment", "cert sign", "crl sign"}
EXTENDED_USAGES = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}


def install_crds(kubectl: Any) -> None:
    """cert-manager's CRDs for Issuer and Certificate, established before anything uses them."""
    for name in CERT_MANAGER_CRDS:
        kubectl("apply", "--server-side", "-f", str(cert_manager_crds() / name))
    for name in ("issuers.cert-manager.io", "certificates.cert-manager.io"):
        kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def issue(api: k8s.ApiClient, namespace: str) -> list[str]:
    """Issue every Certificate of ``namespace`` whose Secret is missing (CAs first); their names."""
    custom = k8s.CustomObjectsApi(api)
    core = k8s.CoreV1Api(api)
    issuers = {i["metadata"]["name"]: i for i in _items(custom, namespace, "issuers")}
    certificates = _items(custom, namespace, "certificates")
    # Certificates signed by a CA Secret need that Secret: self-signed ones (the CA) come first.
    ordered = sorted(certificates, key=lambda c: "selfSigned" not in issuers[c["spec"]["issuerRef"]["name"]]["spec"])
    issued = []
    for certificate in ordered:
        spec = certificate["spec"]
        unknown = set(spec) - KNOWN_FIELDS
        if unknown:
            raise AssertionError(f"Certificate {certificate['metadata']['name']}: the stand-in cannot honour {unknown}")
        issuer = issuers[spec["issuerRef"]["name"]]["spec"]
        key = _private_key(spec.get("privateKey") or {})
        if "selfSigned" in issuer:
            signer_key, signer_cert = key, None
        elif "ca" in issuer:
            secret = core.read_namespaced_secret(issuer["ca"]["secretName"], namespace)
            data = secret.data or {}
            signer_key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), password=None)
            signer_cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        else:
            raise AssertionError(f"Issuer kind {sorted(issuer)} is not one the stand-in issues for")
        cert = _certificate(spec, key, signer_key, signer_cert)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        ca_pem = pem if signer_cert is None else signer_cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        name = certificate["metadata"]["name"]
        body: Any = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": spec["secretName"],
                "annotations": {
                    "cert-manager.io/certificate-name": name,
                    "cert-manager.io/issuer-name": spec["issuerRef"]["name"],
                    "cert-manager.io/issuer-kind": spec["issuerRef"].get("kind", "Issuer"),
                    "cert-manager.io/common-name": spec.get("commonName", ""),
                },
            },
            "data": {
                k: base64.b64encode(v).decode() for k, v in (("tls.crt", pem), ("tls.key", key_pem), ("ca.crt", ca_pem))
            },
        }
        core.create_namespaced_secret(namespace, body)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Ready",
                        "message": "issued",
                        "lastTransitionTime": now,
                    }
                ],
                "notAfter": cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        }
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "certificates", name, status)
        issued.append(name)
    return issued


def _items(custom: k8s.CustomObjectsApi, namespace: str, plural: str) -> list[dict[str, Any]]:
    found: Any = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    return list(found["items"])


def _private_key(spec: dict[str, Any]) -> Any:
    algorithm = spec.get("algorithm", "RSA")
    if algorithm == "ECDSA":
        curves = {256: ec.SECP256R1(), 384: ec.SECP384R1(), 521: ec.SECP521R1()}
        return ec.generate_private_key(curves[int(spec.get("size", 256))])
    if algorithm == "RSA":
        return rsa.generate_private_key(public_exponent=65537, key_size=int(spec.get("size", 2048)))
    raise AssertionError(f"privateKey.algorithm {algorithm} is not one the stand-in issues")


def duration_of(text: str) -> dt.timedelta:
    """A Go duration as cert-manager reads ``duration`` (hours, minutes, seconds)."""
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", text):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    return dt.timedelta(seconds=total)


def _certificate(
    spec: dict[str, Any], key: Any, signer_key: Any, signer_cert: x509.Certificate | None
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec["commonName"])] if spec.get("commonName") else [])
    now = dt.datetime.now(dt.UTC)
    usages = set(spec.get("usages") or ["digital signature", "key encipherment"])
    unknown = usages - KEY_USAGES - set(EXTENDED_USAGES)
    if unknown:
        raise AssertionError(f"usages {unknown} are not ones the stand-in issues")
    is_ca = bool(spec.get("isCA"))
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if signer_cert is None else signer_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + duration_of(spec.get("duration", "2160h")))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature="digital signature" in usages,
                content_commitment=False,
                key_encipherment="key encipherment" in usages,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca or "cert sign" in usages,
                crl_sign="crl sign" in usages,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    extended = [EXTENDED_USAGES[u] for u in sorted(usages) if u in EXTENDED_USAGES]
    if extended:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended), critical=False)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in spec.get("dnsNames") or []]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in spec.get("ipAddresses") or []]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer_key, hashes.SHA256())


def certificate_names(path: Path) -> list[str]:
    """The Certificates a layout's file declares (for the scenario's checks)."""
    return [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Certificate"]
