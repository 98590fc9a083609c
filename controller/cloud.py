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
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import gwplan
from controller.desired import Nic2
from controller.names import GatewayKey
from controller.settings import StaticNic
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


@dataclass(frozen=True)
class CloudState:
    nic: Nic2 | None
    public_ip: str | None
    conditions: tuple[Condition, ...]
    failed: bool = False
    """A step after the NIC failed (the routes): the state stands, and the reconcile is retried."""
    fenced: bool = False
    """NIC2 is attached to the pinned node's server and to no other: a pod of the gateway left on another
    node can no longer serve, so it may be deleted without its kubelet's word (``placement.stranded``)."""


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
    It fences nothing: the NIC is wherever the operator put it."""

    def __init__(self, nics: Mapping[str, StaticNic]) -> None:
        self.nics = dict(nics)

    async def ensure(self, want: CloudWant) -> CloudState:
        nic = self.nics.get(f"{want.key.namespace}/{want.key.name}")
        if nic is None:
            return CloudState(
                None,
                None,
                (
                    Condition(
                        CLOUD_READY,
                        False,
                        "NoStaticNIC",
                        f"the operator's staticNICs has no entry {want.key.namespace}/{want.key.name}",
                    ),
                ),
            )
        return CloudState(
            Nic2(nic.mac, nic.address, nic.gateway),
            nic.public_ip,
            (Condition(CLOUD_READY, True, "StaticNIC", f"NIC2 {nic.mac} {nic.address} via {nic.gateway}"),),
        )

    async def release(self, key: GatewayKey) -> int:
        return 0

    async def owned(self) -> dict[GatewayKey, str]:
        return {}

    async def transit_cidrs(self) -> tuple[str, ...] | None:
        return tuple(sorted({str(ipaddress.IPv4Interface(n.address).network) for n in self.nics.values()}))


_conforms: Cloud = StaticCloud({})
