"""Validation: pure functions from documents (and operator options) to a list of problems.

Two tiers, one set of rules:

* ``validate_object(doc)``: everything decidable from one object alone. These rules live in
  ``controller.api.resources`` (schema + CEL twins) and are ALSO enforced at admission by the generated CRDs;
  tests prove both give the same verdict on one corpus. Nulls are treated as the API server treats them
  (``admit`` returns the stored form: nulls of known fields dropped or defaulted).
* ``validate_gateway(gateway, peers, options)``: rules that need other objects or the operator's own
  configuration, so no admission schema can express them (a CRD's CEL sees one object): grants naming
  the gateway's exposures, overlapping subnets across peers, internalSourceCIDRs (an operator flag, not
  part of any CR) when there are reverse exposures, and then its disjointness from every peer's subnets,
  duplicate IKE ids / public keys across peers, a peer's kind matching its gateway's type. docs/api.md
  lists them.

Every problem names the resource, the field path and the rule, e.g.
``VPNPeer/tenant-acme/hq: spec.ipsec.remoteSubnets[1]: "192.168.20.0/33" is not an IPv4 CIDR``.
"""

from __future__ import annotations

import bisect
import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from controller.api.model import (
    Gateway,
    IPsecGateway,
    LegacyTunnel,
    Meta,
    VPNGateway,
    VPNPeer,
    meta_of,
    parse,
)
from controller.api.resources import BY_KIND, CIDR, DNS_LABEL
from controller.api.schema import FieldError, check, kind_of, prune_nulls, show

REVERSE_NEEDS_INTERNAL = "ReverseExposuresRequireInternalSourceCIDRs"


@dataclass(frozen=True, order=True)
class Item:
    """The part of a gateway a problem invalidates, and so leaves out of the plan."""

    kind: Literal["gateway", "peer", "exposure", "reverse", "grant"] = "gateway"
    name: str = ""
    """peer: the VPNPeer's (legacy: the tunnel's) name; exposure/reverse: the exposure's; grant:
    ``kind/peer/exposure`` (``controller.plan.allocate.grant_key_text``)."""

    def __str__(self) -> str:
        return self.kind if self.kind == "gateway" else f"{self.kind} {self.name}"


GATEWAY = Item()


@dataclass(frozen=True)
class Problem:
    """One reason an input is rejected. ``str()`` is the line users see."""

    resource: str
    """``Kind/namespace/name`` (or ``operator`` for the operator's own configuration)."""
    error: FieldError
    item: Item = GATEWAY
    """What the problem leaves out of the plan: the gateway (nothing renders) or one part of it."""

    @property
    def reason(self) -> str:
        return self.error.reason

    def __str__(self) -> str:
        return f"{self.resource}: {self.error}"


