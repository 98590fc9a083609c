"""initnat.rules: validation (every plan value that reaches iptables), rendering, revocation. Pure."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv4Network

import pytest

from gwplan import Exposure, Grant, Nat, Nic, Port, ReverseExposure
from initnat import rules, tables
from initnat.rules import NatConfigError

NIC2 = IPv4Address("192.0.2.2")
MASK = 0x0FFF0000
A, B, C = 0x10000, 0x20000, 0x30000


def nat(**kw: object) -> Nat:
    base = Nat(
        service_cidr="198.18.0.0/24",
        source_address="198.18.0.1",
        internal_source_cidrs=("10.0.0.0/8",),
        exposures=(
            Exposure("web", "198.18.0.10", (Port(80), Port(53, "UDP")), target_address="192.0.2.66"),
            Exposure("api", "198.18.0.11", (Port(9090),), target_host="api.fabric.example"),
        ),
        reverse_exposures=(ReverseExposure("db", "198.18.0.20", "203.0.113.5", (Port(5432),)),),
        grants=(
            Grant("s1", "web", "exposure", ("203.0.113.0/28",), A),
            Grant("s2", "web", "exposure", ("203.0.113.16/28", "198.19.2.0/28"), B),
            Grant("s1", "db", "reverse", ("10.1.0.0/16",), C),
        ),
        mark_mask=MASK,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


RESOLVED = {"api.fabric.example": IPv4Address("192.0.2.70")}


def policy(n: Nat | None = None) -> rules.Policy:
    return rules.validate(n or nat(), nic2_address=NIC2, resolved=RESOLVED)


def test_render_is_the_iptables_save_form_of_the_intended_rules() -> None:
    rs = rules.render(policy())
    (flt, nt) = rs.tables
    assert flt.table == "filter" and flt.chains == ("VPNGW-FORWARD", "VPNGW-TARGETS")
    assert flt.rules[:5] == (
        "-A VPNGW-FORWARD -m conntrack --ctstate INVALID "
        '-m comment --comment "vpngw conntrack invalid" -j DROP',
        "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw new and not DNATed" -j VPNGW-TARGETS',
        "-A VPNGW-FORWARD -m conntrack ! --ctorigdst 198.18.0.0/24 "
        '-m comment --comment "vpngw not for a virtual IP" -j RETURN',
        "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw serviceCIDR only through DNAT" -j DROP',
        "-A VPNGW-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -m connmark ! --mark 0x0/0xfff0000 "
        '-m comment --comment "vpngw established granted flows" -j ACCEPT',
    )
    assert (
        "-A VPNGW-FORWARD -s 203.0.113.16/28 -p udp -m conntrack --ctstate NEW -m conntrack --ctorigdst "
        "198.18.0.10 --ctorigdstport 53 -m connmark --mark 0x0/0xfff0000 -m comment --comment "
        '"vpngw grant to=192.0.2.66 peer=s2 exposure=web" -j CONNMARK --set-xmark 0x20000/0xfff0000'
    ) in flt.rules
    forward = [r for r in flt.rules if r.startswith("-A VPNGW-FORWARD ")]
    assert (
        forward[-4]
        == "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m connmark ! --mark 0x0/0xfff0000 -j ACCEPT"
    )
    assert tuple(forward[-3:]) == tuple(
        f'-A VPNGW-FORWARD -m conntrack --ctorigdst {vip} -m comment --comment "vpngw not granted" -j DROP'
        for vip in ("198.18.0.10", "198.18.0.11", "198.18.0.20")
    )
    # The exposures' real addresses (192.0.2.70 is the resolved targetHost) are dropped for connections
    # that did not come through our DNAT; the reverse exposure's target (tenant side) is not listed.
    assert [r for r in flt.rules if r.startswith("-A VPNGW-TARGETS ")] == [
        f'-A VPNGW-TARGETS -d {t}/32 -m comment --comment "vpngw exposure target only via its virtual IP" '
        "-j DROP"
        for t in ("192.0.2.66", "192.0.2.70")
    ]
    assert nt.chains == ("VPNGW-PREROUTING", "VPNGW-EXPOSURES", "VPNGW-POSTROUTING")
    assert (
        "-A VPNGW-EXPOSURES -d 198.18.0.11/32 -p tcp -m tcp --dport 9090 -m comment --comment "
        '"vpngw exposure=api" -j DNAT --to-destination 192.0.2.70:9090'
    ) in nt.rules
    assert [r for r in nt.rules if r.startswith("-A VPNGW-PREROUTING ")] == [
        "-A VPNGW-PREROUTING -d 198.18.0.20/32 -p tcp -m tcp --dport 5432 -m comment --comment "
        '"vpngw reverse=db" -j DNAT --to-destination 203.0.113.5:5432'
    ], "no tunnel known (no guard): no way into the exposures' chain; reverse exposures stay"
    snat = [r for r in nt.rules if "SNAT" in r]
    assert [r.rsplit(" ", 1)[1] for r in snat] == ["192.0.2.2", "192.0.2.2", "198.18.0.1"], (
        "exposures SNAT to NIC2, reverse exposures to the serviceCIDR source address"
    )
    # invalid + targets jump + gate + serviceCIDR drop + established + (1 source x 2 ports + 2 sources x
    # 2 ports + 1 source x 1 port) + NEW + 3 drops, then 2 targets
    assert len(flt.rules) == 1 + 1 + 1 + 1 + 1 + 7 + 1 + 3 + 2
    assert rs.marks == {A, B, C} and rules.render(policy()) == rs, "deterministic"
    no_cidr = rules.render(policy(nat(service_cidr=None))).tables[0].rules
    assert not any("RETURN" in r for r in no_cidr), "no gate without serviceCidr"
    assert len(no_cidr) == len(flt.rules) - 2, "nor its drop of what we did not DNAT"
    reverse_only = nat(exposures=(), grants=(Grant("s1", "db", "reverse", ("10.1.0.0/16",), C),))
    assert not any("VPNGW-TARGETS" in r for r in rules.render(policy(reverse_only)).tables[0].rules), (
        "no exposure target, no jump to the (empty) target list"
    )


def test_names_only_ever_appear_sanitised_inside_comments() -> None:
    hostile = "x\" -j ACCEPT\n-A FORWARD -j DROP \\ '$(reboot)"
    n = nat(
        exposures=(Exposure(hostile, "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
        reverse_exposures=(),
        grants=(Grant(hostile, hostile, "exposure", ("203.0.113.0/28",), A),),
    )
    rs = rules.render(policy(n))
    for line in (r for t in rs.tables for r in t.rules):
        assert "\n" not in line and "\\" not in line and "'" not in line
        before, _, rest = line.partition("--comment ")
        assert "x_" not in before
        if rest:
            assert rest.startswith('"') and rest.count('"') == 2, line
            assert "-j ACCEPT\n" not in rest


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"service_cidr": "198.18.0.0/33"}, "nat.serviceCidr", id="cidr-prefix"),
        pytest.param(
            {"source_address": "198.19.0.1"}, "nat.sourceAddress: 198.19.0.1 is outside", id="src-out"
        ),
        pytest.param(
            {"internal_source_cidrs": ("10.0.0.0/8", "fe80::/64")}, "nat.internalSourceCidrs[1]", id="v6"
        ),
        pytest.param({"mark_mask": 0}, "nat.markMask", id="mask-zero"),
        pytest.param({"mark_mask": 2**32}, "nat.markMask", id="mask-big"),
        pytest.param(
            {"mark_mask": 0xFFFFFFFF, "grants": ()},
            r"nat.markMask: 0xffffffff .*iptables-save prints a full mask without it",
            id="mask-full",
        ),
    ],
)
def test_nat_level_fields_are_checked(change: dict[str, object], field: str) -> None:
    with pytest.raises(NatConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        policy(nat(**change))


def _exp(**kw: object) -> Exposure:
    return dataclasses.replace(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exposure", "message"),
    [
        pytest.param(
            _exp(virtual_ip="198.18.0.300"), r"nat.exposures\[0\].virtualIp: .* not an IPv4", id="vip"
        ),
        pytest.param(
            _exp(virtual_ip="10.0.0.1"), r"virtualIp: 10.0.0.1 is outside nat.serviceCidr", id="vip-out"
        ),
        pytest.param(_exp(virtual_ip="198.18.0.1"), r"virtualIp: .* is nat.sourceAddress", id="vip-own"),
        pytest.param(_exp(virtual_ip="198.18.0.10 -j ACCEPT"), r"virtualIp: .* not an IPv4", id="vip-inject"),
        pytest.param(
            _exp(target_address="192.0.2.66/32"), r"targetAddress: .* not an IPv4", id="target-cidr"
        ),
        pytest.param(
            _exp(target_address=None), r"nat.exposures\[0\]: targetAddress or targetHost", id="no-target"
        ),
        pytest.param(
            _exp(target_address=None, target_host="-j ACCEPT"), r"targetHost: .* not a DNS", id="host"
        ),
        pytest.param(
            _exp(target_address=None, target_host="1.2.3.4"), r"targetHost: .* not a DNS", id="host-ip"
        ),
        pytest.param(
            _exp(target_address=None, target_host="other.example"), r"not been resolved", id="unres"
        ),
        pytest.param(_exp(ports=()), r"ports: at least one", id="no-ports"),
        pytest.param(_exp(ports=(Port(0),)), r"ports\[0\].port: 0 is not a port", id="port-0"),
        pytest.param(_exp(ports=(Port(65536),)), r"ports\[0\].port: 65536", id="port-big"),
        pytest.param(_exp(ports=(Port(True),)), r"ports\[0\].port: True", id="port-bool"),
        pytest.param(_exp(ports=(Port("80"),)), r"ports\[0\].port: '80'", id="port-str"),  # type: ignore[arg-type]
        pytest.param(_exp(ports=(Port(80, "SCTP"),)), r"ports\[0\].protocol: 'SCTP'", id="proto"),  # type: ignore[arg-type]
        pytest.param(
            _exp(ports=(Port(80), Port(80))), r"ports\[1\]: 198.18.0.10 tcp/80 is listed twice", id="dup"
        ),
        pytest.param(_exp(name=""), r"name: must not be empty", id="empty-name"),
    ],
)
def test_exposure_fields_are_checked_and_named(exposure: Exposure, message: str) -> None:
    with pytest.raises(NatConfigError, match=message):
        policy(nat(exposures=(exposure,), grants=(), reverse_exposures=()))


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        pytest.param(
            Grant("p", "web", "exposure", ("x",), A), r"grants\[0\].sources\[0\]: 'x' is not", id="src"
        ),
        pytest.param(
            Grant("p", "web", "exposure", (), 0x1), r"grants\[0\].mark: 0x1 is not a non-zero", id="out"
        ),
        pytest.param(
            Grant("p", "web", "exposure", (), 0), r"grants\[0\].mark: 0 is not an integer", id="zero"
        ),
        pytest.param(
            Grant("p", "nope", "exposure", (), A), r"grants\[0\].exposure: 'nope' is not in", id="name"
        ),
        pytest.param(Grant("p", "web", "reverse", (), A), r"'web' is not in nat.reverseExposures", id="kind"),
        pytest.param(
            Grant("p", "db", "reverse", ("192.0.2.0/24",), A), r"not inside nat.internal", id="rev-src"
        ),
        pytest.param(Grant("p", "web", "bogus", (), A), r"grants\[0\].kind", id="bad-kind"),  # type: ignore[arg-type]
        pytest.param(
            Grant("p", "web", "exposure", ("0.0.0.0/0",), A),
            r"grants\[0\].sources\[0\]: 0.0.0.0/0 admits every source",
            id="any-source",
        ),
    ],
)
def test_grant_fields_are_checked_and_named(grant: Grant, message: str) -> None:
    with pytest.raises(NatConfigError, match=message):
        policy(nat(grants=(grant,)))


def test_two_grants_cannot_share_a_mark() -> None:
    g = Grant("p", "web", "exposure", ("10.0.0.0/8",), A)
    with pytest.raises(
        NatConfigError, match=r"grants\[1\].mark: 0x10000 is already the mark of nat.grants\[0\]"
    ):
        policy(nat(grants=(g, dataclasses.replace(g, peer="q"))))


def test_a_virtual_ip_belongs_to_one_exposure_a_second_claim_is_left_out_alone() -> None:
    """One bad exposure must not keep the others from applying: a second (reverse) exposure on a virtual
    IP (a (virtual IP, protocol, port) can DNAT to one target only, SNAT is chosen per virtual IP) used to
    reject the whole plan. The first in plan order keeps it, the second is left out with its grants."""
    clash = dataclasses.replace(nat().exposures[0], name="web2", ports=(Port(80), Port(8443)))
    g_clash = Grant("s3", "web2", "exposure", ("203.0.113.32/28",), 0x40000)
    p = policy(nat(exposures=(*nat().exposures, clash), grants=(*nat().grants, g_clash)))
    (out,) = p.left_out
    assert out == rules.LeftOut(
        field="nat.exposures[2].virtualIp",
        exposure="web2",
        vip=IPv4Address("198.18.0.10"),
        reason="198.18.0.10 is already the virtual IP of nat.exposures[0] (with tcp/80)",
        grants=(g_clash,),
    )
    assert p.services == policy().services and p.admissions == policy().admissions, "the rest as before"
    assert p.grants == nat().grants and 0x40000 not in p.marks
    # ... whichever way round, and across kinds: a reverse exposure on an exposure's virtual IP.
    rev = (dataclasses.replace(nat().reverse_exposures[0], virtual_ip="198.18.0.11"),)
    r = policy(nat(reverse_exposures=rev))
    (out,) = r.left_out
    assert (out.kind, out.exposure, out.field) == ("reverse", "db", "nat.reverseExposures[0].virtualIp")
    assert out.reason == "198.18.0.11 is already the virtual IP of nat.exposures[1]"
    assert [g.mark for g in out.grants] == [C] and C not in r.marks, "its grant is left out with it"
    assert not any(x.kind == "reverse" for x in r.services)
    # Nothing of web2 is rendered (the "not granted" drop of its virtual IP is web's already).
    lines = [x for t in rules.render(p).tables for x in t.rules]
    assert lines == [x for t in rules.render(policy()).tables for x in t.rules], "nothing of web2 rendered"


def test_internal_source_cidrs_must_name_networks() -> None:
    """0.0.0.0/0 would admit every source, and iptables-save prints it as no -s at all: the rule would
    never read back equal, so every apply would revoke and flush the grant."""
    with pytest.raises(NatConfigError, match=r"internalSourceCidrs\[0\]: 0.0.0.0/0 admits every source"):
        policy(nat(internal_source_cidrs=("0.0.0.0/0",)))


def test_reverse_exposures_need_source_address_and_internal_cidrs() -> None:
    with pytest.raises(NatConfigError, match=r"need nat\.sourceAddress"):
        policy(nat(source_address=None))
    with pytest.raises(NatConfigError, match=r"need nat\.internalSourceCidrs"):
        policy(nat(internal_source_cidrs=(), grants=()))


def test_sources_are_normalised_networks() -> None:
    p = policy(nat(grants=(Grant("p", "web", "exposure", ("203.0.113.5/28", "203.0.113.99"), A),)))
    assert {a.source for a in p.admissions} == {IPv4Network("203.0.113.0/28"), IPv4Network("203.0.113.99/32")}


G_A = Grant("s1", "web", "exposure", ("203.0.113.0/28",), A)
G_B = Grant("s2", "web", "exposure", ("203.0.113.16/28",), B)


@pytest.mark.parametrize(
    ("before", "after", "flushed"),
    [
        pytest.param((G_A, G_B), (G_B,), (A,), id="one-revoked"),
        pytest.param((G_A,), (G_A, G_B), (), id="added-nothing-to-flush"),
        pytest.param((G_A, G_B), (G_A, G_B), (), id="unchanged"),
        pytest.param(
            (G_A,), (dataclasses.replace(G_A, sources=("203.0.113.0/27",)),), (A,), id="source-changed"
        ),
        pytest.param(
            (G_A,), (dataclasses.replace(G_A, sources=(*G_A.sources, "198.19.0.0/28")),), (), id="grew"
        ),
        pytest.param(
            (G_A,), (dataclasses.replace(G_A, peer="s9", sources=("10.9.0.0/16",)),), (A,), id="mark-reused"
        ),
    ],
)
def test_revoked(before: tuple[Grant, ...], after: tuple[Grant, ...], flushed: tuple[int, ...]) -> None:
    b = policy(nat(grants=before, reverse_exposures=()))
    a = policy(nat(grants=after, reverse_exposures=()))
    assert tuple(g.mark for g in rules.revoked(b, a)) == flushed


@pytest.mark.parametrize(
    ("before", "after", "mask", "flushed"),
    [
        pytest.param((G_A, G_B), (G_B,), 0x00FF0000, {A}, id="revoked-under-a-new-mask"),
        pytest.param((G_A, G_B), (G_A, G_B), 0x00FF0000, set(), id="mask-changed-grants-kept"),
        pytest.param((G_A, G_B), (G_B,), MASK, {A}, id="same-mask"),
    ],
)
def test_flushes_use_the_mask_the_entries_were_marked_under(
    before: tuple[Grant, ...], after: tuple[Grant, ...], mask: int, flushed: set[int]
) -> None:
    """``--set-xmark G/mask`` wrote the OLD mask's bits; a flush compares ``ctmark & mask == G``, so only
    the old mask finds those entries (with the new one, 0x10000 | bits outside 0xff0000 never match)."""
    b = policy(nat(grants=before, reverse_exposures=()))
    a = policy(nat(grants=after, reverse_exposures=(), mark_mask=mask))
    assert rules.flushes(b, a) == {rules.Flush(m, MASK) for m in flushed}
    assert rules.flushes(None, a) == frozenset()
    assert str(rules.Flush(A, MASK)) == "0x10000/0xfff0000"


def test_a_port_removed_from_an_exposure_revokes_its_grants() -> None:
    b = policy(nat(grants=(G_A,), reverse_exposures=()))
    shrunk = (dataclasses.replace(nat().exposures[0], ports=(Port(80),)), nat().exposures[1])
    a = policy(nat(grants=(G_A,), reverse_exposures=(), exposures=shrunk))
    assert rules.revoked(b, a) == (G_A,)
    assert rules.revoked(None, a) == ()


@pytest.mark.parametrize(
    ("nic", "message"),
    [
        pytest.param(Nic(mac="fa:16:3e:00:00"), r"nic.mac: .* not a MAC", id="mac"),
        pytest.param(Nic(address="192.0.2.2"), None, id="address-without-prefix-is-a-/32"),
        pytest.param(Nic(address="192.0.2.2/33"), r"nic.address", id="address"),
        pytest.param(Nic(gateway="192.0.2.1/26"), r"nic.gateway", id="gateway"),
        pytest.param(Nic(table=254), r"nic.table: 254 is reserved", id="main-table"),
        pytest.param(Nic(table=0), r"nic.table: 0 is not", id="table-0"),
        pytest.param(Nic(rule_priority=0), r"nic.rulePriority", id="prio"),
        pytest.param(Nic(rule_priority=32766), r"nic.rulePriority", id="prio-main"),
        # The reply rules sit at +2 and +3: after charon's table 220, before main's 32766.
        pytest.param(
            Nic(rule_priority=218), r"nic.rulePriority: 218 would put .* \(220, 221\) in front", id="prio-220"
        ),
        pytest.param(
            Nic(rule_priority=32763), r"nic.rulePriority: 32763 is not an integer 219..32762", id="prio-+3"
        ),
        pytest.param(Nic(reply_mark=0x3), r"nic.replyMark: 0x3 is not a single bit", id="reply-two-bits"),
        pytest.param(Nic(reply_mark=0), r"nic.replyMark: 0 is not an integer", id="reply-zero"),
        pytest.param(Nic(reply_mark=2**32), r"nic.replyMark", id="reply-too-wide"),
        pytest.param(Nic(reply_mark=True), r"nic.replyMark", id="reply-bool"),
    ],
)
def test_nic_fields_are_checked(nic: Nic, message: str | None) -> None:
    if message is None:
        assert rules.validate_nic(nic).address is not None
        return
    with pytest.raises(NatConfigError, match=message):
        rules.validate_nic(nic)


def test_nic_edges_that_are_accepted() -> None:
    assert rules.validate_nic(Nic(rule_priority=219)).rule_priority == 219, "reply rules at 221, 222"
    assert rules.validate_nic(Nic(rule_priority=32762)).rule_priority == 32762, "the last at 32765"
    assert rules.validate_nic(Nic(reply_mark=0x80000000)).reply_mark == 0x80000000


def test_nic_mac_is_normalised_lower_case() -> None:
    assert rules.validate_nic(Nic(mac="FA:16:3E:AA:BB:CC")).mac == "fa:16:3e:aa:bb:cc"


@pytest.mark.parametrize(
    ("text", "mac"),
    [
        pytest.param(
            '[{"name":"k8s-pod-network","default":true,"mac":"aa:aa:aa:aa:aa:aa"},'
            '{"name":"tenant/nic2","interface":"net1","mac":"FA:16:3E:01:02:03"}]',
            "fa:16:3e:01:02:03",
            id="multus",
        ),
        pytest.param('[{"name":"pod","default":true,"mac":"aa:aa:aa:aa:aa:aa"}]', None, id="no-attachment"),
    ],
)
def test_mac_from_network_status(text: str, mac: str | None) -> None:
    assert rules.mac_from_network_status(text) == mac


def test_network_status_garbage_is_a_named_error() -> None:
    with pytest.raises(NatConfigError, match=r"network-status\[0\].mac"):
        rules.mac_from_network_status('[{"name":"x","mac":"nope"}]')
    with pytest.raises(NatConfigError, match="network-status: not JSON"):
        rules.mac_from_network_status("{")


def test_exposure_targets_are_only_fabric_side() -> None:
    assert policy().exposure_targets == {IPv4Address("192.0.2.66"), IPv4Address("192.0.2.70")}


@pytest.mark.parametrize(
    "special", ["169.254.169.254", "127.0.0.1", "0.0.0.0", "224.0.0.251", "255.255.255.255"]
)
def test_a_dnat_target_must_be_a_unicast_host(special: str) -> None:
    """Also for a resolved targetHost: the controller only saw the name (DNS could say 169.254.169.254,
    the metadata service seen through the node's port). A literal one is a bad plan (the CRD refuses
    it); a resolved one leaves that exposure out, for the same reason, and the rest is applied."""
    web = dataclasses.replace(nat().exposures[0], target_address=special)
    with pytest.raises(NatConfigError, match=r"nat.exposures\[0\].targetAddress: .* special-purpose"):
        rules.validate(nat(exposures=(web, nat().exposures[1])), nic2_address=NIC2, resolved=RESOLVED)
    p = rules.validate(nat(), nic2_address=NIC2, resolved={"api.fabric.example": IPv4Address(special)})
    (out,) = p.left_out
    assert (out.field, out.exposure, out.host) == ("nat.exposures[1].targetHost", "api", "api.fabric.example")
    assert (
        out.reason
        == f"api.fabric.example resolved to {special}, a special-purpose address, not a unicast host"
    )
    assert not any(special in r for t in rules.render(p).tables for r in t.rules), "never a target"


def test_tombstones_drop_revoked_marks_first_in_our_chain() -> None:
    """In front of the shared established rule, and also in front of the serviceCIDR gate: after a
    serviceCidr change the revoked flows' original destination (the old virtual IP) is outside the new
    CIDR, and the gate would RETURN them before any tombstone."""
    p = policy(nat(grants=(G_B,), reverse_exposures=()))
    old_mask = rules.Flush(A, 0x7FFF0000)
    plain, stoned = rules.render(p).tables[0].rules, rules.render(p, [old_mask, old_mask]).tables[0].rules
    extra = [r for r in stoned if r not in plain]
    assert extra == [
        "-A VPNGW-FORWARD -m connmark --mark 0x10000/0x7fff0000 -m comment --comment "
        '"vpngw revoked until its conntrack flush" -j DROP'
    ], "one DROP per revoked mark, with the mask its entries were marked under"
    assert stoned[0] == extra[0] and stoned[1:] == plain, "first, and nothing else moves"
    two = rules.render(p, [rules.Flush(B, MASK), old_mask]).tables[0].rules
    assert [r.split()[5] for r in two[:2]] == ["0x10000/0x7fff0000", "0x20000/0xfff0000"]
    assert two[2:] == plain
    assert rules.render(p, []) == rules.render(p), "no tombstones, the steady-state ruleset"


def _web(**kw: object) -> tuple[Exposure, ...]:
    return (dataclasses.replace(nat().exposures[0], **kw), nat().exposures[1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("after", "flushed"),
    [
        pytest.param(nat(grants=(G_A,), reverse_exposures=()), set(), id="same"),
        pytest.param(
            nat(grants=(G_A,), reverse_exposures=(), exposures=_web(target_address="192.0.2.67")),
            {A},
            id="target-moved",
        ),
        pytest.param(
            nat(
                grants=(dataclasses.replace(G_A, exposure="www", peer="s1-renamed"),),
                reverse_exposures=(),
                exposures=_web(name="www"),
            ),
            set(),
            id="renamed-admits-the-same",
        ),
        pytest.param(
            nat(grants=(G_A,), reverse_exposures=(), exposures=_web(ports=(Port(80),))), {A}, id="port-gone"
        ),
        pytest.param(
            nat(grants=(G_A,), reverse_exposures=(), exposures=_web(virtual_ip="198.18.0.12")),
            {A},
            id="vip-moved",
        ),
    ],
)
def test_memory_and_kernel_agree_on_what_a_grant_lost(after: Nat, flushed: set[int]) -> None:
    """One rule for both paths (--watch compares policies; a restart compares the kernel's rules with the
    new rendering): a grant is revoked when a (source, protocol, virtual IP, port, TARGET) it admitted
    is gone. The target counts (a flow DNATed to an exposure's old target must not outlive the move)
    and is carried in the admission rule's comment; names do not count."""
    before = policy(nat(grants=(G_A,), reverse_exposures=()))
    now = policy(after)
    assert {g.mark for g in rules.revoked(before, now)} == flushed
    kernel = tables.admissions(r for t in rules.render(before).tables for r in t.rules)
    assert {f.mark for f in tables.revoked_in_kernel(kernel, rules.render(now))} == flushed


def test_the_target_leads_the_admission_comment_so_truncation_cannot_cut_it() -> None:
    long = "p" * 200
    n = nat(
        exposures=(Exposure("e" * 200, "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
        reverse_exposures=(),
        grants=(Grant(long, "e" * 200, "exposure", ("203.0.113.0/28",), A),),
    )
    (admit,) = [r for r in rules.render(policy(n)).tables[0].rules if "--set-xmark" in r]
    assert '--comment "vpngw grant to=192.0.2.66 peer=ppp' in admit
    assert set(tables.admissions([admit])[rules.Flush(A, MASK)]) == {
        "-A VPNGW-FORWARD -s 203.0.113.0/28 -p tcp -m conntrack --ctstate NEW -m conntrack --ctorigdst "
        "198.18.0.10 --ctorigdstport 80 -m connmark --mark 0x0/MASK to=192.0.2.66 "
        "-j CONNMARK --set-xmark 0x10000/MASK"
    }


@pytest.mark.parametrize(
    ("change", "resolved", "message"),
    [
        pytest.param(
            {"exposures": _web(target_address="198.18.0.10")},
            RESOLVED,
            r"exposures\[0\]\.targetAddress: 198\.18\.0\.10 is the virtual IP of nat\.exposures\[0\]",
            id="own-vip",
        ),
        pytest.param(
            {
                "reverse_exposures": (
                    dataclasses.replace(nat().reverse_exposures[0], target_address="198.18.0.11"),
                )
            },
            RESOLVED,
            r"reverseExposures\[0\]\.targetAddress: 198\.18\.0\.11 is the virtual IP of nat\.exposures\[1\]",
            id="reverse-to-a-vip",
        ),
    ],
)
def test_a_target_cannot_be_a_virtual_ip(
    change: dict[str, object], resolved: dict[str, IPv4Address], message: str
) -> None:
    """Traffic DNATed to a virtual IP is not what any exposure means (to its own: our filter drops it)."""
    with pytest.raises(NatConfigError, match=message):
        rules.validate(nat(**change), nic2_address=NIC2, resolved=resolved)


def test_a_wireguard_device_admits_only_dnated_new_connections() -> None:
    p = rules.validate(
        nat(), nic2_address=NIC2, resolved=RESOLVED, tunnel_interfaces=(("wireguard.interface", "wg0"),)
    )
    lines = [r for t in rules.render(p).tables for r in t.rules]
    drop = "-A VPNGW-FORWARD -i wg0 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT"
    (at,) = [i for i, r in enumerate(lines) if r.startswith(drop)]
    gate = [i for i, r in enumerate(lines) if "! --ctorigdst" in r]
    assert lines[at].endswith("-j DROP") and at < gate[0], "before traffic not for a VIP leaves the chain"
    assert not any(" -i " in r for t in rules.render(policy()).tables for r in t.rules), "IPsec: no rule"


@pytest.mark.parametrize("dev", ["", "wg0;reboot", "a" * 16, "wg 0"])
def test_a_bad_wireguard_device_name_is_named(dev: str) -> None:
    with pytest.raises(NatConfigError, match=r"wireguard\.interface: .* is not a network device name"):
        rules.validate(
            nat(), nic2_address=NIC2, resolved=RESOLVED, tunnel_interfaces=(("wireguard.interface", dev),)
        )


def reply_policy(
    n: Nat | None = None, device: str = "ens7", mark: int = rules.DEFAULT_REPLY_MARK
) -> rules.Policy:
    return rules.validate(n or nat(), nic2_address=NIC2, resolved=RESOLVED, reply=rules.Reply(device, mark))


def test_the_reply_bit_defaults_to_bit_28_outside_the_default_mark_mask() -> None:
    assert rules.validate_nic(Nic()).reply_mark == 0x10000000 == rules.DEFAULT_REPLY_MARK
    assert rules.validate_nic(Nic(reply_mark=0x1)).reply_mark == 0x1
    assert not rules.DEFAULT_REPLY_MARK & Nat().mark_mask


def test_the_mangle_chain_marks_nic2_connections_and_restores_the_bit_on_their_replies() -> None:
    rs = rules.render(reply_policy())
    assert [t.table for t in rs.tables] == ["filter", "nat", "mangle"], "mangle last: filter commits first"
    (mangle,) = [t for t in rs.tables if t.table == "mangle"]
    assert mangle.chains == ("VPNGW-MANGLE",)
    assert mangle.rules == (
        "-A VPNGW-MANGLE -i ens7 -m conntrack --ctstate NEW "
        '-m comment --comment "vpngw came in on NIC2" -j CONNMARK --set-xmark 0x10000000/0x10000000',
        '-A VPNGW-MANGLE -m conntrack --ctdir REPLY -m comment --comment "vpngw replies leave through NIC2" '
        "-j CONNMARK --restore-mark --nfmask 0x10000000 --ctmask 0x10000000",
    )
    assert ("mangle", "PREROUTING", "VPNGW-MANGLE") in rules.JUMPS
    assert rs.tables[:2] == rules.render(policy()).tables, "filter and nat do not depend on it"
    assert [t.table for t in rules.render(policy()).tables] == ["filter", "nat"], "no NIC2: no mangle"
    other = rules.render(reply_policy(device="eth9", mark=0x1)).tables[2].rules
    assert other[0].startswith("-A VPNGW-MANGLE -i eth9 ") and other[0].endswith("--set-xmark 0x1/0x1")
    stoned = rules.render(reply_policy(), [rules.Flush(A, MASK)])
    assert stoned.tables[2] == rs.tables[2], "tombstones go into the filter chain only"


@pytest.mark.parametrize(
    ("mask", "mark", "message"),
    [
        pytest.param(
            0x1FFF0000,
            rules.DEFAULT_REPLY_MARK,
            r"nic.replyMark: 0x10000000 \(the default\) is inside nat.markMask 0x1fff0000: .* 0x80000000",
            id="default-inside-a-wider-mask",
        ),
        pytest.param(0xFFFFFFFE, rules.DEFAULT_REPLY_MARK, r"e.g. 0x1$", id="widest-mask-leaves-bit-0"),
        pytest.param(
            MASK, 0x10000, r"nic.replyMark: 0x10000 is inside nat.markMask 0xfff0000", id="a-grant-bit"
        ),
        pytest.param(MASK, 0x30000000, r"nic.replyMark: 0x30000000 is not a single bit", id="two-bits"),
    ],
)
def test_the_reply_bit_must_lie_outside_the_grants_mark_mask(mask: int, mark: int, message: str) -> None:
    n = nat(mark_mask=mask, grants=())
    with pytest.raises(NatConfigError, match=message):
        reply_policy(n, mark=mark)


def test_the_widest_mark_mask_works_with_the_bit_it_leaves_free() -> None:
    n = nat(mark_mask=0xFFFFFFFE, grants=(Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x2),))
    (mangle,) = rules.render(reply_policy(n, mark=0x1)).tables[2:]
    assert mangle.rules[0].endswith("--set-xmark 0x1/0x1")


@pytest.mark.parametrize("device", ["-j ACCEPT", "ens 7", "x" * 16, ""])
def test_a_nic2_name_that_cannot_be_an_iptables_argument_is_refused(device: str) -> None:
    with pytest.raises(NatConfigError, match=r"nic: NIC2's name .* cannot be used in an iptables rule"):
        reply_policy(device=device)


def test_the_reply_bit_changes_no_grant_decision() -> None:
    """Grants set only their mask's bits and revocation compares admissions: the bit is invisible to both."""
    with_reply, without = reply_policy(), policy()
    assert rules.revoked(without, with_reply) == () and rules.revoked(with_reply, without) == ()
    assert with_reply.admissions == without.admissions


# --- exposures left out: what DNS or the pod refuses, per exposure ---------------------------------------

GHOST = Exposure("ghost", "198.18.0.12", (Port(443),), target_host="nonexistent.invalid")
G_GHOST = Grant("s3", "ghost", "exposure", ("203.0.113.32/28",), 0x40000)
NXDOMAIN = rules.Unresolved("[Errno -2] Name or service not known", temporary=False)


def test_an_unresolvable_host_leaves_its_exposure_and_grants_out_and_applies_the_rest() -> None:
    n = nat(exposures=(*nat().exposures, GHOST), grants=(*nat().grants, G_GHOST))
    p = rules.validate(n, nic2_address=NIC2, resolved={**RESOLVED, "nonexistent.invalid": NXDOMAIN})
    (out,) = p.left_out
    assert out == rules.LeftOut(
        field="nat.exposures[2].targetHost",
        exposure="ghost",
        vip=IPv4Address("198.18.0.12"),
        reason="nonexistent.invalid does not resolve: [Errno -2] Name or service not known",
        host="nonexistent.invalid",
        grants=(G_GHOST,),
    )
    assert p.grants == nat().grants and 0x40000 not in p.marks, "its grant is left out with it"
    rest = policy()
    assert p.admissions == rest.admissions and p.services == rest.services, "everything else as without it"
    lines = [r for t in rules.render(p).tables for r in t.rules]
    assert [r for r in lines if r not in [r for t in rules.render(rest).tables for r in t.rules]] == [
        "-A VPNGW-FORWARD -m conntrack --ctorigdst 198.18.0.12 "
        '-m comment --comment "vpngw not granted" -j DROP'
    ], "its virtual IP is dropped, nothing else differs"


def test_leaving_an_exposure_out_revokes_its_grants_and_a_revocation_in_the_same_plan_still_happens() -> None:
    """The issue: an unresolvable targetHost made init-nat apply nothing, so a grant revoked in the same
    plan stayed live. Now the revocation goes through, and the left-out exposure's grants are revoked
    too (their flows were DNATed to a target the plan can no longer be held to)."""
    api = Grant("s3", "api", "exposure", ("203.0.113.32/28",), 0x40000)
    before = policy(nat(grants=(G_A, G_B, api), reverse_exposures=()))
    after = rules.validate(
        nat(grants=(G_B, api), reverse_exposures=()),
        nic2_address=NIC2,
        resolved={"api.fabric.example": rules.Unresolved("no answer within 2 s", temporary=True)},
    )
    assert [x.exposure for x in after.left_out] == ["api"]
    assert {g.mark for g in rules.revoked(before, after)} == {A, 0x40000}
    kernel = tables.admissions(r for t in rules.render(before).tables for r in t.rules)
    assert {f.mark for f in tables.revoked_in_kernel(kernel, rules.render(after))} == {A, 0x40000}


def test_a_target_outside_the_namespaces_allowance_is_left_out_when_its_name_resolves_there() -> None:
    """The controller checks address targets against the operator's allowance; a name is resolved in the
    pod, so init-nat checks the address it resolves to (nat.allowedTargets)."""
    allowed = nat(allowed_targets=("192.0.2.64/26",))
    assert policy(allowed).left_out == (), "192.0.2.70 is inside"
    p = rules.validate(allowed, nic2_address=NIC2, resolved={"api.fabric.example": IPv4Address("10.0.0.5")})
    (out,) = p.left_out
    assert (out.exposure, out.field) == ("api", "nat.exposures[1].targetHost")
    assert out.reason == (
        "10.0.0.5 (resolved from api.fabric.example) is outside the exposure targets the operator allows "
        "(192.0.2.64/26)"
    )
    nothing = rules.validate(nat(allowed_targets=()), nic2_address=NIC2, resolved=RESOLVED)
    assert {x.exposure for x in nothing.left_out} == {"web", "api"}, "an empty allowance allows nothing"
    assert {x.exposure for x in policy(nat()).left_out} == set(), "no allowance in the plan: no restriction"


def test_a_host_resolved_to_a_virtual_ip_is_left_out_naming_it() -> None:
    p = rules.validate(nat(), nic2_address=NIC2, resolved={"api.fabric.example": IPv4Address("198.18.0.20")})
    (out,) = p.left_out
    assert out.reason == (
        "api.fabric.example resolved to 198.18.0.20, the virtual IP of nat.reverseExposures[0]; "
        "a target must be a real address"
    )


@pytest.mark.parametrize(
    ("change", "resolved", "field", "reason"),
    [
        pytest.param(
            {"exposures": _web(target_address="192.0.2.2")},
            RESOLVED,
            "nat.exposures[0].targetAddress",
            "192.0.2.2 is the pod's own address",
            id="literal-nic2",
        ),
        pytest.param(
            {},
            {"api.fabric.example": IPv4Address("10.244.0.2")},
            "nat.exposures[1].targetHost",
            "10.244.0.2 is the pod's own address (resolved from api.fabric.example)",
            id="resolved-eth0",
        ),
    ],
)
def test_a_target_is_never_the_pods_own_address(
    change: dict[str, object], resolved: dict[str, IPv4Address], field: str, reason: str
) -> None:
    """DNAT to the pod itself would hand a tunnel peer the pod's own ports (probe, metrics, IKE). The pod's
    addresses are not the plan's to know (eth0's comes from the CNI), so this is per exposure."""
    p = rules.validate(
        nat(**change), nic2_address=NIC2, resolved=resolved, own_addresses=[IPv4Address("10.244.0.2")]
    )
    (out,) = p.left_out
    assert (out.field, out.reason) == (field, reason)


def test_a_left_out_exposure_is_still_validated_as_part_of_the_plan() -> None:
    """Only the target is refused per exposure; a bad value of the plan itself still rejects the plan."""
    bad = dataclasses.replace(GHOST, ports=(Port(0),))
    with pytest.raises(NatConfigError, match=r"nat.exposures\[2\].ports\[0\].port"):
        rules.validate(
            nat(exposures=(*nat().exposures, bad)),
            nic2_address=NIC2,
            resolved={**RESOLVED, "nonexistent.invalid": NXDOMAIN},
        )
    with pytest.raises(NatConfigError, match=r"nat.grants\[3\].mark: 0x10000 is already the mark"):
        rules.validate(
            nat(
                exposures=(*nat().exposures, GHOST),
                grants=(*nat().grants, dataclasses.replace(G_GHOST, mark=A)),
            ),
            nic2_address=NIC2,
            resolved={**RESOLVED, "nonexistent.invalid": NXDOMAIN},
        )


def test_target_hosts_are_normalised_once_each_and_bad_names_refused_before_dns() -> None:
    twice = dataclasses.replace(
        GHOST, name="g2", virtual_ip="198.18.0.13", target_host="NonExistent.Invalid."
    )
    assert rules.target_hosts(nat(exposures=(*nat().exposures, GHOST, twice))) == (
        "api.fabric.example",
        "nonexistent.invalid",
    )
    with pytest.raises(NatConfigError, match=r"nat.exposures\[0\].targetHost: .* not a DNS hostname"):
        rules.target_hosts(nat(exposures=(dataclasses.replace(GHOST, target_host="x; rm -rf /"),)))


def test_a_name_dns_cannot_answer_for_a_moment_keeps_its_address_a_name_without_one_does_not() -> None:
    last = {"a.example": IPv4Address("192.0.2.70"), "b.example": IPv4Address("192.0.2.71")}
    outage = rules.Unresolved("no answer within 2 s", temporary=True)
    answers: dict[str, rules.Answer] = {
        "a.example": outage,
        "b.example": NXDOMAIN,
        "c.example": outage,
        "d.example": IPv4Address("192.0.2.72"),
    }
    used, kept = rules.keep_last(answers, last)
    assert used == {
        "a.example": IPv4Address("192.0.2.70"),
        "b.example": NXDOMAIN,
        "c.example": outage,
        "d.example": IPv4Address("192.0.2.72"),
    }
    assert kept == (rules.Kept("a.example", IPv4Address("192.0.2.70"), "no answer within 2 s"),)


def test_only_addresses_in_force_are_remembered() -> None:
    p = rules.validate(
        nat(), nic2_address=NIC2, resolved={"api.fabric.example": IPv4Address("169.254.169.254")}
    )
    assert rules.remember({"api.fabric.example": IPv4Address("169.254.169.254")}, p) == {}, "refused"
    assert rules.remember(RESOLVED, policy()) == RESOLVED
    assert rules.remember({"api.fabric.example": NXDOMAIN}, policy()) == {}


# --- the pod guard: what reaches the pod itself ----------------------------------------------------------


def guarded(guard: rules.Guard, n: Nat | None = None) -> list[str]:
    p = rules.validate(n or nat(), nic2_address=NIC2, resolved=RESOLVED, guard=guard)
    return [r for t in rules.render(p).tables for r in t.rules]


def test_an_ipsec_pod_takes_ike_and_esp_on_nic2_and_nothing_new_from_its_tunnels() -> None:
    lines = guarded(rules.Guard("ens7", ipsec=True))
    assert [r for r in lines if r.startswith("-A VPNGW-INPUT ")] == [
        "-A VPNGW-INPUT -m conntrack --ctstate RELATED,ESTABLISHED "
        '-m comment --comment "vpngw replies to the pod" -j RETURN',
        '-A VPNGW-INPUT -m policy --dir in --pol ipsec -m comment --comment "vpngw tunnel traffic is not for '
        'the pod" -j DROP',
        '-A VPNGW-INPUT -i ipsec+ -m comment --comment "vpngw tunnel traffic is not for the pod" -j DROP',
        '-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 500 -m comment --comment "vpngw IKE" -j RETURN',
        '-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 4500 -m comment --comment "vpngw IKE" -j RETURN',
        '-A VPNGW-INPUT -i ens7 -p esp -m comment --comment "vpngw ESP" -j RETURN',
        '-A VPNGW-INPUT -i ens7 -m comment --comment "vpngw NIC2 is for the tunnels only" -j DROP',
    ]
    assert [r for r in lines if r.startswith("-A VPNGW-OUTPUT ")] == [
        "-A VPNGW-OUTPUT -d 169.254.169.254/32 -o ens7 "
        '-m comment --comment "vpngw never the metadata service" -j DROP'
    ]
    first_target = next(r for r in lines if r.startswith("-A VPNGW-TARGETS "))
    assert first_target == (
        "-A VPNGW-TARGETS -d 169.254.169.254/32 "
        '-m comment --comment "vpngw never the metadata service" -j DROP'
    ), "first: nothing forwarded to it, whatever the exposures"
    assert not any("ACCEPT" in r for r in lines if r.startswith(("-A VPNGW-INPUT", "-A VPNGW-OUTPUT"))), (
        "our pod chains never accept on behalf of the rest of INPUT/OUTPUT: RETURN or DROP"
    )


def test_a_wireguard_pod_takes_its_listen_port_on_nic2_and_nothing_new_from_its_device() -> None:
    lines = [
        r for r in guarded(rules.Guard("ens7", wireguard=("wg0", 51821))) if r.startswith("-A VPNGW-INPUT ")
    ]
    assert lines[1:] == [
        '-A VPNGW-INPUT -i wg0 -m comment --comment "vpngw tunnel traffic is not for the pod" -j DROP',
        '-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 51821 -m comment --comment "vpngw WireGuard" -j RETURN',
        '-A VPNGW-INPUT -i ens7 -m comment --comment "vpngw NIC2 is for the tunnels only" -j DROP',
    ]


def test_tunnel_traffic_is_dropped_before_nic2s_allowances_are_looked_at() -> None:
    """Under kernel XFRM a decapsulated packet comes in on NIC2 too: UDP 500 to an inner address must not
    pass as IKE. The tunnel rules (policy, devices) come first; only replies pass before them."""
    lines = [r for r in guarded(rules.Guard("ens7", ipsec=True)) if r.startswith("-A VPNGW-INPUT ")]
    tunnel = [i for i, r in enumerate(lines) if "tunnel traffic is not for the pod" in r]
    allowed = [i for i, r in enumerate(lines) if r.endswith("-j RETURN") and "-i ens7" in r]
    assert max(tunnel) < min(allowed) and "RELATED,ESTABLISHED" in lines[0]


def test_the_guard_adds_the_input_and_output_chains_and_the_target_list_even_without_targets() -> None:
    reverse_only = nat(exposures=(), grants=(Grant("s1", "db", "reverse", ("10.1.0.0/16",), C),))
    p = rules.validate(reverse_only, nic2_address=NIC2, guard=rules.Guard("ens7", ipsec=True))
    (flt, _) = rules.render(p).tables
    assert flt.chains == ("VPNGW-FORWARD", "VPNGW-TARGETS", "VPNGW-INPUT", "VPNGW-OUTPUT")
    assert any(r.endswith("-j VPNGW-TARGETS") for r in flt.rules), "the metadata rule needs the jump"
    assert [c for t in rules.render(policy(reverse_only)).tables for c in t.chains] == [
        "VPNGW-FORWARD",
        "VPNGW-TARGETS",
        "VPNGW-PREROUTING",
        "VPNGW-EXPOSURES",
        "VPNGW-POSTROUTING",
    ], "without a guard (no NIC2 known), no pod chains"


def test_the_guard_leaves_grants_and_revocation_alone() -> None:
    before = policy()
    after = rules.validate(nat(), nic2_address=NIC2, resolved=RESOLVED, guard=rules.Guard("ens7", ipsec=True))
    assert rules.revoked(before, after) == () and after.admissions == before.admissions
    kernel = tables.admissions(r for t in rules.render(before).tables for r in t.rules)
    assert tables.revoked_in_kernel(kernel, rules.render(after)) == frozenset()


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        pytest.param(rules.Guard("-j ACCEPT", ipsec=True), r"nic: NIC2's name", id="nic"),
        pytest.param(rules.Guard("ens7", wireguard=("wg 0", 51820)), r"wireguard.interface: ", id="dev"),
        pytest.param(rules.Guard("ens7", wireguard=("wg0", 0)), r"wireguard.listenPort: 0 ", id="port"),
    ],
)
def test_the_guards_values_are_checked(guard: rules.Guard, message: str) -> None:
    with pytest.raises(NatConfigError, match=message):
        rules.validate(nat(), nic2_address=NIC2, resolved=RESOLVED, guard=guard)


