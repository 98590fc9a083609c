"""A hostile neighbour on the shared transit network (NIC2's subnet, where other tenants' gateways and
VMs live) and a hostile tunnel peer, against the gateway pod's data plane, with real traffic.

The neighbour is the lab's router namespace: it sits on NIC2's link (192.0.2.1) and picks its own next
hops, as any host on that subnet can. Where it sends from an address that is not its own, that is said
(what Neutron port security would stop in a cloud that enforces it for every port of the subnet; the
lab has none). Live charon (kernel-libipsec: decapsulated packets come in on ``ipsec0``) and
wireguard-go; init-nat as ``python -m initnat`` in the gateway namespace.

Each test fails on the code before the rule it names: the neighbour's packet arrived where it must not.
"Did not arrive" is shown without a timing: the test waits until our DROP rule has counted the packet,
and a datagram sent after it along an allowed path does arrive.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
from collections.abc import Iterator, Sequence
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from gwplan import (
    Exposure,
    GatewayRef,
    Grant,
    Nat,
    Nic,
    Plan,
    Port,
    ReverseExposure,
    SecretRef,
    WireGuard,
    dumps,
)
from initnat import rules, tables
from initnat.__main__ import EXIT_OK, Gateway, run_once
from initnat.conntrack import FakeFlusher
from initnat.iptables import Completed, Iptables, Runner, run_process
from initnat.statusfile import StatusFile
from lab import netns
from lab.wait import wait_for
from lab.world import CLUSTER_GW, GW_NIC2_ADDR, RTR_NIC2_ADDR, SERVICE_CIDR, SVC_ADDR, Host, Lab
from tests.integration.test_initnat_traffic import (
    ECHO_SERVER,
    GRANT_S1_API,
    GRANT_S1_WEB,
    ONE_SHOT,
    PY,
    WEB_VIP,
    Procs,
    handshaken,
    our_rules_with_counters,
    plan,
    tunnels_up,
    write_plan,
)

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

UDP_LISTEN = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2]))); print("listening", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    print("from", peer[0], data.decode(errors="replace"), flush=True)
"""

UDP_SEND = """
import socket, sys
src, dst, port, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((src, 0))
s.sendto(payload.encode(), (dst, port))
"""

ECHO6_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1]))); s.listen(8); print("listening", flush=True)
while True:
    c, peer = s.accept(); print("from", peer[0], flush=True); c.close()
"""

CONNECT6 = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
except OSError:
    sys.exit(1)
"""

# A router advertisement (RFC 4861) with one prefix for SLAAC (2001:db8:1::/64, documentation space) and a
# router lifetime: a host that accepts it gets a global address and a default route via the sender.
ROGUE_RA = """
import socket, struct, sys
dev = sys.argv[1]
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
prefix = socket.inet_pton(socket.AF_INET6, "2001:db8:1::")
pio = struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 86400, 14400, 0) + prefix
s.sendto(ra + pio, ("ff02::1", 0, 0, socket.if_nametoindex(dev)))
"""

# An ICMP error (destination unreachable, fragmentation needed) that belongs to no connection: conntrack
# calls it INVALID, and so would it a bare TCP RST or a SYN+ACK of no connection.
STRAY_ICMP = """
import socket, struct, sys
src, dst = sys.argv[1], sys.argv[2]
a, b = socket.inet_aton(dst), socket.inet_aton("203.0.113.77")
inner = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 1, 0, 64, 17, 0, a, b)
inner += struct.pack("!HHHH", 40000, 53, 8, 0)
body = struct.pack("!BBHHH", 3, 4, 0, 0, 1400) + inner
total = sum(struct.unpack("!%dH" % (len(body) // 2), body))
total = (total >> 16) + (total & 0xFFFF); total += total >> 16
icmp = body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.bind((src, 0))
s.sendto(icmp, (dst, 0))
"""

