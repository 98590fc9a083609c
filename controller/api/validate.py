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

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.api.model import Gateway, IPsecGateway, Meta, VPNGateway, VPNPeer, meta_of, parse
from controller.api.resources import BY_KIND, CIDR, DNS_LABEL
from controller.api.schema import FieldError, check, kind_of, prune_nulls, show

REVERSE_NEEDS_INTERNAL = "ReverseExposuresRequireInternalSourceCIDRs"


@dataclass(frozen=True)
class Problem:
    """One reason an input is rejected. ``str()`` is the line users see."""

    resource: str
    """``Kind/namespace/name`` (or ``operator`` for the operator's own configuration)."""
    error: FieldError

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


def _problem(
    owner: str, path: str, value: str | None, rule: str, reason: str = "FieldValueInvalid"
) -> Problem:
    return Problem(owner, FieldError(path, rule, show(value) if value is not None else None, reason))


def _overlaps(nets: Iterable[_Net]) -> list[Problem]:
    """Each net overlapping an earlier one (sorted sweep: O(n log n) for 20,000 subnets)."""
    out: list[Problem] = []
    widest: _Net | None = None
    for n in sorted(nets, key=lambda n: (n.first, -n.last, n.owner, n.path)):
        if widest is not None and n.first <= widest.last:
            where = "" if widest.owner == n.owner else f"{widest.owner} "
            out.append(
                _problem(
                    n.owner,
                    n.path,
                    n.text,
                    f"overlaps {where}{widest.path} {show(widest.text)}: "
                    "remote subnets of one gateway must be disjoint",
                    "SubnetsOverlap",
                )
            )
        if widest is None or n.last > widest.last:
            widest = n
    return out


def parse_cidrs(values: Iterable[str], what: str) -> list[Problem]:
    """Check operator-supplied CIDRs (e.g. ``--internal-source-cidrs``) with the same rule as CRs."""
    return [
        _problem("operator", f"{what}[{i}]", v, "is not an IPv4 CIDR")
        for i, v in enumerate(values)
        if re.fullmatch(CIDR, v) is None
    ]


def _peer_path(peer: VPNPeer) -> str:
    return "spec.ipsec.remoteSubnets" if peer.ipsec is not None else "spec.wireguard.allowedIPs"