# --- hostile neighbours and peers: what comes in through NIC2 and the tunnels ----------------------------


def test_exposures_are_dnated_only_for_what_came_through_a_tunnel() -> None:
    """An exposure's DNAT applied to packets from any interface: a neighbour on the transit network
    (NIC2) got to the target through the virtual IP (test_initnat_hostile.py). Exposures now live in
    their own chain, reached by a goto per way a tunnel's packets come in; a goto's chain that ends
    returns to PREROUTING itself, so a tunnel's packets never reach the reverse exposures' DNAT below."""
    ipsec = guarded(rules.Guard("ens7", ipsec=True))
    assert [r for r in ipsec if r.startswith("-A VPNGW-PREROUTING ")] == [
        '-A VPNGW-PREROUTING -m policy --dir in --pol ipsec -m comment --comment "vpngw from a tunnel: '
        'exposures" -g VPNGW-EXPOSURES',
        '-A VPNGW-PREROUTING -i ipsec+ -m comment --comment "vpngw from a tunnel: exposures" '
        "-g VPNGW-EXPOSURES",
        "-A VPNGW-PREROUTING -d 198.18.0.20/32 -p tcp -m tcp --dport 5432 -m comment --comment "
        '"vpngw reverse=db" -j DNAT --to-destination 203.0.113.5:5432',
    ], "the ways in first; then only reverse exposures, for what did not come through a tunnel"
    exposures = [r for r in ipsec if r.startswith("-A VPNGW-EXPOSURES ")]
    assert len(exposures) == 3 and all("-j DNAT --to-destination 192.0.2." in r for r in exposures)
    wg = guarded(rules.Guard("ens7", wireguard=("wg0", 51820)))
    assert [
        r.split(" -m comment")[0] for r in wg if r.startswith("-A VPNGW-PREROUTING ") and " -g " in r
    ] == ["-A VPNGW-PREROUTING -i wg0"]
    p = rules.validate(
        nat(), nic2_address=NIC2, resolved=RESOLVED, tunnel_interfaces=[("wireguard.interface", "wg1")]
    )
    assert p.from_tunnels == ("-i wg1",), "a caller without the guard but with the WireGuard device"
    assert rules.tunnel_matches(rules.Guard("ens7", ipsec=True), ["ipsec+"]) == (
        "-m policy --dir in --pol ipsec",
        "-i ipsec+",
    ), "each way in once"