ICMP_LISTEN = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("listening", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    print("icmp from", peer[0], "type", data[20], "code", data[21], flush=True)
"""

DNS_PORT = 5353  # the exposure's UDP port in these tests
SPOOFED_SERVICE_ADDR = "198.18.0.99"  # inside serviceCIDR, the tunnels' local traffic selector, no VIP
NIC2_RULE = "vpngw from NIC2 only what we DNATed"
CIDR_RULE = "vpngw serviceCIDR only through DNAT"


def scripts(tmp_path: Path) -> None:
    for name, body in (
        ("udp_listen", UDP_LISTEN),
        ("udp_send", UDP_SEND),
        ("echo", ECHO_SERVER),
        ("once", ONE_SHOT),
        ("echo6", ECHO6_SERVER),
        ("connect6", CONNECT6),
        ("ra", ROGUE_RA),
        ("stray_icmp", STRAY_ICMP),
        ("icmp_listen", ICMP_LISTEN),
    ):
        (tmp_path / f"{name}.py").write_text(body)


def udp_listen(procs: Procs, host: Host, tmp_path: Path, addr: str, port: int) -> str:
    name = f"udp-{host.role}-{port}"
    procs.start(host, PY, str(tmp_path / "udp_listen.py"), addr, str(port), name=name)
    wait_for(lambda: "listening" in procs.output(name), 10, name)
    return name


def send(host: Host, tmp_path: Path, src: str, dst: str, port: int, payload: str) -> None:
    host.run(PY, str(tmp_path / "udp_send.py"), src, dst, str(port), payload)


def drops(lab: Lab, comment: str) -> int:
    """Packets counted by the DROP rules of ours whose comment holds ``comment``."""
    return sum(n for n, r in our_rules_with_counters(lab) if comment in r and r.endswith("-j DROP"))


def initnat_once(lab: Lab, plan_file: Path) -> str:
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()
    return res.stderr.decode()


def udp_plan(lab: Lab, site: Host) -> Plan:
    """web (TCP 8080 -> svc) as in the traffic tests, plus UDP 5353 to the same target, granted to s1."""
    p = plan(lab, (Grant("s1", "web", "exposure", (site.lans[0],), GRANT_S1_WEB),))
    web = dataclasses.replace(p.nat.exposures[0], ports=(Port(8080), Port(DNS_PORT, "UDP")))
    return dataclasses.replace(p, nat=dataclasses.replace(p.nat, exposures=(web, *p.nat.exposures[1:])))


async def test_a_transit_neighbour_gets_no_dnat_to_an_exposure_target(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Finding 1. The exposure's DNAT used to apply to packets from any interface: a neighbour sending to
    the virtual IP with a granted peer's source (spoofed, or a grant wide enough to cover transit
    addresses) had its datagrams DNATed to the target and SNATed to NIC2's address: the target, which
    may trust the gateway's address, took them from the gateway. Now only traffic that came through a
    tunnel is DNATed to an exposure; the neighbour's packet is not DNATed and dropped in FORWARD."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    target = udp_listen(procs, lab.svc, tmp_path, SVC_ADDR, DNS_PORT)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    initnat_once(lab, plan_file)
    assert await tunnels_up(lab, [s1]) == ["s1"]

    send(s1, tmp_path, s1.lan_host, WEB_VIP, DNS_PORT, "through-the-tunnel")
    wait_for(lambda: "through-the-tunnel" in procs.output(target), 10, "the tunnel's datagram at the target")
    assert f"from {GW_NIC2_ADDR} through-the-tunnel" in procs.output(target), "DNATed, SNATed to NIC2"

    netns.addr(lab.rtr.ns, "lo", f"{s1.lan_host}/32")  # the neighbour claims a granted peer's source
    before = drops(lab, NIC2_RULE)
    send(lab.rtr, tmp_path, s1.lan_host, WEB_VIP, DNS_PORT, "from-the-neighbour")
    send(s1, tmp_path, s1.lan_host, WEB_VIP, DNS_PORT, "after")
    wait_for(lambda: "after" in procs.output(target), 10, "the tunnel's second datagram")
    assert "from-the-neighbour" not in procs.output(target), "the neighbour's datagram reached the target"
    wait_for(lambda: drops(lab, NIC2_RULE) > before, 10, "our drop at NIC2 to count it")
    nat_rules = lab.gw.run("iptables-save", "-t", "nat").stdout.decode()
    assert "-A VPNGW-PREROUTING -d" not in nat_rules, "no DNAT rule outside the tunnels' chain"


async def test_a_transit_neighbour_cannot_send_into_an_ipsec_tunnel(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Finding 2. A neighbour routing a site's LAN via NIC2's address, with a source inside serviceCIDR
    (the tunnel's local traffic selector), had its packets forwarded (not DNATed, not to a target, not to
    a virtual IP: our chain let it go) and encrypted into the tenant's tunnel: the site took them as the
    cloud's. Now a NEW connection from NIC2 that we did not DNAT is dropped."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    site = udp_listen(procs, s1, tmp_path, s1.lan_host, 7070)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    initnat_once(lab, plan_file)
    assert await tunnels_up(lab, [s1]) == ["s1"]

    netns.addr(lab.rtr.ns, "lo", f"{SPOOFED_SERVICE_ADDR}/32")
    netns.route(lab.rtr.ns, s1.lans[0], "via", GW_NIC2_ADDR)
    before = drops(lab, NIC2_RULE)
    send(lab.rtr, tmp_path, SPOOFED_SERVICE_ADDR, s1.lan_host, 7070, "injected")
    # The gateway's own packet from its serviceCIDR address (on lo) still goes through the tunnel.
    send(lab.gw, tmp_path, "198.18.0.1", s1.lan_host, 7070, "from-the-gateway")
    wait_for(lambda: "from-the-gateway" in procs.output(site), 10, "the gateway's datagram at the site")
    assert "injected" not in procs.output(site), "the neighbour's datagram came out of the tunnel"
    wait_for(lambda: drops(lab, NIC2_RULE) > before, 10, "our drop at NIC2 to count it")


def wireguard_road_warrior(lab: Lab, site: Host, tmp_path: Path) -> None:
    """A WireGuard gateway and a peer that routes more than serviceCIDR into its tunnel (a road warrior's
    "all traffic through the VPN" takes 0.0.0.0/0; here the neighbour's address stands for it)."""
    from lab.peers import wireguard_pair

    keys = wireguard_pair(lab, site, tmp_path)
    lab.gw.wireguard["wg0"].wg(
        "set", "wg0", "peer", keys[site.role][1], "allowed-ips", f"10.99.0.2/32,{site.lans[0]}"
    )
    site.wireguard["wg0"].wg(
        "set", "wg0", "peer", keys["gw"][1], "allowed-ips", f"10.99.0.1/32,{SERVICE_CIDR},{RTR_NIC2_ADDR}/32"
    )
    netns.route(lab.gw.ns, site.lans[0], "dev", "wg0")
    for dst in (SERVICE_CIDR, f"{RTR_NIC2_ADDR}/32"):
        netns.route(site.ns, dst, "dev", "wg0")


async def test_a_transit_neighbour_cannot_open_connections_into_a_wireguard_peer(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Finding 2, WireGuard: no spoofing needed. The neighbour routes the peer's LAN via NIC2's address
    and connects from its own address; wireguard-go encrypts by destination, and a peer that routes the
    neighbour's address into its tunnel (any full-tunnel road warrior) answers through it: a two-way
    TCP connection from the transit network into the tenant's network. Now dropped at NIC2."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    procs.start(s1, PY, str(tmp_path / "echo.py"), s1.lan_host, "7070", name="echo7070")
    wait_for(lambda: "listening" in procs.output("echo7070"), 10, "the peer's echo server")
    target = udp_listen(procs, lab.svc, tmp_path, SVC_ADDR, DNS_PORT)
    wg = dataclasses.replace(
        udp_plan(lab, s1),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, "10.99.0.1/24", SecretRef("k", "k")),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, wg)
    initnat_once(lab, plan_file)
    wireguard_road_warrior(lab, s1, tmp_path)
    send(s1, tmp_path, s1.lan_host, WEB_VIP, DNS_PORT, "through-wg")
    wait_for(lambda: handshaken(s1), 10, "the handshake")
    wait_for(lambda: "through-wg" in procs.output(target), 10, "the exposure through wg0")

    netns.route(lab.rtr.ns, s1.lans[0], "via", GW_NIC2_ADDR)
    once = tmp_path / "once.py"
    before = drops(lab, NIC2_RULE)
    connected = lab.rtr.run(PY, str(once), RTR_NIC2_ADDR, s1.lan_host, "7070", check=False).returncode == 0
    assert not connected, "the neighbour's TCP round trip into the peer's LAN"
    assert "from " not in procs.output("echo7070")
    assert drops(lab, NIC2_RULE) > before, "dropped by our rule at NIC2"


async def test_a_transit_neighbour_cannot_use_the_gateway_as_a_router_into_the_cluster(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Finding 2, the other forward path from NIC2: towards eth0, the cluster network (the pod's default
    route). A neighbour routing the cluster's range via NIC2's address reached it from its own address."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    cluster = lab.hosts["cl"]
    listener = udp_listen(procs, cluster, tmp_path, CLUSTER_GW, 7070)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    initnat_once(lab, plan_file)
    netns.route(lab.rtr.ns, "10.244.0.0/30", "via", GW_NIC2_ADDR)
    before = drops(lab, NIC2_RULE)
    send(lab.rtr, tmp_path, RTR_NIC2_ADDR, CLUSTER_GW, 7070, "into-the-cluster")
    send(lab.gw, tmp_path, "10.244.0.2", CLUSTER_GW, 7070, "the-pods-own")
    wait_for(lambda: "the-pods-own" in procs.output(listener), 10, "the pod's own datagram")
    assert "into-the-cluster" not in procs.output(listener), "the neighbour's datagram reached the cluster"
    wait_for(lambda: drops(lab, NIC2_RULE) > before, 10, "our drop at NIC2 to count it")


async def test_a_transit_neighbour_cannot_slip_packets_of_no_connection_through(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Found by a second review: the NIC2 rule drops NEW connections, but a packet conntrack calls
    INVALID (here an ICMP error of no connection; a bare RST or SYN+ACK the same) matched none of our
    rules and fell through to FORWARD's ACCEPT, into the cluster and the tunnels: host discovery, blind
    but both ways. Now the first rule of our chain drops it."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    cluster = lab.hosts["cl"]
    procs.start(cluster, PY, str(tmp_path / "icmp_listen.py"), name="icmp-cl")
    wait_for(lambda: "listening" in procs.output("icmp-cl"), 10, "the cluster's ICMP listener")
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    initnat_once(lab, plan_file)
    netns.route(lab.rtr.ns, "10.244.0.0/30", "via", GW_NIC2_ADDR)
    before = drops(lab, rules.INVALID_DROP)
    lab.rtr.run(PY, str(tmp_path / "stray_icmp.py"), RTR_NIC2_ADDR, CLUSTER_GW)
    lab.gw.run(PY, str(tmp_path / "stray_icmp.py"), "10.244.0.2", CLUSTER_GW)  # the pod's own: not forwarded
    wait_for(lambda: "icmp from 10.244.0.2" in procs.output("icmp-cl"), 10, "the pod's own ICMP")
    assert f"icmp from {RTR_NIC2_ADDR}" not in procs.output("icmp-cl"), "the neighbour's packet got through"
    wait_for(lambda: drops(lab, rules.INVALID_DROP) > before, 10, "our INVALID drop to count it")


async def test_a_tunnel_peer_reaches_no_service_cidr_address_that_is_no_virtual_ip(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """The serviceCIDR is the tunnels' local selector: a site may send to any address in it. One that is
    no virtual IP (and not the gateway's own) was not dropped by our chain and went wherever the routes
    said: in a pod, out through eth0 into the cluster network. Now NEW connections to serviceCIDR that we
    did not DNAT are dropped, from any interface."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    cluster = lab.hosts["cl"]
    netns.addr(cluster.ns, "lo", f"{SPOOFED_SERVICE_ADDR}/32")  # what the pod's default route leads to
    listener = udp_listen(procs, cluster, tmp_path, SPOOFED_SERVICE_ADDR, 7070)
    target = udp_listen(procs, lab.svc, tmp_path, SVC_ADDR, DNS_PORT)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    initnat_once(lab, plan_file)
    assert await tunnels_up(lab, [s1]) == ["s1"]
    before = drops(lab, CIDR_RULE)
    send(s1, tmp_path, s1.lan_host, SPOOFED_SERVICE_ADDR, 7070, "not-a-vip")
    send(s1, tmp_path, s1.lan_host, WEB_VIP, DNS_PORT, "a-vip")
    wait_for(lambda: "a-vip" in procs.output(target), 10, "the exposure")
    assert "not-a-vip" not in procs.output(listener), "the peer's datagram went on into the cluster"
    wait_for(lambda: drops(lab, CIDR_RULE) > before, 10, "our serviceCIDR drop to count it")


def link_local(host: Host, dev: str) -> str:
    """``dev``'s IPv6 link-local address, once duplicate address detection is done (a tentative address
    can be neither a source nor a destination)."""

    def tentative() -> bool:
        return bool(host.run("ip", "-6", "-o", "addr", "show", "dev", dev, "tentative").stdout.strip())

    wait_for(lambda: not tentative(), 10, f"{host.role} {dev}: duplicate address detection")
    out = host.run("ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link").stdout.decode()
    return out.split("inet6 ", 1)[1].split("/", 1)[0]


async def test_a_transit_neighbour_reaches_nothing_of_the_pod_over_ipv6(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """Finding 4. NIC2 gets an IPv6 link-local address whatever the plan says, and our rules were IPv4
    only: a listener on the pod's IPv6 wildcard (charon and wireguard-go bind one; the probe and metrics
    ports would with ``--*-listen [::]:PORT``) answered a neighbour on the transit link, and a router
    advertisement from the neighbour gave the pod a global address and a default route through it.
    Now ip6tables drops IPv6 on NIC2 (INPUT, FORWARD, OUTPUT)."""
    lab = pod_lab
    s1 = lab.add_site()
    scripts(tmp_path)
    procs.start(lab.gw, PY, str(tmp_path / "echo6.py"), "9100", name="echo6")
    wait_for(lambda: "listening" in procs.output("echo6"), 10, "the pod's IPv6 listener")
    gw_ll = link_local(lab.gw, "ens7")
    link_local(lab.rtr, "r-gw")  # the neighbour's own, its source
    connect = (PY, str(tmp_path / "connect6.py"), f"{gw_ll}%r-gw", "9100")
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, udp_plan(lab, s1))
    out = initnat_once(lab, plan_file)

    assert lab.rtr.run(*connect, check=False).returncode != 0, "the pod's IPv6 listener from the transit link"
    assert "from " not in procs.output("echo6")
    assert lab.gw.run(*connect[:2], "::1", "9100", check=False).returncode == 0, "the pod still reaches it"
    lab.rtr.run(PY, str(tmp_path / "ra.py"), "r-gw")
    lab.rtr.run(*connect, check=False)  # sent after the advertisement: once it is refused, the RA was seen
    assert "2001:db8:1:" not in lab.gw.run("ip", "-6", "addr").stdout.decode(), "an address from the RA"
    assert lab.gw.run("ip", "-6", "route", "show", "default").stdout.decode().strip() == "", "a default route"
    assert "ipv6=guarded" in out, out
    counted = [
        line
        for line in lab.gw.run("ip6tables-nft-save", "-c").stdout.decode().splitlines()
        if line.startswith("[") and "-A VPNGW-INPUT -i ens7 " in line
    ]
    assert counted and not counted[0].startswith("[0:"), f"our IPv6 rule counted them: {counted}"
    again = initnat_once(lab, plan_file)
    assert "changed=False" in again and "ipv6=guarded ipv6_changed=False" in again, again
    # The rule is what stops it: deleted by hand, the same advertisement gives the pod a default route
    # through the neighbour, and the next apply puts the rule back.
    delete = f'-D VPNGW-INPUT -i ens7 -m comment --comment "{rules.IPV6_NIC2}" -j DROP'
    netns.run(
        lab.gw.argv("ip6tables-nft-restore", "--noflush"), input=f"*filter\n{delete}\nCOMMIT\n".encode()
    )
    lab.rtr.run(PY, str(tmp_path / "ra.py"), "r-gw")
    wait_for(
        lambda: "via fe80:" in lab.gw.run("ip", "-6", "route", "show", "default").stdout.decode(),
        10,
        "the advertised default route, without our rule",
    )
    assert "ipv6_changed=True" in initnat_once(lab, plan_file)
    assert lab.rtr.run(*connect, check=False).returncode != 0


def test_the_lab_gives_nic2_an_ipv6_link_local_address(pod_lab: Lab) -> None:
    """What finding 4 rests on, measured: a new namespace has IPv6 on, NIC2 gets a link-local address."""
    assert socket.has_ipv6
    assert link_local(pod_lab.gw, "ens7").startswith("fe80::")


# --- the new rules as the kernel prints them (both variants): a restart finds them in sync --------------


@pytest.fixture
def bare_ns() -> Iterator[str]:
    name = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-hst"
    # A pod's namespace (no forwarding, strict rp_filter), not add_ns's router default: these tests only
    # write and read back rules, nothing in them forwards.
    netns.add_ns(name, netns.POD_SYSCTLS)
    try:
        yield name
    finally:
        netns.destroy_ns(name)


def _in(ns: str) -> Runner:
    def run(argv: Sequence[str], input: str | None = None) -> Completed:
        return run_process(netns.ns_exec(ns, *argv), input)

    return run


GUARDS = [
    pytest.param(rules.Guard("ens7", ipsec=True), id="ipsec"),
    pytest.param(rules.Guard("ens7", wireguard=("wg0", 51820)), id="wireguard"),
]


@pytest.mark.parametrize("variant", ["legacy", "nft"])
@pytest.mark.parametrize("guard", GUARDS)
def test_the_new_rules_read_back_as_rendered(bare_ns: str, variant: str, guard: rules.Guard) -> None:
    """The gotos into VPNGW-EXPOSURES (``-m policy`` in nat PREROUTING, ``-g``), the NIC2 and serviceCIDR
    drops and the IPv6 ruleset are printed by iptables-save exactly as rendered: a second apply writes
    nothing (no probe, no revocation read from a misprint)."""
    p = udp_plan_nat()
    tunnels = [("wireguard.interface", guard.wireguard[0])] if guard.wireguard else []
    policy = rules.validate(p, nic2_address=IPv4Address(GW_NIC2_ADDR), tunnel_interfaces=tunnels, guard=guard)
    for ipt, ruleset in (
        (Iptables(variant, _in(bare_ns)), rules.render(policy)),  # type: ignore[arg-type]
        (Iptables(variant, _in(bare_ns), family="ipv6"), rules.ipv6_rules(guard)),  # type: ignore[arg-type]
    ):
        assert ipt.apply(ruleset).changed
        kernel = tables.kernel_rules(ipt.saved(), ruleset)
        assert kernel == tables.rendered_rules(ruleset), ipt.command
        assert not ipt.apply(ruleset).changed, f"{ipt.command}: in sync, nothing written"
        assert ipt.print_known and ipt.printed is None, "read back as rendered, nothing learned"
    v4 = run_process(netns.ns_exec(bare_ns, f"iptables-{variant}-save", "-t", "nat")).stdout
    assert "-g VPNGW-EXPOSURES" in v4 and "VPNGWPROBE" not in v4


def udp_plan_nat() -> Nat:
    return Nat(
        service_cidr=SERVICE_CIDR,
        source_address="198.18.0.1",
        internal_source_cidrs=("10.244.0.0/30",),
        exposures=(Exposure("web", WEB_VIP, (Port(8080), Port(DNS_PORT, "UDP")), target_address=SVC_ADDR),),
        reverse_exposures=(ReverseExposure("db", "198.18.0.20", "203.0.113.1", (Port(7070),)),),
        grants=(Grant("s1", "web", "exposure", ("203.0.113.0/28",), GRANT_S1_WEB),),
    )


# --- one bad exposure freezes nothing: a duplicate is left out alone -------------------------------------


def test_a_duplicate_exposure_is_left_out_alone_and_a_revocation_in_the_same_plan_applies(
    pod_lab: Lab, tmp_path: Path
) -> None:
    """Finding 3. A second exposure on another's virtual IP and port used to reject the whole plan (exit 2,
    kept=last-good): a grant revoked in the same plan change stayed admitted. Now the duplicate alone is
    left out (the status file says why) and the rest, the revocation included, is applied."""
    lab = pod_lab
    s1 = lab.add_site()
    grant_web = Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB)
    grant_api = Grant("s1", "api", "exposure", (s1.lans[0],), GRANT_S1_API)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, plan(lab, (grant_web, grant_api)))
    initnat_once(lab, plan_file)
    assert f"--set-xmark {GRANT_S1_API:#x}/" in lab.gw.run("iptables-save").stdout.decode()

    v2 = plan(lab, (grant_web, Grant("s1", "dup", "exposure", (s1.lans[0],), 0x00070000)))
    dup = Exposure("dup", WEB_VIP, (Port(8080),), target_address="192.0.2.71")
    v2 = dataclasses.replace(v2, nat=dataclasses.replace(v2.nat, exposures=(*v2.nat.exposures, dup)))
    write_plan(plan_file, v2)
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()
    saved = lab.gw.run("iptables-save").stdout.decode()
    assert f"--set-xmark {GRANT_S1_API:#x}/" not in saved, "the revocation in the same plan applied"
    assert f"--set-xmark {GRANT_S1_WEB:#x}/" in saved and "192.0.2.71" not in saved, "web kept, dup not in"
    assert "0x70000/" not in saved, "the duplicate's grant is left out with it"
    (entry,) = json.loads((tmp_path / "initnat-status.json").read_text())["leftOut"]
    assert entry == {
        "exposure": "dup",
        "field": "nat.exposures[2].virtualIp",
        "virtualIp": WEB_VIP,
        "reason": f"{WEB_VIP} is already the virtual IP of nat.exposures[0] (with tcp/8080)",
        "grants": [{"peer": "s1", "mark": "0x70000"}],
    }
    assert "exposure=dup field=nat.exposures[2].virtualIp" in res.stderr.decode()


# --- IPv6 where ip6tables cannot help: reported, never a failure -----------------------------------------

MAC = "fa:16:3e:aa:bb:06"


@pytest.fixture
def nic2(tmp_path: Path) -> Iterator[str]:
    with netns.nic2_ns("hv6", MAC) as name:
        yield name


class NoIpv6(netns.NsSysctls):
    """The namespace's sysctls as on a kernel booted with ipv6.disable=1: no net.ipv6 tree."""

    def read(self, name: str) -> int:
        if name.startswith("net.ipv6."):
            raise FileNotFoundError(2, "No such file or directory")
        return super().read(name)


def gateway_in(ns: str, ipr: IPRoute, ip6: Runner, sysctls: netns.NsSysctls) -> Gateway:
    return Gateway(
        Iptables("nft", _in(ns)),
        ipr,
        FakeFlusher(),
        ip6tables=Iptables("nft", ip6, family="ipv6"),
        sysctls=sysctls,
    )


def v4_plan() -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="ipsec",
        nic=Nic(mac=MAC, gateway="192.0.2.1"),
        nat=udp_plan_nat(),
    )


@pytest.mark.parametrize(
    ("absent", "state"),
    [
        pytest.param(True, "absent", id="kernel-without-ipv6"),
        pytest.param(False, "unguarded", id="no-ip6tables"),
    ],
)
def test_ipv6_that_cannot_be_guarded_is_reported_and_the_ipv4_rules_still_apply(
    nic2: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, absent: bool, state: str
) -> None:
    """A kernel without IPv6 (ipv6.disable=1: no net.ipv6 sysctls) has nothing to guard and ip6tables is
    not even run; a kernel with IPv6 where ip6tables cannot be run (not installed) is reported as
    unguarded, once, with the reason, in the log and the status file. The IPv4 ruleset applies (exit 0)."""
    calls: list[str] = []

    def ip6(argv: Sequence[str], input: str | None = None) -> Completed:
        calls.append(argv[0])
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    sysctls = NoIpv6(nic2) if absent else netns.NsSysctls(nic2)
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(dumps(v4_plan()))
    status = StatusFile(tmp_path / "status.json")
    with IPRoute(netns=nic2, flags=0) as ipr, caplog.at_level("INFO", logger="initnat"):
        gw = gateway_in(nic2, ipr, ip6, sysctls)
        assert run_once(gw, plan_file, status) == EXIT_OK
        assert run_once(gw, plan_file, status) == EXIT_OK
    assert "VPNGW-EXPOSURES" in run_process(netns.ns_exec(nic2, "iptables-nft-save")).stdout
    doc = json.loads(status.path.read_text())
    assert doc["ipv6"]["state"] == state and doc["lastError"] is None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("initnat.ipv6_" in m for m in lines) == 1, "said once, not at every apply"
    assert f"ipv6={state}" in next(m for m in lines if "initnat.applied" in m)
    if absent:
        assert calls == [] and "net.ipv6.conf.all.disable_ipv6" in doc["ipv6"]["reason"]
    else:
        assert calls and "ip6tables-nft-save" in doc["ipv6"]["reason"]
        assert any(
            r.levelname == "WARNING" and "initnat.ipv6_unguarded" in r.getMessage() for r in caplog.records
        )