def validate_gateway(
    gateway: Gateway, peers: Sequence[VPNPeer], internal_source_cidrs: Sequence[str]
) -> list[Problem]:
    """Problems that need the gateway, all its peers and the operator's options together.

    Assumes every object passed ``validate_object`` and was parsed."""
    problems = parse_cidrs(internal_source_cidrs, "internalSourceCIDRs")
    if problems:
        return problems
    peers = sorted(peers, key=lambda p: p.meta.name)  # messages independent of input order
    gw = str(gateway.meta)
    service = _net(gateway.service_cidr, gw, "spec.serviceCIDR")
    nets: list[_Net] = []
    if isinstance(gateway, VPNGateway):
        problems += _peers(gateway, peers)
        for peer in peers:
            base = _peer_path(peer)
            nets += [_net(s, str(peer.meta), f"{base}[{i}]") for i, s in enumerate(peer.subnets)]
    else:
        problems += _legacy(gateway)
        for t_i, t in enumerate(gateway.tunnels):
            nets += [
                _net(s, gw, f"spec.tunnels[{t_i}].remoteSubnets[{i}]") for i, s in enumerate(t.remote_subnets)
            ]
    # A WireGuard peer's allowedIPs usually include its tunnel address inside the gateway's tunnel
    # subnet: fine. Overlaps between peers are not (WireGuard routes each address to ONE peer).
    for n in nets:
        if n.first <= service.last and service.first <= n.last:
            problems.append(
                _problem(
                    n.owner,
                    n.path,
                    n.text,
                    f"overlaps the gateway's serviceCIDR {gateway.service_cidr}",
                    "OverlapsServiceCIDR",
                )
            )
    problems += _overlaps(nets)
    if isinstance(gateway, VPNGateway) and gateway.wireguard is not None:
        tunnel = _net(gateway.wireguard.address, gw, "spec.wireguard.address")
        if tunnel.first <= service.last and service.first <= tunnel.last:
            problems.append(
                _problem(
                    gw,
                    tunnel.path,
                    tunnel.text,
                    f"overlaps the gateway's serviceCIDR {gateway.service_cidr}",
                    "OverlapsServiceCIDR",
                )
            )
    if gateway.reverse_exposures and not internal_source_cidrs:
        problems.append(
            _problem(
                gw,
                "spec.reverseExposures",
                None,
                "need the operator's internalSourceCIDRs "
                "(--internal-source-cidrs, IPSEC_INTERNAL_SOURCE_CIDRS): "
                "without them nothing constrains who reaches a reverse exposure",
                REVERSE_NEEDS_INTERNAL,
            )
        )
    # internalSourceCIDRs are the sources of reverse grants and nothing else (init-nat uses them only there),
    # so their disjointness from peers and serviceCIDR protects reverse exposures only: without any, an
    # operator-wide fabric range (often 10/8) overlapping a tenant's subnets harms nothing and is allowed.
    internal = [
        _net(c, "operator", f"internalSourceCIDRs[{i}]")
        for i, c in enumerate(internal_source_cidrs if gateway.reverse_exposures else ())
    ]
    for n in nets:
        for c in internal:
            if n.first <= c.last and c.first <= n.last:
                problems.append(
                    _problem(
                        n.owner,
                        n.path,
                        n.text,
                        f"overlaps the operator's internalSourceCIDRs entry {c.text}: the gateway has "
                        "reverse exposures, whose grants admit every internal source, so this peer's own "
                        "addresses would reach them",
                        "InternalSourceCIDRsOverlapPeer",
                    )
                )
    for c in internal:
        if c.first <= service.last and service.first <= c.last:
            problems.append(
                _problem(
                    gw,
                    "spec.serviceCIDR",
                    gateway.service_cidr,
                    f"overlaps the operator's internalSourceCIDRs entry {c.text}: the gateway has reverse "
                    "exposures, whose grants would admit its own virtual IPs as internal sources",
                    "OverlapsServiceCIDR",
                )
            )
    for i, e in enumerate(gateway.exposures):
        if e.address is not None and inside(e.address, [gateway.service_cidr]):
            problems.append(
                _problem(
                    gw,
                    f"spec.exposures[{i}].target.address",
                    e.address,
                    "is inside the gateway's serviceCIDR: a target must be a fabric address",
                    "OverlapsServiceCIDR",
                )
            )
    if not problems:
        problems += _reverse_targets(gateway, peers)
    return problems


def _peers(gateway: VPNGateway, peers: Sequence[VPNPeer]) -> list[Problem]:
    problems: list[Problem] = []
    gw = str(gateway.meta)
    exposures = {e.name for e in gateway.exposures}
    reverse = {e.name for e in gateway.reverse_exposures}
    ike_ids: dict[str, Meta] = {}
    keys: dict[str, Meta] = {}
    for peer in peers:
        p = str(peer.meta)
        if peer.gateway != gateway.meta.name or peer.meta.namespace != gateway.meta.namespace:
            problems.append(
                _problem(
                    p,
                    "spec.gatewayRef.name",
                    peer.gateway,
                    f"does not name the gateway being rendered ({gw})",
                    "GatewayMismatch",
                )
            )
        if gateway.type == "ipsec" and peer.ipsec is None:
            problems.append(
                _problem(
                    p, "spec.ipsec", None, f"is required: {gw} is an ipsec gateway", "FieldValueRequired"
                )
            )
        if gateway.type == "wireguard" and peer.wireguard is None:
            problems.append(
                _problem(
                    p,
                    "spec.wireguard",
                    None,
                    f"is required: {gw} is a wireguard gateway",
                    "FieldValueRequired",
                )
            )
        if gateway.type == "ipsec" and peer.ipsec is not None and gateway.ipsec is not None:
            if (
                peer.ipsec.auth == "psk"
                and peer.ipsec.psk_secret_ref is None
                and gateway.ipsec.psk_secret_ref is None
            ):
                problems.append(
                    _problem(
                        p,
                        "spec.ipsec.pskSecretRef",
                        None,
                        f"is required: {gw} has no default spec.ipsec.pskSecretRef",
                        "FieldValueRequired",
                    )
                )
            if peer.ipsec.auth == "pubkey" and gateway.ipsec.certificate_secret is None:
                problems.append(
                    _problem(
                        p,
                        "spec.ipsec.auth",
                        "pubkey",
                        f"needs a gateway certificate: {gw} has no spec.ipsec.certificateSecretRef",
                        "FieldValueRequired",
                    )
                )
            if ike_id_key(peer.ipsec.id) == ike_id_key(gateway.ipsec.local_id):
                problems.append(
                    _problem(
                        p,
                        "spec.ipsec.id",
                        peer.ipsec.id,
                        f"is the gateway's own IKE id (spec.ipsec.localID of {gw}): a peer's key would be "
                        "offered for every exchange",
                        "FieldValueDuplicate",
                    )
                )
            first = ike_ids.setdefault(ike_id_key(peer.ipsec.id), peer.meta)
            if first != peer.meta:
                problems.append(
                    _problem(
                        p,
                        "spec.ipsec.id",
                        peer.ipsec.id,
                        f"is already the IKE id of {first}",
                        "FieldValueDuplicate",
                    )
                )
        if gateway.type == "wireguard" and peer.wireguard is not None:
            first = keys.setdefault(peer.wireguard.public_key, peer.meta)
            if first != peer.meta:
                problems.append(
                    _problem(
                        p,
                        "spec.wireguard.publicKey",
                        None,
                        f"is already the public key of {first}",
                        "FieldValueDuplicate",
                    )
                )
        for field_name, kind, granted, known in (
            ("exposures", "exposure", peer.exposures, exposures),
            ("reverseExposures", "reverse exposure", peer.reverse_exposures, reverse),
        ):
            problems += [
                _problem(p, f"spec.authorization.{field_name}[{i}]", name, f"names no {kind} of {gw}",
                         "UnknownExposure")
                for i, name in enumerate(granted)
                if name not in known
            ]  # fmt: skip
    return problems


