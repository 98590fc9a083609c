"""render(): the plan's shape, determinism, sticky allocations, the swanctl.conf form, hostile input.

Pure. The live proof (charon loads what we render) is tests/integration/test_render_live.py."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gwplan
from controller.api.model import Gateway, VPNPeer, parse
from controller.api.validate import InvalidInput, select
from controller.plan import render as render_module
from controller.plan.render import RenderOptions, child_name, render_documents, render_parts
from controller.plan.swanctl import UnsafeValue, _value, render_swanctl
from tests.examples import edit, example_docs

INTERNAL = ("192.0.2.64/26",)
OPTS = RenderOptions(internal_source_cidrs=INTERNAL)


IPSEC, WG, LEGACY = (
    example_docs("ipsec.yaml"),
    example_docs("wireguard.yaml"),
    example_docs("legacy-ipsecgateway.yaml"),
)


def test_ipsec_tunnels_have_one_child_per_remote_subnet() -> None:
    plan = render_documents(IPSEC, OPTS)
    assert plan.ipsec is not None and plan.type == "ipsec"
    s1, s2 = plan.ipsec.tunnels
    assert (s1.name, s1.initiate, s2.name) == ("s1", True, "s2")
    assert [(c.name, c.remote_subnet) for c in s1.children] == [
        ("s1-203-0-113-0-28", "203.0.113.0/28"),
        ("s1-198-19-1-16-28", "198.19.1.16/28"),
    ]
    conn = s1.conn["s1"]
    assert conn["version"] == "2" and conn["remote_addrs"] == ["198.51.100.2"]
    assert conn["local"] == {"auth": "psk", "id": "gw.lab.example"}
    assert conn["remote"] == {"auth": "psk", "id": "s1.lab.example"}
    assert conn["proposals"] == ["aes256-sha256-modp2048"]
    assert set(conn["children"]) == {c.name for c in s1.children}
    for c in s1.children:
        child = conn["children"][c.name]
        assert child["local_ts"] == ["198.18.0.0/24"] and child["remote_ts"] == [c.remote_subnet]
        assert child["esp_proposals"] == ["aes256gcm16-modp2048"] and child["start_action"] == "none"


def test_secrets_are_references_per_peer_with_override_or_default_each_owned_by_its_peer_alone() -> None:
    """Never also by our local id: charon would then try every peer's key for every peer (tested live in
    tests/integration/test_hostile_peer.py)."""
    plan = render_documents(IPSEC, OPTS)
    assert plan.ipsec is not None
    assert plan.ipsec.secrets == (
        gwplan.IkeSecret("psk-s1", ("s1.lab.example",), gwplan.SecretRef("s1-psk", "psk")),
        gwplan.IkeSecret("psk-s2", ("s2.lab.example",), gwplan.SecretRef("acme-psk", "psk")),
    )
    legacy = render_documents(LEGACY, OPTS)
    assert legacy.ipsec is not None
    assert {s.owners for s in legacy.ipsec.secrets} == {
        (t.conn[t.name]["remote"]["id"],) for t in legacy.ipsec.tunnels
    }


def test_child_names_are_stable_per_subnet_and_safe() -> None:
    before = render_documents(IPSEC, OPTS)
    after = render_documents(
        edit(IPSEC, 1, ["spec", "ipsec", "remoteSubnets"], ["10.7.0.0/16", "203.0.113.0/28"]), OPTS
    )
    assert before.ipsec is not None and after.ipsec is not None
    names_before = {c.remote_subnet: c.name for c in before.ipsec.tunnels[0].children}
    names_after = {c.remote_subnet: c.name for c in after.ipsec.tunnels[0].children}
    assert names_after["203.0.113.0/28"] == names_before["203.0.113.0/28"]  # was first, now second
    assert child_name("hq", "192.168.10.5/24") == "hq-192-168-10-0-24"
    assert all("." not in n for n in names_after.values())


def test_road_warrior_and_pubkey_peers() -> None:
    documents = edit(IPSEC, 0, ["spec", "ipsec", "certificateSecretRef"], {"name": "acme-tls"})
    documents = edit(documents, 2, ["spec", "type"], "roadWarrior")
    del documents[2]["spec"]["endpoint"]
    documents[2]["spec"]["ipsec"]["auth"] = "pubkey"
    plan = render_documents(documents, OPTS)
    assert plan.ipsec is not None
    rw = plan.ipsec.tunnels[1]
    assert rw.initiate is False
    assert rw.conn["s2"]["remote_addrs"] == ["%any"] and rw.conn["s2"]["dpd_delay"] == "60s"
    assert rw.conn["s2"]["local"]["auth"] == "pubkey" and rw.conn["s2"]["remote"]["auth"] == "pubkey"
    assert [s.id for s in plan.ipsec.secrets] == ["psk-s1"]
    assert plan.ipsec.certificates == (
        gwplan.IkeCertificate("gateway", gwplan.SecretRef("acme-tls", "tls.crt")),
        gwplan.IkeCertificate("ca", gwplan.SecretRef("acme-tls", "ca.crt"), ca=True),
    )
    assert plan.ipsec.private_keys == (
        gwplan.IkePrivateKey("gateway", gwplan.SecretRef("acme-tls", "tls.key")),
    )
    assert gwplan.loads(gwplan.dumps(plan)) == plan


def _parsed(documents: list[dict[str, Any]]) -> tuple[Gateway, list[VPNPeer]]:
    return select([parse(d) for d in documents])


def test_nat_grants_sources_and_marks() -> None:
    plan = render_documents(IPSEC, OPTS)
    nat = plan.nat
    assert (nat.service_cidr, nat.source_address, nat.internal_source_cidrs) == (
        "198.18.0.0/24",
        "198.18.0.1",
        INTERNAL,
    )
    ips = [e.virtual_ip for e in nat.exposures] + [e.virtual_ip for e in nat.reverse_exposures]
    assert len(set(ips)) == 3
    assert all(ipaddress.IPv4Address(ip) in ipaddress.IPv4Network("198.18.0.0/24") for ip in ips)
    assert "198.18.0.1" not in ips
    grants = {(g.kind, g.peer, g.exposure): g for g in nat.grants}
    assert set(grants) == {
        ("exposure", "s1", "web"),
        ("exposure", "s1", "db"),
        ("reverse", "s1", "printer"),
        ("exposure", "s2", "web"),
    }
    assert grants[("exposure", "s1", "web")].sources == ("203.0.113.0/28", "198.19.1.16/28")
    assert grants[("reverse", "s1", "printer")].sources == INTERNAL
    marks = [g.mark for g in nat.grants]
    assert len(set(marks)) == 4 and all(m & ~nat.mark_mask == 0 and m for m in marks)


def test_legacy_renders_tunnels_and_grants_every_tunnel_every_exposure() -> None:
    plan = render_documents(LEGACY, OPTS)
    assert plan.ipsec is not None and plan.gateway.kind == "IPsecGateway"
    assert plan.gateway.api_version == "ipsec.bnerd.net/v1alpha1"
    assert [t.name for t in plan.ipsec.tunnels] == ["s1", "s2"]
    assert {s.ref for s in plan.ipsec.secrets} == {gwplan.SecretRef("legacy-psk", "psk")}
    assert {(g.kind, g.peer, g.exposure) for g in plan.nat.grants} == {
        ("exposure", "s1", "web"),
        ("exposure", "s2", "web"),
        ("reverse", "s1", "printer"),
    }
    (web,) = plan.nat.exposures
    assert (web.target_host, web.target_address) == ("web.svc.lab.example", None)


def test_wireguard_device_and_peers() -> None:
    plan = render_documents(WG, OPTS)
    wg = plan.wireguard
    assert plan.type == "wireguard" and plan.ipsec is None and wg is not None
    assert (wg.interface, wg.listen_port, wg.address) == ("wg0", 51820, "10.99.0.1/24")
    assert wg.private_key_ref == gwplan.SecretRef("acme-wg", "privateKey")
    laptop, s1 = wg.peers
    assert (laptop.endpoint, laptop.persistent_keepalive) == (None, None)
    assert (s1.endpoint, s1.persistent_keepalive, s1.allowed_ips) == (
        "198.51.100.2:51820",
        25,
        ("10.99.0.2/32", "203.0.113.0/28"),
    )
    assert s1.preshared_key_ref == gwplan.SecretRef("s1-wg", "presharedKey")


def test_null_fields_render_as_the_api_server_stores_them() -> None:
    """`field: ~` is dropped (or defaulted) by the API server before the controller sees the object; the
    offline path does the same, so the plan equals the one without the field."""
    nulls = edit(WG, 2, ["spec", "wireguard", "endpointPort"], None)  # the road warrior
    nulls = edit(nulls, 0, ["spec", "exposures", 0, "ports", 0, "protocol"], None)
    nulls = edit(nulls, 1, ["spec", "authorization"], None)
    nulls = edit(nulls, 1, ["spec", "wireguard", "persistentKeepalive"], None)
    plan = render_documents(nulls, OPTS)
    assert plan.nat.exposures[0].ports == (gwplan.Port(80, "TCP"),)
    assert plan.nat.grants == tuple(g for g in render_documents(WG, OPTS).nat.grants if g.peer != "s1")
    assert plan.wireguard is not None and plan.wireguard.peers[1].persistent_keepalive == 25
    ipsec = edit(IPSEC, 0, ["spec", "ipsec", "certificateSecretRef"], None)
    assert render_documents(ipsec, OPTS) == render_documents(IPSEC, OPTS)


def test_same_input_same_bytes_whatever_the_document_order() -> None:
    first = gwplan.dumps(render_documents(IPSEC, OPTS))
    shuffled = IPSEC[:]
    random.Random(7).shuffle(shuffled)  # noqa: S311 - a fixed test order, not crypto
    assert gwplan.dumps(render_documents(shuffled, OPTS)) == first
    assert gwplan.loads(first) == render_documents(IPSEC, OPTS)


def test_previous_plan_keeps_allocations_when_exposures_change() -> None:
    first = gwplan.loads(gwplan.dumps(render_documents(IPSEC, OPTS)))
    more = copy.deepcopy(IPSEC)
    more[0]["spec"]["exposures"] = [
        *({"name": f"x{i}", "target": {"address": "192.0.2.70"}, "ports": [{"port": 80}]} for i in range(60)),
        more[0]["spec"]["exposures"][1],  # db stays, web goes
    ]
    more[1]["spec"]["authorization"]["exposures"] = ["db", "x1"]
    more[2]["spec"]["authorization"]["exposures"] = ["x2"]
    second = render_documents(more, RenderOptions(internal_source_cidrs=INTERNAL, previous=first))
    old_ip = {e.name: e.virtual_ip for e in first.nat.exposures} | {
        e.name: e.virtual_ip for e in first.nat.reverse_exposures
    }
    new_ip = {e.name: e.virtual_ip for e in second.nat.exposures} | {
        e.name: e.virtual_ip for e in second.nat.reverse_exposures
    }
    assert new_ip["db"] == old_ip["db"] and new_ip["printer"] == old_ip["printer"]
    old_mark = {(g.kind, g.peer, g.exposure): g.mark for g in first.nat.grants}
    new_mark = {(g.kind, g.peer, g.exposure): g.mark for g in second.nat.grants}
    for key in old_mark.keys() & new_mark.keys():
        assert new_mark[key] == old_mark[key]
    assert len(set(new_mark.values())) == len(new_mark)


def test_previous_plan_of_another_gateway_is_ignored() -> None:
    other = render_documents(LEGACY, OPTS)
    assert render_documents(
        IPSEC, RenderOptions(internal_source_cidrs=INTERNAL, previous=other)
    ) == render_documents(IPSEC, OPTS)


def test_exposures_beyond_the_service_cidr_are_left_out_by_name_and_the_rest_rendered() -> None:
    small = edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.0.0/30")
    rendering = render_parts(*_parsed(small), OPTS)
    why = (
        'gets no virtual IP: spec.serviceCIDR "198.18.0.0/30" has room for 1 (network, broadcast and the '
        "gateway's own first host are not handed out) but exposures and reverseExposures need 3: widen it or "
        "remove exposures"
    )
    # Fresh names take the pool in sorted order: db gets the one virtual IP, printer and web do not.
    assert [str(p) for p in rendering.left_out] == [
        f'VPNGateway/tenant-acme/acme: spec.exposures[0]: "web" {why}',
        f'VPNGateway/tenant-acme/acme: spec.reverseExposures[0]: "printer" {why}',
    ]
    assert all(p.reason == "AllocationFailed" for p in rendering.left_out)
    nat = rendering.plan.nat
    assert [e.name for e in nat.exposures] == ["db"] and nat.reverse_exposures == ()
    assert {(g.peer, g.exposure) for g in nat.grants} == {("s1", "db")}, "the grants of what is left out go"
    with pytest.raises(InvalidInput):  # the strict (offline) render refuses the same input
        render_documents(small, OPTS)


def _with_mask(plan: gwplan.Plan, mask: int) -> gwplan.Plan:
    return dataclasses.replace(plan, nat=dataclasses.replace(plan.nat, mark_mask=mask))


def test_grants_beyond_the_mark_pool_are_reported_at_the_new_grants_of_their_peers() -> None:
    """A deployed plan whose mask holds 3 marks, all taken; a new grant gets none and is named exactly
    (the grants holding a mark keep it, so it is the new one that is left out, not the first sorted)."""
    tiny = _with_mask(render_documents(IPSEC, OPTS), 0x3)
    fewer = edit(IPSEC, 1, ["spec", "authorization", "exposures"], ["web"])  # s1 loses db: 3 grants
    first = render_documents(fewer, RenderOptions(internal_source_cidrs=INTERNAL, previous=tiny))
    assert sorted(g.mark for g in first.nat.grants) == [1, 2, 3]
    with pytest.raises(InvalidInput) as info:
        render_documents(IPSEC, RenderOptions(internal_source_cidrs=INTERNAL, previous=first))
    (problem,) = info.value.problems
    assert problem.reason == "AllocationFailed"
    assert str(problem) == (
        'VPNPeer/tenant-acme/s1: spec.authorization.exposures[1]: "db" gets no conntrack mark: '
        "VPNGateway/tenant-acme/acme's grants need 4 marks, the mark mask 0x3 holds 3; remove grants"
    )


def test_mark_exhaustion_names_every_grant_left_without_and_keeps_the_rest() -> None:
    one = RenderOptions(
        internal_source_cidrs=INTERNAL, previous=_with_mask(render_documents(IPSEC, OPTS), 0x1)
    )
    rendering = render_parts(*_parsed(IPSEC), one)
    assert [(p.resource, p.error.path, p.error.value) for p in rendering.left_out] == [
        ("VPNPeer/tenant-acme/s1", "spec.authorization.exposures[0]", '"web"'),
        ("VPNPeer/tenant-acme/s1", "spec.authorization.reverseExposures[0]", '"printer"'),
        ("VPNPeer/tenant-acme/s2", "spec.authorization.exposures[0]", '"web"'),
    ]
    # None of the deployed marks fits the mask: all are fresh, and the first in sorted order gets the one.
    assert [(g.peer, g.exposure) for g in rendering.plan.nat.grants] == [("s1", "db")]
    legacy = RenderOptions(
        internal_source_cidrs=INTERNAL, previous=_with_mask(render_documents(LEGACY, OPTS), 0x1)
    )
    rendering = render_parts(*_parsed(LEGACY), legacy)
    assert [(p.resource, p.error.path) for p in rendering.left_out] == [
        ("IPsecGateway/tenant-old/legacy", "spec.tunnels[0].name"),
        ("IPsecGateway/tenant-old/legacy", "spec.tunnels[1].name"),
    ]
    assert "this is its grant of reverse exposure 'printer'" in str(rendering.left_out[0])
    assert all(p.reason == "AllocationFailed" for p in rendering.left_out)
    assert len(rendering.plan.nat.grants) == 1


def test_grants_past_the_rule_budget_are_left_out_and_deployed_ones_come_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by review: rules are grants x sources x ports, so a small plan could ask init-nat for
    millions. Here the budget is 4 rules: s1's web and db (2 subnets x 1 port each) fill it."""
    monkeypatch.setattr(render_module, "MAX_GRANT_RULES", 4)
    rendering = render_parts(*_parsed(IPSEC), OPTS)
    assert [(g.peer, g.kind, g.exposure) for g in rendering.plan.nat.grants] == [
        ("s1", "exposure", "db"),
        ("s1", "exposure", "web"),
    ]
    assert {(p.resource, p.error.path, p.reason) for p in rendering.left_out} == {
        ("VPNPeer/tenant-acme/s1", "spec.authorization.reverseExposures[0]", "TooManyRules"),
        ("VPNPeer/tenant-acme/s2", "spec.authorization.exposures[0]", "TooManyRules"),
    }
    assert "would need 6 filter rules in the gateway pod" in str(rendering.left_out[0])
    # What the deployed plan grants keeps its place: s2's web, deployed, stays; s1's db gives way.
    monkeypatch.setattr(render_module, "MAX_GRANT_RULES", 10**6)
    deployed = render_documents(edit(IPSEC, 1, ["spec", "authorization", "exposures"], ["web"]), OPTS)
    monkeypatch.setattr(render_module, "MAX_GRANT_RULES", 4)
    again = render_parts(*_parsed(IPSEC), RenderOptions(internal_source_cidrs=INTERNAL, previous=deployed))
    assert {(g.peer, g.exposure) for g in again.plan.nat.grants} == {
        ("s1", "printer"),
        ("s1", "web"),
        ("s2", "web"),
    }
    assert [(p.error.value, p.reason) for p in again.left_out] == [('"db"', "TooManyRules")]


