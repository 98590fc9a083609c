"""The static cloud with warm-standby HA: slot b's NIC2 is the ``staticNICs`` entry ``namespace/name#b``
(parsed with field-path errors), reported as ``nic_b``; nothing is moved (no floating IP: the operator
routes the public address to the active slot)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from controller.cloud import CloudState, CloudWant, HaWant, StaticCloud
from controller.desired import Nic2
from controller.names import GatewayKey
from controller.settings import SettingsError, from_config

KEY = GatewayKey("VPNGateway", "t", "hq")
A = {
    "mac": "FA:16:3E:00:00:01",
    "address": "192.0.2.2/26",
    "gateway": "192.0.2.1",
    "publicIP": "203.0.113.10",
}
B = {"mac": "fa:16:3e:00:00:02", "address": "192.0.2.3/26", "gateway": "192.0.2.1"}


def nics(doc: dict[str, Any]) -> Any:
    return from_config({"staticNICs": doc}).static_nics


def ensure(cloud: StaticCloud, ha: HaWant | None) -> CloudState:
    return anyio.run(cloud.ensure, CloudWant(KEY, "n0", None, None, (), ha))


def test_slot_b_is_its_own_entry_beside_slot_a() -> None:
    got = nics({"t/hq": A, "t/hq#b": B})
    assert set(got) == {"t/hq", "t/hq#b"}
    assert got["t/hq#b"].mac == "fa:16:3e:00:00:02" and got["t/hq#b"].public_ip is None
    assert got["t/hq"].mac == "fa:16:3e:00:00:01", "lower-cased as before"


@pytest.mark.parametrize(
    "doc, error",
    [
        pytest.param(
            {"t/hq": A, "t/hq#c": B},
            r"config.staticNICs: 't/hq#c': expected namespace/name \(or",
            id="slot-c",
        ),
        pytest.param({"t/hq": A, "t/hq#": B}, r"'t/hq#': expected namespace/name", id="empty-slot"),
        pytest.param(
            {"t/hq#b": B}, r"config.staticNICs.t/hq#b: slot b of t/hq, which has no entry", id="no-a"
        ),
        pytest.param(
            {"t/hq": A, "t/hq#b": {**B, "publicIP": "203.0.113.11"}},
            r"config.staticNICs.t/hq#b.publicIP: slot b has no public IP of its own",
            id="public-ip-on-b",
        ),
        pytest.param(
            {"t/hq": A, "t/hq#b": {**B, "mac": "fa:16:3e:00:00:01"}},
            r"config.staticNICs.t/hq#b: the same MAC or address as t/hq's",
            id="same-mac",
        ),
        pytest.param(
            {"t/hq": A, "t/hq#b": {**B, "address": "192.0.2.2/26"}},
            r"config.staticNICs.t/hq#b: the same MAC or address",
            id="same-address",
        ),
        pytest.param(
            {"t/hq": A, "t/hq#b": {**B, "gateway": "192.0.2.99"}},
            r"config.staticNICs.t/hq#b.gateway: 192.0.2.99 is not on 192.0.2.0/26",
            id="field-path-of-b",
        ),
    ],
)
def test_slot_b_entries_are_refused_naming_the_field(doc: dict[str, Any], error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        nics(doc)


def test_without_ha_the_static_cloud_answers_as_before() -> None:
    state = ensure(StaticCloud(nics({"t/hq": A, "t/hq#b": B})), None)
    assert state.nic == Nic2("fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1")
    assert state.public_ip == "203.0.113.10" and state.nic_b is None and state.floating_ip_slot is None
    (ready,) = state.conditions
    assert (ready.status, ready.reason, ready.message) == (
        True,
        "StaticNIC",
        "NIC2 fa:16:3e:00:00:01 192.0.2.2/26 via 192.0.2.1",
    )


def test_with_ha_slot_b_gets_its_nic_and_nothing_moves() -> None:
    cloud = StaticCloud(nics({"t/hq": A, "t/hq#b": B}))
    for active in ("a", "b"):
        state = ensure(cloud, HaWant("n1", None, "a" if active == "a" else "b"))
        assert state.nic == Nic2("fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1")
        assert state.nic_b == Nic2("fa:16:3e:00:00:02", "192.0.2.3/26", "192.0.2.1")
        assert state.public_ip == "203.0.113.10", "the gateway's one address, whichever slot serves"
        assert state.floating_ip_slot is None, "the static cloud does not know where it is"
        assert not state.fenced and not state.fenced_b
        (ready,) = state.conditions
        assert ready.status and f"active: slot {active}" in ready.message
        assert "moved by the operator" in ready.message


def test_with_ha_a_missing_slot_b_entry_is_named_and_slot_a_kept() -> None:
    state = ensure(StaticCloud(nics({"t/hq": A})), HaWant("n1", None))
    (ready,) = state.conditions
    assert (ready.status, ready.reason) == (False, "NoStaticNIC")
    assert "no entry t/hq#b (slot b of the HA gateway)" in ready.message
    assert state.nic is not None and state.nic_b is None, "slot a's pod keeps its NIC2"
    assert state.public_ip == "203.0.113.10"
    none = ensure(StaticCloud({}), HaWant("n1", None))
    assert "no entry t/hq or t/hq#b" in none.conditions[0].message and none.nic is None
