"""Render a gateway and its peers to the gateway PLAN (``gwplan.Plan``). Pure and deterministic.

IPsec: one ``Tunnel`` per VPNPeer (legacy: per ``tunnels[]`` entry). Its ``conn`` is the VICI
``load-conn`` payload ``{name: {...}}``: IKEv2, ``local``/``remote`` auth (psk or pubkey) with ids,
proposals, ``remote_addrs`` (the endpoint, or ``%any`` for road warriors) and ONE CHILD per remote subnet
(``local_ts`` serviceCIDR, ``remote_ts`` that subnet). Child names derive from the subnet, not its index,
so adding or removing a subnet never renames another child, and contain no dots (swanctl.conf section
names cannot).

Liveness choices (docs/api.md):

* site peers: ``initiate`` True; every child ``start_action none`` (the status-agent initiates and runs
  the initiate-if-down watchdog, so charon must not race it), ``dpd_delay 30s`` with ``dpd_action clear``
  (a dead peer's SAs are cleared within ~30 s plus retransmits; the watchdog brings the tunnel back, one
  owner for re-initiation, no duplicate IKE_SAs);
* road warriors: ``remote_addrs %any``, ``initiate`` False, ``dpd_delay 60s``/``clear``;
* every conn: ``unique replace`` (a peer that reconnects after a reboot replaces its stale IKE_SA).

Secrets are references only: one ``IkeSecret`` per PSK peer (owners: the peer's id alone) naming the
peer's ``pskSecretRef`` or the gateway default. A pubkey peer's tunnel names the CA its certificate must
chain to (``peer_cas``: the gateway's ``ca.crt``); the status-agent loads it as that conn's remote
``cacerts``, so no other CA charon holds vouches for the peer.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gwplan
from controller.api.model import (
    Exposure,
    Gateway,
    IPsecGateway,
    ReverseExposure,
    SecretKeyRef,
    VPNGateway,
    VPNPeer,
    parse,
)
from controller.api.resources import VERSION
from controller.api.schema import FieldError, show
from controller.api.validate import (
    InvalidInput,
    Item,
    Neighbour,
    Problem,
    Surroundings,
    admit_all,
    admit_gateway,
    inside,
    select,
)
from controller.plan.allocate import (
    DEFAULT_MARK_MASK,
    AllocationError,
    BadMask,
    GrantKey,
    MarksExhausted,
    Pool,
    grant_key_text,
    marks,
    mask_bits,
    virtual_ips,
)

GATEWAY_CA = "ca"
"""Plan id of the CA in the gateway's ``certificateSecretRef`` (``ca.crt``), the one pubkey peers chain to."""
SITE_DPD_DELAY = "30s"
ROAD_WARRIOR_DPD_DELAY = "60s"
ALLOCATION_FAILED = "AllocationFailed"
TOO_MANY_RULES = "TooManyRules"
MAX_GRANT_RULES = 50_000
"""init-nat writes one filter rule per grant, source and port: a few kilobytes of plan can ask for
millions (found by review: 160 exposures of 64 ports granted to a peer of 64 subnets, a 533 KB plan, are
655,360 rules and 331 MB in init-nat, OOM-killed against its 128 Mi limit, the old rules left in force).
Grants past this many rules are left out (those the deployed plan holds come first)."""
BAD_PREVIOUS = "PreviousPlanInvalid"
DEFAULT_KEEPALIVE = 25
"""Seconds; WireGuard site peers keep NAT mappings alive."""


@dataclass(frozen=True)
class RenderOptions:
    internal_source_cidrs: tuple[str, ...] = ()
    """The operator's fabric-side source CIDRs (IPSEC_INTERNAL_SOURCE_CIDRS), allowed to reach reverse
    exposures. Never part of a CR."""
    previous: gwplan.Plan | None = None
    """The plan currently deployed for this gateway: its allocations are kept where still valid."""
    nic: gwplan.Nic = field(default_factory=gwplan.Nic)
    wireguard_interface: str = "wg0"
    transit_cidrs: tuple[str, ...] = ()
    """NIC2's networks (the gateways' transit network): no serviceCIDR may overlap them."""
    neighbours: tuple[Neighbour, ...] = ()
    """The gateways whose serviceCIDRs come first (``controller.api.validate.Surroundings``)."""
    exposure_targets: tuple[str, ...] | None = None
    """The CIDRs the gateway's namespace may expose; None: no restriction (the offline render)."""
    secrets: frozenset[str] | None = None
    """The Secrets of the gateway's namespace opted in for gateways; None: no check (the offline render)."""
    service_cidrs: tuple[str, ...] | None = None
    """Where the namespace's serviceCIDRs may lie; None: no restriction (the offline render)."""
    api_server_cidrs: tuple[str, ...] = ()
    """The API server's endpoints: no peer may route them."""