def test_a_deployed_grant_that_grew_waits_with_the_new_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a held grant ranked first whatever it costs now, so one peer adding subnets could
    push out another peer's deployed grants. Deployed: s1 web (2 rules), s2 web (1). s1 now asks for three
    more subnets (5 rules): with a budget of 5, s2's deployed grant stays and s1's grown one waits."""
    monkeypatch.setattr(render_module, "MAX_GRANT_RULES", 10**6)
    only_web = edit(IPSEC, 1, ["spec", "authorization"], {"exposures": ["web"]})
    deployed = render_documents(only_web, OPTS)
    grown = edit(
        only_web,
        1,
        ["spec", "ipsec", "remoteSubnets"],
        ["203.0.113.0/28", "198.19.1.16/28", "198.19.2.0/28", "198.19.3.0/28", "198.19.4.0/28"],
    )
    monkeypatch.setattr(render_module, "MAX_GRANT_RULES", 5)
    again = render_parts(*_parsed(grown), RenderOptions(internal_source_cidrs=INTERNAL, previous=deployed))
    assert {(g.peer, g.exposure) for g in again.plan.nat.grants} == {("s2", "web")}
    assert [(p.resource, p.reason) for p in again.left_out] == [("VPNPeer/tenant-acme/s1", "TooManyRules")]


@pytest.mark.parametrize(
    "mask, rule",
    [
        (0, "is empty: no bits left for conntrack marks"),
        (0x0F0F0000, "is not one contiguous run of bits"),
        (0x1FFFFFFFF, "does not fit in 32 bits"),
    ],
)
def test_a_damaged_previous_mark_mask_is_named_with_its_plan_and_field(mask: int, rule: str) -> None:
    previous = _with_mask(render_documents(IPSEC, OPTS), mask)
    with pytest.raises(InvalidInput) as info:
        render_documents(IPSEC, RenderOptions(internal_source_cidrs=INTERNAL, previous=previous))
    (problem,) = info.value.problems
    assert problem.reason == "PreviousPlanInvalid"
    assert str(problem).startswith(
        f'previous plan of VPNGateway/tenant-acme/acme: nat.markMask: "{mask:#x}" {rule}'
    )


def test_swanctl_rendering_matches_the_plan_and_holds_no_secret() -> None:
    plan = render_documents(IPSEC, OPTS)
    text = render_swanctl(plan)
    assert "connections {" in text and "include secrets.d/*.conf" in text
    for child in ("s1-203-0-113-0-28", "s1-198-19-1-16-28", "s2-203-0-113-16-28"):
        assert f"            {child} {{" in text
    assert "remote_ts = 198.19.1.16/28" in text and "id = s1.lab.example" in text
    assert "secret =" not in text
    with pytest.raises(ValueError, match="not an IPsec gateway"):
        render_swanctl(render_documents(WG, OPTS))


@pytest.mark.parametrize(
    "value, written",
    [
        ("plain.value-1", "plain.value-1"),
        ('a"b', '"a\\"b"'),
        ("a b", '"a b"'),
        ("x}{", '"x}{"'),
        (["a", "b"], "a,b"),
    ],
)
def test_swanctl_values_are_tokens_or_quoted(value: Any, written: str) -> None:
    assert _value(value) == written


@pytest.mark.parametrize("value", ["a\nb", "a\x00", ["a,b"]])
def test_swanctl_refuses_what_it_cannot_write_safely(value: Any) -> None:
    with pytest.raises(UnsafeValue):
        _value(value)


# --- hostile strings at every field that reaches charon: rejected, or rendered with the meaning intended

HOSTILE = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="ab1.-_@:%\"'{}; \n\\=,#/", max_size=25),
    st.sampled_from(["", "..", "%any", "@x", "x" * 5000, "a}\nconnections {\nevil {", "ünï", "1.2.3.4\n"]),
    st.from_regex(r"[a-z0-9][-a-z0-9.@]{0,30}[a-z0-9]", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(/[0-9]{1,2})?", fullmatch=True),
)
CHARON_FIELDS = [
    (1, ["metadata", "name"], "conn"),
    (0, ["spec", "ipsec", "localID"], "local_id"),
    (1, ["spec", "ipsec", "id"], "remote_id"),
    (1, ["spec", "endpoint"], "remote_addrs"),
    (1, ["spec", "ipsec", "remoteSubnets", 0], "remote_ts"),
    (0, ["spec", "serviceCIDR"], "local_ts"),
    (0, ["spec", "ipsec", "ike", "proposals", 0], "proposals"),
    (0, ["spec", "ipsec", "esp", "proposals", 0], "esp_proposals"),
]


def meaning(plan: gwplan.Plan, what: str) -> Any:
    assert plan.ipsec is not None
    tunnel = next(t for t in plan.ipsec.tunnels if t.name != "s2")
    conn = tunnel.conn[tunnel.name]
    first_child = next(iter(conn["children"].values()))
    return {
        "conn": tunnel.name,
        "local_id": conn["local"]["id"],
        "remote_id": conn["remote"]["id"],
        "remote_addrs": conn["remote_addrs"][0],
        "remote_ts": tunnel.children[0].remote_subnet,
        "local_ts": first_child["local_ts"][0],
        "proposals": conn["proposals"][0],
        "esp_proposals": first_child["esp_proposals"][0],
    }[what]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(CHARON_FIELDS), value=HOSTILE)
def test_hostile_values_are_rejected_or_rendered_verbatim(
    field: tuple[int, list[Any], str], value: str
) -> None:
    i, path, what = field
    documents = edit(IPSEC, i, path, value)
    try:
        plan = render_documents(documents, OPTS)
    except InvalidInput as exc:
        assert exc.problems
        return
    rendered = meaning(plan, what)
    if what in ("remote_ts", "local_ts"):
        assert rendered == str(ipaddress.IPv4Network(value, strict=False))
    else:
        assert rendered == value
    render_swanctl(plan)  # never UnsafeValue for validated input
    assert "\n" not in value and '"' not in value and "{" not in value