class InvalidInput(ValueError):
    """The input cannot be rendered; ``problems`` says every reason (the message lists them all)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


# --- one object -------------------------------------------------------------------------------------


def validate_object(doc: Any, where: str = "?") -> list[Problem]:
    """Every per-object problem of a raw document (what admission would reject). ``where`` names a
    document that is not an object at all (so has no kind or name), e.g. ``document 3 of the input``."""
    return admit(doc, where)[0]


def admit(doc: Any, where: str = "?") -> tuple[list[Problem], Any]:
    """``validate_object``'s problems, and the document as the API server would store it: nulls of known
    fields dropped or defaulted (``controller.api.schema.prune_nulls``). Parse the stored form."""
    if not isinstance(doc, Mapping):
        return [Problem(where, FieldError("(document)", f"must be an object (got {kind_of(doc)})"))], doc
    meta = meta_of(doc)
    resource = BY_KIND.get(meta.kind)
    if resource is None:
        kinds = ", ".join(sorted(BY_KIND))
        return [Problem(str(meta), FieldError("kind", f"is not one of: {kinds}", show(doc.get("kind"))))], doc
    if doc.get("apiVersion") != resource.api_version:
        served = f"is not served for {meta.kind} (use {resource.api_version})"
        return [Problem(str(meta), FieldError("apiVersion", served, show(doc.get("apiVersion"))))], doc
    nulls: list[str] = []
    doc = prune_nulls(resource.root, doc, "", nulls)
    problems = [Problem(str(meta), _null_noted(e, nulls)) for e in check(resource.root, doc, "")]
    md = doc.get("metadata")
    namespace = md.get("namespace") if isinstance(md, Mapping) else None
    if namespace is not None and not (isinstance(namespace, str) and re.fullmatch(DNS_LABEL, namespace)):
        # The API server validates ObjectMeta itself; offline input gets the same rule here.
        problems.append(
            Problem(str(meta), FieldError("metadata.namespace", "is not a DNS label", show(namespace)))
        )
    return problems, doc


def admit_all(documents: Sequence[Any]) -> tuple[list[Problem], list[Any]]:
    """Every per-object problem of every document, and the documents as stored (see ``admit``)."""
    problems: list[Problem] = []
    stored: list[Any] = []
    for i, d in enumerate(documents):
        found, doc = admit(d, document(i))
        problems += found
        stored.append(doc)
    return problems, stored


def _null_noted(error: FieldError, nulls: Sequence[str]) -> FieldError:
    """A required field that was given as null: say why it counts as missing."""
    if error.reason == "FieldValueRequired" and error.path in nulls:
        return replace(error, rule=f"{error.rule} (it is null, and the API server drops null fields)")
    return error


def document(i: int) -> str:
    """How a document without identity is named in a problem: by its position in the input."""
    return f"document {i + 1} of the input"


# --- a gateway and its peers ------------------------------------------------------------------------
#
# Fail closed per item: a problem invalidates the smallest part it is about (a peer, an exposure, a
# grant), and that part is left out of the plan while the rest is rendered; only a problem of the gateway
# itself stops the render. So one invalid object never keeps a revoked grant or a deleted peer in force.
# Conflicts between parts (two peers claiming one subnet or one IKE id) are settled in a fixed order: what
# the deployed plan holds first (a newcomer never knocks out a working peer), then by name.


@dataclass(frozen=True)
class Neighbour:
    """Another gateway of this operator: its serviceCIDR is reachable from the same transit network."""

    resource: str
    """``Kind/namespace/name``."""
    service_cidr: str


@dataclass(frozen=True)
class Surroundings:
    """What a gateway's rules need besides the gateway and its peers: the operator's configuration and
    the other gateways. The defaults check nothing beyond the objects themselves (offline render)."""

    internal_source_cidrs: tuple[str, ...] = ()
    transit_cidrs: tuple[str, ...] = ()
    """NIC2's networks: a virtual IP there could claim another gateway's NIC2 address (the cloud's
    allowed-address-pairs would let it)."""
    neighbours: tuple[Neighbour, ...] = ()
    """The gateways that keep their serviceCIDR before this one (they come first in the operator's order)."""
    exposure_targets: tuple[str, ...] | None = None
    """The CIDRs this gateway's namespace may expose (the operator's allowance); None: no restriction."""
    secrets: frozenset[str] | None = None
    """The Secrets of the gateway's namespace whose owners opted them in (``names.LABEL_GATEWAY_SECRET``
    in the controller); a reference to any other is refused. None: no check (the offline render)."""
    deployed: frozenset[str] = frozenset()
    """Names of the peers (legacy: tunnels) the deployed plan holds: they win conflicts with newcomers."""
    service_cidrs: tuple[str, ...] | None = None
    """The ranges this gateway's namespace may take its serviceCIDR from (the operator's allowance);
    None: any range the other rules leave."""
    api_server_cidrs: tuple[str, ...] = ()
    """The API server's endpoints: the pod's agent talks to them, so no peer may route them."""

    def opted_in(self, name: str) -> bool:
        return self.secrets is None or name in self.secrets


@dataclass(frozen=True)
class Admission:
    """A gateway and its peers with every invalid part left out, and why."""

    gateway: Gateway
    """Without its left-out exposures (legacy: tunnels and reverse exposures)."""
    peers: tuple[VPNPeer, ...]
    """The admitted peers, each without its left-out grants; sorted by name."""
    problems: tuple[Problem, ...]

    @property
    def refused(self) -> tuple[Problem, ...]:
        """Problems of the gateway itself: no plan can be rendered."""
        return tuple(p for p in self.problems if p.item == GATEWAY)


@dataclass(frozen=True)
class _Net:
    first: int
    last: int
    text: str
    owner: str
    path: str


def _net(text: str, owner: str, path: str) -> _Net:
    n = ipaddress.IPv4Network(text, strict=False)
    return _Net(int(n.network_address), int(n.broadcast_address), text, owner, path)


def _meets(a: _Net, b: _Net) -> bool:
    return a.first <= b.last and b.first <= a.last


def _within(a: _Net, b: _Net) -> bool:
    return b.first <= a.first and a.last <= b.last


def _problem(
    owner: str,
    path: str,
    value: str | None,
    rule: str,
    reason: str = "FieldValueInvalid",
    item: Item = GATEWAY,
) -> Problem:
    return Problem(owner, FieldError(path, rule, show(value) if value is not None else None, reason), item)


class _Disjoint:
    """Nets admitted so far, pairwise disjoint and sorted: the one a new net overlaps is found by bisection
    (the last one starting at or before its end), so 20,000 subnets cost O(n log n) lookups."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._nets: list[_Net] = []

    def overlap(self, n: _Net) -> _Net | None:
        i = bisect.bisect_right(self._starts, n.last) - 1
        return self._nets[i] if i >= 0 and self._nets[i].last >= n.first else None

    def add(self, n: _Net) -> None:
        i = bisect.bisect_right(self._starts, n.first)
        self._starts.insert(i, n.first)
        self._nets.insert(i, n)


def _subnets_overlap(n: _Net, other: _Net) -> str:
    where = "" if other.owner == n.owner else f"{other.owner} "
    return f"overlaps {where}{other.path} {show(other.text)}: remote subnets of one gateway must be disjoint"


def parse_cidrs(values: Iterable[str], what: str) -> list[Problem]:
    """Check operator-supplied CIDRs (e.g. ``--internal-source-cidrs``) with the same rule as CRs."""
    return [
        _problem("operator", f"{what}[{i}]", v, "is not an IPv4 CIDR")
        for i, v in enumerate(values)
        if re.fullmatch(CIDR, v) is None
    ]


def _peer_path(peer: VPNPeer) -> str:
    return "spec.ipsec.remoteSubnets" if peer.ipsec is not None else "spec.wireguard.allowedIPs"


def _whose(n: Neighbour, namespace: str) -> str:
    """The other gateway's range as a tenant may read it: named (with its range) in the tenant's own
    namespace, else neither: another tenant's gateways, namespaces and ranges are not told (a tenant
    trying wider ranges would map them all). The platform team finds it: ``kubectl get vpngateways -A
    -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,CIDR:.spec.serviceCIDR``."""
    if n.resource.split("/")[1:2] == [namespace]:
        return f"{n.resource}'s serviceCIDR {n.service_cidr}"
    return "the serviceCIDR of a gateway in another namespace"


def validate_gateway(
    gateway: Gateway, peers: Sequence[VPNPeer], internal_source_cidrs: Sequence[str]
) -> list[Problem]:
    """Every problem that needs the gateway, its peers and the operator's options together (the offline
    render's strict view: ``admit_gateway`` with nothing around the gateway)."""
    return list(admit_gateway(gateway, peers, Surroundings(tuple(internal_source_cidrs))).problems)