def test_nothing_new_from_nic2_is_forwarded_unless_we_dnated_it() -> None:
    """NIC2 is the shared transit network: a neighbour making the pod its next hop got into a WireGuard
    peer's network (encrypted by destination), into an IPsec tunnel (with a serviceCIDR source), into
    the cluster behind eth0. The rule comes before everything but the tombstones and the tunnel's own."""
    p = rules.validate(
        nat(),
        nic2_address=NIC2,
        resolved=RESOLVED,
        tunnel_interfaces=[("wireguard.interface", "wg0")],
        guard=rules.Guard("ens7", wireguard=("wg0", 51820)),
    )
    lines = [r for r in rules.render(p).tables[0].rules if r.startswith("-A VPNGW-FORWARD ")]
    assert lines[:3] == [
        "-A VPNGW-FORWARD -m conntrack --ctstate INVALID "
        '-m comment --comment "vpngw conntrack invalid" -j DROP',
        "-A VPNGW-FORWARD -i wg0 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw tunnel ingress only to virtual IPs" -j DROP',
        "-A VPNGW-FORWARD -i ens7 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw from NIC2 only what we DNATed" -j DROP',
    ]
    assert not any("-i " in r for r in [x for x in rules.render(policy()).tables[0].rules]), "no NIC2 known"