def normalise(cidr: str) -> str:
    return str(ipaddress.IPv4Network(cidr, strict=False))


def child_name(tunnel: str, subnet: str) -> str:
    """Stable per subnet, safe as a swanctl.conf section name: ``hq-192-168-10-0-24``."""
    net = ipaddress.IPv4Network(subnet, strict=False)
    return f"{tunnel}-{str(net.network_address).replace('.', '-')}-{net.prefixlen}"


def _ref(r: SecretKeyRef) -> gwplan.SecretRef:
    return gwplan.SecretRef(name=r.name, key=r.key)


def _conn(
    name: str,
    *,
    local_id: str,
    remote_id: str,
    remote_addr: str | None,
    auth: str,
    ike_proposals: Sequence[str],
    esp_proposals: Sequence[str],
    service_cidr: str,
    subnets: Sequence[str],
) -> tuple[dict[str, Any], tuple[gwplan.Child, ...]]:
    children = tuple(gwplan.Child(name=child_name(name, s), remote_subnet=normalise(s)) for s in subnets)
    dpd_delay = SITE_DPD_DELAY if remote_addr is not None else ROAD_WARRIOR_DPD_DELAY
    body: dict[str, Any] = {
        "version": "2",
        "remote_addrs": [remote_addr or "%any"],
        "proposals": list(ike_proposals),
        "dpd_delay": dpd_delay,
        "unique": "replace",
        "local": {"auth": auth, "id": local_id},
        "remote": {"auth": auth, "id": remote_id},
        "children": {
            c.name: {
                "mode": "tunnel",
                "local_ts": [service_cidr],
                "remote_ts": [c.remote_subnet],
                "esp_proposals": list(esp_proposals),
                "start_action": "none",
                "dpd_action": "clear",
                "close_action": "none",
            }
            for c in children
        },
    }
    return {name: body}, children


def _nat_exposures(
    gateway: Gateway, previous: gwplan.Plan | None
) -> tuple[dict[str, str], tuple[gwplan.Exposure, ...], tuple[gwplan.ReverseExposure, ...]]:
    prev: dict[str, str] = {}
    if previous is not None:
        prev = {e.name: e.virtual_ip for e in previous.nat.exposures}
        prev.update({e.name: e.virtual_ip for e in previous.nat.reverse_exposures})
    names = [e.name for e in gateway.exposures] + [e.name for e in gateway.reverse_exposures]
    ips = virtual_ips(gateway.service_cidr, names, prev)

    def ports(e: Exposure | ReverseExposure) -> tuple[gwplan.Port, ...]:
        return tuple(gwplan.Port(port=p.port, protocol=p.protocol) for p in e.ports)

    exposures = tuple(
        gwplan.Exposure(
            name=e.name, virtual_ip=ips[e.name], ports=ports(e), target_address=e.address, target_host=e.host
        )
        for e in sorted(gateway.exposures, key=lambda e: e.name)
    )
    reverse = tuple(
        gwplan.ReverseExposure(name=e.name, virtual_ip=ips[e.name], target_address=e.address, ports=ports(e))
        for e in sorted(gateway.reverse_exposures, key=lambda e: e.name)
    )
    return ips, exposures, reverse


def _grants(
    wanted: Sequence[tuple[GrantKey, tuple[str, ...]]], previous: gwplan.Plan | None, mask: int
) -> tuple[gwplan.Grant, ...]:
    kinds: dict[str, Literal["exposure", "reverse"]] = {"exposure": "exposure", "reverse": "reverse"}
    prev: dict[GrantKey, int] = {}
    if previous is not None:
        prev = {(g.kind, g.peer, g.exposure): g.mark for g in previous.nat.grants}
    got = marks([k for k, _ in wanted], prev, mask)
    return tuple(
        gwplan.Grant(
            peer=peer, exposure=exposure, kind=kinds[kind], sources=sources, mark=got[(kind, peer, exposure)]
        )
        for (kind, peer, exposure), sources in sorted(wanted)
    )


