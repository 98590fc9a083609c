"""The plan's NAT/authz section as data: validated values and the rules of the chains we own.

Model (one gateway pod, one network namespace)::

    peer --tunnel--> gw: PREROUTING  VPNGW-PREROUTING   from a tunnel (an inbound IPsec policy, ipsec+, the
                                                        WireGuard device): goto VPNGW-EXPOSURES, DNAT
                                                        <virtual ip>:<port> -> <target>:<port>; whatever
                                                        did not come through a tunnel: only the reverse
                                                        exposures' DNAT (a neighbour on NIC2 is never
                                                        DNATed to an exposure target)
                         FORWARD     VPNGW-FORWARD      NEW connections that were not DNATed: from the
                                                        WireGuard device or NIC2 dropped (a neighbour
                                                        using the pod as a router: into a tunnel, the
                                                        cluster, anywhere); the rest go through
                                     VPNGW-TARGETS      which drops those to an exposure target's REAL
                                                        address (only its virtual IP is a way in);
                                                        into serviceCIDR only DNATed (an address there
                                                        that is no virtual IP is nothing of ours);
                                                        authz: a grant's sources may open NEW connections
                                                        to its exposure; they get the grant's conntrack
                                                        mark; marked established flows pass (one rule);
                                                        everything else to a virtual IP drops
                         POSTROUTING VPNGW-POSTROUTING  SNAT  exposures -> NIC2's address (targets reply
                                                        to us); reverse exposures -> Nat.source_address
                                                        (inside serviceCIDR: the tunnels' traffic selector)
    (first in VPNGW-FORWARD, after revoked marks' tombstones: conntrack INVALID, a packet of no
    connection, drops)
    fabric --NIC2--> gw: PREROUTING  VPNGW-MANGLE       (mangle) a NEW connection that comes in on NIC2
                                                        gets the reply bit in its conntrack mark; its
                                                        REPLY packets get it as their packet mark, and
                                                        policy routing (routing.py) sends them out
                                                        through NIC2 whatever the main table says
    the pod itself:      INPUT       VPNGW-INPUT        from a tunnel (ipsec+, IPsec policy, the WireGuard
                                                        device) or NIC2, only replies and, on NIC2, what
                                                        the tunnels need (IKE, ESP / the WireGuard port)
                         OUTPUT      VPNGW-OUTPUT       never the metadata service through NIC2
                         FORWARD     VPNGW-TARGETS      never forwarded to the metadata service
    IPv6 (ip6tables):    INPUT, FORWARD, OUTPUT         nothing through NIC2, nothing in from or forwarded
                                                        through a tunnel device (:func:`ipv6_rules`): the
                                                        data plane is IPv4 only, NIC2 has a link-local
                                                        address anyway

What each rule stops, and the live test that shows it, is in docs/initnat.md ("Hostile neighbours and
peers"). Exposures whose target DNS or the pod refuses, or that claim a virtual IP an earlier one has,
are left out alone (:class:`LeftOut`); targetHost names are resolved as absolute names (dns.py).

Authorisation matches the ORIGINAL (pre-DNAT) destination through ``-m conntrack --ctorigdst``, so the
filter decides on what the client asked for, not on where DNAT sent it. Rules are rendered in the exact
form ``iptables-save`` prints them (``-d x/32``, ``-p tcp -m tcp --dport``, ``0x`` marks), so comparing
the kernel's state with the wanted state is a string comparison (no-op re-applies touch nothing).

Every plan value that reaches iptables is validated here (addresses and networks through ``ipaddress``,
ports as ints 1..65535, marks within the mask) and re-rendered from the parsed value, never copied as
text. Names only ever appear inside ``--comment "..."`` after :func:`comment` reduced them to a safe
alphabet. Errors name the plan field (``nat.exposures[2].virtualIp: ...``).

This module is pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Literal

from gwplan import DEFAULT_REPLY_MARK as _DEFAULT_REPLY_MARK
from gwplan import DEVICE_NAME_RULE, Exposure, Grant, Nat, Nic, ReverseExposure, is_device_name

FILTER_CHAIN = "VPNGW-FORWARD"
TARGET_CHAIN = "VPNGW-TARGETS"
DNAT_CHAIN = "VPNGW-PREROUTING"
EXPOSURE_CHAIN = "VPNGW-EXPOSURES"
SNAT_CHAIN = "VPNGW-POSTROUTING"
MANGLE_CHAIN = "VPNGW-MANGLE"
INPUT_CHAIN = "VPNGW-INPUT"
OUTPUT_CHAIN = "VPNGW-OUTPUT"
OWN_PREFIX = "VPNGW-"
Table = Literal["filter", "nat", "mangle"]

JUMPS: tuple[tuple[Table, str, str], ...] = (
    ("filter", "FORWARD", FILTER_CHAIN),
    ("filter", "INPUT", INPUT_CHAIN),
    ("filter", "OUTPUT", OUTPUT_CHAIN),
    ("nat", "PREROUTING", DNAT_CHAIN),
    ("nat", "POSTROUTING", SNAT_CHAIN),
    ("mangle", "PREROUTING", MANGLE_CHAIN),
)
"""(table, built-in chain, our chain): each jump is kept exactly once, as the built-in chain's FIRST
rule, so a foreign ACCEPT cannot bypass our authorisation. Only the jumps to chains a ruleset has are
written (a ruleset without the pod guard, :class:`Guard`, has no INPUT/OUTPUT chains)."""

_MAX_NAME = 100  # per name inside a comment
_MAX_COMMENT = 250  # xt_comment holds 255 characters (256 bytes with the NUL)
_COMMENT_SAFE = re.compile(r"[^A-Za-z0-9._:/@=+-]")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
_MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
_RESERVED_TABLES = frozenset({0, 253, 254, 255})  # unspec, default, main, local

DEFAULT_REPLY_MARK = _DEFAULT_REPLY_MARK
"""``nic.replyMark`` when the plan has none: bit 28, outside the default ``nat.markMask`` (0x0fff0000)."""
CHARON_RULE_PRIORITY = 220
"""charon's ``routing_table_prio`` (table 220 holds the routes to the tunnels' remote subnets): our reply
rules must come after it, so replies into a tunnel keep following charon's routes."""
RULE_OFFSETS = 3
"""Our rules sit at ``nic.rulePriority`` + 0 (from NIC2's address), +1 (to exposure targets), +2 and +3
(the reply rules, routing.py)."""


class NatConfigError(ValueError):
    """A plan value that would reach iptables or netlink is invalid; the message names the field."""


@dataclass(frozen=True)
class Unresolved:
    """A targetHost DNS gave no address for: ``reason`` says why; ``temporary`` when another try may
    answer (no answer in time, SERVFAIL), not when DNS said the name has no address (NXDOMAIN, NODATA)."""

    reason: str
    temporary: bool


Answer = IPv4Address | Unresolved
"""What a lookup of a targetHost gave."""


# --- validation helpers -----------------------------------------------------------------------------


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise NatConfigError(f"{field}: expected a string, got {type(value).__name__}")
    return value


def address(value: object, field: str) -> IPv4Address:
    """An IPv4 address literal (dotted quad, nothing else)."""
    text = _str(value, field)
    try:
        return IPv4Address(text)
    except ValueError:
        raise NatConfigError(f"{field}: {_show(text)} is not an IPv4 address") from None


