"""lab.controlplane's pure decisions: the flags, the kubeconfigs, the certificates."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.controlplane import flags, pki
from lab.controlplane.flags import Layout, NodeTimings, Ports

LAYOUT = Layout(Path("/run/cp"), Path("/dev/shm/cp/data"))
PORTS = Ports(etcd_client=2379, etcd_peer=2380, apiserver=6443, controller_manager=10257)


def as_dict(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        assert key not in out, f"{key} twice"
        out[key] = value
    return out


def test_apiserver_flags() -> None:
    a = as_dict(flags.apiserver_argv(Path("/bin/kube-apiserver"), LAYOUT, PORTS))
    assert a["--etcd-servers"] == "http://127.0.0.1:2379"
    assert (a["--bind-address"], a["--secure-port"]) == ("127.0.0.1", "6443")
    assert a["--authorization-mode"] == "Node,RBAC"
    plugins = a["--enable-admission-plugins"].split(",")
    assert len(plugins) == len(set(plugins))
    for p in (
        "PodSecurity",
        "OwnerReferencesPermissionEnforcement",
        "NodeRestriction",
        "ServiceAccount",
        "MutatingAdmissionWebhook",
        "ValidatingAdmissionWebhook",
        "ValidatingAdmissionPolicy",
    ):
        assert p in plugins
    assert a["--service-account-issuer"] == a["--api-audiences"] == flags.ISSUER
    assert a["--service-account-key-file"] == str(LAYOUT.sa_pub)
    assert a["--service-account-signing-key-file"] == str(LAYOUT.sa_key)
    assert a["--client-ca-file"] == str(LAYOUT.ca_crt)
    assert a["--service-cluster-ip-range"] == flags.SERVICE_CIDR


def test_controller_manager_flags() -> None:
    timings = NodeTimings(monitor_period=0.5, monitor_grace=3.25, startup_grace=10, eviction_rate=0.5)
    a = as_dict(flags.controller_manager_argv(Path("/bin/kcm"), LAYOUT, PORTS, timings))
    controllers = a["--controllers"].split(",")
    for c in (
        "deployment-controller",
        "replicaset-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "node-lifecycle-controller",
        "taint-eviction-controller",
        "pod-garbage-collector-controller",
        "serviceaccount-token-controller",
        "serviceaccount-controller",
        "root-ca-certificate-publisher-controller",
    ):
        assert c in controllers
    assert "*" not in controllers  # nothing runs that is not listed
    assert a["--use-service-account-credentials"] == "true"
    assert a["--service-account-private-key-file"] == str(LAYOUT.sa_key)
    assert a["--root-ca-file"] == str(LAYOUT.ca_crt)
    assert a["--node-monitor-period"] == "500ms"
    assert a["--node-monitor-grace-period"] == "3250ms"
    assert a["--node-startup-grace-period"] == "10000ms"
    assert a["--node-eviction-rate"] == "0.5"
    assert a["--kubeconfig"] == a["--authentication-kubeconfig"] == a["--authorization-kubeconfig"]
    assert a["--secure-port"] == "10257" and a["--bind-address"] == "127.0.0.1"


def test_the_default_eviction_rate_is_not_one() -> None:
    """At exactly 1 node/s, leaving "master disruption mode" never restores NoExecute tainting
    (NodeTimings.eviction_rate, docs/controlplane.md)."""
    a = as_dict(flags.controller_manager_argv(Path("/bin/kcm"), LAYOUT, PORTS, NodeTimings()))
    assert float(a["--node-eviction-rate"]) not in (1.0, 0.0)


def test_etcd_flags_keep_every_port_on_loopback() -> None:
    a = as_dict(flags.etcd_argv(Path("/bin/etcd"), LAYOUT, PORTS))
    assert a["--data-dir"] == str(LAYOUT.data_dir)
    for key in (
        "--listen-client-urls",
        "--advertise-client-urls",
        "--listen-peer-urls",
        "--initial-advertise-peer-urls",
    ):
        assert a[key].startswith("http://127.0.0.1:")
    assert a["--initial-cluster"] == "lab=http://127.0.0.1:2380"


def test_kubeconfig_needs_exactly_one_credential() -> None:
    with pytest.raises(ValueError):
        flags.kubeconfig_doc("https://x", b"ca", "u")
    with pytest.raises(ValueError):
        flags.kubeconfig_doc("https://x", b"ca", "u", token="t", cert_pem=b"c", key_pem=b"k")  # noqa: S106
    doc = flags.kubeconfig_doc("https://x", b"ca", "u", token="t", namespace="ns")  # noqa: S106
    assert doc["users"][0]["user"] == {"token": "t"}
    assert doc["contexts"][0]["context"]["namespace"] == "ns"
    doc = flags.kubeconfig_doc("https://x", b"ca", "u", cert_pem=b"c", key_pem=b"k")
    assert base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]) == b"c"
    assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]) == b"ca"


def test_address_in_use() -> None:
    assert flags.address_in_use(
        '{"level":"fatal","msg":"listen tcp 127.0.0.1:2380: bind: address already in use"}'
    )
    assert flags.address_in_use(
        "E1 failed to listen on 127.0.0.1:6443: listen tcp: bind: address already in use"
    )
    assert not flags.address_in_use("open /x: permission denied")


def test_safe_name() -> None:
    assert flags.safe_name("system:node:n1") == "system_node_n1"


def test_certificates() -> None:
    ca = pki.CA.make()
    node = pki.CA.issue(ca, "system:node:n1", organizations=("system:nodes",))
    cert = x509.load_pem_x509_certificate(node.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    serving = ca.issue("kube-apiserver", sans=pki.apiserver_sans(flags.SERVICE_IP), server=True)
    sans = x509.load_pem_x509_certificate(serving.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    text = {str(v) for v in sans.value.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", "10.96.0.1"} <= text
    assert "kubernetes.default.svc" in sans.value.get_values_for_type(x509.DNSName)
