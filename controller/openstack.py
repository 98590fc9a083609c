"""The OpenStack cloud backend: a gateway's Neutron port, floating IP, Nova attachment, address pairs,
router routes and security group, through openstacksdk. The I/O shell of ``controller.cloudplan``.

Level-triggered like the rest: ``ensure`` finds what the cloud holds for the gateway BY TAG (never from
local state: a restarted controller finds everything again, and a crash between two steps never
duplicates a port or a floating IP), compares it with ``cloudplan``'s answer, and changes only what
differs (a no-op reconcile only reads). Steps, in order, each named in ``CloudReady``'s reason when it
fails (``PortFailed``, ``AttachFailed``, ...):

1. ``SecurityGroup``: the gateway's own group (tagged), its ingress rules exactly as planned (a 409
   duplicate is success; rules no longer wanted are deleted). Neutron's default egress rules stay.
2. ``Port``: one port on the gateway network (tagged), a fixed IP on the gateway subnet, our group.
3. ``AddressPairs``: replaced whole, with the port's ``revision_number`` as precondition (``If-Match``):
   another writer's change in between is a 412, after which the port is read again and theirs kept.
4. ``FloatingIP``: one on the external network, 1:1 on the port (tagged).
5. ``Attach``: the port on the Nova server behind the pinned node (``spec.providerID``); moved (detach,
   wait, attach) when the gateway is re-pinned; ``ensure`` waits until Neutron shows it attached.
6. ``Routes``: atomic ``add_extraroutes`` / ``remove_extraroutes`` (never a PUT of a router's whole list)
   on the routers of the ClusterLinks naming the gateway; our routes (nexthop: the port's address) are
   removed from every other router.

``release`` deletes all of it (the finalizer; and a gateway gone without it). openstacksdk is
synchronous: each call runs on a worker thread.

Warm-standby HA (``CloudWant.ha``, docs/ha.md): slot a's port is the port above (its name and tags
unchanged: enabling HA leaves the running pod alone); slot b's is a second port (``cloudplan.port_name``:
``<name>#b``, tagged ``vpngw-slot:b`` besides; the same network, subnet and group; steps ``SlotBPort``,
``SlotBAttach``) on slot b's node's server. The floating IP, the address pairs and the routes' next hop
are the ACTIVE slot's port's, in this order, all before the attachments (a failover does not wait for a
dead node's port to be moved): a floating IP on another port is disassociated, waited for until Neutron
shows it on no port, then associated (steps ``FloatingIPDisassociate``, ``FloatingIPAssociate``; a
failure in between leaves it on no port, and the next ``ensure`` associates it); pairs are set on the
active's port, then ours removed from the other's; routes are added via the active's address, then ours
via the other's removed. Without HA (also without HA again) the order is the one above, and a floating IP
found on another port is moved the same two-step way; slot b's port, if any, is detached and deleted
(step ``SlotBRelease``) once everything is on slot a's. The sweep (``owned``) and ``release`` find both
ports by the gateway's tags (``release`` also slot b's left untagged by a crash, by its name).

Every call on ``conn.network`` and ``conn.compute`` goes through one wrapper (``_Guarded``), which asks
the leadership guard before a write and tells ``observe`` (the controller's metrics) of each call:
``(operation, seconds, error)``, operation ``network.create_port``, error None or what it raised; a
listing is timed until the caller has read it all (openstacksdk fetches its pages as they are read).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
import types
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from controller.cloud import CLOUD_READY, CloudError, CloudState, CloudWant
from controller.cloudplan import (
    Rule,
    Slot,
    adoption_refusal,
    cluster_tag,
    floating_ip_updates,
    foreign_cluster,
    gateway_of,
    instance_tag,
    other_slot,
    plan_cloud,
    port_name,
    resource_name,
    routes,
    routing_condition,
    scope_condition,
    slot_of,
    slot_pairs,
    slot_tag,
    tags,
)
from controller.desired import Nic2
from controller.names import GatewayKey
from controller.status import Condition

log = logging.getLogger(__name__)

ROUTER_INTERFACE_OWNERS = frozenset(
    {
        "network:router_interface",
        "network:router_interface_distributed",
        "network:ha_router_replicated_interface",
    }
)
"""A router's port on a subnet (neutron_lib.constants: ROUTER_INTERFACE_OWNERS)."""
T = TypeVar("T")
CallObserver = Callable[[str, float, BaseException | None], None]
"""``(operation, seconds, error)`` of one openstacksdk call (``network.create_port``; error: None or what
it raised)."""
PROVIDER_ID = re.compile(r"^openstack://[^/]*/([0-9A-Fa-f-]{36})$")


class AdoptionRefused(Exception):
    """A resource that may not be adopted for a gateway (the message says why; nothing was tagged)."""


@dataclass(frozen=True)
class Adopted:
    port_id: str
    address: str
    server: str | None
    """The server the port is attached to (the reconcile moves it to the gateway's node)."""
    floating_ips: tuple[str, ...]
    tagged: tuple[str, ...]
    """``kind/id`` of what was tagged now (empty on a dry run, or when everything was ours already)."""