def admit_gateway(gateway: Gateway, peers: Sequence[VPNPeer], around: Surroundings) -> Admission:
    """The gateway and the parts of it that can be rendered; every problem names the part it leaves out.

    Assumes every object passed ``validate_object`` and was parsed."""
    problems = parse_cidrs(around.internal_source_cidrs, "internalSourceCIDRs")
    problems += parse_cidrs(around.transit_cidrs, "transitCIDRs")
    problems += parse_cidrs(around.exposure_targets or (), "exposureTargets")
    problems += parse_cidrs(around.service_cidrs or (), "serviceCIDRs")
    problems += parse_cidrs(around.api_server_cidrs, "apiServer")
    if problems:
        return Admission(gateway, (), tuple(problems))
    gw = str(gateway.meta)
    service = _net(gateway.service_cidr, gw, "spec.serviceCIDR")
    problems += _gateway_itself(gateway, service, around)
    # Reverse exposures first: whether any survive decides whether peers may overlap internalSourceCIDRs.
    reverse, found = _reverse_exposures(gateway, around)
    problems += found
    internal = [
        _net(c, "operator", f"internalSourceCIDRs[{i}]")
        for i, c in enumerate(around.internal_source_cidrs if reverse else ())
    ]
    exposures, found = _exposures(gateway, service, around)
    problems += found
    if isinstance(gateway, VPNGateway):
        admitted, found = _admit_peers(gateway, peers, service, internal, around)
        problems += found
        granted = []
        for peer in admitted:
            peer, found = _grants(gateway, peer, exposures, reverse)
            problems += found
            granted.append(peer)
        kept = dataclasses.replace(
            gateway,
            exposures=tuple(e for e in gateway.exposures if e.name in exposures),
            reverse_exposures=tuple(e for e in gateway.reverse_exposures if e.name in reverse),
        )
        return Admission(kept, tuple(sorted(granted, key=lambda p: p.meta.name)), tuple(problems))
    tunnels, found = _admit_tunnels(gateway, service, internal, around)
    problems += found
    carried = []
    for i, e in enumerate(gateway.reverse_exposures):
        if e.name not in reverse:
            continue
        if any(inside(e.address, t.remote_subnets) for t in tunnels):
            carried.append(e)
        else:
            problems.append(
                _problem(
                    gw,
                    f"spec.reverseExposures[{i}].target.address",
                    e.address,
                    "is not inside any tunnel's remoteSubnets",
                    "ReverseTargetOutsidePeer",
                    Item("reverse", e.name),
                )
            )
    kept_legacy = dataclasses.replace(
        gateway,
        tunnels=tunnels,
        exposures=tuple(e for e in gateway.exposures if e.name in exposures),
        reverse_exposures=tuple(carried),
    )
    return Admission(kept_legacy, (), tuple(problems))


