"""NIC2 by MAC and its source-policy routing, over netlink (pyroute2; thin I/O shell).

A pod's default route points at eth0 (the cluster network). Traffic that arrives on NIC2 (IKE, ESP-in-UDP,
WireGuard, exposure replies) must leave through NIC2 again, and forwarded exposure traffic (DNATed to a
fabric-side target; its source is still the peer's address when routing decides) must leave through NIC2
too, so::

    ip rule add from <NIC2 address>/32 lookup <table> priority <prio>
    ip rule add to <exposure target>/32 lookup <table> priority <prio + 1>     (one per target)
    ip rule add fwmark <B>/<B> lookup main suppress_prefixlength 0 priority <prio + 2>
    ip rule add fwmark <B>/<B> lookup <table> priority <prio + 3>
    ip route replace default via <NIC2 gateway> dev <NIC2> table <table>
    ip route replace <NIC2 subnet> dev <NIC2> scope link table <table>         (on-link hosts direct)

The two ``fwmark`` rules route replies to connections that came in on NIC2 (the mangle chain gives their
reply packets the bit B, ``nic.replyMark``; rules.reply_rules): a reverse exposure's fabric client is
answered through NIC2 although the main table's default route is eth0. The first of them lets the main
table's SPECIFIC routes win over NIC2's table (only main's default route is suppressed): a WireGuard
peer's routes live in main, and with ``src_valid_mark`` on (as hosts running Calico's WireGuard leave it
for the pods they create) the kernel's reverse-path check of a reply coming out of the tunnel is a lookup
WITH the mark; without this rule it would find NIC2, not the tunnel device, and strict rp_filter drops
the reply (measured, docs/initnat.md).

Ours are: rules at OUR priorities that look up OUR table (the ``fwmark`` one at prio + 3 included), the
``fwmark ... lookup main suppress_prefixlength 0`` rule at prio + 2, and the routes in OUR table. Nothing
else is written or removed. charon's table 220 (priority 220, before all of ours: rules.validate_nic
keeps prio + 2 above it) still wins for the tunnels' remote subnets, also for replies that carry the
bit (under kernel XFRM a tunnel's decapsulated packets come in on NIC2).
The NIC is found by MAC (Multus may name it anything, not net1).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Interface
from typing import Any, Protocol

from pyroute2 import IPRoute

from initnat.rules import NicConfig

log = logging.getLogger(__name__)


class NicError(Exception):
    """NIC2 is absent or unusable (bad input: the pod has no such interface, or it lacks an address)."""


class RoutingError(Exception):
    """Netlink refused a change to our rule or route."""


@dataclass(frozen=True)
class Nic2:
    index: int
    name: str
    mac: str
    address: IPv4Interface
    gateway: IPv4Address


@dataclass(frozen=True)
class RoutingChange:
    rule: bool
    route: bool
    address: bool
    targets: bool = False
    reply: bool = False

    @property
    def changed(self) -> bool:
        return self.rule or self.route or self.address or self.targets or self.reply


class Netlink(Protocol):
    """The part of pyroute2's IPRoute we use (the real one in production, in a throwaway netns in tests)."""

    def link_lookup(self, **kwarg: Any) -> list[int]: ...
    def get_links(self, *argv: Any, **kwarg: Any) -> Any: ...
    def get_addr(self, **kwarg: Any) -> Any: ...
    def get_rules(self, **kwarg: Any) -> Any: ...
    def get_routes(self, **kwarg: Any) -> Any: ...
    def rule(self, command: str, **kwarg: Any) -> Any: ...
    def route(self, command: str, **kwarg: Any) -> Any: ...
    def addr(self, command: str, **kwarg: Any) -> Any: ...
    def link(self, command: str, **kwarg: Any) -> Any: ...


def open_netlink() -> IPRoute:
    """IPRoute on the namespace this process runs in."""
    return IPRoute()


def find_nic(ipr: Netlink, cfg: NicConfig, mac: str) -> Nic2:
    """NIC2 by ``mac``; its address and gateway from ``cfg`` or, when absent there, the interface."""
    try:
        return _find_nic(ipr, cfg, mac)
    except NicError:
        raise
    except Exception as exc:  # pyroute2's NetlinkError is NOT an OSError; translate once here
        raise RoutingError(f"netlink: reading interfaces failed: {exc}") from exc


