"""A throwaway PKI for TLS and mTLS tests: a CA, a server and a client certificate, and a stranger.

The server certificate carries DNS and IP SANs for every host given, because the CA's Go client (and
grpcio) match the SAN, never the CN (docs/reference/protocol.md, "Cloud-config and TLS"). The "other" CA and
its client certificate stand for a client the server must refuse.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path
    other_client_cert: Path
    other_client_key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
    )


def new_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA: its key and certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(common_name), _name(common_name), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def new_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    usage: x509.ObjectIdentifier,
    hosts: Sequence[str] = (),
    organization: str | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by the CA for ``usage``, with ``hosts`` as SANs (else the common name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(_name(common_name, organization), ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    if not names:
        names.append(x509.DNSName(common_name))
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1")) -> Pki:
    """Write PEM files into ``directory`` and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = new_ca("ca-externalgrpc test CA")
    server_key, server_cert = new_leaf(
        ca_key, ca_cert, "ca-externalgrpc-server", ExtendedKeyUsageOID.SERVER_AUTH, hosts
    )
    client_key, client_cert = new_leaf(
        ca_key, ca_cert, "cluster-autoscaler-grpc-client", ExtendedKeyUsageOID.CLIENT_AUTH
    )
    other_ca_key, other_ca_cert = new_ca("unrelated test CA")
    other_key, other_cert = new_leaf(other_ca_key, other_ca_cert, "stranger", ExtendedKeyUsageOID.CLIENT_AUTH)
    paths = Pki(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        other_ca_cert=directory / "other-ca.crt",
        other_client_cert=directory / "other-client.crt",
        other_client_key=directory / "other-client.key",
    )
    write_cert(ca_cert, paths.ca_cert)
    write_cert(server_cert, paths.server_cert)
    write_key(server_key, paths.server_key)
    write_cert(client_cert, paths.client_cert)
    write_key(client_key, paths.client_key)
    write_cert(other_ca_cert, paths.other_ca_cert)
    write_cert(other_cert, paths.other_client_cert)
    write_key(other_key, paths.other_client_key)
    return paths