SECRET_NOT_OPTED_IN = "SecretNotOptedIn"  # noqa: S105 (a reason)


def not_opted_in(name: str) -> str:
    return (
        f"names Secret {name}, which does not exist or is not opted in for gateways (its owner labels it "
        "vpn.bnerd.net/gateway-secret=true): a gateway is never given a Secret its owner did not mean for one"
    )


def _gateway_itself(gateway: Gateway, service: _Net, around: Surroundings) -> list[Problem]:
    """Rules of the gateway's own fields: one broken, and nothing of it can be rendered."""
    gw = str(gateway.meta)
    problems = []
    allowed = around.service_cidrs
    if allowed is not None and not any(_within(service, _net(c, "", "")) for c in allowed):
        problems.append(
            _problem(
                gw,
                "spec.serviceCIDR",
                gateway.service_cidr,
                f"is not inside the ranges the operator allows namespace {gateway.meta.namespace} "
                f"({', '.join(allowed) or 'none'}; the chart's allowances.namespaces."
                f"{gateway.meta.namespace}.serviceCIDRs)",
                "ServiceCIDRNotAllowed",
            )
        )
    own: list[tuple[str, str]] = []
    if isinstance(gateway, IPsecGateway):
        own.append(("spec.auth.pskSecretRef.name", gateway.psk_secret_ref.name))
    elif gateway.wireguard is not None:
        own.append(("spec.wireguard.privateKeySecretRef.name", gateway.wireguard.private_key_secret_ref.name))
    for path, name in own:
        if not around.opted_in(name):
            problems.append(_problem(gw, path, name, not_opted_in(name), SECRET_NOT_OPTED_IN))
    if isinstance(gateway, VPNGateway) and gateway.wireguard is not None:
        tunnel = _net(gateway.wireguard.address, gw, "spec.wireguard.address")
        if _meets(tunnel, service):
            problems.append(
                _problem(
                    gw,
                    tunnel.path,
                    tunnel.text,
                    f"overlaps the gateway's serviceCIDR {gateway.service_cidr}",
                    "OverlapsServiceCIDR",
                )
            )
        # The tunnel subnet is a route into wg0 in the pod: it must not take the pod's own traffic (the
        # API server, the metadata service, loopback) nor NIC2's network (found by review).
        elsewhere = [
            *((r, what, "ReservedRange") for r, what in _reserved(around)),
            *(
                (_net(c, "", ""), "the gateways' transit network (NIC2's subnet)", "OverlapsTransitNetwork")
                for c in around.transit_cidrs
            ),
            *(  # as for peers: internal sources reach a gateway only through its reverse exposures
                (_net(c, "", ""), "the operator's internalSourceCIDRs", "OverlapsInternalSourceCIDRs")
                for c in (around.internal_source_cidrs if gateway.reverse_exposures else ())
            ),
        ]
        hit = next(((r, what, reason) for r, what, reason in elsewhere if _meets(tunnel, r)), None)
        if hit is not None:
            problems.append(
                _problem(
                    gw,
                    tunnel.path,
                    tunnel.text,
                    f"overlaps {hit[0].text}, {hit[1]}: the tunnel subnet is routed into the WireGuard "
                    "device",
                    hit[2],
                )
            )
    # Ranges the serviceCIDR must stay out of: (range, the rule, the reason).
    taken = [
        *(
            (c, f"overlaps the operator's internalSourceCIDRs entry {c}: traffic from its virtual IPs (the "
             "source of its reverse exposures' SNAT) would pass for fabric sources at every gateway's "
             "reverse exposures", "OverlapsServiceCIDR")
            for c in around.internal_source_cidrs
        ),
        *(
            (c, f"overlaps the gateways' transit network {c} (NIC2's subnet): a virtual IP could claim "
             "another gateway's NIC2 address", "OverlapsTransitNetwork")
            for c in around.transit_cidrs
        ),
        *(
            (n.service_cidr, f"overlaps {_whose(n, gateway.meta.namespace)}, which it had first: gateways on "
             "one transit network need disjoint serviceCIDRs", "ServiceCIDRTaken")
            for n in around.neighbours
        ),
    ]  # fmt: skip
    problems += [
        _problem(gw, "spec.serviceCIDR", gateway.service_cidr, rule, reason)
        for cidr, rule, reason in taken
        if _meets(_net(cidr, "", ""), service)
    ]
    return problems