@dataclass(frozen=True)
class Rendering:
    """A plan, and the parts of the input left out of it (each problem names its part)."""

    plan: gwplan.Plan
    left_out: tuple[Problem, ...] = ()


def render(gateway: Gateway, peers: Sequence[VPNPeer], options: RenderOptions | None = None) -> gwplan.Plan:
    """The plan for ``gateway`` and ALL its ``peers`` (already schema-valid and parsed), or
    ``InvalidInput`` with every problem found: the offline render's strict view of ``render_parts``."""
    rendering = render_parts(gateway, peers, options)
    if rendering.left_out:
        raise InvalidInput(rendering.left_out)
    return rendering.plan


def _deployed(previous: gwplan.Plan | None) -> frozenset[str]:
    if previous is None:
        return frozenset()
    if previous.ipsec is not None:
        return frozenset(t.name for t in previous.ipsec.tunnels)
    return (
        frozenset(p.name for p in previous.wireguard.peers) if previous.wireguard is not None else frozenset()
    )


def render_parts(
    gateway: Gateway, peers: Sequence[VPNPeer], options: RenderOptions | None = None
) -> Rendering:
    """The plan of every valid part of ``gateway`` and its ``peers`` (already schema-valid and parsed),
    and the parts left out: an invalid peer, exposure or grant is left out and named, the rest rendered
    (fail closed per item: one bad object never keeps a revoked grant or a deleted peer in force).

    Raises ``InvalidInput`` when the gateway itself cannot be rendered (its own fields, the operator's
    options, a damaged previous plan)."""
    options = options or RenderOptions()
    previous = options.previous
    ref = gwplan.GatewayRef(
        kind=gateway.meta.kind,
        api_version=f"{'vpn' if isinstance(gateway, VPNGateway) else 'ipsec'}.bnerd.net/{VERSION}",
        namespace=gateway.meta.namespace,
        name=gateway.meta.name,
    )
    if previous is not None and previous.gateway != ref:
        previous = None  # another gateway's allocations mean nothing here
    around = Surroundings(
        internal_source_cidrs=options.internal_source_cidrs,
        transit_cidrs=options.transit_cidrs,
        neighbours=options.neighbours,
        exposure_targets=options.exposure_targets,
        secrets=options.secrets,
        deployed=_deployed(previous),
        service_cidrs=options.service_cidrs,
        api_server_cidrs=options.api_server_cidrs,
    )
    written = gateway, peers  # the input as the user wrote it: problems point at its fields
    admitted = admit_gateway(gateway, peers, around)
    if admitted.refused:
        raise InvalidInput(admitted.problems)
    left_out = list(admitted.problems)
    gateway, peers = admitted.gateway, list(admitted.peers)
    service_cidr = normalise(gateway.service_cidr)
    internal = tuple(normalise(c) for c in options.internal_source_cidrs)
    mask = DEFAULT_MARK_MASK
    if previous is not None:
        mask = previous.nat.mark_mask
        try:
            mask_bits(mask)
        except BadMask as exc:
            error = FieldError(
                "nat.markMask", f"{exc}: the previous plan is damaged", f'"{mask:#x}"', BAD_PREVIOUS
            )
            raise InvalidInput([Problem(f"previous plan of {gateway.meta}", error)]) from exc
    try:
        _, exposures, reverse = _nat_exposures(gateway, previous)
    except AllocationError as exc:
        # The exposures that got no virtual IP are the fresh ones past the room left: leave them out.
        left_out += _virtual_ips_exhausted(written[0], exc)
        gateway = _without_exposures(gateway, set(exc.unplaced))
        peers = [
            dataclasses.replace(
                p,
                exposures=tuple(e for e in p.exposures if e not in exc.unplaced),
                reverse_exposures=tuple(e for e in p.reverse_exposures if e not in exc.unplaced),
            )
            for p in peers
        ]
        _, exposures, reverse = _nat_exposures(gateway, previous)
    wanted: list[tuple[GrantKey, tuple[str, ...]]] = []
    if isinstance(gateway, VPNGateway):
        for p in peers:
            sources = tuple(normalise(s) for s in p.subnets)
            wanted += [(("exposure", p.meta.name, e), sources) for e in p.exposures]
            wanted += [(("reverse", p.meta.name, e), internal) for e in p.reverse_exposures]
    else:
        for t in gateway.tunnels:
            sources = tuple(normalise(s) for s in t.remote_subnets)
            wanted += [(("exposure", t.name, e.name), sources) for e in gateway.exposures]
            wanted += [
                (("reverse", t.name, e.name), internal)
                for e in gateway.reverse_exposures
                if inside(e.address, t.remote_subnets)
            ]
    wanted, over, rules = rule_budget(wanted, port_counts(exposures, reverse), previous, MAX_GRANT_RULES)
    if over:
        why = (
            f"is left out: {gateway.meta}'s grants would need {rules} filter rules in the gateway pod (each "
            f"grant: its sources times its exposure's ports), more than the {MAX_GRANT_RULES} it takes; "
            "grant fewer sources or ports, or split the peers over more gateways"
        )
        left_out += _grants_left_out(*written, over, why, TOO_MANY_RULES)
    try:
        grants = _grants(wanted, previous, mask)
    except MarksExhausted as exc:
        # The grants without a mark are the new ones past the pool: leave them out, keep the others.
        left_out += _marks_exhausted(*written, exc, mask)
        unmarked = set(exc.grants)
        grants = _grants([w for w in wanted if w[0] not in unmarked], previous, mask)
    nat = gwplan.Nat(
        service_cidr=service_cidr,
        source_address=Pool.of(service_cidr).source_address,
        internal_source_cidrs=internal,
        exposures=exposures,
        reverse_exposures=reverse,
        grants=grants,
        mark_mask=mask,
        allowed_targets=(
            tuple(normalise(c) for c in options.exposure_targets)
            if options.exposure_targets is not None
            else None
        ),
    )
    if isinstance(gateway, IPsecGateway):
        plan = gwplan.Plan(gateway=ref, type="ipsec", ipsec=_legacy_ipsec(gateway, service_cidr), nat=nat)
    elif gateway.type == "ipsec":
        plan = gwplan.Plan(gateway=ref, type="ipsec", ipsec=_ipsec(gateway, peers, service_cidr), nat=nat)
    else:
        plan = gwplan.Plan(
            gateway=ref, type="wireguard", wireguard=_wireguard(gateway, peers, options), nat=nat
        )
    return Rendering(with_nic(plan, options.nic), tuple(left_out))


