"""The optional certificate/private-key references added to gwplan.Ipsec for pubkey auth: they
round-trip through the canonical JSON, default to empty, and old documents without them still load."""

from __future__ import annotations

import json

import pytest

import gwplan


def plan(**ipsec: object) -> gwplan.Plan:
    return gwplan.Plan(
        gateway=gwplan.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw"),
        type="ipsec",
        ipsec=gwplan.Ipsec(**ipsec),  # type: ignore[arg-type]
    )


def test_certificates_and_keys_round_trip() -> None:
    p = plan(
        certificates=(
            gwplan.IkeCertificate("gateway", gwplan.SecretRef("tls", "tls.crt")),
            gwplan.IkeCertificate("ca", gwplan.SecretRef("tls", "ca.crt"), ca=True),
        ),
        private_keys=(gwplan.IkePrivateKey("gateway", gwplan.SecretRef("tls", "tls.key")),),
    )
    assert gwplan.loads(gwplan.dumps(p)) == p
    doc = json.loads(gwplan.dumps(p))
    assert doc["ipsec"]["certificates"][1] == {
        "ca": True,
        "id": "ca",
        "ref": {"key": "ca.crt", "name": "tls"},
    }


def test_documents_without_the_new_fields_still_load() -> None:
    doc = json.loads(gwplan.dumps(plan()))
    del doc["ipsec"]["certificates"], doc["ipsec"]["privateKeys"], doc["hash"]
    loaded = gwplan.from_dict(doc)
    assert loaded.ipsec is not None and loaded.ipsec.certificates == () and loaded.ipsec.private_keys == ()


def test_a_malformed_certificate_is_named_by_path() -> None:
    doc = json.loads(
        gwplan.dumps(plan(certificates=(gwplan.IkeCertificate("c", gwplan.SecretRef("a", "b")),)))
    )
    del doc["hash"]
    doc["ipsec"]["certificates"][0]["ca"] = "yes"
    with pytest.raises(gwplan.PlanError, match=r"ipsec\.certificates\[0\]\.ca: expected bool"):
        gwplan.from_dict(doc)