def _reverse_exposures(gateway: Gateway, around: Surroundings) -> tuple[set[str], list[Problem]]:
    gw = str(gateway.meta)
    if gateway.reverse_exposures and not around.internal_source_cidrs:
        return set(), [
            _problem(
                gw,
                f"spec.reverseExposures[{i}]",
                e.name,
                "needs the operator's internalSourceCIDRs (the chart's internalSourceCIDRs; "
                "--internal-source-cidrs, IPSEC_INTERNAL_SOURCE_CIDRS): without them nothing constrains "
                "who reaches a reverse exposure",
                REVERSE_NEEDS_INTERNAL,
                Item("reverse", e.name),
            )
            for i, e in enumerate(gateway.reverse_exposures)
        ]
    return {e.name for e in gateway.reverse_exposures}, []


def _exposures(gateway: Gateway, service: _Net, around: Surroundings) -> tuple[set[str], list[Problem]]:
    gw = str(gateway.meta)
    kept: set[str] = set()
    problems = []
    allowed = [ipaddress.IPv4Network(c, strict=False) for c in around.exposure_targets or ()]
    for i, e in enumerate(gateway.exposures):
        item = Item("exposure", e.name)
        path = f"spec.exposures[{i}].target.address"
        if e.address is not None and inside(e.address, [gateway.service_cidr]):
            problems.append(
                _problem(
                    gw,
                    path,
                    e.address,
                    "is inside the gateway's serviceCIDR: a target must be a fabric address",
                    "OverlapsServiceCIDR",
                    item,
                )
            )
        elif e.address is not None and inside(e.address, list(around.api_server_cidrs)):
            # init-nat routes a target out through NIC2: the agent's own API traffic would follow it
            # and the pod could no longer read its plan (found by review).
            problems.append(
                _problem(
                    gw,
                    path,
                    e.address,
                    "is the API server's endpoint (networkPolicy.apiServer): the gateway's agent reads its "
                    "plan there, and a target is routed out through NIC2",
                    "ReservedRange",
                    item,
                )
            )
        elif (
            around.exposure_targets is not None
            and e.address is not None
            and not any(ipaddress.IPv4Address(e.address) in n for n in allowed)
        ):
            problems.append(
                _problem(
                    gw,
                    path,
                    e.address,
                    f"is not inside the exposure targets the operator allows for "
                    f"namespace {gateway.meta.namespace} ({', '.join(around.exposure_targets) or 'none'}; "
                    f"the chart's allowances.namespaces.{gateway.meta.namespace}.exposureTargets)",
                    "ExposureTargetNotAllowed",
                    item,
                )
            )
        else:
            kept.add(e.name)
    return kept, problems


