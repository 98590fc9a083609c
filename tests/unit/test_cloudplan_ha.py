"""Warm-standby HA's cloud decisions (pure): slot b's port name and tag, the floating IP's moves
(disassociate first), and the address pairs on the active slot's port only. The lab reads no address
pairs (no port security is modelled): these tests are where a pair left on the standby's port is caught."""

from __future__ import annotations

import pytest

from controller.cloudplan import (
    adoption_refusal,
    floating_ip_updates,
    gateway_of,
    other_slot,
    port_name,
    resource_name,
    slot_of,
    slot_pairs,
    slot_tag,
    tags,
)
from controller.names import GatewayKey

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")
SERVICE = "198.18.0.0/24"


def test_slot_a_is_the_port_without_ha_and_slot_b_its_own() -> None:
    assert port_name(KEY, "a") == resource_name(KEY) == "vpngw-acme.tenant-acme"
    assert port_name(KEY, "b") == "vpngw-acme.tenant-acme#b"
    assert slot_tag("a") is None and slot_tag("b") == "vpngw-slot:b"
    assert "," not in str(slot_tag("b")), "Neutron's tag filter splits on commas"
    assert slot_of(tags(KEY, "vpngw")) == "a"
    assert slot_of([*tags(KEY, "vpngw"), "vpngw-slot:b"]) == "b"
    assert other_slot("a") == "b" and other_slot("b") == "a"


def test_slot_b_name_meets_no_other_gateways_port_name() -> None:
    """``<name>-b`` would be slot a's port name of the same gateway in namespace ``tenant-acme-b``, and an
    untagged port is adopted by its name."""
    neighbour = GatewayKey("VPNGateway", "tenant-acme-b", "acme")
    dotted = GatewayKey("VPNGateway", "b", "acme.tenant-acme")
    names = {port_name(k, s) for k in (neighbour, dotted) for s in ("a", "b")}
    assert port_name(KEY, "b") not in names


def test_slot_b_port_is_the_same_gateway_and_not_foreign() -> None:
    b = [*tags(KEY, "vpngw"), str(slot_tag("b"))]
    assert gateway_of(b) == KEY, "the sweep counts it for the gateway"
    assert adoption_refusal("port p", b, KEY, "vpngw") is None, "not another gateway's"


@pytest.mark.parametrize(
    "on, to, updates",
    [
        pytest.param("pa", "pa", (), id="there-already"),
        pytest.param(None, "pa", ("pa",), id="on-no-port-associate"),
        pytest.param("", "pb", ("pb",), id="empty-port-id-is-no-port"),
        pytest.param("pa", "pb", (None, "pb"), id="another-port-disassociate-first"),
    ],
)
def test_a_floating_ip_moves_by_disassociating_first(
    on: str | None, to: str, updates: tuple[str | None, ...]
) -> None:
    assert floating_ip_updates(on, to) == updates


THEIRS = {"ip_address": "192.0.2.50/32"}


@pytest.mark.parametrize(
    "active, a_before, b_before, a_after, b_after",
    [
        pytest.param(
            "a",
            [THEIRS],
            [],
            [THEIRS, {"ip_address": "198.18.0.4/32"}],
            [],
            id="active-a-pairs-on-a",
        ),
        pytest.param(
            "b",
            [THEIRS, {"ip_address": "198.18.0.4/32"}],
            [],
            [THEIRS],
            [{"ip_address": "198.18.0.4/32"}],
            id="failover-pairs-move-to-b-theirs-stay-on-a",
        ),
        pytest.param(
            "a",
            [],
            [{"ip_address": "198.18.0.4/32"}, {"ip_address": "198.18.0.9/32"}, THEIRS],
            [{"ip_address": "198.18.0.4/32"}],
            [THEIRS],
            id="back-to-a-every-one-of-ours-off-b",
        ),
    ],
)
def test_address_pairs_are_on_the_active_slots_port_only(
    active: str,
    a_before: list[dict[str, str]],
    b_before: list[dict[str, str]],
    a_after: list[dict[str, str]],
    b_after: list[dict[str, str]],
) -> None:
    assert active in ("a", "b")
    got = slot_pairs({"a": a_before, "b": b_before}, ["198.18.0.4"], SERVICE, "a" if active == "a" else "b")
    assert list(got["a"].pairs) == a_after and list(got["b"].pairs) == b_after
    assert got["a"].changed == (a_before != a_after) and got["b"].changed == (b_before != b_after)


def test_pairs_already_in_place_change_nothing() -> None:
    got = slot_pairs({"a": [THEIRS], "b": [{"ip_address": "198.18.0.4/32"}]}, ["198.18.0.4"], SERVICE, "b")
    assert not got["a"].changed and not got["b"].changed