def _without_exposures(gateway: Gateway, names: set[str]) -> Gateway:
    return dataclasses.replace(
        gateway,
        exposures=tuple(e for e in gateway.exposures if e.name not in names),
        reverse_exposures=tuple(e for e in gateway.reverse_exposures if e.name not in names),
    )


def with_nic(plan: gwplan.Plan, nic: gwplan.Nic) -> gwplan.Plan:
    """``plan`` on NIC2 ``nic``: its ``nic`` section, and each IKE connection's ``local_addrs`` set to NIC2's
    address when it is known. Without it charon picks the source address by the pod's routes, whose
    default leaves through eth0 (found by running the pod: it happened to choose NIC2's, by luck)."""
    plan = dataclasses.replace(plan, nic=nic)
    if plan.ipsec is None:
        return plan
    local = [nic.address.split("/")[0]] if nic.address else None
    tunnels = []
    for t in plan.ipsec.tunnels:
        conn: dict[str, Any] = {}
        for name, body in t.conn.items():
            body = dict(body)
            if local is None:
                body.pop("local_addrs", None)
            else:
                body["local_addrs"] = list(local)
            conn[name] = body
        tunnels.append(dataclasses.replace(t, conn=conn))
    return dataclasses.replace(plan, ipsec=dataclasses.replace(plan.ipsec, tunnels=tuple(tunnels)))