def _admit_peers(
    gateway: VPNGateway,
    peers: Sequence[VPNPeer],
    service: _Net,
    internal: Sequence[_Net],
    around: Surroundings,
) -> tuple[list[VPNPeer], list[Problem]]:
    """The peers that can be rendered, in the operator's order (deployed first, then by name)."""
    gw = str(gateway.meta)
    admitted: list[VPNPeer] = []
    problems: list[Problem] = []
    ike_ids: dict[str, Meta] = {}
    keys: dict[str, Meta] = {}
    nets = _Disjoint()
    for peer in sorted(peers, key=lambda p: (p.meta.name not in around.deployed, p.meta.name)):
        p = str(peer.meta)
        item = Item("peer", peer.meta.name)
        found: list[Problem] = []

        def refuse(path: str, value: str | None, rule: str, reason: str = "FieldValueInvalid") -> None:
            found.append(_problem(p, path, value, rule, reason, item))  # noqa: B023 (used in this iteration)

        if peer.gateway != gateway.meta.name or peer.meta.namespace != gateway.meta.namespace:
            refuse(
                "spec.gatewayRef.name",
                peer.gateway,
                f"does not name the gateway being rendered ({gw})",
                "GatewayMismatch",
            )
        if gateway.type == "ipsec" and peer.ipsec is None:
            refuse("spec.ipsec", None, f"is required: {gw} is an ipsec gateway", "FieldValueRequired")
        if gateway.type == "wireguard" and peer.wireguard is None:
            refuse("spec.wireguard", None, f"is required: {gw} is a wireguard gateway", "FieldValueRequired")
        if gateway.type == "ipsec" and peer.ipsec is not None and gateway.ipsec is not None:
            pi, gi = peer.ipsec, gateway.ipsec
            if pi.auth == "psk" and pi.psk_secret_ref is None and gi.psk_secret_ref is None:
                refuse(
                    "spec.ipsec.pskSecretRef",
                    None,
                    f"is required: {gw} has no default spec.ipsec.pskSecretRef",
                    "FieldValueRequired",
                )
            ref = pi.psk_secret_ref or gi.psk_secret_ref
            if pi.auth == "psk" and ref is not None and not around.opted_in(ref.name):
                path = "spec.ipsec.pskSecretRef.name" if pi.psk_secret_ref else "spec.ipsec.pskSecretRef"
                refuse(
                    path,
                    ref.name,
                    not_opted_in(ref.name) + ("" if pi.psk_secret_ref else f" (the default of {gw})"),
                    SECRET_NOT_OPTED_IN,
                )
            cert = gi.certificate_secret
            if pi.auth == "pubkey" and cert is not None and not around.opted_in(cert):
                refuse(
                    "spec.ipsec.auth",
                    "pubkey",
                    f"needs {gw}'s certificate: it " + not_opted_in(cert),
                    SECRET_NOT_OPTED_IN,
                )
            if pi.auth == "pubkey" and gi.certificate_secret is None:
                refuse(
                    "spec.ipsec.auth",
                    "pubkey",
                    f"needs a gateway certificate: {gw} has no spec.ipsec.certificateSecretRef",
                    "FieldValueRequired",
                )
            if ike_id_key(pi.id) == ike_id_key(gi.local_id):
                refuse(
                    "spec.ipsec.id",
                    pi.id,
                    f"is the gateway's own IKE id (spec.ipsec.localID of {gw}): a "
                    "peer's key would be offered for every exchange",
                    "FieldValueDuplicate",
                )
            first = ike_ids.get(ike_id_key(pi.id))
            if first is not None:
                refuse("spec.ipsec.id", pi.id, f"is already the IKE id of {first}", "FieldValueDuplicate")
        if gateway.type == "wireguard" and peer.wireguard is not None:
            pk = peer.wireguard.preshared_key_secret_ref
            if pk is not None and not around.opted_in(pk.name):
                refuse(
                    "spec.wireguard.presharedKeySecretRef.name",
                    pk.name,
                    not_opted_in(pk.name),
                    SECRET_NOT_OPTED_IN,
                )
            first = keys.get(peer.wireguard.public_key)
            if first is not None:
                refuse(
                    "spec.wireguard.publicKey",
                    None,
                    f"is already the public key of {first}",
                    "FieldValueDuplicate",
                )
        base = _peer_path(peer)
        own = [_net(s, p, f"{base}[{i}]") for i, s in enumerate(peer.subnets)]
        found += _own_subnets(own, service, internal, gateway.service_cidr, item, _reserved(around))
        for n in own:
            other = nets.overlap(n)
            if other is not None:
                refuse(n.path, n.text, _subnets_overlap(n, other), "SubnetsOverlap")
        if found:
            problems += found
            continue
        admitted.append(peer)
        for n in own:
            nets.add(n)
        if peer.ipsec is not None:
            ike_ids[ike_id_key(peer.ipsec.id)] = peer.meta
        if peer.wireguard is not None:
            keys[peer.wireguard.public_key] = peer.meta
    return admitted, problems


# Ranges no peer's subnets may touch: traffic there is the pod's own (loopback, the metadata service at
# 169.254.169.254) or no unicast network at all; routed into a tunnel, the pod would hand it to the peer.
SPECIAL_RANGES = (
    ("0.0.0.0/8", "this-network (0.0.0.0/8; a default route 0.0.0.0/0 included)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, where the cloud's metadata service lives"),
    ("224.0.0.0/3", "multicast and reserved"),
)


