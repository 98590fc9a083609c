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
    netns.add_ns(name)
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
    assert (
        rule_text.replace("1000:\tfrom 192.0.2.2 lookup 100\n", "")
        .replace("1001:\tfrom all to 192.0.2.66 lookup 100\n", "")
        .replace("1001:\tfrom all to 192.0.2.70 lookup 100\n", "")
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
