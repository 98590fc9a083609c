"""The control plane's certificates and keys, made at start (no file I/O here but ``write_private``).

One cluster CA signs the apiserver's serving certificate and every client certificate (admin, the
controller manager, nodes); the ServiceAccount signing key is a separate key pair. EC P-256 throughout,
as lab.kubeapi.tls makes its CA (whose ``make_certs`` is one fixed CA plus one server certificate, with
no client certificates: the pieces it shares with this module are its SAN list and its key choice).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.kubeapi.tls import DEFAULT_DNS

VALIDITY = datetime.timedelta(days=365)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CA:
    """The cluster CA: its certificate and key (kept to mint node and user certificates later)."""

    cert_pem: bytes
    key_pem: bytes

    @staticmethod
    def make(name: str = "lab-controlplane-ca", now: datetime.datetime | None = None) -> CA:
        now = now or datetime.datetime.now(datetime.UTC)
        key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return CA(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        sans: Sequence[str] = (),
        server: bool = False,
        now: datetime.datetime | None = None,
    ) -> KeyPair:
        """A certificate for ``common_name`` (Kubernetes' user name) in ``organizations`` (its groups);
        a serving certificate for ``sans`` (IP addresses or DNS names) when ``server``."""
        now = now or datetime.datetime.now(datetime.UTC)
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        key = _key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(_names(sans)), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _names(sans: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for s in sans:
        if s in seen:
            continue
        seen.add(s)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(s)))
        except ValueError:
            names.append(x509.DNSName(s))
    return names


def apiserver_sans(service_ip: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """127.0.0.1, the in-cluster names (as the emulator's certificate has them), the Service IP."""
    return ("127.0.0.1", *DEFAULT_DNS, service_ip, *extra)


def service_account_keys() -> KeyPair:
    """The ServiceAccount token signing key (ES256) and its public key (``cert_pem`` holds the public
    key in PEM: kube-apiserver's --service-account-key-file takes either)."""
    key = _key()
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(pub, _key_pem(key))


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 (keys, kubeconfigs with credentials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
