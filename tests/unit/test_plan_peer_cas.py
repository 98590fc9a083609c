"""``gwplan.Tunnel.peer_cas`` in the plan document: it round-trips, is left out for a PSK tunnel (so older
plans and their hashes are unchanged), and a malformed value is named by its path."""

from __future__ import annotations

import json

import pytest

import gwplan

CONN = {"t": {"remote": {"auth": "pubkey", "id": "t.example"}, "children": {}}}


def plan(peer_cas: tuple[str, ...] | None) -> gwplan.Plan:
    tunnel = gwplan.Tunnel("t", False, (), CONN, peer_cas=peer_cas)
    ca = gwplan.IkeCertificate("ca", gwplan.SecretRef("tls", "ca.crt"), ca=True)
    return gwplan.Plan(
        gateway=gwplan.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw"),
        type="ipsec",
        ipsec=gwplan.Ipsec(tunnels=(tunnel,), certificates=(ca,)),
    )


def test_peer_cas_round_trip_as_peerCas() -> None:
    p = plan(("ca",))
    assert gwplan.loads(gwplan.dumps(p)) == p
    assert json.loads(gwplan.dumps(p))["ipsec"]["tunnels"][0]["peerCas"] == ["ca"]


def test_a_tunnel_without_them_has_no_field_and_loads_as_none() -> None:
    doc = json.loads(gwplan.dumps(plan(None)))
    assert "peerCas" not in doc["ipsec"]["tunnels"][0]
    loaded = gwplan.loads(gwplan.dumps(plan(None)))
    assert loaded.ipsec is not None and loaded.ipsec.tunnels[0].peer_cas is None


@pytest.mark.parametrize(
    ("value", "message"), [("ca", "peerCas: expected list"), ([1], r"peerCas\[0\]: expected str")]
)
def test_a_malformed_value_is_named_by_path(value: object, message: str) -> None:
    doc = json.loads(gwplan.dumps(plan(("ca",))))
    del doc["hash"]
    doc["ipsec"]["tunnels"][0]["peerCas"] = value
    with pytest.raises(gwplan.PlanError, match=rf"ipsec\.tunnels\[0\]\.{message}"):
        gwplan.from_dict(doc)