METADATA = IPv4Address("169.254.169.254")
"""The cloud's metadata service (OpenStack's and the others'): never a target, never reached through NIC2
or forwarded to (:func:`guard_rules`)."""


def special_purpose(addr: IPv4Address) -> bool:
    """Not a unicast host: this-network, loopback, link-local (the metadata service, 169.254/16),
    multicast, reserved space, broadcast."""
    return (
        addr.is_unspecified
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr == IPv4Address("255.255.255.255")
        or addr in IPv4Network("0.0.0.0/8")
    )


def target(value: object, field: str) -> IPv4Address:
    """A DNAT target: a unicast host address. A resolved targetHost is checked here too, since the
    controller only sees the name: DNS must not point an exposure at the metadata service (169.254/16),
    loopback, this-network, multicast or reserved space."""
    addr = address(value, field)
    if special_purpose(addr):
        raise NatConfigError(f"{field}: {addr} is a special-purpose address, not a unicast host")
    return addr


def network(value: object, field: str) -> IPv4Network:
    """An IPv4 address or CIDR; host bits are cleared (iptables would do the same)."""
    text = _str(value, field)
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise NatConfigError(f"{field}: {_show(text)} is not an IPv4 address or CIDR") from None
    if not isinstance(net, IPv4Network):
        raise NatConfigError(f"{field}: {_show(text)} is IPv6; this gateway's rules are IPv4 only")
    return net


def source_network(value: object, field: str) -> IPv4Network:
    """A CIDR traffic is admitted from: not 0.0.0.0/0, which admits every source (and which iptables-save
    prints as no ``-s`` at all, so the admission rule could not be read back: init-nat would revoke and
    flush it on every apply)."""
    net = network(value, field)
    if net.prefixlen == 0:
        raise NatConfigError(f"{field}: {net} admits every source; name the networks that may connect")
    return net


def interface(value: object, field: str) -> IPv4Interface:
    text = _str(value, field)
    try:
        iface = IPv4Interface(text)
    except ValueError:
        raise NatConfigError(f"{field}: {_show(text)} is not an IPv4 address with prefix") from None
    return iface