@dataclass(frozen=True)
class OpenStackSettings:
    network: str
    """The gateway network (name or id): every gateway's port is on it."""
    external_network: str
    """Where floating IPs come from (name or id)."""
    subnet: str | None = None
    """The gateway subnet (name or id); None: the network's only IPv4 subnet."""
    instance: str = "vpngw"
    attach_timeout: float = 60.0
    cluster: str | None = None
    """The cluster's identity (``cloudplan.cluster_tag``): tagged on everything, and what ``owned`` lists;
    None: no cluster tag, no cloud-wide sweep."""
    floating_ip_hold: float = 0.0
    """Seconds a moved floating IP stays on no port (after Neutron shows it disassociated) before it is
    associated with the new port: the L3 agent must see it on no port to drop its conntrack entries, or
    running flows stay on the old port. 0: only the natural gap (the lab's follower, polling every 0.2 s,
    saw ~0.3 s); raise it where the cloud's L3 agent is measured to miss that."""


def server_of(provider_id: str | None) -> str | None:
    """The Nova server id in a Node's ``spec.providerID`` (``openstack:///<id>``, ``openstack://<region>/<id>``)."""
    m = PROVIDER_ID.match(provider_id or "")
    return m.group(1).lower() if m else None


def neutron_error_type(exc: BaseException) -> str | None:
    """The ``NeutronError.type`` of an openstacksdk HTTP error (``OverQuota``, ``SecurityGroupRuleExists``,
    ...), None when the answer carries none."""
    response = getattr(exc, "response", None)
    try:
        body = response.json() if response is not None else None
    except ValueError:
        return None
    error = body.get("NeutronError") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def _rule_exists(exc: BaseException) -> bool:
    """A 409 that says the rule exists, and only that: Neutron's OverQuota is a 409 too (neutron_lib
    exceptions.OverQuota is a Conflict), and counting it as done left peers' ports closed with CloudReady
    True (found by review against the real Neutron)."""
    return getattr(exc, "status_code", None) == 409 and neutron_error_type(exc) == "SecurityGroupRuleExists"