def _reserved(around: Surroundings) -> list[tuple[_Net, str]]:
    """(range, what it is) of the ranges no peer's subnets may overlap."""
    api = [
        (c, "the API server's endpoint (networkPolicy.apiServer): the gateway's agent reads its plan there")
        for c in around.api_server_cidrs
    ]
    return [(_net(c, "", ""), what) for c, what in (*SPECIAL_RANGES, *api)]


def _own_subnets(
    own: Sequence[_Net],
    service: _Net,
    internal: Sequence[_Net],
    service_cidr: str,
    item: Item,
    reserved: Sequence[tuple[_Net, str]],
) -> list[Problem]:
    """One peer's (or legacy tunnel's) subnets against each other, serviceCIDR, internalSourceCIDRs and
    the reserved ranges. A WireGuard peer's allowedIPs usually include its tunnel address inside the
    gateway's tunnel subnet: fine. Overlaps between peers are not (WireGuard routes each address to ONE
    peer)."""
    problems = []
    for n in own:
        hit = next(((r, what) for r, what in reserved if _meets(n, r)), None)  # one is enough to say
        if hit is not None:
            problems.append(
                _problem(
                    n.owner,
                    n.path,
                    n.text,
                    f"overlaps {hit[0].text}, {hit[1]}: no peer may route it",
                    "ReservedRange",
                    item,
                )
            )
    widest: _Net | None = None
    for n in sorted(own, key=lambda n: (n.first, -n.last, n.path)):
        if widest is not None and n.first <= widest.last:
            problems.append(
                _problem(n.owner, n.path, n.text, _subnets_overlap(n, widest), "SubnetsOverlap", item)
            )
        if widest is None or n.last > widest.last:
            widest = n
    for n in own:
        if _meets(n, service):
            problems.append(
                _problem(
                    n.owner,
                    n.path,
                    n.text,
                    f"overlaps the gateway's serviceCIDR {service_cidr}",
                    "OverlapsServiceCIDR",
                    item,
                )
            )
        # internalSourceCIDRs are the sources of reverse grants and nothing else (init-nat uses them only
        # there), so their disjointness from peers protects reverse exposures only: without any, an
        # operator-wide fabric range (often 10/8) overlapping a tenant's subnets harms nothing.
        for c in internal:
            if _meets(n, c):
                problems.append(
                    _problem(
                        n.owner,
                        n.path,
                        n.text,
                        f"overlaps the operator's internalSourceCIDRs entry {c.text}: the gateway has "
                        "reverse exposures, whose grants admit every internal source, so this peer's own "
                        "addresses would reach them",
                        "InternalSourceCIDRsOverlapPeer",
                        item,
                    )
                )
    return problems


def _grants(
    gateway: VPNGateway, peer: VPNPeer, exposures: set[str], reverse: set[str]
) -> tuple[VPNPeer, list[Problem]]:
    """``peer`` with only the grants that name a rendered exposure (and, for a reverse exposure, one whose
    target sits behind this peer)."""
    gw = str(gateway.meta)
    p = str(peer.meta)
    problems = []
    targets = {e.name: e.address for e in gateway.reverse_exposures}
    known = {e.name for e in gateway.exposures}
    kept_ex: list[str] = []
    for i, name in enumerate(peer.exposures):
        item = Item("grant", f"exposure/{peer.meta.name}/{name}")
        if name in exposures:
            kept_ex.append(name)
        elif name in known:
            problems.append(
                _problem(
                    p,
                    f"spec.authorization.exposures[{i}]",
                    name,
                    f"names an exposure of {gw} that is left out",
                    "ExposureLeftOut",
                    item,
                )
            )
        else:
            problems.append(
                _problem(
                    p,
                    f"spec.authorization.exposures[{i}]",
                    name,
                    f"names no exposure of {gw}",
                    "UnknownExposure",
                    item,
                )
            )
    kept_rev: list[str] = []
    for i, name in enumerate(peer.reverse_exposures):
        item = Item("grant", f"reverse/{peer.meta.name}/{name}")
        path = f"spec.authorization.reverseExposures[{i}]"
        if name in reverse and inside(targets[name], peer.subnets):
            kept_rev.append(name)
        elif name in reverse:
            problems.append(
                _problem(
                    p,
                    path,
                    name,
                    f"targets {targets[name]}, which is not inside this peer's subnets",
                    "ReverseTargetOutsidePeer",
                    item,
                )
            )
        elif name in targets:
            problems.append(
                _problem(
                    p,
                    path,
                    name,
                    f"names a reverse exposure of {gw} that is left out",
                    "ExposureLeftOut",
                    item,
                )
            )
        else:
            problems.append(
                _problem(p, path, name, f"names no reverse exposure of {gw}", "UnknownExposure", item)
            )
    return dataclasses.replace(peer, exposures=tuple(kept_ex), reverse_exposures=tuple(kept_rev)), problems


