"""A throwaway CA and server certificate made at start, and the admin kubeconfig (file I/O only here)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Certs:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    sans: tuple[str, ...]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_certs(extra_sans: Sequence[str] = (), now: datetime.datetime | None = None) -> Certs:
    """CA + server certificate for 127.0.0.1, localhost, the in-cluster names and ``extra_sans``
    (IP addresses or DNS names)."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeapi-emulator-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    sans: list[str] = []
    for s in ("127.0.0.1", *DEFAULT_DNS, *extra_sans):
        if s in sans:
            continue
        sans.append(s)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(s)))
        except ValueError:
            names.append(x509.DNSName(s))
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Certs(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        sans=tuple(sans),
    )


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def server_context(certs: Certs, workdir: Path) -> ssl.SSLContext:
    """The server's SSL context (the key is written 0600 into ``workdir`` because ssl loads from files)."""
    cert_file, key_file = workdir / "server.crt", workdir / "server.key"
    _write_private(cert_file, certs.cert_pem + certs.ca_pem)
    _write_private(key_file, certs.key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def kubeconfig(
    server: str, token: str, ca_pem: bytes | None, user: str = "admin", namespace: str = "default"
) -> str:
    cluster: dict[str, object] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubeapi-emulator", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": user, "context": {"cluster": "kubeapi-emulator", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_kubeconfig(path: Path, text: str) -> None:
    """0600: the file holds a bearer token."""
    _write_private(path, text.encode())