class _Step:
    """Translates whatever a step raises into a CloudError naming the step (once, here)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _Step:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: Any) -> None:
        if ev is None or isinstance(ev, CloudError | AdoptionRefused) or not isinstance(ev, Exception):
            return
        code = getattr(ev, "status_code", None)
        detail = " ".join(str(ev).split())[:400]
        raise CloudError(
            f"{self.name}Failed", f"{self.name}: {detail}" + (f" (HTTP {code})" if code else "")
        ) from ev


WRITE_PREFIXES = ("create_", "update_", "delete_", "set_", "add_", "remove_")
"""The openstacksdk proxy methods that change the cloud (every one this backend calls)."""


def _no_observer(operation: str, seconds: float, error: BaseException | None) -> None:
    return None


def _timed(items: Iterator[Any], operation: str, started: float, observe: CallObserver) -> Iterator[Any]:
    """``items`` (an openstacksdk listing, fetched page by page as it is read), told to ``observe`` when
    read to its end or failed."""
    error: BaseException | None = None
    try:
        yield from items
    except Exception as exc:
        error = exc
        raise
    finally:
        observe(operation, time.monotonic() - started, error)


class _Guarded:
    """An openstacksdk proxy (``conn.network``, ``conn.compute``) whose writes first ask ``guard``: a
    deposed leader's worker thread, still in a step when its reconcile was cancelled (a cancel cannot stop
    a thread), sends nothing more. What it created untagged is adopted by the next leader (``_find``).
    Every call is told to ``observe`` (the module's docstring)."""

    def __init__(self, proxy: Any, guard: Callable[[], bool], observe: CallObserver, service: str) -> None:
        self._proxy, self._guard, self._observe, self._service = proxy, guard, observe, service

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._proxy, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        operation = f"{self._service}.{name}"

        def call(*args: Any, **kwargs: Any) -> Any:
            if name.startswith(WRITE_PREFIXES) and not self._guard():
                log.warning("cloud.not_leading call=%s: not sent, this replica no longer leads", name)
                raise CloudError("NotLeading", f"{name}: not sent, this replica no longer leads")
            started = time.monotonic()
            try:
                result = attr(*args, **kwargs)
            except Exception as exc:
                self._observe(operation, time.monotonic() - started, exc)
                raise
            if isinstance(result, types.GeneratorType):
                return _timed(result, operation, started, self._observe)
            self._observe(operation, time.monotonic() - started, None)
            return result

        return call


class _GuardedConnection:
    """``conn`` with guarded ``network`` and ``compute``, looked up when used (as openstacksdk does: its
    proxies authenticate and discover endpoints on first use)."""

    def __init__(self, conn: Any, guard: Callable[[], bool], observe: CallObserver = _no_observer) -> None:
        self._conn, self._guard, self._observe = conn, guard, observe

    @property
    def network(self) -> _Guarded:
        return _Guarded(self._conn.network, self._guard, self._observe, "network")

    @property
    def compute(self) -> _Guarded:
        return _Guarded(self._conn.compute, self._guard, self._observe, "compute")


class OpenStackCloud:
    """``controller.cloud.Cloud`` over an openstacksdk ``Connection``."""

    def __init__(
        self,
        conn: Any,
        settings: OpenStackSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        guard: Callable[[], bool] | None = None,
        observe: CallObserver | None = None,
    ) -> None:
        self.guard = guard or (lambda: True)
        self.conn = (
            conn
            if guard is None and observe is None
            else _GuardedConnection(conn, self.guard, observe or _no_observer)
        )
        """With ``guard`` (the controller: whether it still leads), every write asks it first; with
        ``observe``, every call is told to it."""
        self.settings = settings
        self._sleep = sleep
        self._ids: tuple[str, str, str, str, int, str | None] | None = None

    # --- Cloud ----------------------------------------------------------------------------------

    async def ensure(self, want: CloudWant) -> CloudState:
        # Not abandoned on cancel: a cancelled reconcile (leadership lost) waits for its thread, which sends
        # no further write (``guard``) and so ends soon; a thread of one term never runs beside the next
        # term's reconcile of the same gateway.
        return await anyio.to_thread.run_sync(self._ensure, want)

    async def release(self, key: GatewayKey) -> int:
        return await anyio.to_thread.run_sync(self._release, key)

    async def transit_cidrs(self) -> tuple[str, ...] | None:
        """The gateway subnet's CIDR (looked up once); None while Neutron cannot be asked."""
        try:
            return (str((await anyio.to_thread.run_sync(self._network))[3]),)
        except CloudError as exc:
            log.warning("cloud.transit_unknown step=%s error=%r", exc.step, str(exc))
            return None

    async def inspect(self, key: GatewayKey) -> dict[str, Any]:
        """What the cloud holds for ``key``, read only (``python -m controller diagnose``); raises
        CloudError."""
        return await anyio.to_thread.run_sync(self._inspect, key)

    def _inspect(self, key: GatewayKey) -> dict[str, Any]:
        """Found by tag as ``ensure`` finds them, but nothing adopted or tagged (``_find`` writes): the
        port, its floating IPs, the security group (with its rule count) and the routes whose next hop is
        the port's address on the routers of the gateway subnet. Plain data, ids and addresses only."""
        net = self.conn.network
        wanted = ",".join(self._tags(key))
        with _Step("Inspect"):

            def mine(listing: Callable[..., Any]) -> list[Any]:
                found = [
                    r
                    for r in listing(tags=wanted)
                    if not foreign_cluster(r.tags or [], self.settings.cluster)
                ]
                return sorted(found, key=lambda r: str(getattr(r, "created_at", "") or ""))

            everything, fips, groups = mine(net.ports), mine(net.ips), mine(net.security_groups)
            ports = [p for p in everything if slot_of(p.tags or []) == "a"]
            port = ports[0] if ports else None
            slot_b = [p for p in everything if slot_of(p.tags or []) == "b"]
            address = str((port.fixed_ips or [{}])[0].get("ip_address") or "") if port is not None else ""
            address_b = str((slot_b[0].fixed_ips or [{}])[0].get("ip_address") or "") if slot_b else ""
            routes_on: list[dict[str, str]] = []
            routes_b: list[dict[str, str]] = []
            if address or address_b:
                transit = self._transit_routers()
                for router in net.routers():
                    if router.id in transit:
                        for r in router.routes or []:
                            route = {"router": str(router.id), "destination": str(r.get("destination"))}
                            if address and r.get("nexthop") == address:
                                routes_on.append(route)
                            elif address_b and r.get("nexthop") == address_b:
                                routes_b.append(route)
            group = groups[0] if groups else None
        facts: dict[str, Any] = {
            "port": None
            if port is None
            else {
                "id": str(port.id),
                "status": str(port.status),
                "mac": str(port.mac_address),
                "address": address,
                "device_id": str(port.device_id or ""),
            },
            "ports": len(ports),
            "floating_ips": [
                {"id": str(f.id), "address": str(f.floating_ip_address), "port_id": str(f.port_id or "")}
                for f in fips
            ],
            "security_group": None
            if group is None
            else {"id": str(group.id), "rules": len(group.security_group_rules or [])},
            "routes": routes_on,
        }
        if slot_b:  # HA: slot b's port (only then: the facts of a gateway without HA are as they were)
            facts["slot_b_port"] = {
                "id": str(slot_b[0].id),
                "status": str(slot_b[0].status),
                "address": address_b,
                "device_id": str(slot_b[0].device_id or ""),
                "routes": routes_b,
            }
        return facts

    # --- steps ----------------------------------------------------------------------------------

    def _network(self) -> tuple[str, str, str, str, int, str | None]:
        """(network id, subnet id, external network id, subnet cidr, prefix, gateway ip), looked up once."""
        if self._ids is None:
            with _Step("Network"):
                net = self.conn.network.find_network(self.settings.network, ignore_missing=False)
                ext = self.conn.network.find_network(self.settings.external_network, ignore_missing=False)
                if self.settings.subnet:
                    sub = self.conn.network.find_subnet(self.settings.subnet, ignore_missing=False)
                else:
                    subs = [s for s in self.conn.network.subnets(network_id=net.id) if s.ip_version == 4]
                    if len(subs) != 1:
                        raise CloudError(
                            "NetworkFailed",
                            f"network {net.name} has {len(subs)} IPv4 subnets: set the subnet",
                        )
                    sub = subs[0]
                cidr = ipaddress.IPv4Network(sub.cidr)
                self._ids = (net.id, sub.id, ext.id, str(cidr), cidr.prefixlen, sub.gateway_ip)
        return self._ids

    def _tags(self, key: GatewayKey) -> list[str]:
        return list(tags(key, self.settings.instance))

    def _find(self, listing: Callable[..., Any], key: GatewayKey, **adopt: Any) -> list[Any]:
        """Our resources of one kind, by tag, oldest first. Neutron takes no tags at creation (most POSTs
        refuse them, a port's silently drops them), so a resource is created, then tagged: one left
        untagged by a crash in between is found by ``adopt`` (its name, or for a floating IP its port)
        and tagged now, never created twice."""
        found = sorted(
            (
                r
                for r in listing(tags=",".join(self._tags(key)))
                if not foreign_cluster(r.tags or [], self.settings.cluster)
            ),
            key=lambda r: str(getattr(r, "created_at", "") or ""),
        )
        if found or not adopt:
            # Made before the cluster tag was (an earlier release, ``adopt``): the sweep may see it now.
            for r in found:
                have = list(r.tags or [])
                if missing := [t for t in self._cluster_tags() if t not in have]:
                    self.conn.network.set_tags(r, [*have, *missing])
            return found
        return self._orphans(listing, key, (), **adopt)

    def _orphans(
        self, listing: Callable[..., Any], key: GatewayKey, extra: tuple[str, ...], **adopt: Any
    ) -> list[Any]:
        """The untagged resources ``adopt`` finds (``_find``), tagged as ``key``'s now (and ``extra``)."""
        orphans = [r for r in listing(**adopt) if not (getattr(r, "tags", None) or [])]
        for r in orphans:
            log.info("cloud.adopted gateway=%s resource=%s id=%s", key, type(r).__name__, r.id)
            self._tagged(r, key, extra)
        return orphans

    def _cluster_tags(self) -> list[str]:
        return [cluster_tag(self.settings.cluster)] if self.settings.cluster else []

    def _tagged(self, resource: Any, key: GatewayKey, extra: tuple[str, ...] = ()) -> Any:
        return self.conn.network.set_tags(resource, [*self._tags(key), *self._cluster_tags(), *extra])

    async def owned(self) -> dict[GatewayKey, str]:
        return await anyio.to_thread.run_sync(self._owned)

    def _owned(self) -> dict[GatewayKey, str]:
        """Gateway -> the oldest created_at of the resources tagged with this installation and this
        cluster (``sweepable``); nothing without a cluster identity."""
        if not self.settings.cluster:
            return {}
        wanted = ",".join([instance_tag(self.settings.instance), *self._cluster_tags()])
        held: dict[GatewayKey, str] = {}
        with _Step("Sweep"):  # the proxy's lookup too: it authenticates and discovers endpoints on first use
            net = self.conn.network
            for listing in (net.ports, net.ips, net.security_groups):
                for r in listing(tags=wanted):
                    key = gateway_of(r.tags or [])
                    created = str(getattr(r, "created_at", "") or "")
                    if key is not None and created and (key not in held or created < held[key]):
                        held[key] = created
        return held

    def _security_group(self, key: GatewayKey, wanted: frozenset[Rule]) -> Any:
        net = self.conn.network
        with _Step("SecurityGroup"):
            found = self._find(net.security_groups, key, name=resource_name(key))
            if found:
                sg = found[0]
            else:
                sg = net.create_security_group(
                    name=resource_name(key), description=f"VPN gateway {key} (vpngw {self.settings.instance})"
                )
                self._tagged(sg, key)
            have: dict[Rule, list[str]] = {}
            for r in net.security_group_rules(security_group_id=sg.id):
                if r.direction != "ingress" or r.ether_type != "IPv4":
                    continue
                rule = Rule(str(r.protocol or ""), r.port_range_min, str(r.remote_ip_prefix or "0.0.0.0/0"))
                have.setdefault(rule, []).append(r.id)
            missing = [
                {
                    "security_group_id": sg.id,
                    "direction": "ingress",
                    "ethertype": "IPv4",
                    "protocol": rule.protocol,
                    "port_range_min": rule.port,
                    "port_range_max": rule.port,
                    "remote_ip_prefix": rule.remote,
                }
                for rule in sorted(wanted - have.keys())
            ]
            if missing:
                try:  # one bulk POST (Neutron creates all or none)
                    list(net.create_security_group_rules(data=missing))
                except Exception as exc:
                    if not _rule_exists(exc):
                        raise
                    for body in missing:  # someone created one of them meanwhile: one by one, it is done
                        try:
                            net.create_security_group_rule(**body)
                        except Exception as one:
                            if not _rule_exists(one):
                                raise
            for rule, ids in have.items():
                for rid in ids[0 if rule not in wanted else 1 :]:
                    net.delete_security_group_rule(rid, ignore_missing=True)
        return sg

    def _ports(self, key: GatewayKey) -> dict[Slot, list[Any]]:
        """The gateway's ports by slot, oldest first, from ONE listing by the gateway's tags (slot b's
        port carries them too): without HA the same calls as before HA existed. Slot a's untagged port
        (a crash between create and tag) is adopted by its name when none is tagged, as ``_find`` does."""
        net = self.conn.network
        net_id = self._network()[0]
        with _Step("Port"):
            found = self._find(net.ports, key)
            by: dict[Slot, list[Any]] = {"a": [], "b": []}
            for p in found:
                by[slot_of(p.tags or [])].append(p)
            if not by["a"]:
                by["a"] = self._orphans(net.ports, key, (), name=port_name(key, "a"), network_id=net_id)
        return by

    def _port(self, key: GatewayKey, sg: Any, found: list[Any], slot: Slot = "a") -> Any:
        """Slot ``slot``'s port: the oldest ``found`` (``_ports``), or slot b's untagged one adopted by its
        name, or a new one; with our group."""
        net = self.conn.network
        net_id, sub_id, *_ = self._network()
        extra = tuple(t for t in [slot_tag(slot)] if t)
        with _Step("Port" if slot == "a" else "SlotBPort"):
            if not found and slot != "a":
                found = self._orphans(net.ports, key, extra, name=port_name(key, slot), network_id=net_id)
            if found:
                port = found[0]
                if sg.id not in (port.security_group_ids or []):
                    port = net.update_port(port, security_groups=[*port.security_group_ids, sg.id])
                return port
            port = net.create_port(
                network_id=net_id,
                name=port_name(key, slot),
                description=f"VPN gateway {key} NIC2{'' if slot == 'a' else ', HA slot ' + slot} "
                f"(vpngw {self.settings.instance})",
                fixed_ips=[{"subnet_id": sub_id}],
                security_groups=[sg.id],
                port_security_enabled=True,
            )
            self._tagged(port, key, extra)
            return net.get_port(port.id)

    def _pairs(
        self,
        port: Any,
        vips: tuple[str, ...],
        service_cidr: str | None,
        slot: Slot = "a",
        active: Slot = "a",
    ) -> Any:
        """Slot ``slot``'s port's pairs (``cloudplan.slot_pairs``: the virtual IPs when it is the
        ``active`` slot's, none of ours otherwise; anyone else's kept)."""
        net = self.conn.network
        with _Step("AddressPairs"):
            for _ in range(5):
                current = list(port.allowed_address_pairs or [])
                change = slot_pairs({slot: current}, vips, service_cidr, active)[slot]
                if not change.changed:
                    return port
                try:
                    return net.update_port(
                        port, if_revision=port.revision_number, allowed_address_pairs=list(change.pairs)
                    )
                except Exception as exc:
                    if getattr(exc, "status_code", None) != 412:
                        raise
                    log.info("cloud.pairs_raced port=%s revision=%s", port.id, port.revision_number)
                    port = net.get_port(port.id)  # someone else changed it: keep theirs, redo ours
            raise CloudError("AddressPairsFailed", "AddressPairs: the port kept changing under us (5 x 412)")

    def _floating_ip(self, key: GatewayKey, port: Any) -> Any:
        net = self.conn.network
        ext_id = self._network()[2]
        with _Step("FloatingIP"):
            found = self._find(net.ips, key, port_id=port.id)
            if not found:
                fip = net.create_ip(
                    floating_network_id=ext_id, port_id=port.id, description=f"VPN gateway {key}"
                )
                return self._tagged(fip, key)
            fip = found[0]
        for to in floating_ip_updates(fip.port_id or None, str(port.id)):
            if to is None:
                # Disassociated first: Neutron's L3 agent deletes the floating IP's conntrack entries on
                # a disassociation only; moved in one update, running UDP flows (the sites' IKE and
                # NAT-T) stay on the old port (docs/ha.md).
                with _Step("FloatingIPDisassociate"):
                    log.info("cloud.fip_disassociate gateway=%s fip=%s port=%s", key, fip.id, fip.port_id)
                    net.update_ip(fip, port_id=None)
                    fip = self._wait(
                        net.get_ip,
                        fip.id,
                        lambda f: not f.port_id,
                        "on no port",
                        "FloatingIPDisassociate",
                        "floating IP",
                    )
                    if self.settings.floating_ip_hold > 0:
                        self._sleep(self.settings.floating_ip_hold)
            else:
                with _Step("FloatingIPAssociate"):
                    log.info("cloud.fip_associate gateway=%s fip=%s port=%s", key, fip.id, to)
                    fip = net.update_ip(fip, port_id=to)
        return fip

    def _attach(self, port: Any, server: str, step: str = "Attach") -> Any:
        compute = self.conn.compute
        with _Step(step):
            if port.device_id == server:
                return port
            if port.device_id:
                if not str(port.device_owner or "").startswith("compute:"):
                    raise CloudError(
                        f"{step}Failed", f"{step}: port {port.id} is used by {port.device_owner}"
                    )
                log.info("cloud.detaching port=%s server=%s", port.id, port.device_id)
                compute.delete_server_interface(port.id, server=port.device_id, ignore_missing=True)
                port = self._wait_port(port.id, lambda p: not p.device_id, "detached", step)
            compute.create_server_interface(server, port_id=port.id)
            return self._wait_port(port.id, lambda p: p.device_id == server, f"attached to {server}", step)

    def _wait_port(self, port_id: str, done: Callable[[Any], bool], what: str, step: str = "Attach") -> Any:
        return self._wait(self.conn.network.get_port, port_id, done, what, step)

    def _wait(
        self,
        get: Callable[[str], Any],
        rid: str,
        done: Callable[[Any], bool],
        what: str,
        step: str,
        kind: str = "port",
    ) -> Any:
        """``get(rid)`` once ``done`` with it (every 0.1 s, doubling to 2 s), ``attach_timeout`` at most."""
        deadline = time.monotonic() + self.settings.attach_timeout
        delay = 0.1
        while True:
            found = get(rid)
            if done(found):
                return found
            if not self.guard():  # deposed while waiting: the wait is the new leader's now
                raise CloudError("NotLeading", f"{step}: stopped waiting for {kind} {rid}, no longer leading")
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{step}Failed",
                    f"{step}: {kind} {rid} not {what} after {self.settings.attach_timeout:g} s",
                )
            self._sleep(delay)
            delay = min(delay * 2, 2.0)

    def _transit_routers(self) -> set[str]:
        """The routers with an interface on the gateway subnet: the only ones a route to a gateway's
        port can be on (Neutron refuses an extra route whose next hop is on no subnet of the router, and
        removing such an interface while a route uses it)."""
        net_id, subnet_id, *_ = self._network()
        return {
            str(p.device_id)
            for p in self.conn.network.ports(network_id=net_id)
            if p.device_owner in ROUTER_INTERFACE_OWNERS
            and any(ip.get("subnet_id") == subnet_id for ip in p.fixed_ips or [])
        }

    def _routes(
        self,
        routers: tuple[str, ...],
        vips: tuple[str, ...],
        nexthop: str,
        *,
        releasing: bool = False,
        others: tuple[str, ...] = (),
    ) -> None:
        """Our routes exactly on ``routers`` and on no other. Ours: next hop the port's address and a /32
        destination (we program nothing else); a wider route someone pointed at the gateway is theirs and
        stays, until ``releasing``: the port's address is about to be free, and a route left pointing at
        it would send that traffic to whichever port gets the address next. ``others``: the gateway's
        other ports' addresses (HA: the standby slot's), whose /32 routes are ours and go (after the
        active's are added, in the same pass over the routers)."""
        net = self.conn.network
        with _Step("Routes"):
            want = {(r["destination"], r["nexthop"]) for r in routes(vips, nexthop)}
            transit = self._transit_routers()
            for router in net.routers():
                if router.id not in transit:  # another network's router: a route with our next hop
                    continue  # address there is someone else's (the same address on their subnet)
                have = {
                    (r["destination"], r["nexthop"])
                    for r in router.routes or []
                    if (r.get("nexthop") == nexthop or r.get("nexthop") in others)
                    and (releasing or str(r.get("destination", "")).endswith("/32"))
                }
                target = want if router.id in routers else set()
                add, remove = target - have, have - target
                if add:
                    net.add_extra_routes_to_router(router, {"router": {"routes": [
                        {"destination": d, "nexthop": n} for d, n in sorted(add)]}})  # fmt: skip
                if remove:
                    net.remove_extra_routes_from_router(router, {"router": {"routes": [
                        {"destination": d, "nexthop": n} for d, n in sorted(remove)]}})  # fmt: skip
            missing = set(routers) - transit
            if missing:
                raise CloudError(
                    "RoutesFailed",
                    f"Routes: ClusterLink router(s) {', '.join(sorted(missing))} not found or without an "
                    "interface on the gateway subnet",
                )

    def _ensure(self, want: CloudWant) -> CloudState:
        cp = plan_cloud(want.plan, want.routers)
        _, _, _, _, prefix, gateway_ip = self._network()
        sg = self._security_group(want.key, cp.rules)
        ha = want.ha
        found = self._ports(want.key)
        ports: dict[Slot, Any] = {"a": self._port(want.key, sg, found["a"])}
        if ha is not None:
            ports["b"] = self._port(want.key, sg, found["b"], "b")
        active: Slot = ha.active if ha is not None else "a"
        service_cidr = want.plan.nat.service_cidr if want.plan is not None else None
        fip = None
        if ha is not None:  # a failover moves the floating IP first: the sites' tunnels wait for it
            fip = self._floating_ip(want.key, ports[active])
        # The active's pairs first, then ours off the other port: the virtual IPs are never on neither.
        for slot in (active, other_slot(active)):
            if slot in ports:
                ports[slot] = self._pairs(ports[slot], cp.vips, service_cidr, slot, active)
        if fip is None:
            fip = self._floating_ip(want.key, ports[active])
        nexthop = str(ports[active].fixed_ips[0]["ip_address"])
        # Our routes via the gateway's other ports go: the standby slot's, and slot b's once HA is off.
        leftover = found["b"] if ha is None else []
        others = tuple(
            str(p.fixed_ips[0]["ip_address"])
            for p in [*ports.values(), *leftover]
            if p.fixed_ips and str(p.fixed_ips[0]["ip_address"]) != nexthop
        )
        routed: CloudError | None = None
        if ha is not None:
            # Before the attachments: a failover's re-placed slot (its dead node's server may refuse to
            # let go of its port) must not keep the routes on the port that stopped serving.
            routed = self._try_routes(want.key, cp.routers, cp.vips, nexthop, others)
        port = ports["a"]
        address = str(port.fixed_ips[0]["ip_address"])
        nic = Nic2(str(port.mac_address), f"{address}/{prefix}", str(gateway_ip))
        server = server_of(want.provider_id)
        if want.node is not None:
            if server is None:
                raise CloudError(
                    "NoProviderID", f"node {want.node} has no OpenStack providerID ({want.provider_id!r})"
                )
            port = ports["a"] = self._attach(port, server)
        where = f"attached to server {server}" if want.node is not None else "not attached (no node)"
        # _attach returned: Neutron shows the port on the pinned node's server, detached from any other.
        fenced = want.node is not None
        message = f"port {port.id} {address}, floating IP {fip.floating_ip_address}, {where}"
        nic_b, fenced_b = None, False
        if ha is not None:
            port_b = ports["b"]
            address_b = str(port_b.fixed_ips[0]["ip_address"])
            nic_b = Nic2(str(port_b.mac_address), f"{address_b}/{prefix}", str(gateway_ip))
            server_b = server_of(ha.provider_id)
            if ha.node is not None:
                if server_b is None:
                    raise CloudError(
                        "NoProviderID",
                        f"node {ha.node} (slot b) has no OpenStack providerID ({ha.provider_id!r})",
                    )
                port_b = ports["b"] = self._attach(port_b, server_b, "SlotBAttach")
            where_b = f"attached to server {server_b}" if ha.node is not None else "not attached (no node)"
            fenced_b = ha.node is not None
            message = (
                f"slot a: port {port.id} {address}, {where}; slot b: port {port_b.id} {address_b}, "
                f"{where_b}; floating IP {fip.floating_ip_address} on slot {active}'s port"
            )
        ready = Condition(CLOUD_READY, True, "Ready", message)
        if ha is None:
            # Routes last: a router that refuses them (a ClusterLink's, the tenant's choice) must not keep
            # the gateway's own port from its node; RoutingReady says why, and the reconcile is retried.
            routed = self._try_routes(want.key, cp.routers, cp.vips, nexthop, others)
        self._drop_slot_b(want.key, leftover)
        conds = (ready, scope_condition(cp), routing_condition(cp, routed is None, str(routed or "")))
        return CloudState(
            nic,
            str(fip.floating_ip_address),
            conds,
            failed=routed is not None,
            fenced=fenced,
            nic_b=nic_b,
            floating_ip_slot=active if ha is not None else None,
            fenced_b=fenced_b,
        )

    def _try_routes(
        self,
        key: GatewayKey,
        routers: tuple[str, ...],
        vips: tuple[str, ...],
        nexthop: str,
        others: tuple[str, ...],
    ) -> CloudError | None:
        """``_routes``; its failure returned (RoutingReady says it, the reconcile is retried), not raised."""
        try:
            self._routes(routers, vips, nexthop, others=others)
        except CloudError as exc:
            log.warning("cloud.failed gateway=%s step=%s error=%r", key, exc.step, str(exc))
            return exc
        return None

    def _drop_slot_b(self, key: GatewayKey, ports: list[Any]) -> None:
        """HA is off: slot b's port(s) detached and deleted, once the floating IP, the pairs and the routes
        are slot a's."""
        with _Step("SlotBRelease"):
            for port in ports:
                log.info("cloud.slot_b_released gateway=%s port=%s", key, port.id)
                self._delete_port(port)

    def adopt(
        self,
        key: GatewayKey,
        port_id: str,
        *,
        nodes: Collection[str] | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Adopted:
        """Tag an existing port (the seed's gateway port, found by the platform engineer) and its floating
        IP as ``key``'s, so that the next reconcile finds them (``_find``) instead of creating new ones: the
        gateway keeps its address and its floating IP, and no remote peer changes anything. Refused, with
        nothing tagged: a port on another network or subnet, without one IPv4 address, without port
        security, owned by a router or DHCP, attached to a server that is not one of ``nodes`` (the
        cluster's nodes' servers; unknown: None) unless ``force``, anything tagged for another gateway,
        installation or cluster, or a gateway that already has cloud resources (reconciled already: the
        reconcile would keep its own). Its security group is not adopted: the reconcile adds the gateway's
        own beside the port's (docs/install.md, "Moving a gateway from bnerd-vpn-operator")."""
        net = self.conn.network
        net_id, sub_id, *_ = self._network()
        with _Step("Adopt"):
            try:
                port = net.get_port(port_id)
            except Exception as exc:
                if getattr(exc, "status_code", None) == 404:
                    raise AdoptionRefused(f"port {port_id}: no such port (in this project)") from None
                raise
            if port.network_id != net_id:
                raise AdoptionRefused(
                    f"port {port.id} is on network {port.network_id}, not the gateway network {net_id}"
                )
            v4 = [ip for ip in port.fixed_ips or [] if ipaddress.ip_address(ip["ip_address"]).version == 4]
            if len(port.fixed_ips or []) != 1 or len(v4) != 1 or v4[0].get("subnet_id") != sub_id:
                raise AdoptionRefused(
                    f"port {port.id} must have exactly one IPv4 address, on the gateway subnet {sub_id}"
                )
            owner, server = str(port.device_owner or ""), str(port.device_id or "")
            if owner and not owner.startswith("compute:"):
                raise AdoptionRefused(f"port {port.id} is a {owner} port, not a gateway's")
            if port.is_port_security_enabled is False:
                raise AdoptionRefused(
                    f"port {port.id} has port security off: security groups and address pairs need it "
                    f"(openstack port set --enable-port-security {port.id})"
                )
            if server and not force and (nodes is None or server.lower() not in nodes):
                raise AdoptionRefused(
                    f"port {port.id} is attached to server {server}, "
                    + (
                        "not one of this cluster's nodes"
                        if nodes is not None
                        else "and the nodes are unknown"
                    )
                    + ": the reconcile would take it from that server (--force if that is meant)"
                )
            fips = list(net.ips(port_id=port.id))
            cluster = self.settings.cluster
            for what, r in [(f"port {port.id}", port), *((f"floating IP {f.id}", f) for f in fips)]:
                why = adoption_refusal(what, list(r.tags or []), key, self.settings.instance, cluster)
                if why:
                    raise AdoptionRefused(why)
            want = [*self._tags(key), *self._cluster_tags()]
            todo = [
                (kind, r)
                for kind, r in [("port", port), *(("floatingip", f) for f in fips)]
                if not set(want) <= set(r.tags or [])
            ]
            mine = {port.id, *(f.id for f in fips)}
            listings = (("port", net.ports), ("floating IP", net.ips), ("group", net.security_groups))
            held = [
                f"{kind} {r.id}"
                for kind, listing in listings
                for r in listing(tags=",".join(self._tags(key)))
                if r.id not in mine and not foreign_cluster(r.tags or [], cluster)
            ]
            if todo and held:  # (all of it ours already: adopted before, nothing to do)
                raise AdoptionRefused(
                    f"gateway {key} already has {', '.join(held)}: it was reconciled already; adopt before "
                    "its CR reaches the controller"
                )
            tagged: list[str] = []
            for kind, r in todo:
                have = list(r.tags or [])
                tagged.append(f"{kind}/{r.id}")
                if not dry_run:
                    net.set_tags(r, [*have, *(t for t in want if t not in have)])
            address = str(v4[0]["ip_address"])
            log.info(
                "cloud.adopt gateway=%s port=%s address=%s server=%s floating_ips=%s tagged=%s dry_run=%s",
                key,
                port.id,
                address,
                server or "-",
                ",".join(str(f.floating_ip_address) for f in fips),
                ",".join(tagged),
                dry_run,
            )
            return Adopted(
                str(port.id),
                address,
                server or None,
                tuple(str(f.floating_ip_address) for f in fips),
                tuple(tagged),
            )

    def _delete_port(self, port: Any) -> None:
        """Our routes via its address (also wider ones: the address is about to be free), its
        attachment (waited for), then the port."""
        address = port.fixed_ips[0]["ip_address"] if port.fixed_ips else None
        if address:
            self._routes((), (), str(address), releasing=True)
        if port.device_id and str(port.device_owner or "").startswith("compute:"):
            self.conn.compute.delete_server_interface(port.id, server=port.device_id, ignore_missing=True)
            self._wait_port(port.id, lambda p: not p.device_id, "detached")
        self.conn.network.delete_port(port, ignore_missing=True)

    def _release(self, key: GatewayKey) -> int:
        net = self.conn.network
        deleted = 0
        with _Step("Release"):
            ports = self._find(net.ports, key, name=resource_name(key))
            fips = {f.id: f for f in self._find(net.ips, key)}
            fips.update({f.id: f for p in ports for f in self._find(net.ips, key, port_id=p.id)})
            for fip in fips.values():
                net.delete_ip(fip, ignore_missing=True)
                deleted += 1
            # Slot b's port left untagged by a crash (created, never tagged) is found by its name only.
            ports += [p for p in net.ports(name=port_name(key, "b")) if not (p.tags or [])]
            for port in ports:
                self._delete_port(port)
                deleted += 1
            for sg in self._find(net.security_groups, key, name=resource_name(key)):
                net.delete_security_group(sg, ignore_missing=True)
                deleted += 1
        log.info("cloud.released gateway=%s deleted=%d", key, deleted)
        return deleted