def _find_nic(ipr: Netlink, cfg: NicConfig, mac: str) -> Nic2:
    found = ipr.link_lookup(address=mac)
    if not found:
        raise NicError(f"nic: no interface with MAC {mac} in this network namespace")
    index = found[0]
    link = ipr.get_links(index)[0]
    name = str(link.get_attr("IFLA_IFNAME"))
    have = [
        IPv4Interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
        for a in ipr.get_addr(index=index, family=2)
    ]
    addr = cfg.address
    if addr is None:
        if not have:
            raise NicError(f"nic.address: not in the plan and {name} ({mac}) has no IPv4 address")
        addr = have[0]
    gateway = cfg.gateway or _gateway_via(ipr, index)
    if gateway is None:
        raise NicError(f"nic.gateway: not in the plan and no route via {name} ({mac}) names a gateway")
    if gateway not in addr.network:
        raise NicError(f"nic.gateway: {gateway} is not on NIC2's subnet {addr.network}")
    return Nic2(index=index, name=name, mac=mac, address=addr, gateway=gateway)


def local_addresses(ipr: Netlink) -> frozenset[IPv4Address]:
    """Every IPv4 address of this namespace (any interface): an exposure must never be DNATed to one."""
    try:
        return frozenset(IPv4Address(a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr(family=2))
    except Exception as exc:  # pyroute2's NetlinkError is NOT an OSError; translate once here
        raise RoutingError(f"netlink: reading addresses failed: {exc}") from exc


def _gateway_via(ipr: Netlink, index: int) -> IPv4Address | None:
    for r in ipr.get_routes(family=2, table=254):
        gw = r.get_attr("RTA_GATEWAY")
        if gw and r.get_attr("RTA_OIF") == index:
            return IPv4Address(gw)
    return None


def ensure(ipr: Netlink, nic: Nic2, cfg: NicConfig, targets: Iterable[IPv4Address] = ()) -> RoutingChange:
    """Idempotently: NIC2 up with its address, our rules and our table's routes. Reports changes."""
    try:
        change = _ensure(ipr, nic, cfg)
        return replace(
            change, targets=_ensure_targets(ipr, cfg, frozenset(targets)), reply=_ensure_reply(ipr, cfg)
        )
    except NicError:
        raise
    except Exception as exc:  # pyroute2 raises NetlinkError (not an OSError) and friends; translate once here
        raise RoutingError(f"netlink refused a change on {nic.name}: {exc}") from exc


def _ensure(ipr: Netlink, nic: Nic2, cfg: NicConfig) -> RoutingChange:
    added_address = False
    link = ipr.get_links(nic.index)[0]
    if not link["flags"] & 1:  # IFF_UP
        ipr.link("set", index=nic.index, state="up")
        added_address = True
    have = {(str(a.get_attr("IFA_ADDRESS")), a["prefixlen"]) for a in ipr.get_addr(index=nic.index, family=2)}
    if (str(nic.address.ip), nic.address.network.prefixlen) not in have:
        ipr.addr("add", index=nic.index, address=str(nic.address.ip), prefixlen=nic.address.network.prefixlen)
        added_address = True

    src = str(nic.address.ip)
    ours = [
        r
        for r in ipr.get_rules(family=2)
        if r.get_attr("FRA_PRIORITY") == cfg.rule_priority and _rule_table(r) == cfg.table
    ]
    good = [r for r in ours if r.get_attr("FRA_SRC") == src and r["src_len"] == 32]
    rule_changed = not (len(ours) == 1 and len(good) == 1)
    if rule_changed:
        for r in ours:  # ours, but stale (NIC2's address changed) or duplicated: replace as a whole
            ipr.rule(
                "del",
                priority=cfg.rule_priority,
                table=cfg.table,
                src=r.get_attr("FRA_SRC"),
                src_len=r["src_len"],
            )
        ipr.rule("add", src=src, src_len=32, table=cfg.table, priority=cfg.rule_priority)

    routes = [r for r in ipr.get_routes(family=2, table=cfg.table) if r.get_attr("RTA_TABLE") == cfg.table]
    has_default = any(
        r["dst_len"] == 0
        and r.get_attr("RTA_GATEWAY") == str(nic.gateway)
        and r.get_attr("RTA_OIF") == nic.index
        for r in routes
    )
    subnet = nic.address.network
    has_link = any(
        r["dst_len"] == subnet.prefixlen
        and r.get_attr("RTA_DST") == str(subnet.network_address)
        and r.get_attr("RTA_OIF") == nic.index
        and not r.get_attr("RTA_GATEWAY")
        for r in routes
    )
    if not has_link:
        ipr.route("replace", dst=str(subnet), oif=nic.index, table=cfg.table, scope=253)  # RT_SCOPE_LINK
    if not has_default:
        ipr.route("replace", dst="0.0.0.0/0", gateway=str(nic.gateway), oif=nic.index, table=cfg.table)
    return RoutingChange(rule=rule_changed, route=not (has_default and has_link), address=added_address)


def _ensure_targets(ipr: Netlink, cfg: NicConfig, targets: frozenset[IPv4Address]) -> bool:
    """``to <target>/32 lookup <table>`` at priority+1, exactly for ``targets`` (ours: that priority and
    table). Adds the missing ones, removes the ones no longer wanted."""
    prio = cfg.rule_priority + 1
    have = Counter(
        IPv4Address(r.get_attr("FRA_DST"))
        for r in ipr.get_rules(family=2)
        if r.get_attr("FRA_PRIORITY") == prio
        and _rule_table(r) == cfg.table
        and r.get_attr("FRA_DST")
        and r["dst_len"] == 32
    )
    changed = False
    for t, copies in have.items():
        extra = copies if t not in targets else copies - 1
        for _ in range(extra):
            ipr.rule("del", priority=prio, table=cfg.table, dst=str(t), dst_len=32)
            changed = True
    for t in sorted(targets - have.keys()):
        ipr.rule("add", dst=str(t), dst_len=32, table=cfg.table, priority=prio)
        changed = True
    return changed


MAIN_TABLE = 254


def _ensure_reply(ipr: Netlink, cfg: NicConfig) -> bool:
    """The two reply rules (module docstring), exactly once each with ``cfg.reply_mark``: ours at prio + 2
    are the ``fwmark`` rules that look up main with ``suppress_prefixlength 0``, at prio + 3 the rules that
    look up our table. Stale ones (another mark, a duplicate) are deleted; missing ones added. Returns
    whether anything changed."""
    bit = cfg.reply_mark
    wanted: tuple[tuple[int, int, dict[str, int]], ...] = (
        (cfg.rule_priority + 2, MAIN_TABLE, {"suppress_prefixlen": 0}),
        (cfg.rule_priority + 3, cfg.table, {}),
    )
    changed = False
    dump = list(ipr.get_rules(family=2))
    for prio, table, extra in wanted:
        ours = [
            r
            for r in dump
            if r.get_attr("FRA_PRIORITY") == prio
            and _rule_table(r) == table
            and (table != MAIN_TABLE or (r.get_attr("FRA_FWMARK") and _suppressed(r) == 0))
        ]
        good = [
            r for r in ours if _is_reply_rule(r, bit) and _suppressed(r) == extra.get("suppress_prefixlen")
        ]
        if len(ours) == 1 and len(good) == 1:
            continue
        for r in ours:  # stale (replyMark changed, or edited) or duplicated: replace as a whole
            ipr.rule("del", **_rule_key(r, prio, table))
        ipr.rule("add", fwmark=bit, fwmask=bit, table=table, priority=prio, **extra)
        changed = True
    return changed


def _suppressed(r: Any) -> int | None:
    value = r.get_attr("FRA_SUPPRESS_PREFIXLEN")
    return None if value is None or value == 0xFFFFFFFF else int(value)


def _is_reply_rule(r: Any, bit: int) -> bool:
    """A plain ``fwmark bit/bit`` rule: no other selector (a rule that also names a source, destination,
    interface or port range is not the one we want)."""
    return (
        r.get_attr("FRA_FWMARK") == bit
        and r.get_attr("FRA_FWMASK") == bit
        and not r["src_len"]
        and not r["dst_len"]
        and not any(
            r.get_attr(a) for a in ("FRA_IIFNAME", "FRA_OIFNAME", "FRA_SPORT_RANGE", "FRA_DPORT_RANGE")
        )
        and not r["flags"] & 0x2  # FIB_RULE_INVERT
    )


def _rule_key(r: Any, prio: int, table: int) -> dict[str, Any]:
    """What deletes exactly this rule (the kernel matches each attribute given, the rest as wildcards)."""
    key: dict[str, Any] = {"priority": prio, "table": table}
    for attr, arg in (
        ("FRA_FWMARK", "fwmark"),
        ("FRA_FWMASK", "fwmask"),
        ("FRA_SRC", "src"),
        ("FRA_DST", "dst"),
    ):
        if (value := r.get_attr(attr)) is not None:
            key[arg] = value
    if key.get("src"):
        key["src_len"] = r["src_len"]
    if key.get("dst"):
        key["dst_len"] = r["dst_len"]
    return key


def _rule_table(r: Any) -> int:
    table = r.get_attr("FRA_TABLE")
    return int(table if table is not None else r["table"])
