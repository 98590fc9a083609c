"""Contract tests of the OpenStack lab: a REAL Neutron (29.0.0, MariaDB, noauth), the fault proxy in front
of it, and the Nova os-interface EMULATOR, all seen through openstacksdk as the controller will see them.

What LAB-FACTS.md verified about Neutron is re-verified here through this harness; the proxy's faults are
shown to reach openstacksdk as the errors a real outage gives; the emulator's attach/detach/limits are
checked through openstacksdk's compute proxy AND through the port's fields in the real Neutron; teardown
is proved to leave no process and no directory, also when a test fails and when the session is killed.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keystoneauth1.exceptions
import openstack.connection
import openstack.exceptions
import pytest

from lab.openstack import process
from lab.openstack.cloud import BASELINE_TAG, Baseline, Cloud
from lab.openstack.neutron import Neutron
from lab.openstack.nova import MAX_VERSION, NovaEmulator
from lab.openstack.proxy import Fault
from lab.openstack.rest import request_json, split_url
from lab.wait import wait_for

if TYPE_CHECKING:
    from lab.openstack.fixtures import OpenStackLab

# (imported lazily: a module imported before pytest registers it as a plugin cannot be assert-rewritten)
pytest_plugins = ("lab.openstack.fixtures",)
pytestmark = [pytest.mark.lab]

REPO = Path(__file__).resolve().parents[2]
Conn = openstack.connection.Connection


@pytest.fixture
def conn(openstack_lab: OpenStackLab) -> Conn:
    """openstacksdk through both proxies (what the controller's tests will use)."""
    c: Conn = openstack_lab.connect()
    return c


def neutron_error_type(exc: openstack.exceptions.HttpException) -> str:
    assert exc.response is not None
    return str(exc.response.json()["NeutronError"]["type"])


def gw_port(conn: Conn, cloud: Cloud, name: str, ip: str | None = None, **attrs: Any) -> Any:
    fixed = {"subnet_id": cloud.gateway.subnet_id} | ({"ip_address": ip} if ip else {})
    return conn.network.create_port(
        network_id=cloud.gateway.network_id, name=name, fixed_ips=[fixed], **attrs
    )


# -- Neutron through openstacksdk ----------------------------------------------------------------------------


def test_neutron_answers_with_the_extensions_the_operator_needs(conn: Conn, openstack_cloud: Cloud) -> None:
    aliases = {e.alias for e in conn.network.extensions()}
    needed = {
        "router",
        "external-net",
        "extraroute",
        "extraroute-atomic",
        "allowed-address-pairs",
        "port-security",
        "security-group",
        "standard-attr-tag",
        "revision-if-match",
        "standard-attr-revisions",
        "binding",
    }
    assert needed <= aliases
    names = {n.name for n in conn.network.networks()}
    assert {"ext-net", "gw-net", "node-net", "cluster-a-net", "cluster-b-net"} <= names


def test_cloud_topology_is_what_a_gateway_operator_expects(conn: Conn, openstack_cloud: Cloud) -> None:
    cloud = openstack_cloud
    ext = conn.network.get_network(cloud.external.network_id)
    assert ext.is_router_external and ext.provider_network_type == "flat"
    assert conn.network.get_subnet(cloud.external.subnet_id).cidr == "203.0.113.0/24"
    gw_sub = conn.network.get_subnet(cloud.gateway.subnet_id)
    assert (gw_sub.cidr, gw_sub.gateway_ip) == ("192.0.2.0/26", "192.0.2.1")
    router = conn.network.get_router(cloud.router_id)
    assert router.external_gateway_info["network_id"] == cloud.external.network_id
    assert cloud.router_external_ip.startswith("203.0.113.")
    rif = list(conn.network.ports(device_id=cloud.router_id, device_owner="network:router_interface"))
    assert [ip["ip_address"] for p in rif for ip in p.fixed_ips] == ["192.0.2.1"]
    for cl in cloud.clusters:
        ifaces = {
            ip["subnet_id"]: ip["ip_address"]
            for p in conn.network.ports(device_id=cl.router_id)
            for ip in p.fixed_ips
        }
        assert ifaces == {cl.network.subnet_id: cl.network.gateway_ip, cloud.gateway.subnet_id: cl.transit_ip}
    for node in cloud.nodes:
        port = conn.network.get_port(node.port_id)
        assert (port.device_id, port.device_owner, port.binding_host_id) == (
            node.server_id,
            "compute:nova",
            node.host,
        )
        assert node.provider_id == f"openstack:///{node.server_id}"
    assert {BASELINE_TAG} <= set(conn.network.get_network(cloud.gateway.network_id).tags)


def test_port_with_fixed_ip_gets_an_fa163e_mac_and_stays_down(conn: Conn, openstack_cloud: Cloud) -> None:
    sg = conn.network.create_security_group(name="gw-a-sg")
    port = gw_port(conn, openstack_cloud, "gw-a", "192.0.2.5", security_group_ids=[sg.id])
    assert port.mac_address.startswith("fa:16:3e:")
    assert port.fixed_ips == [{"subnet_id": openstack_cloud.gateway.subnet_id, "ip_address": "192.0.2.5"}]
    assert port.security_group_ids == [sg.id]
    assert port.status == "DOWN" and port.binding_vif_type == "unbound"  # no agents, no mechanism drivers
    with pytest.raises(openstack.exceptions.ConflictException) as exc:
        gw_port(conn, openstack_cloud, "gw-b", "192.0.2.5")
    assert neutron_error_type(exc.value) == "IpAddressAlreadyAllocated"


def test_floating_ip_is_one_to_one(conn: Conn, openstack_cloud: Cloud) -> None:
    cloud = openstack_cloud
    port = gw_port(conn, cloud, "gw-fip", "192.0.2.6")
    fip = conn.network.create_ip(floating_network_id=cloud.external.network_id, port_id=port.id)
    assert fip.floating_ip_address.startswith("203.0.113.")
    assert (fip.fixed_ip_address, fip.router_id) == ("192.0.2.6", cloud.router_id)
    with pytest.raises(openstack.exceptions.ConflictException) as exc:
        conn.network.create_ip(floating_network_id=cloud.external.network_id, port_id=port.id)
    assert neutron_error_type(exc.value) == "FloatingIPPortAlreadyAssociated"
    assert [f.id for f in conn.network.ips(port_id=port.id)] == [fip.id]


def test_allowed_address_pairs_are_replaced_whole(conn: Conn, openstack_cloud: Cloud) -> None:
    port = gw_port(conn, openstack_cloud, "gw-aap")
    a, b, c = ({"ip_address": x} for x in ("198.18.0.0/24", "198.18.1.0/24", "198.18.2.0/24"))
    port = conn.network.update_port(port, allowed_address_pairs=[a, b])
    assert {p["ip_address"] for p in port.allowed_address_pairs} == {"198.18.0.0/24", "198.18.1.0/24"}
    port = conn.network.update_port(port, allowed_address_pairs=[c])
    assert [p["ip_address"] for p in port.allowed_address_pairs] == ["198.18.2.0/24"]
    assert all(p["mac_address"] == port.mac_address for p in port.allowed_address_pairs)


def test_if_match_revision_precondition(
    conn: Conn, openstack_cloud: Cloud, openstack_lab: OpenStackLab
) -> None:
    port = gw_port(conn, openstack_cloud, "gw-rev")
    rev = port.revision_number
    updated = conn.network.update_port(
        port, if_revision=rev, allowed_address_pairs=[{"ip_address": "198.18.0.9"}]
    )
    assert updated.revision_number > rev
    put = openstack_lab.neutron_proxy.calls("PUT", rf"^/v2\.0/ports/{port.id}$")[-1]
    assert put.header("if-match") == f"revision_number={rev}"
    with pytest.raises(openstack.exceptions.PreconditionFailedException) as exc:
        conn.network.update_port(port.id, if_revision=rev, allowed_address_pairs=[])
    assert exc.value.status_code == 412
    assert neutron_error_type(exc.value) == "RevisionNumberConstraintFailed"
    assert conn.network.get_port(port.id).allowed_address_pairs[0]["ip_address"] == "198.18.0.9"


def test_extraroutes_atomic_change_only_the_given_routes(conn: Conn, openstack_cloud: Cloud) -> None:
    cloud = openstack_cloud
    a, b = cloud.clusters[0], cloud.clusters[1]
    ra = {"destination": a.network.cidr, "nexthop": a.transit_ip}
    rb = {"destination": b.network.cidr, "nexthop": b.transit_ip}
    rc = {"destination": "198.18.7.0/24", "nexthop": a.transit_ip}
    conn.network.add_extra_routes_to_router(cloud.router_id, {"router": {"routes": [ra, rb]}})
    r = conn.network.add_extra_routes_to_router(cloud.router_id, {"router": {"routes": [rc]}})
    assert sorted(map(str, r.routes)) == sorted(map(str, [ra, rb, rc]))
    r = conn.network.remove_extra_routes_from_router(cloud.router_id, {"router": {"routes": [ra]}})
    assert sorted(map(str, r.routes)) == sorted(map(str, [rb, rc]))
    # the customer side: back to a VPN range through the gateway's address on the transit network
    gw = gw_port(conn, cloud, "gw-transit")
    back = {"destination": "198.18.100.0/24", "nexthop": gw.fixed_ips[0]["ip_address"]}
    assert conn.network.add_extra_routes_to_router(a.router_id, {"router": {"routes": [back]}}).routes == [
        back
    ]
    with pytest.raises(openstack.exceptions.BadRequestException) as exc:  # nexthop on none of its subnets
        bad = {"destination": "198.18.8.0/24", "nexthop": "198.19.0.99"}
        conn.network.add_extra_routes_to_router(cloud.router_id, {"router": {"routes": [bad]}})
    assert neutron_error_type(exc.value) == "InvalidRoutes"


def test_concurrent_add_extraroutes_both_persist(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    cloud = openstack_cloud
    hop = cloud.clusters[0].transit_ip
    routes = [{"destination": f"198.18.{20 + i}.0/24", "nexthop": hop} for i in range(4)]
    errors: list[BaseException] = []

    def add(route: dict[str, str]) -> None:
        try:
            c = openstack_lab.connect()  # one connection per thread, like two controller workers
            c.network.add_extra_routes_to_router(cloud.router_id, {"router": {"routes": [route]}})
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(r,)) for r in routes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(map(str, conn.network.get_router(cloud.router_id).routes)) == sorted(map(str, routes))


def test_removing_an_interface_a_route_needs_is_refused(conn: Conn, openstack_cloud: Cloud) -> None:
    cloud = openstack_cloud
    router = conn.network.create_router(name="scratch-router")
    port = gw_port(conn, cloud, "scratch-if", "192.0.2.20")
    conn.network.add_interface_to_router(router, port=port.id)
    route = {"destination": "198.18.30.0/24", "nexthop": "192.0.2.21"}
    conn.network.add_extra_routes_to_router(router, {"router": {"routes": [route]}})
    with pytest.raises(openstack.exceptions.ConflictException) as exc:
        conn.network.remove_interface_from_router(router, port=port.id)
    assert neutron_error_type(exc.value) == "RouterInterfaceInUseByRoute"


def test_security_group_rule_duplicate_is_409(conn: Conn, openstack_cloud: Cloud) -> None:
    sg = conn.network.create_security_group(name="gw-sg")
    egress = list(conn.network.security_group_rules(security_group_id=sg.id))
    assert {(r.direction, r.ether_type) for r in egress} == {("egress", "IPv4"), ("egress", "IPv6")}
    rule = {
        "security_group_id": sg.id,
        "direction": "ingress",
        "protocol": "udp",
        "port_range_min": 500,
        "port_range_max": 500,
        "remote_ip_prefix": "198.51.100.7/32",
        "ether_type": "IPv4",
    }
    created = conn.network.create_security_group_rule(**rule)
    assert created.remote_ip_prefix == "198.51.100.7/32"
    with pytest.raises(openstack.exceptions.ConflictException) as exc:
        conn.network.create_security_group_rule(**rule)
    assert neutron_error_type(exc.value) == "SecurityGroupRuleExists"
    assert created.id in str(exc.value)  # the message names the existing rule


def test_tags_and_listing_by_tags(conn: Conn, openstack_cloud: Cloud) -> None:
    cloud = openstack_cloud
    gw = "vpngw.example/gateway=ns1.gw1"
    p1, p2 = gw_port(conn, cloud, "t1"), gw_port(conn, cloud, "t2")
    sg = conn.network.create_security_group(name="t-sg")
    fip = conn.network.create_ip(floating_network_id=cloud.external.network_id)
    net = conn.network.create_network(name="t-net")
    for res, tags in ((p1, [gw, "a"]), (p2, [gw, "b"]), (sg, [gw]), (fip, [gw]), (net, [gw])):
        conn.network.set_tags(res, tags)
    router = conn.network.get_router(cloud.router_id)
    conn.network.add_tags(router, [gw])
    assert {p.id for p in conn.network.ports(tags=[gw])} == {p1.id, p2.id}
    assert {p.id for p in conn.network.ports(tags=[gw, "a"])} == {p1.id}  # tags: all of them
    assert {p.id for p in conn.network.ports(any_tags=["a", "b"])} == {p1.id, p2.id}  # any_tags: one of them
    assert [s.id for s in conn.network.security_groups(tags=[gw])] == [sg.id]
    assert [f.id for f in conn.network.ips(tags=[gw])] == [fip.id]
    assert [r.id for r in conn.network.routers(tags=[gw])] == [cloud.router_id]
    assert [n.id for n in conn.network.networks(tags=[gw])] == [net.id]
    assert set(conn.network.get_router(cloud.router_id).tags) == {BASELINE_TAG, gw}


def test_tags_cannot_be_given_at_creation(conn: Conn, openstack_cloud: Cloud) -> None:
    """A trap for the controller: set tags AFTER creating; a port POST even drops them silently."""
    with pytest.raises(openstack.exceptions.BadRequestException, match="tags"):
        conn.network.create_security_group(name="tagged-sg", tags=["x"])
    port = gw_port(conn, openstack_cloud, "tagged-port", tags=["x"])
    assert conn.network.get_port(port.id).tags == []


# -- the fault proxy, seen through openstacksdk ------------------------------------------------------------


@pytest.mark.parametrize(
    "code, exc_type",
    [
        pytest.param(500, openstack.exceptions.HttpException, id="500"),
        pytest.param(503, openstack.exceptions.HttpException, id="503"),
        pytest.param(409, openstack.exceptions.ConflictException, id="409"),
    ],
)
def test_injected_status_reaches_the_sdk_n_times(
    conn: Conn, openstack_lab: OpenStackLab, code: int, exc_type: type[Exception]
) -> None:
    proxy = openstack_lab.neutron_proxy
    proxy.add("GET", r"^/v2\.0/networks$", Fault.status(code), times=2)
    for _ in range(2):
        with pytest.raises(exc_type) as exc:
            list(conn.network.networks())
        assert getattr(exc.value, "status_code", None) == code
    assert len(list(conn.network.networks())) >= 5  # the rule retired after two requests
    log = proxy.calls("GET", r"^/v2\.0/networks$")
    assert [(r.status, r.outcome) for r in log] == [(code, "injected"), (code, "injected"), (200, "passed")]


def test_a_hang_is_a_client_timeout(openstack_lab: OpenStackLab) -> None:
    conn = openstack_lab.connect(timeout=0.5)
    proxy = openstack_lab.neutron_proxy
    proxy.add("GET", r"^/v2\.0/ports$", Fault.hang(30))
    with pytest.raises(keystoneauth1.exceptions.ConnectTimeout):
        list(conn.network.ports())
    proxy.clear()  # releases the held request
    assert len(list(conn.network.ports())) >= 1


def test_a_reset_is_a_connection_failure(conn: Conn, openstack_lab: OpenStackLab) -> None:
    openstack_lab.neutron_proxy.add("GET", r"^/v2\.0/routers$", Fault.reset(), times=1)
    with pytest.raises(keystoneauth1.exceptions.ConnectFailure):
        list(conn.network.routers())
    assert openstack_lab.neutron_proxy.calls("GET", "routers$")[0].outcome == "reset"


def test_a_forwarded_write_whose_answer_is_lost_still_happened(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    name = f"lost-{uuid.uuid4().hex[:8]}"
    openstack_lab.neutron_proxy.add("POST", r"^/v2\.0/ports$", Fault.reset(forward=True), times=1)
    with pytest.raises(keystoneauth1.exceptions.ConnectFailure):
        gw_port(conn, openstack_cloud, name)
    assert len(list(conn.network.ports(name=name))) == 1  # a retry by name must find it, not create twice
    assert openstack_lab.neutron_proxy.writes()[0].forwarded


def test_delay_passes_through(conn: Conn, openstack_lab: OpenStackLab) -> None:
    openstack_lab.neutron_proxy.add("GET", r"^/v2\.0/networks$", Fault.delay(0.2), times=1)
    assert len(list(conn.network.networks())) >= 5
    assert openstack_lab.neutron_proxy.calls("GET", "networks$")[0].outcome == "delayed"


def test_call_log_counts_reads_and_writes(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    port = gw_port(conn, openstack_cloud, "counted")
    proxy = openstack_lab.neutron_proxy
    proxy.clear_log()
    conn.network.get_port(port.id)
    list(conn.network.ports(tags=[BASELINE_TAG]))
    assert proxy.writes() == []  # "zero writes on a no-op"
    assert [(r.method, r.status) for r in proxy.records()] == [("GET", 200), ("GET", 200)]
    assert proxy.records()[1].query == f"tags={BASELINE_TAG}"
    conn.network.update_port(port, name="renamed")
    (write,) = proxy.writes()
    assert (write.method, write.path, write.json()) == (
        "PUT",
        f"/v2.0/ports/{port.id}",
        {"port": {"name": "renamed"}},
    )


def test_proxy_rules_match_method_and_path(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    proxy = openstack_lab.neutron_proxy
    rule = proxy.add("PUT", r"^/v2\.0/ports/", Fault.status(500))
    port = gw_port(conn, openstack_cloud, "matched")  # POST: not matched
    conn.network.get_port(port.id)  # GET: not matched
    with pytest.raises(openstack.exceptions.HttpException):
        conn.network.update_port(port, name="x")
    with pytest.raises(openstack.exceptions.HttpException):
        conn.network.update_port(port, name="y")
    assert rule.hits == 2  # times=None: until removed
    proxy.remove(rule)
    assert conn.network.update_port(port, name="z").name == "z"


def test_sdk_retries_503_but_not_500(openstack_lab: OpenStackLab) -> None:
    """openstacksdk does not retry by default; ``status_code_retries`` retries 503 (keystoneauth's
    retriable codes), never 500."""
    proxy = openstack_lab.neutron_proxy
    conn = openstack_lab.connect(status_code_retries=2)
    proxy.add("GET", r"^/v2\.0/networks$", Fault.status(503), times=2)
    assert len(list(conn.network.networks())) >= 5
    proxy.add("GET", r"^/v2\.0/routers$", Fault.status(500), times=1)
    with pytest.raises(openstack.exceptions.HttpException):
        list(conn.network.routers())
    assert [r.status for r in proxy.calls("GET", r"^/v2\.0/(networks|routers)$")] == [503, 503, 200, 500]


def test_sdk_connect_retries_resend_a_post_whose_answer_was_lost(
    openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    """A trap for the controller: ``connect_retries`` re-sends a POST after a reset, and when the first
    one had reached Neutron there are two ports."""
    conn = openstack_lab.connect(connect_retries=1)
    name = f"dup-{uuid.uuid4().hex[:8]}"
    openstack_lab.neutron_proxy.add("POST", r"^/v2\.0/ports$", Fault.reset(forward=True), times=1)
    gw_port(conn, openstack_cloud, name)
    assert len(list(conn.network.ports(name=name))) == 2
    assert [(r.outcome, r.forwarded) for r in openstack_lab.neutron_proxy.writes()] == [
        ("reset", True),
        ("passed", True),
    ]


# -- Neutron down ----------------------------------------------------------------------------------------


def test_neutron_down_and_back_keeps_data(openstack_lab: OpenStackLab, openstack_cloud: Cloud) -> None:
    neutron = openstack_lab.neutron
    via_proxy = openstack_lab.connect(timeout=5)
    direct = neutron.connect(timeout=5)
    port = gw_port(direct, openstack_cloud, "survivor", "192.0.2.9")
    list(via_proxy.network.networks())  # both connections have discovered Neutron's versions
    neutron.stop()
    assert not neutron.running
    with pytest.raises(keystoneauth1.exceptions.ConnectFailure):  # a connection that discovered before
        direct.network.get_port(port.id)
    with pytest.raises(keystoneauth1.exceptions.DiscoveryFailure):  # a new one fails at discovery
        list(neutron.connect(timeout=5).network.networks())
    with pytest.raises(openstack.exceptions.HttpException) as exc:  # a load balancer in front: 503
        via_proxy.network.get_port(port.id)
    assert exc.value.status_code == 503
    assert openstack_lab.neutron_proxy.records()[-1].outcome == "upstream-down"
    neutron.start()
    back = direct.network.get_port(port.id)
    assert (back.fixed_ips[0]["ip_address"], back.revision_number) == ("192.0.2.9", port.revision_number)
    assert via_proxy.network.get_port(port.id).id == port.id


def test_database_down_holds_requests_until_it_is_back(openstack_lab: OpenStackLab) -> None:
    """MariaDB stopped: Neutron does not fail requests, it holds them (oslo.db reconnects) and answers
    once the database is back."""
    neutron = openstack_lab.neutron
    conn = neutron.connect(timeout=60)
    list(conn.network.networks())
    neutron.db.stop()
    answers: list[int] = []
    held = threading.Thread(target=lambda: answers.append(len(list(conn.network.networks()))))
    try:
        held.start()
        held.join(timeout=2)
        assert held.is_alive() and answers == []
    finally:
        neutron.db.start()
    held.join(timeout=60)
    assert answers and answers[0] >= 5


def test_proxy_stopped_is_connection_refused(openstack_lab: OpenStackLab) -> None:
    conn = openstack_lab.connect(timeout=5)
    list(conn.network.networks())
    openstack_lab.neutron_proxy.stop()
    with pytest.raises(keystoneauth1.exceptions.ConnectFailure):
        list(conn.network.networks())
    openstack_lab.neutron_proxy.start()  # the same port again
    assert len(list(conn.network.networks())) >= 5


# -- the Nova os-interface emulator --------------------------------------------------------------------------


def test_nova_server_view(conn: Conn, openstack_cloud: Cloud) -> None:
    node = openstack_cloud.nodes[0]
    server = conn.compute.get_server(node.server_id)
    assert (server.name, server.status, server.compute_host, server.hypervisor_hostname) == (
        node.name,
        "ACTIVE",
        node.host,
        node.host,
    )
    assert server.availability_zone == "nova"
    assert server.addresses == {
        "node-net": [
            {
                "version": 4,
                "addr": node.ip,
                "OS-EXT-IPS:type": "fixed",
                "OS-EXT-IPS-MAC:mac_addr": conn.network.get_port(node.port_id).mac_address,
            }
        ]
    }
    found = conn.compute.find_server(node.name)
    assert found is not None and found.id == node.server_id
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.get_server(str(uuid.uuid4()))


def test_nova_attach_list_get_detach(conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud) -> None:
    node = openstack_cloud.nodes[1]
    port = gw_port(conn, openstack_cloud, "gw-attach", "192.0.2.7")
    iface = conn.compute.create_server_interface(node.server_id, port_id=port.id)
    assert (iface.port_id, iface.net_id, iface.mac_addr) == (
        port.id,
        openstack_cloud.gateway.network_id,
        port.mac_address,
    )
    assert iface.fixed_ips == [{"subnet_id": openstack_cloud.gateway.subnet_id, "ip_address": "192.0.2.7"}]
    bound = conn.network.get_port(port.id)
    assert (bound.device_id, bound.device_owner, bound.binding_host_id) == (
        node.server_id,
        "compute:nova",
        node.host,
    )
    assert (
        bound.revision_number == port.revision_number + 3
    )  # the attach moved the revision: refetch before If-Match
    assert {i.port_id for i in conn.compute.server_interfaces(node.server_id)} == {node.port_id, port.id}
    assert conn.compute.get_server_interface(port.id, server=node.server_id).port_state == "DOWN"
    conn.compute.delete_server_interface(port.id, server=node.server_id)
    assert openstack_lab.nova.wait_idle()
    freed = conn.network.get_port(port.id)
    assert (freed.device_id, freed.device_owner, freed.binding_host_id) == ("", "", "")
    assert {i.port_id for i in conn.compute.server_interfaces(node.server_id)} == {node.port_id}
    with pytest.raises(openstack.exceptions.NotFoundException):
        conn.compute.get_server_interface(port.id, server=node.server_id)


def test_nova_refuses_a_port_in_use(conn: Conn, openstack_cloud: Cloud) -> None:
    n0, n1 = openstack_cloud.nodes[0], openstack_cloud.nodes[1]
    port = gw_port(conn, openstack_cloud, "gw-busy")
    conn.compute.create_server_interface(n0.server_id, port_id=port.id)
    for server in (n1.server_id, n0.server_id):  # another server's port, and this one's again
        with pytest.raises(openstack.exceptions.ConflictException, match=f"Port {port.id} is still in use"):
            conn.compute.create_server_interface(server, port_id=port.id)
    assert conn.network.get_port(port.id).device_id == n0.server_id
    with pytest.raises(openstack.exceptions.NotFoundException, match="could not be found"):
        conn.compute.create_server_interface(n1.server_id, port_id=str(uuid.uuid4()))


def test_nova_interface_limit(conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud) -> None:
    node = openstack_cloud.nodes[2]
    openstack_lab.nova.server(node.server_id).max_interfaces = 2  # the primary port counts
    p1, p2 = gw_port(conn, openstack_cloud, "lim-1"), gw_port(conn, openstack_cloud, "lim-2")
    conn.compute.create_server_interface(node.server_id, port_id=p1.id)
    with pytest.raises(openstack.exceptions.HttpException) as exc:
        conn.compute.create_server_interface(node.server_id, port_id=p2.id)
    assert exc.value.status_code == 500
    assert f"Failed to attach network adapter device to {node.server_id}" in str(exc.value)
    assert conn.network.get_port(p2.id).device_id == ""


def test_nova_refuses_a_server_in_the_wrong_state(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    node = openstack_cloud.nodes[0]
    openstack_lab.nova.server(node.server_id).vm_state = "error"
    port = gw_port(conn, openstack_cloud, "gw-state")
    with pytest.raises(openstack.exceptions.ConflictException, match="while it is in vm_state error"):
        conn.compute.create_server_interface(node.server_id, port_id=port.id)


def test_nova_detach_is_asynchronous(conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud) -> None:
    nova = openstack_lab.nova
    node = openstack_cloud.nodes[0]
    port = gw_port(conn, openstack_cloud, "gw-async")
    conn.compute.create_server_interface(node.server_id, port_id=port.id)
    nova.pause_detaches()
    conn.compute.delete_server_interface(port.id, server=node.server_id)  # 202: accepted, not done
    assert conn.network.get_port(port.id).device_id == node.server_id
    other = gw_port(conn, openstack_cloud, "never-attached")
    conn.compute.delete_server_interface(other.id, server=node.server_id)  # 202 as well, fails later
    nova.resume_detaches()
    assert nova.wait_idle()
    assert conn.network.get_port(port.id).device_id == ""
    assert nova.faults == [(node.server_id, f"Port {other.id} is not attached")]


def test_nova_slow_attach_times_out_but_happens(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    node = openstack_cloud.nodes[1]
    port = gw_port(conn, openstack_cloud, "gw-slow")
    impatient = openstack_lab.connect(timeout=0.5)
    openstack_lab.nova.attach_delay = 2.0
    with pytest.raises(keystoneauth1.exceptions.ConnectTimeout):
        impatient.compute.create_server_interface(node.server_id, port_id=port.id)
    assert conn.network.get_port(port.id).device_id == node.server_id


def test_nova_faults_through_its_proxy_have_novas_format(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    node = openstack_cloud.nodes[0]
    openstack_lab.nova_proxy.fail("POST", r"/os-interface$", 503, times=1)
    port = gw_port(conn, openstack_cloud, "gw-nova-503")
    with pytest.raises(openstack.exceptions.HttpException) as exc:
        conn.compute.create_server_interface(node.server_id, port_id=port.id)
    assert exc.value.status_code == 503
    assert exc.value.response is not None and "serviceUnavailable" in exc.value.response.json()
    assert conn.network.get_port(port.id).device_id == ""  # the emulator never saw it
    conn.compute.create_server_interface(node.server_id, port_id=port.id)
    assert [r.status for r in openstack_lab.nova_proxy.calls("POST")] == [503, 200]


@pytest.mark.parametrize(
    "headers, status, version",
    [
        pytest.param({}, 200, "2.1", id="none-is-2.1"),
        pytest.param(
            {"OpenStack-API-Version": "compute latest"},
            200,
            f"{MAX_VERSION[0]}.{MAX_VERSION[1]}",
            id="latest",
        ),
        pytest.param({"X-OpenStack-Nova-API-Version": "2.70"}, 200, "2.70", id="legacy-header"),
        pytest.param({"OpenStack-API-Version": "compute 3.0"}, 406, "2.1", id="too-new-406"),
        pytest.param({"OpenStack-API-Version": "compute x.y"}, 400, "2.1", id="malformed-400"),
    ],
)
def test_nova_microversion_headers(
    openstack_nova: NovaEmulator, openstack_cloud: Cloud, headers: dict[str, str], status: int, version: str
) -> None:
    node = openstack_cloud.nodes[0]
    c = http.client.HTTPConnection(*split_url(openstack_nova.url), timeout=10)
    c.request("GET", f"/v2.1/servers/{node.server_id}/os-interface", headers=headers)
    resp = c.getresponse()
    body = resp.read()
    c.close()
    assert resp.status == status
    assert resp.getheader("OpenStack-API-Version") == f"compute {version}"
    assert "OpenStack-API-Version" in (resp.getheader("Vary") or "")
    if status == 200:
        tags = ["tag" in i for i in json.loads(body)["interfaceAttachments"]]
        assert tags == [version != "2.1"]  # "tag" appears from 2.70


def test_nova_version_discovery(openstack_nova: NovaEmulator) -> None:
    status, doc = request_json(openstack_nova.url, "GET", "/v2.1/")
    assert status == 200
    assert (doc["version"]["id"], doc["version"]["min_version"], doc["version"]["version"]) == (
        "v2.1",
        "2.1",
        "2.100",
    )
    status, doc = request_json(openstack_nova.url, "GET", "/")
    assert [v["id"] for v in doc["versions"]] == ["v2.0", "v2.1"]


# -- the harness itself --------------------------------------------------------------------------------------


def test_sweep_returns_neutron_to_the_baseline(
    conn: Conn, openstack_lab: OpenStackLab, openstack_cloud: Cloud
) -> None:
    cloud = openstack_cloud
    net = conn.network.create_network(name="extra-net")
    sub = conn.network.create_subnet(network_id=net.id, cidr="198.18.40.0/24", ip_version=4)
    router = conn.network.create_router(name="extra-router")
    conn.network.add_interface_to_router(router, subnet=sub.id)
    port = gw_port(conn, cloud, "extra-port")
    conn.network.create_ip(floating_network_id=cloud.external.network_id, port_id=port.id)
    conn.network.create_security_group_rule(
        security_group_id=cloud.default_security_group_id,
        direction="ingress",
        protocol="tcp",
        port_range_min=22,
        port_range_max=22,
    )
    conn.network.add_extra_routes_to_router(
        cloud.router_id,
        {"router": {"routes": [{"destination": "198.18.41.0/24", "nexthop": cloud.clusters[0].transit_ip}]}},
    )
    conn.network.set_tags(conn.network.get_network(cloud.gateway.network_id), ["changed"])
    before = Baseline.capture(openstack_lab.neutron.endpoint)
    import lab.openstack.fixtures as fx

    assert fx._session is not None
    done = fx._session.baseline.sweep(openstack_lab.neutron.endpoint)
    assert {
        "floatingips",
        "routers",
        "ports",
        "subnets",
        "networks",
        "security_group_rules",
        "routes_reset",
        "tags_restored",
    } <= set(done)
    after = Baseline.capture(openstack_lab.neutron.endpoint)
    assert after.ids == fx._session.baseline.ids != before.ids
    assert after.tags == fx._session.baseline.tags and after.routes == fx._session.baseline.routes
    assert fx._session.baseline.sweep(openstack_lab.neutron.endpoint) == {}


def test_session_neutron_is_shared(openstack_neutron: Neutron) -> None:
    from lab.openstack.fixtures import acquire_session, release_session

    lab = acquire_session()
    try:
        assert lab.neutron is openstack_neutron and lab.users >= 2
    finally:
        release_session()
    assert openstack_neutron.running


def test_fixtures_refuse_an_unmarked_test(tmp_path: Path) -> None:
    result = _child_pytest(tmp_path, "def test_unmarked(openstack_cloud):\n    pass\n")
    assert result.returncode == 1
    assert "mark it @pytest.mark.lab" in result.stdout


CHILD_TEST = """
import threading, time
import pytest
from lab.openstack.proxy import Fault
from lab.wait import wait_for

pytestmark = pytest.mark.lab


def test_fails_midway(openstack_lab):
    conn = openstack_lab.connect()
    port = conn.network.create_port(network_id=openstack_lab.cloud.gateway.network_id, name="leak-check")
    conn.compute.create_server_interface(openstack_lab.cloud.nodes[0].server_id, port_id=port.id)
    held = openstack_lab.neutron_proxy.add("GET", "^/v2.0/ports$", Fault.hang(600))
    threading.Thread(target=lambda: list(conn.network.ports()), daemon=True).start()
    wait_for(lambda: held.hits, 30, "the ports list held in the proxy")
    openstack_lab.neutron.stop()
    {wait}
    assert False, "deliberate failure with Neutron stopped and a request held"
"""


def _child_pytest(
    tmp_path: Path, source: str, *, kill_after: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a test file in a child pytest whose TMPDIR is ``tmp_path/tmp``."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    test_file = tmp_path / "test_child.py"
    test_file.write_text(source)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "lab.openstack.fixtures",
        "-c",
        os.devnull,
        "--rootdir",
        str(tmp_path),
        "-q",
        "-x",
        str(test_file),
    ]
    if kill_after is None:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: kill_after.exists() or child.poll() is not None, 120, "the child's readiness")
        assert child.poll() is None, "the child ended before it signalled readiness"
    except AssertionError:
        child.kill()
        child.communicate(timeout=30)
        raise
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, child.returncode, out, "")


def _our_leftovers(root: Path) -> tuple[list[str], list[int]]:
    dirs = sorted(p.name for p in root.iterdir() if p.name.startswith(process.RUN_PREFIX))
    return dirs, process.processes_under(root)


@pytest.fixture
def child_tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    process.cleanup_stale(tmp_path / "tmp")  # whatever a failed assertion below left behind


def test_a_failing_test_leaves_no_process_and_no_directory(child_tmp: Path) -> None:
    result = _child_pytest(child_tmp, CHILD_TEST.format(wait=""))
    assert result.returncode == 1, result.stdout[-3000:]
    assert "deliberate failure with Neutron stopped" in result.stdout
    assert _our_leftovers(child_tmp / "tmp") == ([], [])


def test_a_killed_session_is_cleaned_by_the_next_start(child_tmp: Path) -> None:
    ready = child_tmp / "ready"
    wait = f"open({str(ready)!r}, 'w').close(); time.sleep(120)"
    result = _child_pytest(child_tmp, CHILD_TEST.format(wait=wait), kill_after=ready)
    assert result.returncode == -signal.SIGKILL
    root = child_tmp / "tmp"
    # nobody ran the child's teardown: PR_SET_PDEATHSIG stopped its daemons, its directory is still there
    wait_for(lambda: not process.processes_under(root), 20, "the child's daemons stopped", interval=0.1)
    dirs, procs = _our_leftovers(root)
    assert procs == [] and len(dirs) == 1
    removed = process.cleanup_stale(root)  # what the next start_neutron() runs first
    assert [p.name for p in removed] == dirs
    assert _our_leftovers(root) == ([], [])
