"""The controller's render and the status-agent agree on which CA vouches for which peer (pure).

A pubkey peer's tunnel names the CA its certificate must chain to (``gwplan.Tunnel.peer_cas``); the agent
refuses a plan whose certificate tunnel names none, so everything the controller renders must pass the
agent's own check. The live proof is tests/integration/test_agent_ipsec_ca.py."""

from __future__ import annotations

import json

import gwplan
from agent.ipsec.plan import desired
from controller.plan.render import GATEWAY_CA, RenderOptions, render_documents
from controller.plan.swanctl import render_swanctl
from tests.examples import edit, example_docs

OPTS = RenderOptions(internal_source_cidrs=("192.0.2.64/26",))
IPSEC = example_docs("ipsec.yaml")


def pubkey_documents() -> list[dict[str, object]]:
    documents = edit(IPSEC, 0, ["spec", "ipsec", "certificateSecretRef"], {"name": "acme-tls"})
    documents = edit(documents, 2, ["spec", "type"], "roadWarrior")
    del documents[2]["spec"]["endpoint"]
    documents[2]["spec"]["ipsec"]["auth"] = "pubkey"
    return documents


def test_a_pubkey_peer_is_pinned_to_the_gateways_ca_and_a_psk_peer_to_none() -> None:
    plan = render_documents(pubkey_documents(), OPTS)
    assert plan.ipsec is not None
    psk, pubkey = plan.ipsec.tunnels
    assert (psk.name, psk.peer_cas) == ("s1", None)
    assert (pubkey.name, pubkey.peer_cas) == ("s2", (GATEWAY_CA,))
    ca = [c for c in plan.ipsec.certificates if c.id == GATEWAY_CA]
    assert len(ca) == 1 and ca[0].ca and ca[0].ref.key == "ca.crt"
    assert "cacerts" not in pubkey.conn["s2"]["remote"], "the agent sets it, from the Secret"


def test_what_the_controller_renders_the_agent_loads_with_its_pins() -> None:
    want = desired(render_documents(pubkey_documents(), OPTS))
    assert want.pins == {"s2": (f"cert/{GATEWAY_CA}",)}


def test_a_psk_only_plan_serialises_without_the_field() -> None:
    """PSK tunnels leave ``peerCas`` out of the document: their plans (and hashes) are as before."""
    doc = json.loads(gwplan.dumps(render_documents(IPSEC, OPTS)))
    assert all("peerCas" not in t for t in doc["ipsec"]["tunnels"])
    pinned = json.loads(gwplan.dumps(render_documents(pubkey_documents(), OPTS)))
    assert [t.get("peerCas") for t in pinned["ipsec"]["tunnels"]] == [None, [GATEWAY_CA]]


def test_the_swanctl_form_names_the_pinned_ca() -> None:
    text = render_swanctl(render_documents(pubkey_documents(), OPTS))
    assert "# s2: remote cacerts = CA ca (Secret acme-tls, key ca.crt), pinned by the status-agent" in text
    assert "# s1: remote cacerts" not in text