def _virtual_ips_exhausted(gateway: Gateway, exc: AllocationError) -> list[Problem]:
    """One problem per exposure left without a virtual IP, saying what serviceCIDR holds and what is
    asked (the ones holding a virtual IP keep it, so it is the new ones that are left out)."""
    why = (
        f"gets no virtual IP: spec.serviceCIDR {show(gateway.service_cidr)} has room for {exc.available} "
        "(network, broadcast and the gateway's own first host are not handed out) but exposures and "
        f"reverseExposures need {exc.needed}: widen it or remove exposures"
    )
    named: list[tuple[str, Literal["exposure", "reverse"], str]] = [
        *((f"spec.exposures[{i}]", "exposure", e.name) for i, e in enumerate(gateway.exposures)),
        *(
            (f"spec.reverseExposures[{i}]", "reverse", e.name)
            for i, e in enumerate(gateway.reverse_exposures)
        ),
    ]
    return [
        Problem(str(gateway.meta), FieldError(path, why, show(name), ALLOCATION_FAILED), Item(kind, name))
        for path, kind, name in named
        if name in exc.unplaced
    ]


def _marks_exhausted(
    gateway: Gateway, peers: Sequence[VPNPeer], exc: MarksExhausted, mask: int
) -> list[Problem]:
    """One problem per grant left without a conntrack mark (grants holding a mark in the deployed plan keep
    it, so it is the new ones that are left out). ``gateway`` and ``peers`` are the input as written, so
    the paths point at the user's fields."""
    why = (
        f"gets no conntrack mark: {gateway.meta}'s grants need {exc.needed} marks, the mark mask "
        f"{mask:#x} holds {exc.available}; remove grants"
    )
    return _grants_left_out(gateway, peers, exc.grants, why, ALLOCATION_FAILED)


def port_counts(
    exposures: Iterable[gwplan.Exposure], reverse: Iterable[gwplan.ReverseExposure]
) -> dict[tuple[str, str], int]:
    """(kind, exposure) -> its number of ports: what one source of a grant of it costs in rules."""
    out = {("exposure", e.name): len(e.ports) for e in exposures}
    return out | {("reverse", e.name): len(e.ports) for e in reverse}


def rule_budget(
    wanted: Sequence[tuple[GrantKey, tuple[str, ...]]],
    ports: Mapping[tuple[str, str], int],
    previous: gwplan.Plan | None,
    budget: int = MAX_GRANT_RULES,
) -> tuple[list[tuple[GrantKey, tuple[str, ...]]], tuple[GrantKey, ...], int]:
    """(the grants within ``budget`` filter rules, those left out, the rules all would need): each costs
    its sources times its exposure's ports (``ports``: (kind, exposure) -> count); what the deployed plan
    grants at no more than its deployed cost comes first, then by peer, kind and exposure (pure). A
    deployed grant that grew waits with the new ones: otherwise one peer's growth could push out another
    peer's deployed grants (found by review)."""
    held: dict[GrantKey, int] = {}
    if previous is not None:
        before = port_counts(previous.nat.exposures, previous.nat.reverse_exposures)
        held = {
            (g.kind, g.peer, g.exposure): len(g.sources) * before.get((g.kind, g.exposure), 0)
            for g in previous.nat.grants
        }

    def cost(w: tuple[GrantKey, tuple[str, ...]]) -> int:
        (kind, _, exposure), sources = w
        return len(sources) * ports.get((kind, exposure), 0)

    def first(w: tuple[GrantKey, tuple[str, ...]]) -> bool:
        return w[0] in held and cost(w) <= held[w[0]]

    within: list[tuple[GrantKey, tuple[str, ...]]] = []
    out: list[GrantKey] = []
    used = 0
    for w in sorted(wanted, key=lambda w: (not first(w), w[0][1], w[0][0], w[0][2])):
        if used + cost(w) <= budget:
            within.append(w)
            used += cost(w)
        else:
            out.append(w[0])
    return within, tuple(out), sum(cost(w) for w in wanted)