def port(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise NatConfigError(f"{field}: {_show(value)} is not a port number (an integer 1..65535)")
    return value


def protocol(value: object, field: str) -> Literal["tcp", "udp"]:
    if value == "TCP":
        return "tcp"
    if value == "UDP":
        return "udp"
    raise NatConfigError(f"{field}: {_show(value)} is not TCP or UDP")


def hostname(value: object, field: str) -> str:
    text = _str(value, field)
    if not _HOSTNAME.match(text) or text.replace(".", "").isdigit():
        raise NatConfigError(f"{field}: {_show(text)} is not a DNS hostname (RFC 1123)")
    return text.rstrip(".").lower()


def mac(value: object, field: str) -> str:
    text = _str(value, field)
    if not _MAC.match(text):
        raise NatConfigError(f"{field}: {_show(text)} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    return text.lower()


def _int(value: object, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise NatConfigError(f"{field}: {_show(value)} is not an integer {lo}..{hi}")
    return value


def _show(value: object) -> str:
    """A bounded, printable rendering of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def comment(text: str) -> str:
    """``text`` (a plan name) reduced to characters that are inert inside a double-quoted iptables
    argument: no quotes, backslashes, whitespace, control or non-ASCII characters."""
    return _COMMENT_SAFE.sub("_", text)[:_MAX_NAME]


_NO_QUOTE = re.compile(r"^[A-Za-z0-9_-]+$")


def quoted(text: str) -> str:
    """``text`` as ``iptables-save`` prints an argument (xtables_save_string): bare when it is only
    ``[A-Za-z0-9_-]``, else in double quotes. ``text`` never holds a quote or backslash (see comment)."""
    return text if _NO_QUOTE.match(text) else f'"{text}"'


# --- validated model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NicConfig:
    """NIC2 as the plan describes it, validated. ``None`` fields are read from the interface."""

    mac: str | None
    address: IPv4Interface | None
    gateway: IPv4Address | None
    table: int
    rule_priority: int
    reply_mark: int = DEFAULT_REPLY_MARK
    """One bit: the conntrack mark of connections that came in on NIC2, the packet mark of their replies
    and the ``fwmark`` of the reply rules."""


def validate_nic(nic: Nic) -> NicConfig:
    return NicConfig(
        mac=None if nic.mac is None else mac(nic.mac, "nic.mac"),
        address=None if nic.address is None else interface(nic.address, "nic.address"),
        gateway=None if nic.gateway is None else address(nic.gateway, "nic.gateway"),
        table=_checked_table(nic.table),
        rule_priority=_rule_priority(nic.rule_priority),
        reply_mark=DEFAULT_REPLY_MARK if nic.reply_mark is None else reply_mark(nic.reply_mark),
    )


def _rule_priority(value: object) -> int:
    # Our reply rules (+2, +3) must come after charon's 220, and +3 before main's 32766.
    low, high = CHARON_RULE_PRIORITY - 1, 32765 - RULE_OFFSETS
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value < low:
        raise NatConfigError(
            f"nic.rulePriority: {value} would put init-nat's reply rules ({value + 2}, {value + 3}) in front "
            f"of charon's table {CHARON_RULE_PRIORITY}: replies into a tunnel must follow charon's routes; "
            f"use {low}..{high} (the default is 1000)"
        )
    return _int(value, "nic.rulePriority", low, high)


def reply_mark(value: object, field: str = "nic.replyMark") -> int:
    """A single mark bit (``fwmark B/B`` and ``--set-xmark B/B``: one bit cannot collide with itself)."""
    bit = _int(value, field, 1, 2**31)
    if bit & (bit - 1):
        raise NatConfigError(f"{field}: {bit:#x} is not a single bit (e.g. 0x10000000)")
    return bit


def _checked_table(value: object) -> int:
    table = _int(value, "nic.table", 1, 2**32 - 1)
    if table in _RESERVED_TABLES:
        raise NatConfigError(f"nic.table: {table} is reserved (253 default, 254 main, 255 local)")
    return table


@dataclass(frozen=True, order=True)
class Service:
    """One (virtual IP, protocol, port) -> target mapping."""

    vip: IPv4Address
    proto: Literal["tcp", "udp"]
    port: int
    target: IPv4Address
    name: str
    kind: Literal["exposure", "reverse"]


@dataclass(frozen=True, order=True)
class Admission:
    """What one grant admits: NEW connections from ``source`` to one service."""

    mark: int
    source: IPv4Network
    service: Service

    @property
    def key(self) -> tuple[IPv4Network, str, IPv4Address, int, IPv4Address]:
        """What revocation compares (:func:`revoked`), exactly what the kernel's admission rule shows
        (``tables.admissions``): source, protocol, virtual IP, port, and the target (carried in the
        rule's comment). Names and kinds do not count: a renamed exposure admits the same flows."""
        s = self.service
        return (self.source, s.proto, s.vip, s.port, s.target)


@dataclass(frozen=True, order=True)
class Flush:
    """Delete the conntrack entries whose ``ctmark & mask == mark``."""

    mark: int
    mask: int

    def __str__(self) -> str:
        return f"{self.mark:#x}/{self.mask:#x}"


@dataclass(frozen=True, order=True)
class Reply:
    """Replies to connections that came in on ``device`` (NIC2) leave through it (:func:`render`'s mangle
    chain marks them with ``mark``; routing.py's reply rules route that mark to NIC2's table)."""

    device: str
    mark: int


@dataclass(frozen=True, order=True)
class LeftOut:
    """An exposure that is not in the rules, with its grants, because its target depends on something
    outside the plan that refused it: DNS (``targetHost`` unresolvable, a single-label name, or resolved
    to an address a literal ``targetAddress`` could not be either, or outside ``nat.allowedTargets``) or
    the pod (the target is one of its own addresses); or because it claims a virtual IP an earlier
    (reverse) exposure of the plan already has (the first in plan order keeps it). Everything else of the
    plan is applied; the exposure's virtual IP is dropped like a virtual IP no grant admits, and its
    grants' flows are revoked like any withdrawn grant's."""

    field: str
    """The plan field that was refused, e.g. ``nat.exposures[2].targetHost``."""
    exposure: str
    vip: IPv4Address
    reason: str
    host: str | None = None
    grants: tuple[Grant, ...] = ()
    kind: Literal["exposure", "reverse"] = "exposure"
    """``reverse``: a reverse exposure (left out only for a virtual IP another one already has)."""


_IPSEC_POLICY_IN = "-m policy --dir in --pol ipsec"
IKE_PORTS = (500, 4500)
"""IKE, and NAT-T (IKE and ESP-in-UDP: charon's kernel-libipsec always encapsulates) on 4500."""
LIBIPSEC_DEVICES = "ipsec+"
"""charon's kernel-libipsec TUN devices (``ipsec0``, ...): decapsulated packets come in on them."""


@dataclass(frozen=True, order=True)
class Guard:
    """What may reach the pod itself from NIC2 and the tunnels (the pod guard, :func:`guard_rules`)."""

    nic: str
    """NIC2's name (found by MAC)."""
    ipsec: bool = False
    """An IPsec gateway: IKE (UDP 500, 4500) and ESP come in on NIC2; decapsulated traffic comes in on
    ``ipsec+`` (kernel-libipsec) or on NIC2 with an IPsec policy (kernel XFRM)."""
    wireguard: tuple[str, int] | None = None
    """A WireGuard gateway: (device, listen port). The port comes in on NIC2, decapsulated traffic on the
    device."""
    standby: bool = False
    """The pod is its HA pair's standby (the role file says ``standby``, :func:`role_of`): NIC2 drops what
    the tunnels need (IKE and ESP, or the WireGuard port), ahead of the replies rule, so nobody reaches its
    charon or device and no flow the pod served while it was active goes on (:func:`standby_rules`)."""


@dataclass(frozen=True)
class Policy:
    """The NAT section, validated and flattened. Input of rendering and of :func:`revoked`."""

    services: tuple[Service, ...]
    admissions: tuple[Admission, ...]
    grants: tuple[Grant, ...]
    """The plan's grants, in plan order, each with a valid, unique mark."""
    mask: int
    exposure_snat: IPv4Address
    reverse_snat: IPv4Address | None
    service_cidr: IPv4Network | None = None
    tunnel_interfaces: tuple[str, ...] = ()
    """Devices whose peers choose their own destinations (WireGuard): a NEW connection coming in through
    one of them is forwarded only if we DNATed it (an exposure's virtual IP)."""
    reply: Reply | None = None
    """NIC2 and the reply bit; None renders no mangle chain (what callers that know no NIC2 name get)."""
    left_out: tuple[LeftOut, ...] = ()
    """Exposures not in the rules (and their grants, not in :attr:`grants`), each with its reason."""
    guard: Guard | None = None
    """What may reach the pod itself; None renders no INPUT/OUTPUT chains (callers that know no NIC2)."""

    @property
    def marks(self) -> frozenset[int]:
        return frozenset(g.mark for g in self.grants)

    @property
    def exposure_targets(self) -> frozenset[IPv4Address]:
        """Fabric-side targets: reached through NIC2 whatever the pod's default route (routing.py)."""
        return frozenset(s.target for s in self.services if s.kind == "exposure")

    @property
    def nic(self) -> str | None:
        """NIC2's name when the caller gave the pod guard (what NIC2 and the tunnels may reach)."""
        return None if self.guard is None else self.guard.nic

    @property
    def from_tunnels(self) -> tuple[str, ...]:
        """The matches of traffic that came through a tunnel (:func:`tunnel_matches`), empty when the
        caller knew no tunnel: then exposures are DNATed from nowhere (fail closed)."""
        return tunnel_matches(self.guard, self.tunnel_interfaces)


def tunnel_matches(guard: Guard | None, devices: Iterable[str] = ()) -> tuple[str, ...]:
    """iptables matches, one per way a tunnel's decapsulated packets come in: for IPsec an inbound IPsec
    policy (kernel XFRM: they come in on NIC2) and the ``ipsec+`` TUN devices (kernel-libipsec); for
    WireGuard its device (``guard.wireguard``, and ``devices``: Policy.tunnel_interfaces)."""
    out: dict[str, None] = {}
    if guard is not None and guard.ipsec:
        out[_IPSEC_POLICY_IN] = None
        out[f"-i {LIBIPSEC_DEVICES}"] = None
    if guard is not None and guard.wireguard is not None:
        out[f"-i {guard.wireguard[0]}"] = None
    for dev in devices:
        out[f"-i {dev}"] = None
    return tuple(out)


def fully_qualified(host: str) -> bool:
    """``host`` (normalised by :func:`hostname`) has more than one label. A single label (``db``) only
    means something under a search domain, and the pod's are the gateway namespace's: DNS is never asked
    about one (:func:`validate` leaves its exposure out)."""
    return "." in host


def target_hosts(nat: Nat) -> tuple[str, ...]:
    """The exposures' ``targetHost`` names (normalised, once each) that need DNS; a name that is no
    hostname is refused here, before anything asks DNS about it, and a single-label one is not asked
    about (:func:`fully_qualified`). dns.lookup resolves each as an absolute name."""
    out: dict[str, None] = {}
    for i, e in enumerate(nat.exposures):
        if e.target_address is None and e.target_host is not None:
            host = hostname(e.target_host, f"nat.exposures[{i}].targetHost")
            if fully_qualified(host):
                out[host] = None
    return tuple(out)


def validate(
    nat: Nat,
    *,
    nic2_address: IPv4Address,
    resolved: Mapping[str, Answer] | None = None,
    tunnel_interfaces: Sequence[tuple[str, str]] = (),
    reply: Reply | None = None,
    own_addresses: Iterable[IPv4Address] = (),
    guard: Guard | None = None,
) -> Policy:
    """Check every value of ``nat`` that reaches iptables; ``resolved`` maps target hosts to what DNS
    answered (an address, or :class:`Unresolved`); ``tunnel_interfaces`` are (field, device name) of
    tunnels whose peers pick their destinations; ``reply`` is NIC2's name and ``nic.replyMark``
    (validated: a device name, one bit outside markMask); ``own_addresses`` are the pod's addresses
    (NIC2's is one whatever is given); ``guard`` what may reach the pod itself (device names and the
    WireGuard port validated).

    A value of the plan itself that is invalid raises :class:`NatConfigError` (nothing is applied: the
    controller renders valid plans, so this is a bug or a hand-made plan). A target refused for what DNS
    or the pod says (:class:`LeftOut`) leaves that exposure and its grants out of the policy, and the
    rest is applied: one unresolvable name must not keep a revocation elsewhere in the plan from taking
    effect. A resolved address is refused exactly where a literal ``targetAddress`` would be."""
    resolved = resolved or {}
    own = frozenset(own_addresses) | {nic2_address}
    allowed = (
        None
        if nat.allowed_targets is None
        else [network(c, f"nat.allowedTargets[{i}]") for i, c in enumerate(nat.allowed_targets)]
    )
    if guard is not None:
        _check_guard(guard)
    for field_name, dev in tunnel_interfaces:
        if not is_device_name(dev):
            raise NatConfigError(
                f"{field_name}: {_show(dev)} is not a network device name ({DEVICE_NAME_RULE})"
            )
    mask = _int(nat.mark_mask, "nat.markMask", 1, 2**32 - 1)
    if mask == 0xFFFFFFFF:
        # libxt_connmark prints `--mark X/0xffffffff` as `--mark X`: the kernel's rules would never
        # compare equal to ours (every apply a rewrite, every grant revoked after a restart, tombstones
        # not found). 0xfffffffe and narrower round-trip (tested with the real iptables-save).
        raise NatConfigError(
            "nat.markMask: 0xffffffff is not supported: iptables-save prints a full mask without it "
            "(`--mark X`), so init-nat could not read its own rules back; leave at least one bit out "
            "(the default is 0xfff0000)"
        )
    if reply is not None:
        if not is_device_name(reply.device):
            raise NatConfigError(
                f"nic: NIC2's name {_show(reply.device)} cannot be used in an iptables rule "
                f"({DEVICE_NAME_RULE})"
            )
        bit = reply_mark(reply.mark)
        if bit & mask:
            # Grants' --set-xmark G/MASK would overwrite the bit, and flushes by G/MASK would see it.
            raise NatConfigError(
                f"nic.replyMark: {bit:#x}{' (the default)' if bit == DEFAULT_REPLY_MARK else ''} is inside "
                f"nat.markMask {mask:#x}: the reply bit must be outside the grants' marks; set "
                f"nic.replyMark to a bit outside it, e.g. {_free_bit(mask):#x}"
            )
    cidr = None if nat.service_cidr is None else network(nat.service_cidr, "nat.serviceCidr")
    source = None if nat.source_address is None else address(nat.source_address, "nat.sourceAddress")
    if source is not None and cidr is not None and source not in cidr:
        raise NatConfigError(f"nat.sourceAddress: {source} is outside nat.serviceCidr {cidr}")
    internal = tuple(
        source_network(c, f"nat.internalSourceCidrs[{i}]") for i, c in enumerate(nat.internal_source_cidrs)
    )
    services: list[Service] = []
    by_name: dict[tuple[str, str], list[Service]] = {}
    seen: set[tuple[IPv4Address, str, int]] = set()
    vip_of: dict[IPv4Address, str] = {}  # one virtual IP, one (reverse) exposure: SNAT is chosen per VIP
    target_of: list[tuple[str, IPv4Address]] = []  # (field, target), checked against every virtual IP
    refused: dict[tuple[str, str], LeftOut] = {}  # (kind, name) -> why it is left out (grants added below)
    # Every virtual IP of the plan, before any is validated (a reverse exposure's comes after the
    # exposures): a resolved address that is one is refused for that exposure alone. Bad values are
    # skipped here and named by add() below.
    all_vips: dict[IPv4Address, str] = {}
    every: list[tuple[str, Exposure | ReverseExposure]] = [
        *((f"nat.exposures[{i}]", x) for i, x in enumerate(nat.exposures)),
        *((f"nat.reverseExposures[{i}]", x) for i, x in enumerate(nat.reverse_exposures)),
    ]
    for where, x in every:
        with contextlib.suppress(ValueError, TypeError):
            all_vips.setdefault(IPv4Address(x.virtual_ip), where)

    def add(
        kind: Literal["exposure", "reverse"],
        e: Exposure | ReverseExposure,
        path: str,
        target: IPv4Address | None,
        target_field: str,
        why: str | None = None,
        host: str | None = None,
    ) -> None:
        """Validate a (reverse) exposure; ``target`` None: it is left out (``why``), its name and virtual
        IP still taken (a grant naming it is left out too; its virtual IP is dropped). One that claims a
        virtual IP an earlier one has is left out too: the first in plan order keeps it."""
        name = _str(e.name, f"{path}.name")
        if not name:
            raise NatConfigError(f"{path}.name: must not be empty")
        if (kind, name) in by_name:
            raise NatConfigError(f"{path}.name: {_show(name)} is used twice")
        vip = address(e.virtual_ip, f"{path}.virtualIp")
        if cidr is not None and vip not in cidr:
            raise NatConfigError(f"{path}.virtualIp: {vip} is outside nat.serviceCidr {cidr}")
        if vip == source:
            raise NatConfigError(f"{path}.virtualIp: {vip} is nat.sourceAddress (the gateway's own)")
        if not e.ports:
            raise NatConfigError(f"{path}.ports: at least one port is required")
        keys: list[tuple[IPv4Address, Literal["tcp", "udp"], int]] = []
        for j, p in enumerate(e.ports):
            key = (
                vip,
                protocol(p.protocol, f"{path}.ports[{j}].protocol"),
                port(p.port, f"{path}.ports[{j}].port"),
            )
            if key in keys:
                raise NatConfigError(f"{path}.ports[{j}]: {vip} {key[1]}/{key[2]} is listed twice")
            keys.append(key)
        if vip in vip_of:
            # Two (reverse) exposures on one virtual IP: a (virtual IP, protocol, port) can DNAT to one
            # target only, and SNAT is chosen per virtual IP. The one that came first keeps it; this one
            # alone is left out, whatever its target (a newcomer cannot knock out a working exposure).
            clash = [f"{k[1]}/{k[2]}" for k in keys if k in seen]
            target, target_field, host = None, f"{path}.virtualIp", None
            why = f"{vip} is already the virtual IP of {vip_of[vip]}" + (
                f" (with {', '.join(clash)})" if clash else ""
            )
        else:
            vip_of[vip] = path
            seen.update(keys)
        if target is not None:
            target_of.append((target_field, target))
        mine = [] if target is None else [Service(v, proto, n, target, name, kind) for v, proto, n in keys]
        by_name[(kind, name)] = mine
        services.extend(mine)
        if target is None:
            refused[(kind, name)] = LeftOut(target_field, name, vip, why or "refused", host, kind=kind)

    for i, e in enumerate(nat.exposures):
        path = f"nat.exposures[{i}]"
        dest: IPv4Address | None = None
        why: str | None = None
        host: str | None = None
        if e.target_address is not None:
            target_field = f"{path}.targetAddress"
            dest = target(e.target_address, target_field)
        elif e.target_host is not None:
            target_field = f"{path}.targetHost"
            host = hostname(e.target_host, target_field)
            answer = resolved.get(host)
            if not fully_qualified(host):
                why = (
                    f"{host} is a single-label name: a targetHost must be fully qualified (e.g. "
                    f"{host}.example.com); it is resolved as an absolute name, never under the pod's search "
                    "domains (the gateway namespace's, not the tenant's)"
                )
            elif answer is None:
                raise NatConfigError(f"{target_field}: {host} has not been resolved")
            elif isinstance(answer, Unresolved):
                why = f"{host} does not resolve: {answer.reason}"
            elif special_purpose(answer):
                why = f"{host} resolved to {answer}, a special-purpose address, not a unicast host"
            elif answer in all_vips:
                why = (
                    f"{host} resolved to {answer}, the virtual IP of {all_vips[answer]}; "
                    "a target must be a real address"
                )
            else:
                dest = answer
        else:
            raise NatConfigError(f"{path}: targetAddress or targetHost is required")
        if dest is not None and dest in own:
            # DNAT to the pod itself would hand a peer the pod's own ports (probes, metrics, IKE).
            why = f"{dest} is the pod's own address" + (f" (resolved from {host})" if host else "")
            dest = None
        if dest is not None and allowed is not None and not any(dest in n for n in allowed):
            # The operator's allowance for the gateway's namespace (nat.allowedTargets): a name is
            # resolved here, so only here can its address be checked.
            allowance = ", ".join(map(str, allowed)) or "none"
            resolved_from = f" (resolved from {host})" if host else ""
            why = f"{dest}{resolved_from} is outside the exposure targets the operator allows ({allowance})"
            dest = None
        add("exposure", e, path, dest, target_field, why, host)
    for i, r in enumerate(nat.reverse_exposures):
        path = f"nat.reverseExposures[{i}]"
        if source is None:
            raise NatConfigError(f"{path}: reverse exposures need nat.sourceAddress (the SNAT source)")
        if not internal:
            raise NatConfigError(f"{path}: reverse exposures need nat.internalSourceCidrs")
        add("reverse", r, path, target(r.target_address, f"{path}.targetAddress"), f"{path}.targetAddress")
    for target_field, dest in target_of:
        if dest in vip_of:  # DNAT to a virtual IP: to its own, our filter drops it; to another, a loop
            raise NatConfigError(
                f"{target_field}: {dest} is the virtual IP of {vip_of[dest]}; a target must be a real address"
            )

    admissions: list[Admission] = []
    kept: list[Grant] = []
    left_grants: dict[tuple[str, str], list[Grant]] = {key: [] for key in refused}
    marks: dict[int, str] = {}
    for i, g in enumerate(nat.grants):
        path = f"nat.grants[{i}]"
        _str(g.peer, f"{path}.peer")
        mark = _int(g.mark, f"{path}.mark", 1, 2**32 - 1)
        if mark & ~mask or not mark & mask:
            raise NatConfigError(
                f"{path}.mark: {mark:#x} is not a non-zero value within nat.markMask {mask:#x}"
            )
        if mark in marks:
            raise NatConfigError(f"{path}.mark: {mark:#x} is already the mark of {marks[mark]}")
        marks[mark] = path
        if g.kind not in ("exposure", "reverse"):
            raise NatConfigError(f"{path}.kind: {_show(g.kind)} is not exposure or reverse")
        targets = by_name.get((g.kind, _str(g.exposure, f"{path}.exposure")))
        if targets is None:
            what = "nat.exposures" if g.kind == "exposure" else "nat.reverseExposures"
            raise NatConfigError(f"{path}.exposure: {_show(g.exposure)} is not in {what}")
        sources = []
        for j, s in enumerate(g.sources):
            src = source_network(s, f"{path}.sources[{j}]")
            if g.kind == "reverse" and not any(src.subnet_of(c) for c in internal):
                raise NatConfigError(f"{path}.sources[{j}]: {src} is not inside nat.internalSourceCidrs")
            sources.append(src)
        if (g.kind, g.exposure) in refused:
            left_grants[(g.kind, g.exposure)].append(g)  # validated like the others, admitted nowhere
            continue
        kept.append(g)
        admissions.extend(Admission(mark, src, svc) for src in sources for svc in targets)
    return Policy(
        services=tuple(services),
        admissions=tuple(admissions),
        grants=tuple(kept),
        mask=mask,
        exposure_snat=nic2_address,
        reverse_snat=source,
        service_cidr=cidr,
        tunnel_interfaces=tuple(dev for _, dev in tunnel_interfaces),
        reply=reply,
        left_out=tuple(dataclasses.replace(x, grants=tuple(left_grants[key])) for key, x in refused.items()),
        guard=guard,
    )


def _check_guard(guard: Guard) -> None:
    if not is_device_name(guard.nic):
        raise NatConfigError(
            f"nic: NIC2's name {_show(guard.nic)} cannot be used in an iptables rule ({DEVICE_NAME_RULE})"
        )
    if guard.wireguard is not None:
        dev, listen = guard.wireguard
        if not is_device_name(dev):
            raise NatConfigError(
                f"wireguard.interface: {_show(dev)} is not a network device name ({DEVICE_NAME_RULE})"
            )
        port(listen, "wireguard.listenPort")


@dataclass(frozen=True, order=True)
class Kept:
    """A targetHost DNS could not answer this time (temporarily) that keeps the address it had."""

    host: str
    address: IPv4Address
    reason: str


def keep_last(
    answers: Mapping[str, Answer], last: Mapping[str, IPv4Address]
) -> tuple[dict[str, Answer], tuple[Kept, ...]]:
    """``answers`` where a name that could not be resolved THIS time (no answer in time, SERVFAIL: a
    DNS outage) keeps the address it had (``last``, what :func:`remember` kept): a moment of DNS trouble
    must not revoke an exposure's flows. A name DNS says has no address (NXDOMAIN) or one never resolved
    is not kept: that exposure is left out. The kept address goes through :func:`validate` again."""
    out: dict[str, Answer] = {}
    kept: list[Kept] = []
    for host, a in answers.items():
        if isinstance(a, Unresolved) and a.temporary and host in last:
            out[host] = last[host]
            kept.append(Kept(host, last[host], a.reason))
        else:
            out[host] = a
    return out, tuple(kept)


def remember(answers: Mapping[str, Answer], policy: Policy) -> dict[str, IPv4Address]:
    """The addresses :func:`keep_last` may fall back on next time: those in force (not left out)."""
    refused = {x.host for x in policy.left_out}
    return {h: a for h, a in answers.items() if isinstance(a, IPv4Address) and h not in refused}


def _free_bit(mask: int) -> int:
    """The highest bit outside ``mask`` (there is one: a full mask is refused)."""
    return next(1 << b for b in range(31, -1, -1) if not mask & (1 << b))


# --- rendering ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRules:
    table: Table
    chains: tuple[str, ...]
    rules: tuple[str, ...]
    """``-A <our chain> ...`` lines, exactly as ``iptables-save`` prints them."""


@dataclass(frozen=True)
class Ruleset:
    tables: tuple[TableRules, ...]
    marks: frozenset[int]
    mask: int

    @property
    def rule_count(self) -> int:
        return sum(len(t.rules) for t in self.tables)


def _hex(n: int) -> str:
    return f"{n:#x}"


def _c(*words: str) -> str:
    """A comment match: fixed words and sanitised names, space-separated."""
    return f"-m comment --comment {quoted(' '.join(words)[:_MAX_COMMENT])}"


def tombstone_rules(tombstones: Iterable[Flush]) -> list[str]:
    """One DROP per revoked mark, with the mask its entries were marked under (see :func:`render`)."""
    return [
        f"-A {FILTER_CHAIN} -m connmark --mark {_hex(t.mark)}/{_hex(t.mask)} "
        f"{_c('vpngw revoked until its conntrack flush')} -j DROP"
        for t in sorted(set(tombstones))
    ]


_ESTABLISHED = "-m conntrack --ctstate RELATED,ESTABLISHED -m connmark ! --mark 0x0/"


def with_tombstones(ruleset: Ruleset, tombstones: Iterable[Flush]) -> Ruleset:
    """``ruleset`` plus a DROP per revoked mark whose conntrack entries may still exist (the flush
    follows this ruleset, or it failed), FIRST in our filter chain: a revoked grant is cut by the same
    transaction that withdraws its admission, not only once (or if) the flush succeeds. First, not just
    in front of the shared established-flows rule: after a ``serviceCidr`` change a revoked flow's
    original destination (the old virtual IP) is outside the new CIDR, and the gate would RETURN it
    before any later rule. Every forwarded packet tests them, but they exist only between a
    revocation's transaction and its flush. The caller lifts them again after a successful flush."""
    stones = tombstone_rules(tombstones)
    if not stones:
        return ruleset
    out = []
    for t in ruleset.tables:
        if t.table == "filter":
            t = TableRules(t.table, t.chains, (*stones, *t.rules))
        out.append(t)
    return Ruleset(tuple(out), ruleset.marks, ruleset.mask)


def render(policy: Policy, tombstones: Iterable[Flush] = ()) -> Ruleset:
    """The rules of our chains for ``policy`` (deterministic: same input, same lines), with
    ``tombstones`` (:func:`with_tombstones`)."""
    return with_tombstones(_render(policy), tombstones)


def _render(policy: Policy) -> Ruleset:
    m = _hex(policy.mask)
    filter_rules: list[str] = []
    grant_names = {g.mark: f"peer={comment(g.peer)} {g.kind}={comment(g.exposure)}" for g in policy.grants}
    # A packet conntrack calls INVALID (a bare RST, a FIN or SYN+ACK of no connection, an ICMP error of
    # none) has no entry, so none of the --ctstate/--ctorigdst rules below match it and it would fall
    # through to FORWARD's ACCEPT: found by review, a transit neighbour probed the networks behind the
    # gateway that way (blind, but both ways). Nothing of ours is ever INVALID.
    filter_rules.append(f"-A {FILTER_CHAIN} -m conntrack --ctstate INVALID {_c(INVALID_DROP)} -j DROP")
    for dev in policy.tunnel_interfaces:
        # A WireGuard peer picks its destinations (its AllowedIPs constrain only its source): from its
        # tunnel only our virtual IPs are a way in. NEW and not DNATed by us: dropped, whatever the
        # address (an exposure target's real one, NIC2's subnet, the cluster network behind eth0).
        # Replies and DNATed connections pass; reverse exposures enter from the fabric side.
        filter_rules.append(
            f"-A {FILTER_CHAIN} -i {dev} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
            f"{_c('vpngw tunnel ingress only to virtual IPs')} -j DROP"
        )
    if policy.nic is not None:
        # NIC2 is the shared transit network: other tenants' gateways and VMs can make the pod their
        # next hop. What may come in on it to be forwarded is a reverse exposure (DNATed by us) and the
        # replies of what we forwarded out; a NEW connection we did not DNAT is a neighbour using the
        # pod as a router: into a tunnel (WireGuard encrypts by destination; a serviceCIDR source
        # matches an IPsec policy), into the cluster behind eth0, or to anything else. Under kernel XFRM
        # a tunnel's decapsulated packets come in on NIC2 too: not DNATed, they are no exposure either.
        filter_rules.append(
            f"-A {FILTER_CHAIN} -i {policy.nic} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
            f"{_c(NIC2_INGRESS)} -j DROP"
        )
    targets = sorted(policy.exposure_targets)
    if targets or policy.guard is not None:
        # An exposure target is reachable through its virtual IP only. A NEW forwarded connection that
        # was not DNATed by us asked for some real address: if that is a target, drop it (IPsec's
        # selectors already refuse it; a WireGuard peer's allowed IPs only constrain its SOURCE). DNATed
        # connections (exposures, reverse exposures), replies and established flows skip the list; the
        # gateway's own traffic never passes FORWARD.
        filter_rules.append(
            f"-A {FILTER_CHAIN} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
            f"{_c('vpngw new and not DNATed')} -j {TARGET_CHAIN}"
        )
    target_rules = []
    if policy.guard is not None:
        # Nothing is ever forwarded to the cloud's metadata service (it would answer with the node's
        # instance data): not DNATed (validate refuses it as a target), so NEW connections to it walk
        # this list, whichever device they came in on.
        target_rules.append(f"-A {TARGET_CHAIN} -d {METADATA}/32 {_c(_NOT_METADATA)} -j DROP")
    target_rules += [
        f"-A {TARGET_CHAIN} -d {t}/32 {_c('vpngw exposure target only via its virtual IP')} -j DROP"
        for t in targets
    ]
    if policy.service_cidr is not None:  # traffic that is not for a virtual IP leaves our chain at once
        # iptables-save prints a /32 conntrack address without its prefix: render it the same way, or
        # the rule would never read back equal (a full re-apply every resync).
        cidr = policy.service_cidr
        dst = cidr.network_address if cidr.prefixlen == 32 else cidr
        filter_rules.append(
            f"-A {FILTER_CHAIN} -m conntrack ! --ctorigdst {dst} {_c('vpngw not for a virtual IP')} -j RETURN"
        )
        # Into serviceCIDR only through our DNAT: an address in it that is no virtual IP (a tunnel's
        # selector allows every one) is nothing of ours to forward to; in a pod the routes would take it
        # out through eth0. From here on, a NEW connection is one we DNATed.
        filter_rules.append(
            f"-A {FILTER_CHAIN} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
            f"{_c(SERVICE_CIDR_DNAT_ONLY)} -j DROP"
        )
    # Established flows of admitted grants: one rule, whatever the number of grants. A revoked grant's
    # flows are dropped by its tombstone until its conntrack entries are deleted; then they are
    # re-tracked as NEW, no admission rule matches, and they fall through to the DROP.
    filter_rules.append(
        f"-A {FILTER_CHAIN} {_ESTABLISHED}{m} {_c('vpngw established granted flows')} -j ACCEPT"
    )
    for a in policy.admissions:
        s = a.service
        filter_rules.append(
            f"-A {FILTER_CHAIN} -s {a.source} -p {s.proto} -m conntrack --ctstate NEW "
            f"-m conntrack --ctorigdst {s.vip} --ctorigdstport {s.port} -m connmark --mark 0x0/{m} "
            f"{_c('vpngw grant', f'to={s.target}', grant_names[a.mark])} "
            f"-j CONNMARK --set-xmark {_hex(a.mark)}/{m}"
        )
    filter_rules.append(
        f"-A {FILTER_CHAIN} -m conntrack --ctstate NEW -m connmark ! --mark 0x0/{m} -j ACCEPT"
    )
    # A left-out exposure's virtual IP is dropped too: no grant admits it, and without the rule its
    # packets would leave our chain and be forwarded wherever the routes say.
    vips = sorted({s.vip for s in policy.services} | {x.vip for x in policy.left_out})
    filter_rules.extend(
        f"-A {FILTER_CHAIN} -m conntrack --ctorigdst {vip} {_c('vpngw not granted')} -j DROP" for vip in vips
    )

    # Exposures are DNATed only for what came through a tunnel (their own chain, reached by a goto per
    # way in); the rest of VPNGW-PREROUTING (reverse exposures: the cluster and the fabric) is for what
    # did not: a goto's chain that ends returns to PREROUTING itself, skipping the rest of ours.
    dnat = [
        f"-A {DNAT_CHAIN} {m_in} {_c(TUNNEL_TO_EXPOSURES)} -g {EXPOSURE_CHAIN}"
        for m_in in policy.from_tunnels
    ]
    exposure_dnat: list[str] = []
    snat: list[str] = []
    snat_done: set[IPv4Address] = set()
    for s in policy.services:
        label = f"vpngw {s.kind}={comment(s.name)}"
        (exposure_dnat if s.kind == "exposure" else dnat).append(
            f"-A {EXPOSURE_CHAIN if s.kind == 'exposure' else DNAT_CHAIN} -d {s.vip}/32 -p {s.proto} "
            f"-m {s.proto} --dport {s.port} {_c(label)} -j DNAT --to-destination {s.target}:{s.port}"
        )
        if s.vip not in snat_done:
            snat_done.add(s.vip)
            to = policy.exposure_snat if s.kind == "exposure" else policy.reverse_snat
            snat.append(
                f"-A {SNAT_CHAIN} -m conntrack --ctorigdst {s.vip} {_c(label)} -j SNAT --to-source {to}"
            )
    chains: tuple[str, ...] = (FILTER_CHAIN, TARGET_CHAIN)
    own: tuple[str, ...] = ()
    if policy.guard is not None:
        chains, own = (*chains, INPUT_CHAIN, OUTPUT_CHAIN), guard_rules(policy.guard)
    out = [
        TableRules("filter", chains, (*filter_rules, *target_rules, *own)),
        TableRules("nat", (DNAT_CHAIN, EXPOSURE_CHAIN, SNAT_CHAIN), tuple(dnat + exposure_dnat + snat)),
    ]
    if policy.reply is not None:
        out.append(TableRules("mangle", (MANGLE_CHAIN,), reply_rules(policy.reply)))
    return Ruleset(tables=tuple(out), marks=policy.marks, mask=policy.mask)


_NOT_METADATA = "vpngw never the metadata service"
NIC2_INGRESS = "vpngw from NIC2 only what we DNATed"
SERVICE_CIDR_DNAT_ONLY = "vpngw serviceCIDR only through DNAT"
INVALID_DROP = "vpngw conntrack invalid"
TUNNEL_TO_EXPOSURES = "vpngw from a tunnel: exposures"
_TUNNEL_NOT_FOR_POD = "vpngw tunnel traffic is not for the pod"


def guard_rules(guard: Guard) -> tuple[str, ...]:
    """The pod's own INPUT and OUTPUT (filter). Our chains never ACCEPT: what they allow RETURNs to the
    built-in chain and its other rules, what they refuse is dropped.

    INPUT, in order:

    * replies (RELATED, ESTABLISHED): to what the pod itself started (DNS, the API, charon's or
      WireGuard's own initiations, a diagnostic ping into a tunnel) and ICMP errors about it;
    * from a tunnel, nothing else: IPsec's decapsulated packets (kernel-libipsec: the ``ipsec+`` TUN
      devices; kernel XFRM: any device, with an inbound IPsec policy), the WireGuard device's. A peer
      reaches its exposures (FORWARD), never the pod's own ports (the probe and metrics ports, IKE on
      an inner address);
    * on NIC2, only what the tunnels need: IKE (UDP 500, 4500: NAT-T and kernel-libipsec's ESP-in-UDP)
      and ESP for an IPsec gateway, the listen port for a WireGuard one; everything else NEW from NIC2
      is dropped (the probe and metrics ports, anything listening on 0.0.0.0).

    A standby (``guard.standby``) drops first what the tunnels need on NIC2 (:func:`standby_rules`).

    Traffic from elsewhere (eth0: the kubelet's probes, Prometheus) is left to the cluster's
    NetworkPolicy. OUTPUT: nothing to the metadata service through NIC2 (the node's port is NIC2: the
    cloud's metadata service would answer with the node's instance data)."""
    nic = guard.nic
    replies = "-m conntrack --ctstate RELATED,ESTABLISHED"
    out = [*standby_rules(guard)]
    out.append(f"-A {INPUT_CHAIN} {replies} {_c('vpngw replies to the pod')} -j RETURN")
    if guard.ipsec:
        out.append(f"-A {INPUT_CHAIN} -m policy --dir in --pol ipsec {_c(_TUNNEL_NOT_FOR_POD)} -j DROP")
        out.append(f"-A {INPUT_CHAIN} -i {LIBIPSEC_DEVICES} {_c(_TUNNEL_NOT_FOR_POD)} -j DROP")
    if guard.wireguard is not None:
        out.append(f"-A {INPUT_CHAIN} -i {guard.wireguard[0]} {_c(_TUNNEL_NOT_FOR_POD)} -j DROP")
    if guard.ipsec:
        out.extend(
            f"-A {INPUT_CHAIN} -i {nic} -p udp -m udp --dport {p} {_c('vpngw IKE')} -j RETURN"
            for p in IKE_PORTS
        )
        out.append(f"-A {INPUT_CHAIN} -i {nic} -p esp {_c('vpngw ESP')} -j RETURN")
    if guard.wireguard is not None:
        listen = guard.wireguard[1]
        out.append(
            f"-A {INPUT_CHAIN} -i {nic} -p udp -m udp --dport {listen} {_c('vpngw WireGuard')} -j RETURN"
        )
    out.append(f"-A {INPUT_CHAIN} -i {nic} {_c('vpngw NIC2 is for the tunnels only')} -j DROP")
    out.append(f"-A {OUTPUT_CHAIN} -d {METADATA}/32 -o {nic} {_c(_NOT_METADATA)} -j DROP")
    return tuple(out)


STANDBY = "vpngw HA standby: not serving"


def standby_rules(guard: Guard) -> tuple[str, ...]:
    """The HA standby's drops (docs/ha.md), the first rules of VPNGW-INPUT while ``guard.standby``: on NIC2,
    IKE (UDP 500, 4500, which also carries kernel-libipsec's ESP-in-UDP) and ESP for an IPsec gateway, the
    listen port for a WireGuard one. First, ahead of the replies rule: a conntrack entry of a flow the pod
    served while active (UDP 4500 to a site stays ESTABLISHED while the site keeps sending) must not keep
    a demoted pod answering. A WireGuard gateway's IKE and ESP are dropped anyway (NIC2 is for its port
    only). Nothing else changes: the DNAT of exposures stays (only what came through a tunnel is DNATed
    to an exposure, and a standby has no tunnel), so promotion is this list's removal, nothing more.
    Empty while active."""
    if not guard.standby:
        return ()
    nic, out = guard.nic, list[str]()
    if guard.ipsec:
        out.extend(
            f"-A {INPUT_CHAIN} -i {nic} -p udp -m udp --dport {p} {_c(STANDBY)} -j DROP" for p in IKE_PORTS
        )
        out.append(f"-A {INPUT_CHAIN} -i {nic} -p esp {_c(STANDBY)} -j DROP")
    if guard.wireguard is not None:
        out.append(
            f"-A {INPUT_CHAIN} -i {nic} -p udp -m udp --dport {guard.wireguard[1]} {_c(STANDBY)} -j DROP"
        )
    return tuple(out)


Role = Literal["active", "standby"]
ROLE_FILE = "ha-role"
"""The HA role file's name in the live directory (docs/ha.md): the agent writes ``active`` or ``standby``."""


@dataclass(frozen=True)
class RoleReading:
    """What the role file says, as init-nat acts on it."""

    role: Role
    error: str | None = None
    """Why the file could not be taken at its word (init-nat then stands by: fail closed)."""
    absent: bool = False
    """There is no role file (the role then follows the plan: :func:`role_of`)."""


def role_of(content: bytes | None, *, ha: bool) -> RoleReading:
    """The role the file's ``content`` gives (None: there is no file) for a plan with (``ha``) or without
    an ``ha`` section. No file is ``active`` without ``ha`` (a gateway without HA never needs one) and
    ``standby`` with it (fail closed: a fresh pod's agent has not written it yet, or could not; its
    first plan with ``ha`` starts it standby anyway; a serving pod whose plan gains ``ha`` has had the
    file, ``active``, since its agent started). ``active`` or ``standby`` (surrounding whitespace allowed)
    is that role; anything else (empty, a half-written file, garbage) is ``standby``, with the reason:
    serving twice is worse than not serving for a moment, and the agent writes the file by atomic rename
    (and empties it when it cannot write it as a standby)."""
    if content is None:
        return RoleReading("standby" if ha else "active", absent=True)
    text = content.strip()
    if text == b"active":
        return RoleReading("active")
    if text == b"standby":
        return RoleReading("standby")
    return RoleReading(
        "standby", f"{ROLE_FILE}: {_show(text[:40])} is neither active nor standby: standing by"
    )


IPV6_NIC2 = "vpngw no IPv6 on NIC2"
IPV6_TUNNEL = "vpngw no IPv6 in the tunnels"


def ipv6_rules(guard: Guard) -> Ruleset:
    """The ip6tables filter ruleset (applied like the IPv4 one: our chains, each jump first in its
    built-in chain, one ``ip6tables-restore --noflush`` transaction). The data plane is IPv4 only (the
    plan's addresses, the tunnels' selectors, every rule above), but NIC2 gets an IPv6 link-local address
    whatever the plan says, and the kernel acts on what arrives there: a neighbour on the transit link
    reaches whatever listens on the pod's IPv6 wildcard (charon's and wireguard-go's sockets do; the
    probe and metrics ports would with ``[::]``), and a router advertisement from it gives the pod a
    global address and a default route through the neighbour. So nothing IPv6 comes in, leaves or is
    forwarded through NIC2, nor comes in or is forwarded through a tunnel device; eth0 (the cluster,
    which may be dual-stack) is left alone. No sysctl is needed (``disable_ipv6`` is read-only in a
    container that is not privileged). Under kernel XFRM decapsulated packets come in on NIC2: covered."""
    nic = guard.nic
    devices = ([LIBIPSEC_DEVICES] if guard.ipsec else []) + (
        [] if guard.wireguard is None else [guard.wireguard[0]]
    )
    forward = [
        f"-A {FILTER_CHAIN} -i {nic} {_c(IPV6_NIC2)} -j DROP",
        f"-A {FILTER_CHAIN} -o {nic} {_c(IPV6_NIC2)} -j DROP",
    ]
    for dev in devices:
        forward += [
            f"-A {FILTER_CHAIN} -i {dev} {_c(IPV6_TUNNEL)} -j DROP",
            f"-A {FILTER_CHAIN} -o {dev} {_c(IPV6_TUNNEL)} -j DROP",
        ]
    inp = [f"-A {INPUT_CHAIN} -i {nic} {_c(IPV6_NIC2)} -j DROP"]
    inp += [f"-A {INPUT_CHAIN} -i {dev} {_c(IPV6_TUNNEL)} -j DROP" for dev in devices]
    out = [f"-A {OUTPUT_CHAIN} -o {nic} {_c(IPV6_NIC2)} -j DROP"]
    table = TableRules("filter", (FILTER_CHAIN, INPUT_CHAIN, OUTPUT_CHAIN), (*forward, *inp, *out))
    return Ruleset(tables=(table,), marks=frozenset(), mask=0)


def reply_rules(reply: Reply) -> tuple[str, ...]:
    """The mangle chain (PREROUTING, before routing decides): a NEW connection that comes in on NIC2 gets
    the reply bit in its conntrack mark (``--set-xmark B/B`` touches that bit only: the grants' bits are
    set later, in FORWARD, under their mask); packets of the REPLY direction get the connection's bit as
    their packet mark, which the reply rules route to NIC2's table. NEW only: a connection that began
    elsewhere (a tunnel peer's, to an exposure) keeps its replies on the main/charon routes even though
    they come in on NIC2. REPLY only: the fabric client's own packets are routed as before (into the
    tunnel). Locally answered connections (IKE, WireGuard) are OUTPUT, never here: the ``from <NIC2
    address>`` rule routes them."""
    b = _hex(reply.mark)
    return (
        f"-A {MANGLE_CHAIN} -i {reply.device} -m conntrack --ctstate NEW "
        f"{_c('vpngw came in on NIC2')} -j CONNMARK --set-xmark {b}/{b}",
        f"-A {MANGLE_CHAIN} -m conntrack --ctdir REPLY {_c('vpngw replies leave through NIC2')} "
        f"-j CONNMARK --restore-mark --nfmask {b} --ctmask {b}",
    )


# --- revocation --------------------------------------------------------------------------------------


def _admitted(policy: Policy) -> dict[int, frozenset[tuple[object, ...]]]:
    out: dict[int, set[tuple[object, ...]]] = {g.mark: set() for g in policy.grants}
    for a in policy.admissions:
        out[a.mark].add(a.key)
    return {k: frozenset(v) for k, v in out.items()}


def flushes(before: Policy | None, after: Policy) -> frozenset[Flush]:
    """The conntrack flushes that revoke what ``before`` admitted and ``after`` does not (see
    :func:`revoked`). Each uses ``before``'s mask: its entries were marked under it (``--set-xmark
    G/mask`` writes only the mask's bits), so after a ``markMask`` change a flush with the new mask would
    compare other bits and miss them."""
    if before is None:
        return frozenset()
    return frozenset(Flush(g.mark, before.mask) for g in revoked(before, after))


def revoked(before: Policy | None, after: Policy) -> tuple[Grant, ...]:
    """Grants of ``before`` whose conntrack entries must go once ``after``'s rules are in place.

    A grant is revoked when its mark is gone, or when its mark now admits less than before (a source,
    port, virtual IP or target removed or changed: flows marked under the old admission may be ones the
    new rules would refuse, or DNATed to a target the exposure no longer names). Grants that only gained
    admissions keep their flows. Compared: :attr:`Admission.key`, the same facts that
    ``tables.revoked_in_kernel`` reads from the kernel's rules after a restart.
    """
    if before is None:
        return ()
    was, now = _admitted(before), _admitted(after)
    return tuple(
        sorted(
            (g for g in before.grants if g.mark not in now or not was[g.mark] <= now[g.mark]),
            key=lambda g: g.mark,
        )
    )


def mac_from_network_status(text: str) -> str | None:
    """NIC2's MAC from Multus' ``k8s.v1.cni.cncf.io/network-status`` annotation (a downward-API file):
    the first attached (non-default) network that reports a MAC."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise NatConfigError(f"network-status: not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise NatConfigError("network-status: expected a JSON list of networks")
    for i, net in enumerate(doc):
        if isinstance(net, dict) and not net.get("default") and net.get("mac"):
            return mac(net["mac"], f"network-status[{i}].mac")
    return None
