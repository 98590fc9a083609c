"""The device's IP side, as wg-quick would leave it: address, link up, routes for peer networks.

rtnetlink through pyroute2's ``AsyncIPRoute`` (the agent runs inside the pod's network namespace; tests
may pass ``netns=`` instead, pyroute2 then works through a forked helper and this process never changes
namespace). Routes we own are the main-table, ``proto static`` routes out of the WireGuard device; the
connected route of the address is the kernel's (``proto kernel``) and is left alone.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RouteChanges:
    """What to do to one address family's routes through the device."""

    family: int
    add: tuple[str, ...]
    delete: tuple[str, ...]


def route_changes(
    family: int, wanted: Iterable[str], current: Iterable[str], claimed: AbstractSet[str] | None = None
) -> RouteChanges:
    """One family's changes (pure): add the wanted routes not there, delete the ones there not wanted.
    ``current`` are the device's main-table, proto static routes of any family; ``claimed`` (when given)
    limits the deletions to those routes: the others are not ours to remove."""
    want = {r for r in wanted if _family(r) == family}
    have = {r for r in current if _family(r) == family}
    stale = have - want if claimed is None else (have - want) & claimed
    return RouteChanges(family, tuple(sorted(want - have)), tuple(sorted(stale)))


def manages_ipv6(wanted: Iterable[str], added: AbstractSet[str]) -> bool:
    """Whether the IPv6 routes are touched at all (pure): only when the plan wants IPv6 routes or this
    agent put some in place earlier (they go when the plan drops them). The controller's plans are
    IPv4-only today, so an agent never lists, let alone deletes, IPv6 routes it did not add."""
    return bool(added) or any(_family(r) == AF_INET6 for r in wanted)


def _claimed_ipv6(wanted: Iterable[str], added: AbstractSet[str]) -> AbstractSet[str] | None:
    """The IPv6 routes we may delete: with IPv6 in the plan, every proto static one through the device
    (as for IPv4: the device is ours); without, only those this agent added."""
    return None if any(_family(r) == AF_INET6 for r in wanted) else added


class NetDev(Protocol):
    async def configure(
        self, interface: str, address: str, routes: tuple[str, ...], *, up: bool = True
    ) -> tuple[int, int]:
        """Address on, link up, exactly ``routes`` (ours) via the device. Returns (added, removed)
        routes. Raises NetDevError. ``up`` False (an HA standby): address on, link DOWN, no routes (the
        kernel drops a down device's IPv4 routes itself; they come back with the next ``up``)."""
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
    """``NetDev`` over a fresh AsyncIPRoute per call (a call is rare: on plan change and on resync).
    Remembers, per interface, the IPv6 routes it put in place (see ``manages_ipv6``)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._ipv6_added: dict[str, set[str]] = {}

    def _ipr(self) -> Any:
        return AsyncIPRoute(netns=self.netns, flags=0) if self.netns else AsyncIPRoute()

    async def configure(
        self, interface: str, address: str, routes: tuple[str, ...], *, up: bool = True
    ) -> tuple[int, int]:
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
                # Down, the device sends and receives nothing: wireguard-go closes its UDP socket and stops
                # its peers on the TUN's down event, the kernel module in its ndo_stop; both open the socket
                # again on up, and send a keepalive to each peer with persistent keepalive.
                await ipr.link("set", index=index, state="up" if up else "down")
                if not up:
                    return 0, 0
                # One family at a time, IPv4 first and in full (adds, then deletes): a device without IPv6
                # (disable_ipv6) refuses IPv6 routes, and that must not leave IPv4 routes of removed peers
                # in place. An IPv6 failure is reported after IPv4 has converged (not ready, retried).
                ipv4 = route_changes(AF_INET, routes, await self._ours(ipr, index, AF_INET))
                await self._apply(ipr, index, ipv4)
                added, removed = len(ipv4.add), len(ipv4.delete)
                mine = self._ipv6_added.setdefault(interface, set())
                if manages_ipv6(routes, mine):
                    try:
                        have6 = await self._ours(ipr, index, AF_INET6)
                        ipv6 = route_changes(AF_INET6, routes, have6, claimed=_claimed_ipv6(routes, mine))
                        mine &= have6  # forget the routes that went (a device reset flushes them)
                        mine |= have6 & {r for r in routes if _family(r) == AF_INET6}  # wanted and there
                        await self._apply(ipr, index, ipv6, mine)
                    except NetlinkError as exc:  # EACCES: IPv6 disabled on the device (disable_ipv6)
                        raise NetDevError(f"{interface}: IPv6 routes: {os.strerror(exc.code)}") from exc
                    except OSError as exc:
                        raise NetDevError(f"{interface}: IPv6 routes: {exc.strerror or exc}") from exc
                    added, removed = added + len(ipv6.add), removed + len(ipv6.delete)
        except NetDevError:
            raise
        except NetlinkError as exc:  # not an OSError in pyroute2
            raise NetDevError(f"{interface}: {exc}") from exc
        except OSError as exc:
            raise NetDevError(f"{interface}: {exc.strerror or exc}") from exc
        return added, removed

    @staticmethod
    async def _ours(ipr: Any, index: int, family: int) -> set[str]:
        """The main-table, proto static routes of one family out of the device."""
        return {
            str(ipaddress.ip_network(f"{r.get('RTA_DST')}/{r['dst_len']}", strict=False))
            async for r in await ipr.get_routes(oif=index, family=family, table=MAIN_TABLE)
            if r["proto"] == RTPROT_STATIC and r.get("RTA_DST")
        }

    @staticmethod
    async def _apply(ipr: Any, index: int, changes: RouteChanges, track: set[str] | None = None) -> None:
        ours = {"oif": index, "proto": RTPROT_STATIC, "table": MAIN_TABLE}
        for dst in changes.add:
            await ipr.route("replace", dst=dst, family=changes.family, **ours)
            if track is not None:
                track.add(dst)
        for dst in changes.delete:
            await ipr.route("del", dst=dst, family=changes.family, **ours)
            if track is not None:
                track.discard(dst)
