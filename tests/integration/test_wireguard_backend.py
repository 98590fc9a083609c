"""The UAPI backend and the address/route shell against the real thing: a live wireguard-go (its UAPI
socket and TUN device) in a lab namespace, with a live peer for handshakes, and rtnetlink in that
namespace through pyroute2 (``IpRouteNetDev(netns=...)``)."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent.wireguard.diff import diff
from gwkit.wireguard.backend import ApplyRejected, DeviceUnavailable, UapiBackend
from gwkit.wireguard.model import DesiredDevice, DesiredPeer, DeviceUpdate, PeerUpdate
from gwkit.wireguard.netdev import IpRouteNetDev, NetDevError, peer_routes
from lab import netns
from lab.peers import wireguard_pair
from lab.world import Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


def keypair() -> tuple[str, str]:
    private = subprocess.run(["wg", "genkey"], capture_output=True, check=True).stdout.strip()
    public = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, check=True).stdout.strip()
    return private.decode(), public.decode()


def randkey() -> str:
    return base64.b64encode(os.urandom(32)).decode()


async def test_uapi_diff_apply_keeps_an_unchanged_peers_session(lab: Lab, tmp_path: Path) -> None:
    site = lab.add_site()
    gw_wg, site_wg = lab.start_wireguard(lab.gw), lab.start_wireguard(site)
    gw_priv, gw_pub = keypair()
    site_priv, site_pub = keypair()
    backend = UapiBackend(gw_wg.uapi_dir)
    other, psk = randkey(), randkey()
    want = DesiredDevice(
        gw_priv,
        51820,
        (
            DesiredPeer(site_pub, ("10.99.0.2/32",), f"{site.addresses[0]}:51820", psk),
            DesiredPeer(other, ("10.99.0.9/32",), persistent_keepalive=0),
        ),
    )
    await backend.apply("wg0", diff(want, await backend.get("wg0")))
    assert diff(want, await backend.get("wg0")).empty  # what we wrote is what it reports
    netns.addr(lab.gw.ns, "wg0", "10.99.0.1/24")
    netns.run(["ip", "-n", lab.gw.ns, "link", "set", "wg0", "up"])
    (tmp_path / "k").write_text(site_priv)
    (tmp_path / "psk").write_text(psk)
    site_wg.wg(
        "set",
        "wg0",
        "private-key",
        str(tmp_path / "k"),
        "listen-port",
        "51820",
        "peer",
        gw_pub,
        "allowed-ips",
        "10.99.0.0/24",
        "preshared-key",
        str(tmp_path / "psk"),
    )
    netns.addr(site.ns, "wg0", "10.99.0.2/24")
    netns.run(["ip", "-n", site.ns, "link", "set", "wg0", "up"])
    assert lab.gw.ping("10.99.0.2", count=2)  # the gateway initiates to the planned endpoint
    before = {p.public_key: p for p in (await backend.get("wg0")).peers}[site_pub]
    assert before.last_handshake is not None and before.rx_bytes > 0
    # Reload: the other peer goes and gets new allowed IPs; the site peer is unchanged.
    reload = DesiredDevice(gw_priv, 51820, (want.peers[0],))
    update = diff(reload, await backend.get("wg0"))
    assert [p.public_key for p in update.peers] == [other]
    await backend.apply("wg0", update)
    after = {p.public_key: p for p in (await backend.get("wg0")).peers}
    assert set(after) == {site_pub}
    assert after[site_pub].last_handshake == before.last_handshake
    assert after[site_pub].rx_bytes >= before.rx_bytes
    assert lab.gw.ping("10.99.0.2")  # same session, no new handshake needed
    assert {p.public_key: p for p in (await backend.get("wg0")).peers}[
        site_pub
    ].last_handshake == before.last_handshake
    # Removing the preshared key on our side only: the zero key clears it, and the peer can no longer talk.
    await backend.apply(
        "wg0",
        diff(
            DesiredDevice(gw_priv, 51820, (DesiredPeer(site_pub, ("10.99.0.2/32",)),)),
            await backend.get("wg0"),
        ),
    )
    assert not (await backend.get("wg0")).peers[0].has_preshared_key


async def test_uapi_rejection_and_daemon_death_are_translated(lab: Lab) -> None:
    gw_wg = lab.start_wireguard(lab.gw)
    backend = UapiBackend(gw_wg.uapi_dir)
    peer = randkey()
    bad = DeviceUpdate(
        peers=(PeerUpdate(peer, new=True, endpoint="vpn.example.net:51820", allowed_ips=("10.9.0.0/24",)),)
    )
    with pytest.raises(ApplyRejected, match=r"wg0 \(uapi\): set failed: errno="):
        await backend.apply("wg0", bad)  # wireguard-go does not resolve names: the agent must
    # A failed set is NOT atomic: lines before the bad one took effect (the peer exists, half-configured).
    # The next diff against the device repairs it.
    half = (await backend.get("wg0")).peers
    assert [(p.public_key, p.allowed_ips) for p in half] == [(peer, ())]
    want = DesiredDevice(randkey(), 51820, (DesiredPeer(peer, ("10.9.0.0/24",), "198.51.100.2:51820"),))
    await backend.apply("wg0", diff(want, await backend.get("wg0")))
    assert diff(want, await backend.get("wg0")).empty
    gw_wg.kill()  # SIGKILL leaves the stale socket file behind (LAB-FACTS)
    with pytest.raises(DeviceUnavailable, match=r"wg0 \(uapi\)"):
        await backend.get("wg0")
    gw_wg.start()
    assert (await backend.get("wg0")).peers == ()


async def test_netdev_sets_address_link_and_exactly_our_routes(lab: Lab) -> None:
    lab.start_wireguard(lab.gw)
    nd = IpRouteNetDev(netns=lab.gw.ns)

    def show(what: str) -> str:
        return lab.gw.run("ip", "-4", what, "show", "dev", "wg0").stdout.decode()

    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "198.19.1.16/28")) == (2, 0)
    assert "10.99.0.1/24" in show("addr") and ",UP" in lab.gw.run("ip", "link", "show", "wg0").stdout.decode()
    routes = show("route")
    assert "203.0.113.0/28 proto static" in routes and "198.19.1.16/28 proto static" in routes
    assert "10.99.0.0/24 proto kernel" in routes
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "198.19.1.16/28")) == (0, 0)
    # Someone else's route through the device (not proto static) is left alone.
    lab.gw.run("ip", "route", "add", "198.19.9.0/24", "dev", "wg0", "proto", "boot")
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28",)) == (0, 1)
    routes = show("route")
    assert "198.19.1.16/28" not in routes and "203.0.113.0/28" in routes and "198.19.9.0/24" in routes
    # A new address in another subnet: added before the old one goes, so no route is flushed.
    assert await nd.configure("wg0", "10.98.0.1/24", ("203.0.113.0/28",)) == (0, 0)
    assert "10.98.0.1/24" in show("addr") and "10.99.0.1/24" not in show("addr")
    assert "198.19.9.0/24" in show("route")
    # A new address in the same subnet is a secondary, deleted with the old primary: it is put back, and
    # our routes (which the kernel flushed with the last address) are re-added.
    await nd.configure("wg0", "10.98.0.2/24", ("203.0.113.0/28",))
    assert "10.98.0.2/24" in show("addr") and "10.98.0.1/24" not in show("addr")
    assert "203.0.113.0/28 proto static" in show("route")
    with pytest.raises(NetDevError, match="wg7: no such device"):
        await nd.configure("wg7", "10.99.0.1/24", ())
    t0 = time.monotonic()
    await nd.configure("wg0", "10.99.0.2/24", ("203.0.113.0/28",))
    assert time.monotonic() - t0 < 5


async def test_netdev_routes_ipv6_allowed_ips_through_the_tunnel(lab: Lab, tmp_path: Path) -> None:
    """IPv6 allowed IPs get routes like IPv4 ones (wg-quick does), in the gateway namespace on the live
    wireguard-go device, and IPv6 traffic to a site's IPv6 LAN flows through the tunnel because of them."""
    site = lab.add_site()
    keys = wireguard_pair(lab, site, tmp_path)  # IPv4 tunnel 10.99.0.1 <-> 10.99.0.2
    (_, gw_pub), (_, site_pub) = keys[lab.gw.role], keys[site.role]
    gw_allowed = f"10.99.0.2/32,{site.lans[0]},fd00:99::2/128,fd00:5::/64"
    lab.gw.wireguard["wg0"].wg("set", "wg0", "peer", site_pub, "allowed-ips", gw_allowed)
    site.wireguard["wg0"].wg("set", "wg0", "peer", gw_pub, "allowed-ips", "10.99.0.1/32,fd00:99::1/128")
    for host, addr in ((lab.gw, "fd00:99::1/64"), (site, "fd00:99::2/64")):
        host.run("ip", "-6", "addr", "add", addr, "dev", "wg0", "nodad")
    site.run("ip", "-6", "addr", "add", "fd00:5::1/64", "dev", "lo", "nodad")
    nd = IpRouteNetDev(netns=lab.gw.ns)
    allowed = ["10.99.0.2/32", site.lans[0], "fd00:99::2/128", "fd00:5::/64", "::/0"]
    routes = peer_routes("10.99.0.1/24", allowed)
    assert routes == (site.lans[0], "fd00:5::/64", "fd00:99::2/128")

    def v6_routes() -> str:
        return lab.gw.run("ip", "-6", "route", "show", "dev", "wg0").stdout.decode()

    assert not lab.gw.ping("fd00:5::1"), "no route to the site's IPv6 LAN yet"
    assert await nd.configure("wg0", "10.99.0.1/24", routes) == (3, 0)
    assert "fd00:5::/64 proto static" in v6_routes() and "fd00:99::2 proto static" in v6_routes()
    v4 = lab.gw.run("ip", "-4", "route", "show", "dev", "wg0").stdout.decode()
    assert f"{site.lans[0]} proto static" in v4
    assert await nd.configure("wg0", "10.99.0.1/24", routes) == (0, 0), "the kernel's listing matches ours"
    assert site.ping("10.99.0.1"), "the site (the initiator) handshakes; the gateway learns its endpoint"
    assert lab.gw.ping("fd00:5::1", count=2), "IPv6 through the tunnel to the site's LAN"
    assert lab.gw.ping(site.lan_host), "and IPv4 still"
    # Someone else's IPv6 route through the device (not proto static) is left alone; ours follow the plan.
    lab.gw.run("ip", "-6", "route", "add", "fd00:77::/64", "dev", "wg0", "proto", "boot")
    assert await nd.configure("wg0", "10.99.0.1/24", (site.lans[0],)) == (0, 2)
    assert "fd00:5::/64" not in v6_routes() and "fd00:77::/64" in v6_routes()
    assert not lab.gw.ping("fd00:5::1"), "the IPv6 route went with the allowed IP"