def _grants_left_out(
    gateway: Gateway, peers: Sequence[VPNPeer], keys: Sequence[GrantKey], why: str, reason: str
) -> list[Problem]:
    """One problem per grant in ``keys``, at the field that asked for it."""
    by_peer = {p.meta.name: p for p in peers}
    tunnels = {t.name: i for i, t in enumerate(gateway.tunnels)} if isinstance(gateway, IPsecGateway) else {}
    problems: list[Problem] = []
    for key in sorted(keys, key=lambda k: (k[1], k[0], k[2])):
        kind, owner, name = key
        item = Item("grant", grant_key_text(key))
        peer = by_peer.get(owner)
        if peer is not None:
            field_name, granted = (
                ("exposures", peer.exposures)
                if kind == "exposure"
                else ("reverseExposures", peer.reverse_exposures)
            )
            error = FieldError(
                f"spec.authorization.{field_name}[{granted.index(name)}]", why, show(name), reason
            )
            problems.append(Problem(str(peer.meta), error, item))
        else:
            what = "exposure" if kind == "exposure" else "reverse exposure"
            error = FieldError(
                f"spec.tunnels[{tunnels[owner]}].name",
                f"{why} (every tunnel is granted every exposure; this is its grant of {what} {name!r})",
                show(owner),
                reason,
            )
            problems.append(Problem(str(gateway.meta), error, item))
    return problems


def _ipsec(gateway: VPNGateway, peers: Sequence[VPNPeer], service_cidr: str) -> gwplan.Ipsec:
    gi = gateway.ipsec
    assert gi is not None  # validated: type ipsec has spec.ipsec
    tunnels: list[gwplan.Tunnel] = []
    secrets: list[gwplan.IkeSecret] = []
    pubkey = False
    for p in peers:
        pi = p.ipsec
        assert pi is not None  # validated: peers of an ipsec gateway have spec.ipsec
        name = p.meta.name
        conn, children = _conn(
            name,
            local_id=gi.local_id,
            remote_id=pi.id,
            remote_addr=p.endpoint if p.type == "site" else None,
            auth=pi.auth,
            ike_proposals=gi.ike_proposals,
            esp_proposals=gi.esp_proposals,
            service_cidr=service_cidr,
            subnets=pi.remote_subnets,
        )
        # A certificate peer is pinned to the gateway's CA (ca.crt of certificateSecretRef, below): the only
        # CA the CRD names, so today every pubkey peer of a gateway trusts the same one.
        tunnels.append(
            gwplan.Tunnel(
                name=name,
                initiate=p.type == "site",
                children=children,
                conn=conn,
                peer_cas=(GATEWAY_CA,) if pi.auth == "pubkey" else None,
            )
        )
        if pi.auth == "psk":
            ref = pi.psk_secret_ref or gi.psk_secret_ref
            assert ref is not None  # validated
            secrets.append(gwplan.IkeSecret(id=f"psk-{name}", owners=(pi.id,), ref=_ref(ref)))
        else:
            pubkey = True
    certificates: tuple[gwplan.IkeCertificate, ...] = ()
    keys: tuple[gwplan.IkePrivateKey, ...] = ()
    if pubkey and gi.certificate_secret is not None:
        s = gi.certificate_secret
        certificates = (
            gwplan.IkeCertificate(id="gateway", ref=gwplan.SecretRef(s, "tls.crt")),
            gwplan.IkeCertificate(id=GATEWAY_CA, ref=gwplan.SecretRef(s, "ca.crt"), ca=True),
        )
        keys = (gwplan.IkePrivateKey(id="gateway", ref=gwplan.SecretRef(s, "tls.key")),)
    return gwplan.Ipsec(
        secrets=tuple(secrets), tunnels=tuple(tunnels), certificates=certificates, private_keys=keys
    )


def _legacy_ipsec(gateway: IPsecGateway, service_cidr: str) -> gwplan.Ipsec:
    tunnels: list[gwplan.Tunnel] = []
    secrets: list[gwplan.IkeSecret] = []
    for t in sorted(gateway.tunnels, key=lambda t: t.name):
        conn, children = _conn(
            t.name,
            local_id=gateway.local_id,
            remote_id=t.peer_id,
            remote_addr=t.peer_address,
            auth="psk",
            ike_proposals=gateway.ike_proposals,
            esp_proposals=gateway.esp_proposals,
            service_cidr=service_cidr,
            subnets=t.remote_subnets,
        )
        tunnels.append(gwplan.Tunnel(name=t.name, initiate=True, children=children, conn=conn))
        secrets.append(
            gwplan.IkeSecret(id=f"psk-{t.name}", owners=(t.peer_id,), ref=_ref(gateway.psk_secret_ref))
        )
    return gwplan.Ipsec(secrets=tuple(secrets), tunnels=tuple(tunnels))


