"""The device's IP side, as wg-quick would leave it: address, link up, routes for peer networks.

rtnetlink through pyroute2's ``AsyncIPRoute`` (the agent runs inside the pod's network namespace; tests
may pass ``netns=`` instead, pyroute2 then works through a forked helper and this process never changes
namespace). Routes we own are the main-table, ``proto static`` routes out of the WireGuard device; the
connected route of the address is the kernel's (``proto kernel``) and is left alone.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

log = logging.getLogger(__name__)

RTPROT_KERNEL = 2
RTPROT_STATIC = 4
MAIN_TABLE = 254


AF_INET = 2
AF_INET6 = 10


def _family(cidr: str) -> int:
    return AF_INET6 if ":" in cidr else AF_INET


def _family_first(cidr: str) -> tuple[int, str]:
    return (_family(cidr), cidr)


class NetDevError(OSError):
    """rtnetlink refused a change, or the device vanished under us."""


def peer_routes(address: str, allowed_ips: Iterable[str]) -> tuple[str, ...]:
    """The routes wg-quick would add (pure): every allowed IP, IPv4 and IPv6, not inside the address's
    own subnet (the connected route covers those), de-duplicated, IPv4 first, each family sorted.
    ``0.0.0.0/0`` and ``::/0`` are skipped: a default route into the tunnel is a policy-routing decision,
    not ours."""
    own = ipaddress.ip_interface(address).network
    out: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for cidr in allowed_ips:
        net = ipaddress.ip_network(cidr, strict=False)
        if net.prefixlen == 0:
            continue
        if net.version == own.version and net.subnet_of(own):  # type: ignore[arg-type]
            continue
        out.add(net)
    return tuple(str(n) for n in sorted(out, key=lambda n: (n.version, n)))


class NetDev(Protocol):
    async def configure(self, interface: str, address: str, routes: tuple[str, ...]) -> tuple[int, int]:
        """Address on, link up, exactly ``routes`` (ours) via the device. Returns (added, removed)
        routes. Raises NetDevError."""
        ...


class IpRouteLinks:
    """``LinkControl`` for the kernel backend: look up / create a ``wireguard`` link."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns

    def _ipr(self) -> Any:
        return AsyncIPRoute(netns=self.netns, flags=0) if self.netns else AsyncIPRoute()

    async def exists(self, interface: str) -> bool:
        async with self._ipr() as ipr:
            return bool(await ipr.link_lookup(ifname=interface))

    async def create_wireguard(self, interface: str) -> None:
        async with self._ipr() as ipr:
            await ipr.link("add", ifname=interface, kind="wireguard")


class IpRouteNetDev:
    """``NetDev`` over a fresh AsyncIPRoute per call (a call is rare: on plan change and on resync)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns

    def _ipr(self) -> Any:
        return AsyncIPRoute(netns=self.netns, flags=0) if self.netns else AsyncIPRoute()

    async def configure(self, interface: str, address: str, routes: tuple[str, ...]) -> tuple[int, int]:
        iface = ipaddress.ip_interface(address)
        try:
            async with self._ipr() as ipr:
                found = await ipr.link_lookup(ifname=interface)
                if not found:
                    raise NetDevError(f"{interface}: no such device")
                index = found[0]
                family = AF_INET if iface.version == 4 else AF_INET6
                have = {
                    (a.get("IFA_ADDRESS"), a["prefixlen"])
                    async for a in await ipr.get_addr(index=index, family=family)
                }
                want = (str(iface.ip), iface.network.prefixlen)
                # Add the new address before removing the old one: when a device loses its last IPv4
                # address the kernel flushes every IPv4 route through it (ours and anyone else's).
                if want not in have:
                    await ipr.addr("add", index=index, address=want[0], prefixlen=want[1])
                for addr, plen in have - {want}:  # a changed plan address replaces the old one
                    await ipr.addr("del", index=index, address=addr, prefixlen=plen)
                if have - {want}:
                    # Deleting a primary address also deletes its secondaries: a new address in the same
                    # subnet was one of them. Put it back (the routes are re-added below).
                    now = {
                        (a.get("IFA_ADDRESS"), a["prefixlen"])
                        async for a in await ipr.get_addr(index=index, family=family)
                    }
                    if want not in now:
                        await ipr.addr("add", index=index, address=want[0], prefixlen=want[1])
                await ipr.link("set", index=index, state="up")
                current: set[str] = set()
                for family in (AF_INET, AF_INET6):
                    current |= {
                        str(ipaddress.ip_network(f"{r.get('RTA_DST')}/{r['dst_len']}", strict=False))
                        async for r in await ipr.get_routes(oif=index, family=family, table=MAIN_TABLE)
                        if r["proto"] == RTPROT_STATIC and r.get("RTA_DST")
                    }
                wanted = set(routes)
                # IPv4 first: a device without IPv6 (disable_ipv6) refuses the IPv6 routes, and the error
                # (not ready, retried) must not leave the IPv4 sites unrouted.
                ours = {"oif": index, "proto": RTPROT_STATIC, "table": MAIN_TABLE}
                for dst in sorted(wanted - current, key=_family_first):
                    await ipr.route("replace", dst=dst, family=_family(dst), **ours)
                for dst in sorted(current - wanted, key=_family_first):
                    await ipr.route("del", dst=dst, family=_family(dst), **ours)
        except NetDevError:
            raise
        except NetlinkError as exc:  # not an OSError in pyroute2
            raise NetDevError(f"{interface}: {exc}") from exc
        except OSError as exc:
            raise NetDevError(f"{interface}: {exc.strerror or exc}") from exc
        return len(wanted - current), len(current - wanted)
