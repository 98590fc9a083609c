"""What a gateway should have in the cloud (OpenStack Neutron and Nova), as data. Pure.

From the plan in force and the ClusterLinks that serve the gateway:

* security-group ingress rules on the gateway's own group: IPsec site peers with an IPv4 endpoint get
  UDP 500, UDP 4500 and ESP from that /32; WireGuard site peers their listen port (UDP) from the /32. A
  peer whose endpoint is a hostname (it cannot be pinned) or a road warrior (it comes from anywhere)
  opens the port to 0.0.0.0/0, and ``SecurityGroupScoped`` goes False naming it. Reverse exposures admit
  their ports from each ``internalSourceCIDRs`` entry (their traffic arrives on the port; the security
  group never sees tunnel traffic).
* allowed-address-pairs: one /32 per reverse exposure's virtual IP (fabric traffic to it arrives on the
  port, and its replies leave from it).
* router extra routes: each reverse exposure's virtual IP /32 via the port's address, on the routers of
  the ClusterLinks that name this gateway only (the seed put them on every link's router: a route into
  one customer's service CIDR on another customer's router).

Warm-standby HA (docs/ha.md) gives a gateway two slots, ``a`` and ``b``, each with its own port. Slot a's
port is the port a gateway without HA has (its name and tags: enabling HA leaves the running pod's port
alone); slot b's is named ``<slot a's name>#b`` and tagged ``vpngw-slot:b`` besides. The floating IP,
the address pairs and the routes' next hop belong to the ACTIVE slot's port only (``slot_pairs``); a
floating IP on another port is disassociated first, then associated (``floating_ip_updates``): Neutron's
L3 agent drops a floating IP's conntrack entries on disassociation only, so a one-step move keeps the
remote sites' running UDP flows (IKE, NAT-T) on the old port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gwplan
from controller.names import GatewayKey
from controller.status import Condition

SECURITY_GROUP_SCOPED = "SecurityGroupScoped"
ROUTING_READY = "RoutingReady"
ANYWHERE = "0.0.0.0/0"


@dataclass(frozen=True, order=True)
class Rule:
    """An ingress security-group rule (IPv4)."""

    protocol: str
    """``udp``, ``tcp`` or ``esp``."""
    port: int | None
    remote: str
    """The source CIDR."""


@dataclass(frozen=True)
class Open:
    peer: str
    why: Literal["hostname endpoint", "road warrior"]
    detail: str = ""


@dataclass(frozen=True)
class CloudPlan:
    rules: frozenset[Rule]
    vips: tuple[str, ...]
    """Reverse exposures' virtual IPs (address pairs and routes)."""
    routers: tuple[str, ...]
    """The routers to carry the routes (the ClusterLinks naming the gateway)."""
    opened: tuple[Open, ...]


def tags(key: GatewayKey, instance: str) -> tuple[str, str]:
    """The Neutron tags of everything owned for ``key`` (no commas: Neutron's tag filter splits on them)."""
    return (instance_tag(instance), f"{GATEWAY_TAG}{key.kind}.{key.namespace}.{key.name}")


GATEWAY_TAG = "vpngw-gateway:"


def instance_tag(instance: str) -> str:
    return f"vpngw-instance:{instance}"


CLUSTER_TAG = "vpngw-cluster:"


def foreign_cluster(resource_tags: Iterable[str], cluster: str | None) -> bool:
    """Whether a resource carries another cluster's identity: never ours to reuse, tag or release, even
    with our instance's and gateway's tags (two clusters, one instance name, one project)."""
    return any(t.startswith(CLUSTER_TAG) and t != cluster_tag(cluster or "") for t in resource_tags)


def cluster_tag(cluster: str) -> str:
    """The cluster's identity (its kube-system namespace's uid): what a cloud-wide sweep may touch, so two
    clusters with the same instance name in one project never release each other's gateways."""
    return f"{CLUSTER_TAG}{cluster}"


Slot = Literal["a", "b"]
"""A warm-standby gateway's two slots (docs/ha.md): two pods on two nodes, each with its own port."""
SLOT_TAG = "vpngw-slot:"


def slot_tag(slot: Slot) -> str | None:
    """The tag slot ``slot``'s port carries besides ``tags``: ``vpngw-slot:b`` for slot b; None for slot
    a, whose port is tagged as a gateway without HA has it (enabling HA leaves it alone)."""
    return f"{SLOT_TAG}{slot}" if slot != "a" else None


