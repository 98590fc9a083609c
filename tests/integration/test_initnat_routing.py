"""initnat.routing against real netlink in a throwaway namespace: NIC2 found by MAC under any name, our
policy rule and table idempotent, foreign rules and routes untouched, stale ones of ours replaced."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Interface

import pytest
from pyroute2 import IPRoute

from gwplan import Nic
from initnat import routing, rules
from lab import netns

pytestmark = [pytest.mark.lab]

MAC = "fa:16:3e:12:34:56"


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-rt"
    netns.add_ns(name, netns.POD_SYSCTLS)  # as a pod's namespace: no forwarding, strict rp_filter
    try:
        # NIC2 named ens9 (not net1), like a host-device attachment; a foreign rule and route exist.
        netns.run(
            ["ip", "-n", name, "link", "add", "ens9", "address", MAC, "type", "veth", "peer", "name", "peer9"]
        )
        for dev in ("ens9", "peer9"):
            netns.run(["ip", "-n", name, "link", "set", dev, "up"])
        netns.addr(name, "ens9", "192.0.2.2/26")
        netns.run(["ip", "-n", name, "rule", "add", "from", "10.1.1.1", "lookup", "77", "priority", "500"])
        netns.route(name, "10.5.0.0/16", "via", "192.0.2.1", "dev", "ens9", "table", "77")
        yield name
    finally:
        netns.destroy_ns(name)


@pytest.fixture
def ipr(ns: str) -> Iterator[IPRoute]:
    with IPRoute(netns=ns, flags=0) as handle:
        yield handle


def show(ns: str, *args: str) -> str:
    return netns.run(["ip", "-n", ns, *args]).stdout.decode()


def test_nic2_by_mac_whatever_its_name_with_address_from_the_interface(ipr: IPRoute) -> None:
    cfg = rules.validate_nic(Nic(gateway="192.0.2.1"))
    nic = routing.find_nic(ipr, cfg, MAC.upper())
    assert (nic.name, nic.address, nic.gateway) == (
        "ens9",
        IPv4Interface("192.0.2.2/26"),
        IPv4Address("192.0.2.1"),
    )


def test_absent_nic_and_missing_gateway_are_clear_errors(ipr: IPRoute) -> None:
    with pytest.raises(routing.NicError, match=r"no interface with MAC fa:16:3e:00:00:99"):
        routing.find_nic(ipr, rules.validate_nic(Nic()), "fa:16:3e:00:00:99")
    with pytest.raises(routing.NicError, match=r"nic\.gateway: not in the plan and no route via ens9"):
        routing.find_nic(ipr, rules.validate_nic(Nic()), MAC)
    with pytest.raises(routing.NicError, match=r"nic\.gateway: 10\.0\.0\.1 is not on NIC2.s subnet"):
        routing.find_nic(ipr, rules.validate_nic(Nic(gateway="10.0.0.1")), MAC)


def test_policy_routing_is_idempotent_and_touches_only_ours(ns: str, ipr: IPRoute) -> None:
    cfg = rules.validate_nic(Nic(gateway="192.0.2.1", table=100, rule_priority=1000))
    nic = routing.find_nic(ipr, cfg, MAC)
    foreign = (show(ns, "rule"), show(ns, "route", "show", "table", "77"), show(ns, "route"))
    targets = {IPv4Address("192.0.2.66"), IPv4Address("192.0.2.70")}
    first = routing.ensure(ipr, nic, cfg, targets)
    assert first.rule and first.route and first.targets
    rule_text = show(ns, "rule")
    assert "1000:\tfrom 192.0.2.2 lookup 100" in rule_text
    assert "1001:\tfrom all to 192.0.2.66 lookup 100" in rule_text
    table = show(ns, "route", "show", "table", "100")
    assert "default via 192.0.2.1 dev ens9" in table and "192.0.2.0/26 dev ens9" in table
    state = (rule_text, table)

    again = routing.ensure(ipr, nic, cfg, targets)
    assert not again.changed, again
    assert (show(ns, "rule"), show(ns, "route", "show", "table", "100")) == state
    assert "1002:\tfrom all fwmark 0x10000000/0x10000000 lookup main suppress_prefixlength 0" in rule_text
    assert "1003:\tfrom all fwmark 0x10000000/0x10000000 lookup 100" in rule_text
    assert (
        rule_text.replace("1000:\tfrom 192.0.2.2 lookup 100\n", "")
        .replace("1001:\tfrom all to 192.0.2.66 lookup 100\n", "")
        .replace("1001:\tfrom all to 192.0.2.70 lookup 100\n", "")
        .replace("1002:\tfrom all fwmark 0x10000000/0x10000000 lookup main suppress_prefixlength 0\n", "")
        .replace("1003:\tfrom all fwmark 0x10000000/0x10000000 lookup 100\n", "")
        == foreign[0]
    ), "foreign rules untouched"
    assert (show(ns, "route", "show", "table", "77"), show(ns, "route")) == foreign[1:]

    # A target dropped from the plan loses its rule; the other keeps its own.
    assert routing.ensure(ipr, nic, cfg, {IPv4Address("192.0.2.66")}).targets
    assert "to 192.0.2.70" not in show(ns, "rule") and "to 192.0.2.66" in show(ns, "rule")


def test_stale_rule_of_ours_is_replaced_when_nic2s_address_changes(ns: str, ipr: IPRoute) -> None:
    cfg = rules.validate_nic(Nic(gateway="192.0.2.1"))
    routing.ensure(ipr, routing.find_nic(ipr, cfg, MAC), cfg)
    netns.run(["ip", "-n", ns, "addr", "flush", "dev", "ens9"])
    moved = rules.validate_nic(Nic(address="192.0.2.5/26", gateway="192.0.2.1"))
    nic = routing.find_nic(ipr, moved, MAC)
    change = routing.ensure(ipr, nic, moved)
    assert change.rule and change.address
    rule_text = show(ns, "rule")
    assert "from 192.0.2.5 lookup 100" in rule_text and "from 192.0.2.2 lookup 100" not in rule_text
    assert "192.0.2.5/26" in show(ns, "addr", "show", "dev", "ens9")


REPLY_MAIN = "1002:\tfrom all fwmark {m}/{m} lookup main suppress_prefixlength 0"
REPLY_OURS = "1003:\tfrom all fwmark {m}/{m} lookup 100"


def test_reply_rules_route_the_reply_bit_to_nic2_and_only_ours_are_managed(ns: str, ipr: IPRoute) -> None:
    """The two fwmark rules: a packet with the reply bit leaves through NIC2 instead of the main table's
    default route, while main's specific routes still win; a replyMark change replaces ours; rules at
    our priorities that are not ours stay."""
    # A pod-like main table: the default route elsewhere (a second veth stands in for eth0), a specific one.
    netns.run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "c-gw"])
    for dev in ("eth0", "c-gw"):
        netns.run(["ip", "-n", ns, "link", "set", dev, "up"])
    netns.addr(ns, "eth0", "10.244.0.2/30")
    netns.route(ns, "default", "via", "10.244.0.1")
    netns.route(ns, "203.0.113.0/28", "dev", "peer9")  # as a WireGuard peer's route lives in main
    foreign = [
        ["fwmark", "0x10000000/0x10000000", "lookup", "77", "priority", "1002"],  # another table
        ["from", "10.3.3.3", "lookup", "main", "priority", "1002"],  # main, but no fwmark: not ours
    ]
    for args in foreign:
        netns.run(["ip", "-n", ns, "rule", "add", *args])
    cfg = rules.validate_nic(Nic(gateway="192.0.2.1"))
    nic = routing.find_nic(ipr, cfg, MAC)
    assert routing.ensure(ipr, nic, cfg).reply
    text = show(ns, "rule")
    m = "0x10000000"
    assert REPLY_MAIN.format(m=m) in text and REPLY_OURS.format(m=m) in text
    assert "1002:\tfrom all fwmark 0x10000000/0x10000000 lookup 77" in text
    assert "1002:\tfrom 10.3.3.3 lookup main" in text

    def route(*args: str) -> str:
        return show(ns, "route", "get", *args)

    assert "dev eth0" in route("198.51.100.7"), "unmarked: the pod's default route"
    assert "via 192.0.2.1 dev ens9 table 100" in route("198.51.100.7", "mark", m), "marked: NIC2"
    assert "dev peer9" in route("203.0.113.5", "mark", m), "marked, but main's specific route wins"
    assert "dev ens9" in route("192.0.2.9", "mark", m), "NIC2's own subnet"

    state = show(ns, "rule")
    assert not routing.ensure(ipr, nic, cfg).changed, "idempotent"
    assert show(ns, "rule") == state
    # A rule of ours deleted by hand (drift) is put back.
    netns.run(["ip", "-n", ns, "rule", "del", "priority", "1003", "fwmark", f"{m}/{m}", "lookup", "100"])
    assert "dev eth0" in route("198.51.100.7", "mark", m), "without it the reply takes eth0"
    assert routing.ensure(ipr, nic, cfg).reply and show(ns, "rule") == state

    # Another bit: ours are replaced, the foreign ones at our priority stay.
    other = rules.validate_nic(Nic(gateway="192.0.2.1", reply_mark=0x1))
    assert routing.ensure(ipr, nic, other).reply
    text = show(ns, "rule")
    assert REPLY_MAIN.format(m="0x1") in text and REPLY_OURS.format(m="0x1") in text
    assert REPLY_MAIN.format(m=m) not in text and REPLY_OURS.format(m=m) not in text
    assert "1002:\tfrom all fwmark 0x10000000/0x10000000 lookup 77" in text
    assert "1002:\tfrom 10.3.3.3 lookup main" in text
    assert "via 192.0.2.1 dev ens9 table 100" in route("198.51.100.7", "mark", "0x1")
    assert not routing.ensure(ipr, nic, other).changed