def test_service_cidr_is_entered_only_through_our_dnat() -> None:
    """A tunnel's selector (serviceCIDR) lets a peer send to any address in it; one that is no virtual IP
    went on wherever the routes said (in a pod: eth0). After the gate, a NEW connection not DNATed drops:
    the admission rules below only ever see connections we DNATed."""
    forward = [r for r in rules.render(policy()).tables[0].rules if r.startswith("-A VPNGW-FORWARD ")]
    gate = next(i for i, r in enumerate(forward) if "vpngw not for a virtual IP" in r)
    assert forward[gate + 1] == (
        "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw serviceCIDR only through DNAT" -j DROP'
    )
    assert all("--set-xmark" not in r for r in forward[: gate + 2]), "before every admission"


@pytest.mark.parametrize("name", ["db", "DB.", "localhost"])
def test_a_single_label_target_host_is_left_out_and_never_asked_about(name: str) -> None:
    """In the pod a single label is resolved under the gateway namespace's search list (an operator-owned
    namespace): ``db`` would be the operator's Service. targetHost must be fully qualified."""
    single = dataclasses.replace(GHOST, target_host=name)
    n = nat(exposures=(*nat().exposures, single), grants=(*nat().grants, G_GHOST))
    assert rules.target_hosts(n) == ("api.fabric.example",), "DNS is not asked about it"
    p = rules.validate(n, nic2_address=NIC2, resolved=RESOLVED)
    (out,) = p.left_out
    host = name.rstrip(".").lower()
    assert (out.field, out.exposure, out.host, out.grants) == (
        "nat.exposures[2].targetHost",
        "ghost",
        host,
        (G_GHOST,),
    )
    assert out.reason.startswith(f"{host} is a single-label name: a targetHost must be fully qualified")
    assert rules.fully_qualified("db.example") and not rules.fully_qualified("db")