def slot_of(resource_tags: Iterable[str]) -> Slot:
    """The slot a port of a gateway (``tags``) serves: b when tagged ``vpngw-slot:b``, else a."""
    return "b" if f"{SLOT_TAG}b" in set(resource_tags) else "a"


def port_name(key: GatewayKey, slot: Slot) -> str:
    """The name of slot ``slot``'s port: slot a's is ``resource_name`` (the port without HA), slot b's
    ``<that>#b``. Not ``-b``: ``vpngw-acme.tenant-acme-b`` is also slot a's port name of gateway acme in
    namespace tenant-acme-b, and an untagged port is adopted by its name (``_find``); ``#`` is in no
    namespace or gateway name."""
    return resource_name(key) if slot == "a" else f"{resource_name(key)}#{slot}"


def other_slot(slot: Slot) -> Slot:
    return "b" if slot == "a" else "a"


def floating_ip_updates(on: str | None, to: str) -> tuple[str | None, ...]:
    """The ``port_id`` updates, in order, that put a floating IP associated with port ``on`` (None: with
    none) on port ``to``: none when it is there; one association when it is on no port; on another port,
    a disassociation (None) first, then the association. Neutron's legacy L3 agent deletes the floating
    IP's conntrack entries when it is disassociated, not when it moves to another fixed IP in one update:
    a one-step move keeps running UDP flows (remote sites' IKE and NAT-T) on the old port (measured in
    the lab: 45 s and counting, docs/ha.md)."""
    if on == to:
        return ()
    if not on:
        return (to,)
    return (None, to)


def gateway_of(resource_tags: Iterable[str]) -> GatewayKey | None:
    """The gateway a resource is tagged for (``tags``), None when none or not one of ours."""
    for t in resource_tags:
        if t.startswith(GATEWAY_TAG):
            kind, _, rest = t[len(GATEWAY_TAG) :].partition(".")
            namespace, _, name = rest.partition(".")
            if name:
                if kind == "VPNGateway":
                    return GatewayKey("VPNGateway", namespace, name)
                if kind == "IPsecGateway":
                    return GatewayKey("IPsecGateway", namespace, name)
    return None


def sweepable(
    held: Mapping[GatewayKey, str], exists: Callable[[GatewayKey], bool | None], before: str
) -> tuple[GatewayKey, ...]:
    """The gateways the cloud holds resources for (``held``: key -> oldest resource's created_at, as
    Neutron writes it, UTC ``YYYY-MM-DDTHH:MM:SSZ``) that do not exist, created before ``before`` (the
    grace period: a gateway being created is not swept while a cache lags). ``exists`` answers None when
    it cannot say (the kind answers 404, the namespace is not watched): never swept then."""
    return tuple(
        sorted(
            (k for k, created in held.items() if created and created < before and exists(k) is False),
            key=str,
        )
    )


def adoption_refusal(
    what: str, resource_tags: Sequence[str], key: GatewayKey, instance: str, cluster: str | None = None
) -> str | None:
    """Why a resource made outside this installation (the seed's port or floating IP) may not be adopted
    for ``key``, or None. Ours already (our tags) is fine; a resource any vpngw installation or cluster
    tagged for another gateway, or another installation or cluster tagged at all, belongs to someone:
    adopting it would take a running gateway's address away."""
    ours = set(tags(key, instance)) | ({cluster_tag(cluster)} if cluster else set())
    mine = [t for t in resource_tags if t.startswith((GATEWAY_TAG, "vpngw-instance:", CLUSTER_TAG))]
    foreign = sorted(set(mine) - ours)
    if foreign:
        return (
            f"{what} is tagged {', '.join(foreign)}: it belongs to another gateway, installation or cluster"
        )
    return None


def resource_name(key: GatewayKey) -> str:
    return f"{key.object_name}.{key.namespace}"