def _wireguard(gateway: VPNGateway, peers: Sequence[VPNPeer], options: RenderOptions) -> gwplan.WireGuard:
    gw = gateway.wireguard
    assert gw is not None  # validated
    out: list[gwplan.WgPeer] = []
    for p in peers:
        pw = p.wireguard
        assert pw is not None  # validated
        site = p.type == "site" and p.endpoint is not None
        keepalive = (
            pw.persistent_keepalive
            if pw.persistent_keepalive is not None
            else (DEFAULT_KEEPALIVE if site else None)
        )
        out.append(
            gwplan.WgPeer(
                name=p.meta.name,
                public_key=pw.public_key,
                allowed_ips=tuple(normalise(a) for a in pw.allowed_ips),
                endpoint=f"{p.endpoint}:{pw.endpoint_port}" if site else None,
                preshared_key_ref=_ref(pw.preshared_key_secret_ref) if pw.preshared_key_secret_ref else None,
                persistent_keepalive=keepalive or None,
            )
        )
    return gwplan.WireGuard(
        interface=options.wireguard_interface,
        listen_port=gw.listen_port,
        address=gw.address,
        private_key_ref=_ref(gw.private_key_secret_ref),
        peers=tuple(out),
    )


# --- documents in, plan out -------------------------------------------------------------------------


def render_documents(docs: Sequence[Mapping[str, Any]], options: RenderOptions | None = None) -> gwplan.Plan:
    """Validate (every object, then the set), parse and render; InvalidInput lists every problem."""
    problems, stored = admit_all(docs)
    if problems:
        raise InvalidInput(problems)
    gateway, peers = select([parse(d) for d in stored])
    return render(gateway, peers, options)


# --- what a refused gateway keeps ------------------------------------------------------------------


@dataclass(frozen=True)
class Conn:
    """What a peer's connection is made of: who it is (the IKE id and how it authenticates), where it
    is dialled, and what it routes. The deployed plan's and the object's are compared: any change and
    the deployed connection is no longer what is asked (an id changed because the old one leaked must
    not keep authenticating)."""

    id: str | None = None
    auth: str | None = None
    endpoint: str | None = None
    """The host a site peer is dialled at (None: a road warrior)."""
    subnets: frozenset[str] = frozenset()


def deployed_conn(item: gwplan.Tunnel | gwplan.WgPeer) -> Conn:
    """What the deployed plan's tunnel (or WireGuard peer) was rendered from."""
    if isinstance(item, gwplan.WgPeer):
        host = item.endpoint.rsplit(":", 1)[0] if item.endpoint else None
        return Conn(endpoint=host, subnets=frozenset(item.allowed_ips))
    body = item.conn.get(item.name) or {}
    remote = body.get("remote") or {}
    addrs = body.get("remote_addrs") or ["%any"]
    return Conn(
        id=remote.get("id"),
        auth=remote.get("auth"),
        endpoint=None if addrs == ["%any"] else str(addrs[0]),
        subnets=frozenset(c.remote_subnet for c in item.children),
    )


@dataclass(frozen=True)
class PeerNow:
    """A peer (legacy: a tunnel) as its object says now, read however invalid the gateway is."""

    secret: gwplan.SecretRef | None = None
    """The PSK (IPsec) or preshared key (WireGuard) it names now."""
    public_key: str | None = None
    grants: frozenset[tuple[str, str]] = frozenset()
    """(kind, exposure) it is granted now (VPNPeer only; a legacy tunnel is granted every exposure)."""
    conn: Conn | None = None
    """What its connection is made of now (None: unreadable, and the deployed one goes)."""