def ike_id_key(ike_id: str) -> str:
    """charon compares FQDN and email identities case-insensitively (strncasecmp in identification.c):
    ``hq.acme.example`` and ``HQ.ACME.EXAMPLE`` select the same config and the same PSK."""
    return ike_id.lower()


def _admit_tunnels(
    gateway: IPsecGateway, service: _Net, internal: Sequence[_Net], around: Surroundings
) -> tuple[tuple[LegacyTunnel, ...], list[Problem]]:
    """The legacy gateway's tunnels that can be rendered: deployed ones first, then in spec order."""
    gw = str(gateway.meta)
    deployed, reserved = around.deployed, _reserved(around)
    order = sorted(range(len(gateway.tunnels)), key=lambda i: (gateway.tunnels[i].name not in deployed, i))
    admitted: list[int] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    nets = _Disjoint()
    for i in order:
        t = gateway.tunnels[i]
        item = Item("peer", t.name)
        found = []
        if ike_id_key(t.peer_id) == ike_id_key(gateway.local_id):
            found.append(
                _problem(
                    gw,
                    f"spec.tunnels[{i}].peer.id",
                    t.peer_id,
                    "is the gateway's own IKE id (spec.localID): its key would be offered for every exchange",
                    "FieldValueDuplicate",
                    item,
                )
            )
        first = seen.get(ike_id_key(t.peer_id))
        if first is not None:
            found.append(
                _problem(
                    gw,
                    f"spec.tunnels[{i}].peer.id",
                    t.peer_id,
                    f"is already the IKE id of spec.tunnels[{first}]",
                    "FieldValueDuplicate",
                    item,
                )
            )
        own = [_net(s, gw, f"spec.tunnels[{i}].remoteSubnets[{j}]") for j, s in enumerate(t.remote_subnets)]
        found += _own_subnets(own, service, internal, gateway.service_cidr, item, reserved)
        for n in own:
            other = nets.overlap(n)
            if other is not None:
                found.append(_problem(gw, n.path, n.text, _subnets_overlap(n, other), "SubnetsOverlap", item))
        if found:
            problems += found
            continue
        admitted.append(i)
        seen[ike_id_key(t.peer_id)] = i
        for n in own:
            nets.add(n)
    return tuple(gateway.tunnels[i] for i in sorted(admitted)), problems


def inside(address: str, subnets: Sequence[str]) -> bool:
    a = ipaddress.IPv4Address(address)
    return any(a in ipaddress.IPv4Network(s, strict=False) for s in subnets)


def select(resources: Sequence[Any]) -> tuple[Gateway, list[VPNPeer]]:
    """The one gateway of the input and its peers; InvalidInput when there is not exactly one gateway."""
    gateways = [r for r in resources if isinstance(r, VPNGateway | IPsecGateway)]
    peers = [r for r in resources if isinstance(r, VPNPeer)]
    seen: set[str] = set()
    duplicates = []
    for r in resources:
        if str(r.meta) in seen:
            duplicates.append(Problem(str(r.meta), FieldError("metadata.name", "appears twice in the input")))
        seen.add(str(r.meta))
    if duplicates:
        raise InvalidInput(duplicates)
    if len(gateways) != 1:
        found = ", ".join(str(g.meta) for g in gateways) or "none"
        raise InvalidInput(
            [
                Problem(
                    "input",
                    FieldError(
                        "(documents)", f"must contain exactly one VPNGateway or IPsecGateway (found {found})"
                    ),
                )
            ]
        )
    if isinstance(gateways[0], IPsecGateway) and peers:
        raise InvalidInput(
            [
                Problem(
                    str(p.meta),
                    FieldError("kind", "VPNPeers belong to VPNGateways, not legacy IPsecGateways"),
                )
                for p in peers
            ]
        )
    return gateways[0], peers


def validate(documents: Sequence[Any], internal_source_cidrs: Sequence[str] = ()) -> list[Problem]:
    """Every problem of a set of documents (one gateway and its peers): per-object rules first; when
    every object is well-formed, the cross-object rules. Allocation problems are render's business."""
    problems, stored = admit_all(documents)
    if problems:
        return problems
    try:
        gateway, peers = select([parse(d) for d in stored])
    except InvalidInput as exc:
        return list(exc.problems)
    return validate_gateway(gateway, peers, internal_source_cidrs)