def _ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def plan_cloud(plan: gwplan.Plan | None, routers: Iterable[str]) -> CloudPlan:
    rules: set[Rule] = set()
    opened: list[Open] = []
    if plan is None:
        return CloudPlan(frozenset(), (), tuple(sorted(set(routers))), ())
    if plan.ipsec is not None:
        for t in plan.ipsec.tunnels:
            body: dict[str, Any] = dict(next(iter(t.conn.values()), {}))
            addr = (body.get("remote_addrs") or ["%any"])[0]
            if addr == "%any":
                remote = ANYWHERE
                opened.append(Open(t.name, "road warrior"))
            elif _ipv4(addr):
                remote = f"{addr}/32"
            else:
                remote = ANYWHERE
                opened.append(Open(t.name, "hostname endpoint", addr))
            rules |= {Rule("udp", 500, remote), Rule("udp", 4500, remote), Rule("esp", None, remote)}
    if plan.wireguard is not None:
        wg = plan.wireguard
        for p in wg.peers:
            host = p.endpoint.rpartition(":")[0] if p.endpoint else None
            if host is None:
                remote = ANYWHERE
                opened.append(Open(p.name, "road warrior"))
            elif _ipv4(host):
                remote = f"{host}/32"
            else:
                remote = ANYWHERE
                opened.append(Open(p.name, "hostname endpoint", host))
            rules.add(Rule("udp", wg.listen_port, remote))
    for rev in plan.nat.reverse_exposures:
        for port in rev.ports:
            for cidr in plan.nat.internal_source_cidrs:
                rules.add(Rule(port.protocol.lower(), port.port, cidr))
    vips = tuple(sorted(r.virtual_ip for r in plan.nat.reverse_exposures))
    return CloudPlan(frozenset(rules), vips, tuple(sorted(set(routers))), tuple(opened))


def scope_condition(cp: CloudPlan) -> Condition:
    if not cp.opened:
        return Condition(SECURITY_GROUP_SCOPED, True, "AllSourcesPinned", "every peer's source is a /32")
    names = ", ".join(f"{o.peer} ({o.why}{' ' + o.detail if o.detail else ''})" for o in cp.opened)
    return Condition(
        SECURITY_GROUP_SCOPED,
        False,
        "HostnameEndpointOpensPort",
        f"the gateway's port is open to 0.0.0.0/0 for: {names}; pin an IPv4 endpoint to scope it",
    )


NO_ROUTER = "NoRouter"


def routing_condition(cp: CloudPlan, programmed: bool, detail: str = "") -> Condition:
    if not cp.vips:
        return Condition(ROUTING_READY, True, "NoReverseExposures", "no reverse exposure needs routes")
    if not programmed:
        return Condition(
            ROUTING_READY, False, "RoutesPending", detail or "address pairs or routes not programmed"
        )
    if not cp.routers:
        # Paired on the port, but nothing routes fabric traffic to them: they cannot be reached.
        return Condition(
            ROUTING_READY,
            False,
            NO_ROUTER,
            f"{len(cp.vips)} virtual IP(s) paired, but no ClusterLink names this gateway, so no router "
            "carries them: add the gateway's name to a ClusterLink's spec.gateways",
        )
    return Condition(
        ROUTING_READY,
        True,
        "RoutesProgrammed",
        f"{len(cp.vips)} virtual IP(s) paired; on router(s) {', '.join(cp.routers)}",
    )


@dataclass(frozen=True)
class PairsChange:
    pairs: tuple[dict[str, str], ...]
    changed: bool


def address_pairs(
    current: Sequence[dict[str, str]], vips: Sequence[str], service_cidr: str | None
) -> PairsChange:
    """The port's address pairs: ours (a /32 inside the gateway's serviceCIDR) replaced by ``vips``,
    anyone else's kept as they are (the list is replaced whole, so theirs must be in it)."""
    net = ipaddress.IPv4Network(service_cidr) if service_cidr else None

    def ours(p: dict[str, str]) -> bool:
        try:
            ip = ipaddress.IPv4Network(p.get("ip_address", ""), strict=False)
        except ValueError:
            return False
        return net is not None and ip.prefixlen == 32 and ip.subnet_of(net)

    keep = [dict(p) for p in current if not ours(p)]
    mine = [{"ip_address": f"{v}/32"} for v in vips]
    want = keep + mine
    have_ours = sorted(p["ip_address"].split("/")[0] for p in current if ours(p))
    return PairsChange(tuple(want), have_ours != sorted(vips))


def slot_pairs(
    current: Mapping[Slot, Sequence[dict[str, str]]],
    vips: Sequence[str],
    service_cidr: str | None,
    active: Slot,
) -> dict[Slot, PairsChange]:
    """Each slot's port's address pairs (``current``: slot -> its port's pairs now): the virtual IPs on the
    ``active`` slot's port only, ours removed from the other's, anyone else's kept on both
    (``address_pairs``). The lab reads no address pairs (no port security is modelled), so this is where
    a pair left on the standby's port is caught."""
    return {
        slot: address_pairs(pairs, vips if slot == active else (), service_cidr)
        for slot, pairs in current.items()
    }


def routes(vips: Sequence[str], nexthop: str) -> list[dict[str, str]]:
    return [{"destination": f"{v}/32", "nexthop": nexthop} for v in vips]
