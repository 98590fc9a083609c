"""Certificates and private keys in the IPsec agent's pure plan diff."""

from __future__ import annotations

import pytest

from agent.ipsec.plan import Loaded, PlanRejected, desired, diff
from gwplan import GatewayRef, IkeCertificate, IkePrivateKey, Ipsec, Plan, SecretRef

GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw")
TLS = "gw-tls"


def plan(*, certs: tuple[IkeCertificate, ...] = (), keys: tuple[IkePrivateKey, ...] = ()) -> Plan:
    return Plan(gateway=GW, type="ipsec", ipsec=Ipsec(certificates=certs, private_keys=keys))


CERT = IkeCertificate("gateway", SecretRef(TLS, "tls.crt"))
CA = IkeCertificate("ca", SecretRef(TLS, "ca.crt"), ca=True)
KEY = IkePrivateKey("gateway", SecretRef(TLS, "tls.key"))


def test_certificate_and_key_of_the_same_id_do_not_collide() -> None:
    want = desired(plan(certs=(CERT, CA), keys=(KEY,)))
    assert set(want.creds) == {"cert/gateway", "cert/ca", "key/gateway"}


def test_a_duplicate_certificate_id_names_the_field() -> None:
    with pytest.raises(PlanRejected, match=r"ipsec.certificates\[1\].id: 'gateway' is used twice"):
        desired(plan(certs=(CERT, CERT)))


@pytest.mark.parametrize(
    ("loaded", "versions", "expected"),
    [
        pytest.param(
            {}, {"cert/gateway": "v1", "key/gateway": "v1"}, ("cert/gateway", "key/gateway"), id="fresh"
        ),
        pytest.param(
            {"cert/gateway": "v1", "key/gateway": "v1"},
            {"cert/gateway": "v1", "key/gateway": "v1"},
            (),
            id="unchanged",
        ),
        pytest.param(
            {"cert/gateway": "v1", "key/gateway": "v1"},
            {"cert/gateway": "v2", "key/gateway": "v2"},
            ("cert/gateway", "key/gateway"),
            id="renewed",
        ),
        pytest.param({}, {"key/gateway": "v1"}, ("key/gateway",), id="unreadable-cert-left-alone"),
    ],
)
def test_creds_load_when_their_secret_version_changes(
    loaded: dict[str, str], versions: dict[str, str], expected: tuple[str, ...]
) -> None:
    want = desired(plan(certs=(CERT,), keys=(KEY,)))
    changes = diff(Loaded(creds=loaded), want, {}, versions)
    assert changes.load_creds == expected
    assert changes.empty is (not expected)