def test_ipv6_on_nic2_and_the_tunnels_is_dropped() -> None:
    """The data plane is IPv4 only, but NIC2 has an IPv6 link-local address: a neighbour reached the
    pod's IPv6 listeners and gave it a default route by router advertisement (test_initnat_hostile.py)."""
    (t,) = rules.ipv6_rules(rules.Guard("ens7", ipsec=True)).tables
    assert (t.table, t.chains) == ("filter", ("VPNGW-FORWARD", "VPNGW-INPUT", "VPNGW-OUTPUT"))
    assert [
        r.replace(' -m comment --comment "vpngw no IPv6 on NIC2"', "").replace(
            ' -m comment --comment "vpngw no IPv6 in the tunnels"', ""
        )
        for r in t.rules
    ] == [
        "-A VPNGW-FORWARD -i ens7 -j DROP",
        "-A VPNGW-FORWARD -o ens7 -j DROP",
        "-A VPNGW-FORWARD -i ipsec+ -j DROP",
        "-A VPNGW-FORWARD -o ipsec+ -j DROP",
        "-A VPNGW-INPUT -i ens7 -j DROP",
        "-A VPNGW-INPUT -i ipsec+ -j DROP",
        "-A VPNGW-OUTPUT -o ens7 -j DROP",
    ]
    (w,) = rules.ipv6_rules(rules.Guard("ens7", wireguard=("wg0", 51820))).tables
    assert '-A VPNGW-INPUT -i wg0 -m comment --comment "vpngw no IPv6 in the tunnels" -j DROP' in w.rules
    assert not any("eth0" in r or "ACCEPT" in r for r in t.rules + w.rules), "the cluster side is left alone"