@dataclass(frozen=True)
class StillAsked:
    """What the cluster still asks of a gateway whose new plan cannot be rendered: only what can be read
    for sure (names, references, grants), so that nothing removed or revoked since stays in force."""

    peers: Mapping[str, PeerNow]
    """The peers (legacy: tunnels) that still exist and are themselves valid."""
    exposures: frozenset[str]
    reverse_exposures: frozenset[str]
    legacy: bool = False
    exposure_targets: tuple[str, ...] | None = None
    """The operator's allowance for the namespace NOW (None: any target): a narrowed allowance takes
    effect on a refused gateway too, or a tenant could keep its gateway refused to keep its targets."""
    internal_source_cidrs: tuple[str, ...] | None = None
    """The operator's internalSourceCIDRs NOW (None: as deployed): reverse exposures' sources follow
    them; none left, no reverse exposure stays."""
    certificate_secret: tuple[str | None] | None = None
    """``(name,)``: the Secret the gateway's certificateSecretRef names NOW (None inside: none); None: not
    checked. Another Secret than the deployed certificates' (a leaked CA or key replaced): the deployed
    certificates, key and the certificate peers pinned to them go (found by review)."""


def keep_only_still_asked(previous: gwplan.Plan, still: StillAsked) -> gwplan.Plan:
    """The deployed plan without what was removed or revoked since it was rendered (pure): a gateway
    field that became invalid may keep the previous plan, but never a peer, a grant or a Secret that
    is gone. A peer whose key reference or public key changed goes whole (its old key is revoked
    material), as does one whose id, endpoint or subnets changed (``Conn``); an exposure that is gone
    takes its grants with it."""
    ipsec, wireguard = previous.ipsec, previous.wireguard
    kept: set[str] = set()
    if ipsec is not None and still.certificate_secret is not None:
        held = {c.ref.name for c in ipsec.certificates} | {k.ref.name for k in ipsec.private_keys}
        if held and held != {still.certificate_secret[0]}:
            ipsec = dataclasses.replace(
                ipsec,
                certificates=(),
                private_keys=(),
                tunnels=tuple(t for t in ipsec.tunnels if t.peer_cas is None),
            )
    if ipsec is not None:
        refs = {s.id: s.ref for s in ipsec.secrets}
        tunnels = []
        for t in ipsec.tunnels:
            now = still.peers.get(t.name)
            ref = refs.get(f"psk-{t.name}")
            if now is None or (ref is not None and ref != now.secret) or now.conn != deployed_conn(t):
                continue
            tunnels.append(t)
            kept.add(t.name)
        ipsec = dataclasses.replace(
            ipsec,
            tunnels=tuple(tunnels),
            secrets=tuple(s for s in ipsec.secrets if s.id.removeprefix("psk-") in kept),
        )
    if wireguard is not None:
        wg_peers = []
        for p in wireguard.peers:
            now = still.peers.get(p.name)
            if (
                now is None
                or now.public_key != p.public_key
                or now.secret != p.preshared_key_ref
                or now.conn != deployed_conn(p)
            ):
                continue
            wg_peers.append(p)
            kept.add(p.name)
        wireguard = dataclasses.replace(wireguard, peers=tuple(wg_peers))
    nat = previous.nat
    allowed = None if still.exposure_targets is None else tuple(normalise(c) for c in still.exposure_targets)
    internal = (
        nat.internal_source_cidrs
        if still.internal_source_cidrs is None
        else tuple(normalise(c) for c in still.internal_source_cidrs)
    )
    exposures = tuple(
        e
        for e in nat.exposures
        if e.name in still.exposures
        and (allowed is None or e.target_address is None or inside(e.target_address, allowed))
    )
    reverse = tuple(e for e in nat.reverse_exposures if e.name in still.reverse_exposures and internal)
    live = {("exposure", e.name) for e in exposures} | {("reverse", e.name) for e in reverse}

    def granted(g: gwplan.Grant) -> bool:
        if g.peer not in kept or (g.kind, g.exposure) not in live:
            return False
        return still.legacy or (g.kind, g.exposure) in still.peers[g.peer].grants

    nat = dataclasses.replace(
        nat,
        exposures=exposures,
        reverse_exposures=reverse,
        internal_source_cidrs=internal,
        grants=tuple(
            g if g.kind != "reverse" else dataclasses.replace(g, sources=internal)
            for g in nat.grants
            if granted(g)
        ),
        allowed_targets=nat.allowed_targets if allowed is None else allowed,
    )
    return dataclasses.replace(previous, ipsec=ipsec, wireguard=wireguard, nat=nat)
