"""The L3 follower's contract (lab/l3follower.py): what the real Neutron records about a router
becomes the router namespace's datapath, and stops being it when Neutron drops it.

Topology (TEST-NET addresses only; every namespace is this run's and goes on every exit path)::

    inet ns  eth0 198.51.100.250/30 --- r-ext 198.51.100.249/30   rtr ns ("gw-router")
                                        br0 192.0.2.1/26 (bridge: the gw-net segment)
    a ns     eth0 192.0.2.20/26  ------ r-a (in br0)
    b ns     eth0 192.0.2.21/26  ------ r-b (in br0); 198.18.5.1/32 on lo (behind an extra route)

Neutron (the session's real one, through a FaultProxy for the follower) holds two ports on gw-net with
those fixed addresses and a floating IP of ext-net; a UDP listener in a and b says who got each probe.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openstack.connection
import pytest

from lab import netns
from lab.l3follower import ROUTE_PROTO, L3Follower, own_routes
from lab.openstack.cloud import Cloud
from lab.openstack.neutron import Neutron
from lab.openstack.proxy import Fault, FaultProxy
from lab.wait import wait_for

pytest_plugins = ("lab.openstack.fixtures",)
pytestmark = [pytest.mark.lab]

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
UDP_PORT = 5353
A_IP, B_IP, RTR_IP = "192.0.2.20", "192.0.2.21", "192.0.2.1"
INET_IP, RTR_EXT_IP = "198.51.100.250", "198.51.100.249"
BEHIND_B = "198.18.5.1"

LISTENER = """
import socket, sys
name = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, (src, sport) = s.recvfrom(2048)
    print(f"{name} from={src}:{sport} {data.decode()}", flush=True)
    s.sendto(name.encode(), (src, sport))
"""

PROBE = """
import socket, sys
dst, port, payload, sport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", sport))
s.settimeout(0.5)
s.sendto(payload.encode(), (dst, port))
try:
    data, (src, _) = s.recvfrom(2048)
except socket.timeout:
    print("none")
else:
    print(data.decode(), src)
