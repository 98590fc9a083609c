"""The cloud boundary: what a gateway needs outside Kubernetes (NIC2, its public address), behind a small
interface the controller owns.

``Cloud.ensure`` is level-triggered like the rest of the reconcile: given what the gateway should have
now (``CloudWant``), it makes the cloud hold that (creating, updating, deleting what it owns) and reports
what the gateway can use (``CloudState``): NIC2's MAC, address and router, the public IP, and the
conditions it is responsible for. ``release`` removes everything it holds for a gateway (the finalizer).
It is also called for a gateway gone without its finalizer (removed by hand, or gone while no
controller ran): what the cloud still holds for it goes.

Backends:

* ``StaticCloud`` (here): NIC2 from the operator's configuration (``staticNICs``), for the lab and for
  clusters that attach a second NIC by other means. It owns nothing, so it creates and releases nothing.
* OpenStack (``controller.openstack``): a Neutron port, floating IP, Nova attachment, address pairs,
  router routes, security group rules.

Warm-standby HA (docs/ha.md): ``CloudWant.ha`` adds slot b (the second pod's node) and says which slot is
active. ``CloudWant.node`` and ``CloudState.nic`` stay slot a's (the gateway's objects without HA), so
enabling HA leaves the running pod's NIC2 alone; ``CloudState.nic_b`` is slot b's. The OpenStack backend
gives each slot its own port, attached to its own node's server, and puts the floating IP, the address
pairs and the routes on the active slot's port (a floating IP is moved by disassociating it first, then
associating it). The static backend moves nothing: see ``StaticCloud``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import gwplan
from controller.cloudplan import Slot
from controller.desired import Nic2
from controller.names import GatewayKey
from controller.settings import STATIC_SLOT_B, StaticNic
from controller.status import Condition

CLOUD_READY = "CloudReady"


class CloudError(Exception):
    """A cloud step failed. ``step`` names it (it becomes the CloudReady reason); ``retryable``: whether
    trying again later can help."""

    def __init__(self, step: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.step = step
        self.retryable = retryable


@dataclass(frozen=True)
class HaWant:
    """The cloud side of a warm-standby gateway: slot b, and which slot serves. Slot a is the gateway's
    ``CloudWant.node`` / ``provider_id``; the two nodes differ (the controller's placement)."""

    node: str | None
    """The node slot b is pinned to (None: none can take it; its port then stays unattached)."""
    provider_id: str | None
    """That node's ``spec.providerID`` (``openstack:///<server-id>``)."""
    active: Slot = "a"
    """The slot that serves (the Lease's holder, ``controller.ha``): the floating IP, the reverse
    exposures' address pairs and the routers' next hop belong to its port."""


@dataclass(frozen=True)
class CloudWant:
    key: GatewayKey
    node: str | None
    """The node the gateway is pinned to (None: none can take it)."""
    provider_id: str | None
    """That node's ``spec.providerID`` (``openstack:///<server-id>``)."""
    plan: gwplan.Plan | None
    """The plan in force (its virtual IPs, peers and reverse exposures decide address pairs, routes and
    security-group rules); None when the gateway has never rendered."""
    routers: tuple[str, ...] = ()
    """The routers of the ClusterLinks (in the gateway's namespace) that name this gateway."""
    ha: HaWant | None = None
    """Warm-standby HA: slot b and the active slot. None: one pod (``node``), the cloud as without HA;
    going back to None deletes what slot b held."""


@dataclass(frozen=True)
class CloudState:
    nic: Nic2 | None
    public_ip: str | None
    conditions: tuple[Condition, ...]
    failed: bool = False
    """A step after the NIC failed (the routes): the state stands, and the reconcile is retried."""
    fenced: bool = False
    """NIC2 is attached to the pinned node's server and to no other: a pod of the gateway left on another
    node can no longer serve, so it may be deleted without its kubelet's word (``placement.stranded``).
    With HA: slot a's NIC2 and node (``fenced_b`` is slot b's)."""
    nic_b: Nic2 | None = None
    """With HA: slot b's NIC2 (its own port); None without HA (``nic`` is slot a's either way)."""
    floating_ip_slot: Slot | None = None
    """With HA: the slot whose port holds the floating IP now (``ha.active`` once ``ensure`` returned:
    a move that failed half-way raises CloudError). None without HA, and from a backend that moves no
    floating IP (``StaticCloud``)."""
    fenced_b: bool = False
    """With HA: ``fenced`` for slot b (its NIC2 attached to slot b's node's server and to no other)."""


class Cloud(Protocol):
    async def ensure(self, want: CloudWant) -> CloudState:
        """Make the cloud hold what ``want`` says; raises CloudError (the reconcile is retried)."""
        ...

    async def release(self, key: GatewayKey) -> int:
        """Delete everything held for ``key`` (idempotent); the number of resources deleted."""
        ...

    async def owned(self) -> dict[GatewayKey, str]:
        """Gateway -> oldest created_at of what the cloud holds for it, tagged with this installation and
        this cluster (the sweep's input, ``cloudplan.sweepable``); raises CloudError."""
        ...

    async def transit_cidrs(self) -> tuple[str, ...] | None:
        """The networks gateways' NIC2s sit on (no serviceCIDR may overlap them: a virtual IP there could
        claim another gateway's NIC2 address); None while unknown (the cloud cannot be asked yet: nothing
        new is rendered then, as no serviceCIDR can be checked)."""
        ...


class StaticCloud:
    """``Cloud`` over configured NICs: ``namespace/name`` -> MAC, address, gateway (and a public IP).
    It fences nothing: the NIC is wherever the operator put it.

    With HA, slot b's NIC2 is the entry ``namespace/name#b`` (``controller.settings``: its own MAC and
    address, no public IP of its own). Nothing is moved when the active slot changes: the operator makes
    the public IP reach the active slot's NIC2 address (their router's NAT or a VIP they move, following
    the gateway's Lease), points the reverse exposures' routes at it, and permits the virtual IPs on both
    NICs. ``floating_ip_slot`` stays None: this backend does not know where the public IP is."""

    def __init__(self, nics: Mapping[str, StaticNic]) -> None:
        self.nics = dict(nics)

    async def ensure(self, want: CloudWant) -> CloudState:
        name = f"{want.key.namespace}/{want.key.name}"
        entries = [name] if want.ha is None else [name, f"{name}{STATIC_SLOT_B}"]
        missing = [e for e in entries if e not in self.nics]
        if missing:
            nic = self.nics.get(name)
            return CloudState(
                Nic2(nic.mac, nic.address, nic.gateway) if nic is not None else None,  # HA: slot a serves on
                nic.public_ip if nic is not None else None,
                (
                    Condition(
                        CLOUD_READY,
                        False,
                        "NoStaticNIC",
                        f"the operator's staticNICs has no entry {' or '.join(missing)}"
                        + (" (slot b of the HA gateway)" if missing == [f"{name}{STATIC_SLOT_B}"] else ""),
                    ),
                ),
            )
        nic = self.nics[name]
        message = f"NIC2 {nic.mac} {nic.address} via {nic.gateway}"
        nic_b = None
        if want.ha is not None:
            b = self.nics[f"{name}{STATIC_SLOT_B}"]
            nic_b = Nic2(b.mac, b.address, b.gateway)
            message = (
                f"slot a: {message}; slot b: NIC2 {b.mac} {b.address} via {b.gateway}; active: slot "
                f"{want.ha.active} (static NICs: the public IP and routes are moved by the operator)"
            )
        return CloudState(
            Nic2(nic.mac, nic.address, nic.gateway),
            nic.public_ip,
            (Condition(CLOUD_READY, True, "StaticNIC", message),),
            nic_b=nic_b,
        )

    async def release(self, key: GatewayKey) -> int:
        return 0

    async def owned(self) -> dict[GatewayKey, str]:
        return {}

    async def transit_cidrs(self) -> tuple[str, ...] | None:
        return tuple(sorted({str(ipaddress.IPv4Interface(n.address).network) for n in self.nics.values()}))


_conforms: Cloud = StaticCloud({})