def ike_id_key(ike_id: str) -> str:
    """charon compares FQDN and email identities case-insensitively (strncasecmp in identification.c):
    ``hq.acme.example`` and ``HQ.ACME.EXAMPLE`` select the same config and the same PSK."""
    return ike_id.lower()


def _legacy(gateway: IPsecGateway) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(gateway.tunnels):
        if ike_id_key(t.peer_id) == ike_id_key(gateway.local_id):
            problems.append(
                _problem(
                    str(gateway.meta),
                    f"spec.tunnels[{i}].peer.id",
                    t.peer_id,
                    "is the gateway's own IKE id (spec.localID): its key would be offered for every exchange",
                    "FieldValueDuplicate",
                )
            )
        first = seen.setdefault(ike_id_key(t.peer_id), i)
        if first != i:
            problems.append(
                _problem(
                    str(gateway.meta),
                    f"spec.tunnels[{i}].peer.id",
                    t.peer_id,
                    f"is already the IKE id of spec.tunnels[{first}]",
                    "FieldValueDuplicate",
                )
            )
    return problems


def inside(address: str, subnets: Sequence[str]) -> bool:
    a = ipaddress.IPv4Address(address)
    return any(a in ipaddress.IPv4Network(s, strict=False) for s in subnets)


def _reverse_targets(gateway: Gateway, peers: Sequence[VPNPeer]) -> list[Problem]:
    """A reverse exposure's target must sit behind the peer (or legacy tunnel) that carries it."""
    problems: list[Problem] = []
    targets = {e.name: e.address for e in gateway.reverse_exposures}
    if isinstance(gateway, VPNGateway):
        for peer in peers:
            for i, name in enumerate(peer.reverse_exposures):
                if name in targets and not inside(targets[name], peer.subnets):
                    problems.append(
                        Problem(
                            str(peer.meta),
                            FieldError(
                                f"spec.authorization.reverseExposures[{i}]",
                                f"targets {targets[name]}, which is not inside this peer's subnets",
                                f'"{name}"',
                                "ReverseTargetOutsidePeer",
                            ),
                        )
                    )
    else:
        for i, e in enumerate(gateway.reverse_exposures):
            if not any(inside(e.address, t.remote_subnets) for t in gateway.tunnels):
                problems.append(
                    Problem(
                        str(gateway.meta),
                        FieldError(
                            f"spec.reverseExposures[{i}].target.address",
                            "is not inside any tunnel's remoteSubnets",
                            f'"{e.address}"',
                            "ReverseTargetOutsidePeer",
                        ),
                    )
                )
    return problems


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