async def test_netdev_ipv4_converges_when_the_device_refuses_ipv6_routes(lab: Lab) -> None:
    """IPv6 disabled on the live wireguard-go device (sysctl in the gateway namespace): the IPv6 route
    of the plan is refused, but that refusal comes after IPv4 has converged, so the IPv4 route of a
    removed peer is gone; the error names IPv6. With IPv6 back, the next call adds the missing route."""
    lab.start_wireguard(lab.gw)
    nd = IpRouteNetDev(netns=lab.gw.ns)

    def show(family: str) -> str:
        return lab.gw.run("ip", family, "route", "show", "dev", "wg0").stdout.decode()

    assert await nd.configure("wg0", "10.99.0.1/24", ("198.19.1.16/28", "203.0.113.0/28")) == (2, 0)
    lab.gw.run("sysctl", "-q", "-w", "net.ipv6.conf.wg0.disable_ipv6=1")
    with pytest.raises(NetDevError) as refused:
        await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "fd00:5::/64"))
    v4 = show("-4")
    assert "203.0.113.0/28 proto static" in v4 and "198.19.1.16/28" not in v4, "IPv4 converged anyway"
    assert str(refused.value) == "wg0: IPv6 routes: Permission denied"
    assert "fd00:5::/64" not in show("-6")
    # The retry (the agent stays not ready until then) has nothing left to do for IPv4.
    with pytest.raises(NetDevError, match=r"^wg0: IPv6 routes: "):
        await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "fd00:5::/64"))
    lab.gw.run("sysctl", "-q", "-w", "net.ipv6.conf.wg0.disable_ipv6=0")
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "fd00:5::/64")) == (1, 0)
    assert "fd00:5::/64 proto static" in show("-6")


async def test_netdev_never_deletes_ipv6_routes_it_did_not_add(lab: Lab) -> None:
    """A proto static IPv6 route through the device that the agent did not add (an IPv4-only plan, which
    is every plan the controller writes today) is left alone, also by a fresh agent (a restart); an IPv6
    route the agent added goes when the plan drops it, the foreign one stays."""
    lab.start_wireguard(lab.gw)

    def v6() -> str:
        return lab.gw.run("ip", "-6", "route", "show", "dev", "wg0").stdout.decode()

    nd = IpRouteNetDev(netns=lab.gw.ns)
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28", "fd00:5::/64")) == (2, 0)
    lab.gw.run("ip", "-6", "route", "add", "fd00:77::/64", "dev", "wg0", "proto", "static")
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28",)) == (0, 1)
    assert "fd00:5::/64" not in v6() and "fd00:77::/64 proto static" in v6()
    assert await nd.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28",)) == (0, 0)
    restarted = IpRouteNetDev(netns=lab.gw.ns)
    assert await restarted.configure("wg0", "10.99.0.1/24", ("203.0.113.0/28",)) == (0, 0)
    assert "fd00:77::/64 proto static" in v6()
