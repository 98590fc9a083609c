"""Warm-standby HA's cloud side against a REAL Neutron (neutron 29 on MariaDB, lab/openstack) and the
Nova os-interface EMULATOR: an HA gateway's two slots each get their own port on their own node's server,
and the floating IP, the address pairs and the routes follow the active slot.

* HA enabled on a running gateway: slot a's port is left alone (no write to it), slot b's port appears on
  the standby node's server; the floating IP stays on slot a's port.
* Failover (active b): the floating IP is disassociated first, Neutron read until it shows it on no port,
  then associated with slot b's port (the order proved in the proxy's request log); pairs and routes on
  b's port and gone from a's (another client's pair on a's stays). A second ensure writes nothing.
* The standby's node changes: only slot b's port is re-attached, no floating IP write.
* A Neutron failure between the disassociation and the association: CloudReady's reason names the step,
  the floating IP is on no port, the next ensure associates it (and only that).
* HA off: slot b's port is detached and deleted once everything is slot a's; release and the sweep take
  both ports; a slot b port left untagged by a crash is adopted, not duplicated, and released; a port
  adopted from the seed stays slot a's, and adopting it again finds nothing to do.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from controller.cloud import CloudError, CloudWant, HaWant
from controller.cloudplan import Slot, cluster_tag, port_name, sweepable, tags
from controller.openstack import OpenStackCloud, OpenStackSettings, server_of
from lab.openstack.fixtures import OpenStackLab
from lab.openstack.proxy import Fault, Record
from tests.integration.test_controller_openstack import (
    KEY,
    backend,
    docs,
    ensure,
    plan_of_docs,
    routes_on,
    tagged,
    want,
)

pytestmark = pytest.mark.lab

SERVICE_PREFIX = "198.18.0."
VIPS = sorted(f"{r.virtual_ip}/32" for r in plan_of_docs(docs(False, False)).nat.reverse_exposures)
"""The reverse exposures' virtual IPs (allocated in the serviceCIDR), as pairs and route destinations."""


@pytest.fixture
def lab(openstack_lab: OpenStackLab) -> Iterator[OpenStackLab]:
    yield openstack_lab


def ha_want(lab: OpenStackLab, active: Slot = "a", standby: int = 1, node: int = 0) -> CloudWant:
    w = want(lab, docs(hostname_peer=False, road_warrior=False), node=node)
    n = lab.cloud.nodes[standby]
    return dataclasses.replace(w, ha=HaWant(n.name, n.provider_id, active))


def slot_ports(lab: OpenStackLab) -> dict[str, Any]:
    """Slot -> the gateway's port (exactly one each), read straight from Neutron."""
    out: dict[str, Any] = {}
    for p in tagged(lab, "ports"):
        slot = "b" if "vpngw-slot:b" in p.tags else "a"
        assert slot not in out, f"two ports of slot {slot}"
        out[slot] = p
    return out


def ours(port: Any) -> list[str]:
    return sorted(
        p["ip_address"] for p in port.allowed_address_pairs if p["ip_address"].startswith(SERVICE_PREFIX)
    )


def theirs_on(port: Any) -> bool:
    """Another client's pair (192.0.2.50/32) is on ``port`` (Neutron adds the port's MAC to it)."""
    return any(p["ip_address"] == "192.0.2.50/32" for p in port.allowed_address_pairs)


def address(port: Any) -> str:
    return str(port.fixed_ips[0]["ip_address"])


def via(lab: OpenStackLab, nexthop: str) -> list[str]:
    """The destinations routed via ``nexthop`` on any ClusterLink router of the lab."""
    return sorted(
        r["destination"]
        for c in lab.cloud.clusters
        for r in routes_on(lab, c.router_id)
        if r["nexthop"] == nexthop
    )


def fip_writes(lab: OpenStackLab) -> list[Record]:
    return lab.neutron_proxy.writes(r"^/v2\.0/floatingips")


def body_port_id(r: Record) -> Any:
    return json.loads(r.body)["floatingip"]["port_id"]