"""


@dataclass
class Topo:
    rtr: str
    a: str
    b: str
    inet: str
    tmp: Path
    procs: list[subprocess.Popen[bytes]]

    def listener_log(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text()

    def probe(self, dst: str, payload: str, sport: int = 0) -> tuple[str, str] | None:
        """Sends one datagram from the internet ns; (who answered, from which address) or None."""
        return self.probe_from(self.inet, dst, payload, sport)

    def probe_from(self, ns: str, dst: str, payload: str, sport: int = 0) -> tuple[str, str] | None:
        """Sends one datagram from ``ns``; (who answered, from which address) or None."""
        script = str(self.tmp / "probe.py")
        res = netns.run(netns.ns_exec(ns, PY, script, dst, str(UDP_PORT), payload, str(sport)), timeout=10)
        words = res.stdout.decode().split()
        return (words[0], words[1]) if len(words) == 2 else None

    def reaches(self, dst: str, who: str, payload: str) -> bool:
        """A NEW flow (fresh source port) to ``dst`` is answered by ``who``, and ``who`` saw ``payload``."""
        got = self.probe(dst, payload)
        return got is not None and got[0] == who and payload in self.listener_log(who)


def timing(what: str, called: float, answered: float, applied: float, seen: float) -> None:
    """The numbers docs/openstack-lab.md quotes (``-s`` shows them; nothing asserts on them)."""
    print(
        f"\nl3follower.timing {what}: neutron call {answered - called:.2f} s, applied "
        f"{applied - called:+.2f} s after the call began ({applied - answered:+.2f} s after its answer), "
        f"observed by the test {seen - called:.2f} s after the call began"
    )


def _ns(tag: str) -> str:
    return f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-{tag}"


@pytest.fixture
def topo(tmp_path: Path) -> Iterator[Topo]:
    names = {role: _ns(role) for role in ("l3r", "l3a", "l3b", "l3i")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for ns in names.values():
            netns.add_ns(ns)
        rtr, a, b, inet = names["l3r"], names["l3a"], names["l3b"], names["l3i"]
        netns.run(["ip", "-n", rtr, "link", "add", "br0", "type", "bridge"])
        netns.run(["ip", "-n", rtr, "link", "set", "br0", "up"])
        netns.addr(rtr, "br0", f"{RTR_IP}/26")
        for ns, dev, ip in ((a, "r-a", A_IP), (b, "r-b", B_IP)):
            netns.veth(ns, "eth0", rtr, dev)
            netns.run(["ip", "-n", rtr, "link", "set", dev, "master", "br0"])
            netns.addr(ns, "eth0", f"{ip}/26")
            netns.route(ns, "default", "via", RTR_IP)
        netns.addr(b, "lo", f"{BEHIND_B}/32")
        netns.veth(inet, "eth0", rtr, "r-ext")
        netns.addr(inet, "eth0", f"{INET_IP}/30")
        netns.addr(rtr, "r-ext", f"{RTR_EXT_IP}/30")
        netns.route(inet, "default", "via", RTR_EXT_IP)
        (tmp_path / "listener.py").write_text(LISTENER)
        (tmp_path / "probe.py").write_text(PROBE)
        for name, ns in (("a", a), ("b", b), ("i", inet)):
            with open(tmp_path / f"{name}.out", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        netns.ns_exec(ns, PY, str(tmp_path / "listener.py"), name, str(UDP_PORT)),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        t = Topo(rtr, a, b, inet, tmp_path, procs)
        wait_for(lambda: all("ready" in t.listener_log(n) for n in "abi"), 10, "the three listeners")
        yield t
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        for ns in names.values():
            netns.destroy_ns(ns)  # also one add_ns left half-made; a missing one is fine
        left = [ns for ns in netns.list_namespaces() if ns in names.values()]
        assert not left, f"namespaces left behind: {left}"


Conn = openstack.connection.Connection


@pytest.fixture
def conn(openstack_neutron: Neutron, openstack_cloud: Cloud) -> Conn:
    """openstacksdk straight to Neutron (the test's changes never meet the follower's faults)."""
    c: Conn = openstack_neutron.connect()
    return c


@dataclass
class Ports:
    a: Any
    b: Any
    fip: Any


@pytest.fixture
def ports(conn: Conn, openstack_cloud: Cloud) -> Ports:
    """Ports a and b on gw-net with the namespaces' addresses, and a floating IP on a (the sweep of
    ``openstack_cloud`` deletes them after the test)."""
    cloud = openstack_cloud

    def port(name: str, ip: str) -> Any:
        fixed = [{"subnet_id": cloud.gateway.subnet_id, "ip_address": ip}]
        return conn.network.create_port(network_id=cloud.gateway.network_id, name=name, fixed_ips=fixed)

    a, b = port("l3f-a", A_IP), port("l3f-b", B_IP)
    fip = conn.network.create_ip(floating_network_id=cloud.external.network_id, port_id=a.id)
    return Ports(a, b, fip)


@pytest.fixture
def follower(topo: Topo, openstack_cloud: Cloud, neutron_proxy: FaultProxy) -> Iterator[L3Follower]:
    f = L3Follower(neutron_proxy.url, openstack_cloud.router_id, topo.rtr, external_dev="r-ext", interval=0.2)
    try:
        yield f.start()
    finally:
        f.close()


def test_a_floating_ip_follows_its_association_in_neutron(
    topo: Topo, ports: Ports, follower: L3Follower, conn: Conn
) -> None:
    fip = ports.fip.floating_ip_address
    assert fip.startswith("203.0.113.")
    wait_for(lambda: topo.reaches(fip, "a", "to-a-1"), 20, f"{fip} reaching a")
    assert f"from={INET_IP}:" in topo.listener_log("a")  # DNAT only: the sender's address is kept
    assert topo.probe(fip, "to-a-2") == ("a", fip)  # the answer comes back from the floating IP
    # a flow a starts leaves SNATed to the floating IP (its source as the internet ns's listener sees it)
    assert topo.probe_from(topo.a, INET_IP, "from-a") == ("i", INET_IP)
    assert f"i from={fip}:" in topo.listener_log("i")
    # a flow that will still be running when the floating IP moves
    assert topo.probe(fip, "old-flow-1", sport=40001) == ("a", fip)

    t0 = time.monotonic()
    conn.network.update_ip(ports.fip, port_id=ports.b.id)
    t1 = time.monotonic()
    wait_for(lambda: topo.reaches(fip, "b", "to-b-1"), 20, f"{fip} reaching b after re-association")
    t2 = time.monotonic()
    before = topo.listener_log("a")
    assert topo.probe(fip, "to-b-2") == ("b", fip)
    assert "to-b-2" not in topo.listener_log("a") and topo.listener_log("a") == before
    # a move in one update keeps the conntrack entries, as the legacy L3 agent does: a running flow
    # keeps its DNAT to a
    assert topo.probe(fip, "old-flow-2", sport=40001) == ("a", fip)
    timing("floating IP re-associated", t0, t1, follower.stats.applied_at, t2)

    # disassociated: the rules go and so do the floating IP's conntrack entries (the L3 agent's
    # delete_conntrack_state): when the floating IP is associated again, the running flow follows it
    conn.network.update_ip(ports.fip, port_id=None)
    wait_for(lambda: follower.stats.applied is not None and not follower.stats.applied.nat, 20, "no NAT")
    nat = netns.run(netns.ns_exec(topo.rtr, "iptables-save", "-t", "nat")).stdout.decode()
    assert "-A L3F-PRE" not in nat and "-A L3F-POST" not in nat and "-A PREROUTING -j L3F-PRE" in nat
    assert topo.probe(fip, "to-nobody") is None
    assert topo.probe(fip, "old-flow-3", sport=40001) is None
    assert "old-flow-3" not in topo.listener_log("a")
    # associated again (with b): the same running flow now reaches b (with its entry kept: still a)
    conn.network.update_ip(ports.fip, port_id=ports.b.id)
    wait_for(lambda: topo.reaches(fip, "b", "to-b-3"), 20, f"{fip} reaching b again")
    assert topo.probe(fip, "old-flow-4", sport=40001) == ("b", fip)


def test_router_routes_follow_neutron_extra_routes(
    topo: Topo, ports: Ports, follower: L3Follower, conn: Conn, openstack_cloud: Cloud
) -> None:
    route = {"destination": "198.18.5.0/24", "nexthop": B_IP}

    def table() -> str:
        return netns.run(["ip", "-n", topo.rtr, "route", "show"]).stdout.decode()

    assert "198.18.5.0/24" not in table()
    t0 = time.monotonic()
    conn.network.add_extra_routes_to_router(openstack_cloud.router_id, {"router": {"routes": [route]}})
    t1 = time.monotonic()
    wait_for(lambda: ("198.18.5.0/24", B_IP) in own_routes(topo.rtr), 20, "the extra route in rtr")
    timing("extra route added", t0, t1, follower.stats.applied_at, time.monotonic())
    assert f"198.18.5.0/24 via {B_IP} dev br0 proto {ROUTE_PROTO}" in table()
    wait_for(lambda: topo.reaches(BEHIND_B, "b", "routed-1"), 10, "traffic along the extra route")

    conn.network.remove_extra_routes_from_router(openstack_cloud.router_id, {"router": {"routes": [route]}})
    wait_for(lambda: "198.18.5.0/24" not in table(), 20, "the extra route gone from rtr")
    assert topo.probe(BEHIND_B, "routed-2") is None


def test_the_follower_keeps_the_datapath_while_neutron_is_down_and_catches_up(
    topo: Topo,
    ports: Ports,
    follower: L3Follower,
    conn: Conn,
    neutron_proxy: FaultProxy,
    openstack_neutron: Neutron,
) -> None:
    fip = ports.fip.floating_ip_address
    wait_for(lambda: topo.reaches(fip, "a", "up-1"), 20, f"{fip} reaching a")

    # Neutron unreachable for the follower (a 503 from the proxy, as a load balancer would): the test
    # moves the floating IP meanwhile, straight to Neutron; the datapath stays as it was
    rule = neutron_proxy.add(None, r".*", Fault.status(503))
    errors = follower.stats.errors
    wait_for(lambda: follower.stats.errors >= errors + 3, 20, "the follower seeing Neutron fail")
    conn.network.update_ip(ports.fip, port_id=ports.b.id)
    seen = follower.stats.polls
    wait_for(lambda: follower.stats.polls >= seen + 3, 20, "three more polls")
    assert topo.reaches(fip, "a", "down-1")
    neutron_proxy.remove(rule)
    wait_for(lambda: topo.reaches(fip, "b", "back-1"), 20, f"{fip} reaching b once Neutron answers")

    # the real Neutron API process killed and started again: same story
    openstack_neutron.stop()
    errors = follower.stats.errors
    wait_for(lambda: follower.stats.errors >= errors + 3, 20, "the follower seeing Neutron down")
    assert topo.reaches(fip, "b", "down-2")
    openstack_neutron.start()
    ok = follower.stats.ok
    wait_for(lambda: follower.stats.ok > ok, 30, "the follower polling again")
    conn.network.update_ip(ports.fip, port_id=ports.a.id)
    wait_for(lambda: topo.reaches(fip, "a", "back-2"), 20, f"{fip} reaching a after Neutron's restart")


def test_the_follower_removes_what_neutron_does_not_hold_and_cleans_up(
    topo: Topo, openstack_cloud: Cloud, neutron_proxy: FaultProxy
) -> None:
    """A route and a DNAT rule a previous follower left (Neutron holds neither) go; ``close()`` leaves
    no chain and no route of the follower's."""
    netns.run(["ip", "-n", topo.rtr, "route", "add", "198.18.9.0/24", "via", A_IP, "proto", ROUTE_PROTO])
    netns.run(["ip", "-n", topo.rtr, "route", "add", "198.18.10.0/24", "via", A_IP])  # not the follower's
    stale = (
        "*nat\n:L3F-PRE - [0:0]\n-A L3F-PRE -d 203.0.113.250/32 -j DNAT --to-destination 192.0.2.20\nCOMMIT\n"
    )
    netns.run(netns.ns_exec(topo.rtr, "iptables-restore", "--noflush"), input=stale.encode())

    def nat() -> str:
        return netns.run(netns.ns_exec(topo.rtr, "iptables-save", "-t", "nat")).stdout.decode()

    with L3Follower(neutron_proxy.url, openstack_cloud.router_id, topo.rtr) as follower:
        wait_for(lambda: follower.stats.applies, 20, "the follower's first apply")
        assert own_routes(topo.rtr) == set()
        assert "203.0.113.250" not in nat() and "-A POSTROUTING -j L3F-POST" in nat()
        assert follower.stats.applied is not None and follower.stats.applied.nat == ()
    assert "L3F" not in nat()
    table = netns.run(["ip", "-n", topo.rtr, "route", "show"]).stdout.decode()
    assert "198.18.9.0/24" not in table and "198.18.10.0/24 via" in table