def test_enabling_ha_adds_slot_bs_port_on_the_standby_node_and_leaves_slot_a_alone(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    single = ensure(cloud, dataclasses.replace(ha_want(lab), ha=None))
    (a_before,) = tagged(lab, "ports")
    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    state = ensure(cloud, ha_want(lab))
    ports = slot_ports(lab)
    a, b = ports["a"], ports["b"]
    assert a.id == a_before.id and a.revision_number == a_before.revision_number, "slot a's port untouched"
    assert not lab.neutron_proxy.writes(rf"^/v2\.0/ports/{a.id}"), "no write to slot a's port"
    assert [r.path for r in lab.nova_proxy.writes(r".")] == [
        f"/v2.1/servers/{lab.cloud.nodes[1].server_id}/os-interface"
    ], "only slot b's attach"
    assert a.name == port_name(KEY, "a") == "vpngw-acme.tenant-acme" and set(a.tags) == set(tags(KEY, "test"))
    assert b.name == "vpngw-acme.tenant-acme#b" and set(b.tags) == {*tags(KEY, "test"), "vpngw-slot:b"}
    assert (b.network_id, b.fixed_ips[0]["subnet_id"]) == (a.network_id, a.fixed_ips[0]["subnet_id"])
    assert b.security_group_ids == a.security_group_ids
    assert a.device_id == server_of(lab.cloud.nodes[0].provider_id)
    assert b.device_id == server_of(lab.cloud.nodes[1].provider_id)
    (fip,) = tagged(lab, "ips")
    assert fip.port_id == a.id and state.public_ip == single.public_ip == fip.floating_ip_address
    assert not fip_writes(lab), "the floating IP stays where it is"
    assert state.nic == single.nic, "slot a's NIC2 is the one without HA"
    assert state.nic_b is not None and state.nic_b.mac == b.mac_address
    assert state.nic_b.address == f"{address(b)}/26" and state.nic_b.gateway == "192.0.2.1"
    assert (state.floating_ip_slot, state.fenced, state.fenced_b) == ("a", True, True)
    assert VIPS and ours(a) == VIPS and ours(b) == []
    assert via(lab, address(a)) == VIPS and via(lab, address(b)) == []
    ready = next(c for c in state.conditions if c.type == "CloudReady")
    assert ready.status and "floating IP" in ready.message and "on slot a's port" in ready.message


def test_failover_disassociates_first_then_moves_everything_to_slot_b_and_a_repeat_writes_nothing(
    lab: OpenStackLab,
) -> None:
    cloud = backend(lab)
    ensure(cloud, ha_want(lab))
    ports = slot_ports(lab)
    theirs = {"ip_address": "192.0.2.50/32"}
    direct = lab.connect(direct=True).network
    direct.update_port(ports["a"], allowed_address_pairs=[*ports["a"].allowed_address_pairs, theirs])
    (fip,) = tagged(lab, "ips")
    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    state = ensure(cloud, ha_want(lab, active="b"))
    a, b = slot_ports(lab)["a"], slot_ports(lab)["b"]
    moves = fip_writes(lab)
    assert [(r.method, r.path) for r in moves] == [("PUT", f"/v2.0/floatingips/{fip.id}")] * 2
    assert [body_port_id(r) for r in moves] == [None, b.id], "disassociated first, then associated"
    between = [
        r for r in lab.neutron_proxy.records() if moves[0].seq < r.seq < moves[1].seq and r.method == "GET"
    ]
    assert any(r.path == f"/v2.0/floatingips/{fip.id}" for r in between), "Neutron read before associating"
    (fip,) = tagged(lab, "ips")
    assert fip.port_id == b.id and state.public_ip == fip.floating_ip_address
    assert state.floating_ip_slot == "b"
    assert ours(b) == VIPS and ours(a) == [], "pairs on the active's port only"
    assert theirs_on(a), "another client's pair stays"
    assert via(lab, address(b)) == VIPS and via(lab, address(a)) == [], "routes via b only"
    assert not lab.nova_proxy.writes(r"."), "no port moved between servers"
    assert state.nic is not None and state.nic.mac == a.mac_address, "nic stays slot a's"
    facts = anyio.run(cloud.inspect, KEY)  # diagnose's read-only view
    assert facts["port"]["id"] == a.id and facts["ports"] == 1, "slot b's port is no duplicate of a's"
    assert facts["slot_b_port"]["id"] == b.id and facts["routes"] == []
    assert sorted(r["destination"] for r in facts["slot_b_port"]["routes"]) == VIPS

    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    again = ensure(cloud, ha_want(lab, active="b"))
    assert lab.neutron_proxy.writes(r".") == [] and lab.nova_proxy.writes(r".") == [], "idempotent"
    assert again == state

    ensure(cloud, ha_want(lab, active="a"))  # and back
    back = fip_writes(lab)
    assert [body_port_id(r) for r in back] == [None, a.id]
    a, b = slot_ports(lab)["a"], slot_ports(lab)["b"]
    assert ours(a) == VIPS and ours(b) == [] and theirs_on(a)
    assert via(lab, address(a)) == VIPS and via(lab, address(b)) == []


def test_a_standby_node_change_reattaches_only_slot_b_and_never_writes_the_floating_ip(
    lab: OpenStackLab,
) -> None:
    cloud = backend(lab)
    ensure(cloud, ha_want(lab, standby=1))
    before = slot_ports(lab)
    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    state = ensure(cloud, ha_want(lab, standby=2))
    after = slot_ports(lab)
    assert after["b"].id == before["b"].id and after["a"].id == before["a"].id
    assert after["b"].device_id == server_of(lab.cloud.nodes[2].provider_id)
    assert after["a"].device_id == server_of(lab.cloud.nodes[0].provider_id)
    nova = [(r.method, r.path) for r in lab.nova_proxy.writes(r".")]
    old, new = lab.cloud.nodes[1].server_id, lab.cloud.nodes[2].server_id
    assert nova == [
        ("DELETE", f"/v2.1/servers/{old}/os-interface/{before['b'].id}"),
        ("POST", f"/v2.1/servers/{new}/os-interface"),
    ], "slot b's port detached from the old standby node and attached to the new one, nothing else"
    assert fip_writes(lab) == [], "the floating IP untouched"
    assert not lab.neutron_proxy.writes(rf"^/v2\.0/ports/{before['a'].id}"), "slot a's port untouched"
    assert state.fenced_b and state.nic_b is not None


def test_a_failure_between_disassociating_and_associating_is_named_and_the_next_ensure_repairs_it(
    lab: OpenStackLab,
) -> None:
    cloud = backend(lab)
    ensure(cloud, ha_want(lab))
    (fip,) = tagged(lab, "ips")
    b = slot_ports(lab)["b"]
    # The first PUT (the disassociation) passes; the second (the association) meets a Neutron failure.
    lab.neutron_proxy.add("PUT", rf"^/v2\.0/floatingips/{fip.id}$", Fault.passthrough(), times=1)
    lab.neutron_proxy.add("PUT", rf"^/v2\.0/floatingips/{fip.id}$", Fault.status(503), times=1)
    with pytest.raises(CloudError) as err:
        ensure(cloud, ha_want(lab, active="b"))
    assert err.value.step == "FloatingIPAssociateFailed" and err.value.retryable
    assert "HTTP 503" in str(err.value)
    (fip,) = tagged(lab, "ips")
    assert not fip.port_id, "on no port for a moment: acceptable"
    lab.neutron_proxy.clear_log()
    state = ensure(cloud, ha_want(lab, active="b"))
    assert [body_port_id(r) for r in fip_writes(lab)] == [b.id], "associated, nothing to disassociate"
    (fip,) = tagged(lab, "ips")
    assert fip.port_id == b.id and state.floating_ip_slot == "b"
    assert via(lab, address(b)) == VIPS


def test_ha_off_moves_everything_back_to_slot_a_and_deletes_slot_bs_port(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, ha_want(lab, active="b"))
    ports = slot_ports(lab)
    a, b = ports["a"], ports["b"]
    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    state = ensure(cloud, dataclasses.replace(ha_want(lab), ha=None))
    assert set(slot_ports(lab)) == {"a"}, "slot b's port gone"
    assert [body_port_id(r) for r in fip_writes(lab)] == [None, a.id], "moved back, disassociated first"
    (fip,) = tagged(lab, "ips")
    assert fip.port_id == a.id
    assert ours(slot_ports(lab)["a"]) == VIPS
    assert via(lab, address(a)) == VIPS and via(lab, address(b)) == []
    detach = [(r.method, r.path) for r in lab.nova_proxy.writes(r".")]
    assert detach == [("DELETE", f"/v2.1/servers/{lab.cloud.nodes[1].server_id}/os-interface/{b.id}")]
    assert [r.path for r in lab.neutron_proxy.calls("DELETE", r"^/v2\.0/ports/")] == [f"/v2.0/ports/{b.id}"]
    assert state.nic_b is None and state.floating_ip_slot is None and not state.fenced_b
    lab.neutron_proxy.clear_log()
    ensure(cloud, dataclasses.replace(ha_want(lab), ha=None))
    assert lab.neutron_proxy.writes(r".") == [], "without HA again, a no-op"


def test_release_and_the_sweep_take_both_ports(lab: OpenStackLab) -> None:
    cloud = backend(lab, cluster="c1")
    ensure(cloud, ha_want(lab, active="b"))
    ports = slot_ports(lab)
    held = anyio.run(cloud.owned)
    assert list(held) == [KEY], "two ports, one gateway"
    assert sweepable(held, lambda k: False, "9999-12-31T00:00:00Z") == (KEY,)
    assert all(cluster_tag("c1") in p.tags for p in ports.values())
    deleted = anyio.run(cloud.release, KEY)
    assert deleted == 4, "the floating IP, two ports, the group"
    assert tagged(lab, "ports") == tagged(lab, "ips") == tagged(lab, "sgs") == []
    for p in ports.values():
        assert via(lab, address(p)) == []
    assert anyio.run(cloud.owned) == {}
    assert anyio.run(cloud.release, KEY) == 0, "idempotent"


def test_a_slot_b_port_left_untagged_by_a_crash_is_adopted_not_duplicated_and_released(
    lab: OpenStackLab,
) -> None:
    cloud = backend(lab)
    ensure(cloud, dataclasses.replace(ha_want(lab), ha=None))
    lab.neutron_proxy.fail(
        "PUT", r"^/v2\.0/ports/[^/]+/tags$", 503, times=1
    )  # slot b's: created, never tagged
    with pytest.raises(CloudError) as err:
        ensure(cloud, ha_want(lab))
    assert err.value.step == "SlotBPortFailed"
    conn = lab.connect(direct=True)
    (orphan,) = conn.network.ports(name=port_name(KEY, "b"))
    assert not orphan.tags
    # Released before any reconcile adopted it: found by its name.
    assert anyio.run(backend(lab).release, KEY) == 4
    assert list(conn.network.ports(name=port_name(KEY, "b"))) == []
    # Once more, and this time the next ensure adopts it.
    ensure(cloud, dataclasses.replace(ha_want(lab), ha=None))
    lab.neutron_proxy.fail("PUT", r"^/v2\.0/ports/[^/]+/tags$", 503, times=1)
    with pytest.raises(CloudError):
        ensure(cloud, ha_want(lab))
    (orphan,) = conn.network.ports(name=port_name(KEY, "b"))
    ensure(backend(lab), ha_want(lab))
    assert (
        slot_ports(lab)["b"].id == orphan.id and len(list(conn.network.ports(name=port_name(KEY, "b")))) == 1
    )
    anyio.run(cloud.release, KEY)


def test_a_port_adopted_from_the_seed_stays_slot_as_and_adopting_it_again_finds_nothing_to_do(
    lab: OpenStackLab,
) -> None:
    net = lab.cloud
    conn = lab.connect(direct=True)
    seed = conn.network.create_port(network_id=net.gateway.network_id, name="bnerd-vpn-acme")
    seed_fip = conn.network.create_ip(floating_network_id=net.external.network_id, port_id=seed.id)
    cloud = backend(lab, cluster="c1")
    adopted = cloud.adopt(KEY, seed.id)
    assert adopted.tagged == (f"port/{seed.id}", f"floatingip/{seed_fip.id}")
    state = ensure(cloud, ha_want(lab))
    ports = slot_ports(lab)
    assert ports["a"].id == seed.id and ports["b"].name == port_name(KEY, "b")
    assert state.public_ip == seed_fip.floating_ip_address
    again = cloud.adopt(KEY, seed.id, nodes={str(n.server_id).lower() for n in net.nodes})
    assert again.tagged == (), "all of it the gateway's already: slot b's port is no stranger"
    ensure(cloud, ha_want(lab, active="b"))
    assert conn.network.get_ip(seed_fip.id).port_id == ports["b"].id, "the seed's floating IP moves"
    anyio.run(cloud.release, KEY)
    assert tagged(lab, "ports") == tagged(lab, "ips") == []


def test_slot_b_without_a_node_has_an_unattached_port_and_no_fence(lab: OpenStackLab) -> None:
    w = ha_want(lab)
    assert w.ha is not None
    state = ensure(
        backend(lab), dataclasses.replace(w, ha=dataclasses.replace(w.ha, node=None, provider_id=None))
    )
    b = slot_ports(lab)["b"]
    assert not b.device_id and state.nic_b is not None and not state.fenced_b and state.fenced
    bad = dataclasses.replace(w, ha=dataclasses.replace(w.ha, provider_id="aws:///i-1"))
    with pytest.raises(CloudError) as err:
        ensure(backend(lab), bad)
    assert err.value.step == "NoProviderID" and "(slot b)" in str(err.value)


def test_the_floating_ip_is_held_on_no_port_for_the_configured_time_before_it_is_associated(
    lab: OpenStackLab,
) -> None:
    """``floating_ip_hold``: the backend's sleep (injected here: no timing in tests) runs between the
    disassociation and the association, never else."""
    slept: list[tuple[float, int]] = []
    conn = lab.connect(connect_retries=0, status_code_retries=0)
    net = lab.cloud
    settings = OpenStackSettings(
        net.gateway.network_id,
        net.external.network_id,
        net.gateway.subnet_id,
        "test",
        floating_ip_hold=1.5,
    )
    cloud = OpenStackCloud(conn, settings, sleep=lambda s: slept.append((s, len(fip_writes(lab)))))
    ensure(cloud, ha_want(lab))
    assert all(s != 1.5 for s, _ in slept), "nothing moved, nothing held"
    lab.neutron_proxy.clear_log()
    ensure(cloud, ha_want(lab, active="b"))
    assert (1.5, 1) in slept, "held after the disassociation (one floating IP write), before the association"
    assert [body_port_id(r) for r in fip_writes(lab)] == [None, slot_ports(lab)["b"].id]
