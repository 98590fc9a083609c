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

Secrets are references only: one ``IkeSecret`` per PSK peer (owners: our local id and the peer's id)
naming the peer's ``pskSecretRef`` or the gateway default.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence
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
    Problem,
    admit_all,
    inside,
    select,
    validate_gateway,
)
from controller.plan.allocate import (
    DEFAULT_MARK_MASK,
    AllocationError,
    BadMask,
    GrantKey,
    MarksExhausted,
    Pool,
    marks,
    mask_bits,
    virtual_ips,
)

SITE_DPD_DELAY = "30s"
ROAD_WARRIOR_DPD_DELAY = "60s"
ALLOCATION_FAILED = "AllocationFailed"
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


def render(gateway: Gateway, peers: Sequence[VPNPeer], options: RenderOptions | None = None) -> gwplan.Plan:
    """The plan for ``gateway`` and its ``peers`` (already schema-valid and parsed).

    Raises ``InvalidInput`` with every problem found (cross-object rules and allocation)."""
    options = options or RenderOptions()
    problems = validate_gateway(gateway, peers, options.internal_source_cidrs)
    if problems:
        raise InvalidInput(problems)
    peers = sorted(peers, key=lambda p: p.meta.name)
    previous = options.previous
    ref = gwplan.GatewayRef(
        kind=gateway.meta.kind,
        api_version=f"{'vpn' if isinstance(gateway, VPNGateway) else 'ipsec'}.bnerd.net/{VERSION}",
        namespace=gateway.meta.namespace,
        name=gateway.meta.name,
    )
    if previous is not None and previous.gateway != ref:
        previous = None  # another gateway's allocations mean nothing here
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
        raise InvalidInput([_virtual_ips_exhausted(gateway, exc)]) from exc
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
    try:
        grants = _grants(wanted, previous, mask)
    except MarksExhausted as exc:
        raise InvalidInput(_marks_exhausted(gateway, peers, exc, mask)) from exc
    nat = gwplan.Nat(
        service_cidr=service_cidr,
        source_address=Pool.of(service_cidr).source_address,
        internal_source_cidrs=internal,
        exposures=exposures,
        reverse_exposures=reverse,
        grants=grants,
        mark_mask=mask,
    )
    if isinstance(gateway, IPsecGateway):
        plan = gwplan.Plan(gateway=ref, type="ipsec", ipsec=_legacy_ipsec(gateway, service_cidr), nat=nat)
    elif gateway.type == "ipsec":
        plan = gwplan.Plan(gateway=ref, type="ipsec", ipsec=_ipsec(gateway, peers, service_cidr), nat=nat)
    else:
        plan = gwplan.Plan(
            gateway=ref, type="wireguard", wireguard=_wireguard(gateway, peers, options), nat=nat
        )
    return with_nic(plan, options.nic)


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


def _virtual_ips_exhausted(gateway: Gateway, exc: AllocationError) -> Problem:
    """The pool that ran out is serviceCIDR: report it there, with what it holds and what is asked."""
    return Problem(
        str(gateway.meta),
        FieldError(
            "spec.serviceCIDR",
            f"has room for {exc.available} virtual IP(s) (network, broadcast and the gateway's own first "
            f"host are not handed out) but exposures and reverseExposures need {exc.needed}: "
            "widen it or remove exposures",
            show(gateway.service_cidr),
            ALLOCATION_FAILED,
        ),
    )


def _marks_exhausted(
    gateway: Gateway, peers: Sequence[VPNPeer], exc: MarksExhausted, mask: int
) -> list[Problem]:
    """More grants than conntrack marks: one problem per object whose grants got none, at the first such
    grant (grants holding a mark in the deployed plan keep it, so it is the new ones that are left out)."""
    why = (
        f"gets no conntrack mark: {gateway.meta}'s grants need {exc.needed} marks, the mark mask "
        f"{mask:#x} holds {exc.available}; remove grants"
    )
    missing: dict[str, list[GrantKey]] = {}
    for key in exc.grants:
        missing.setdefault(key[1], []).append(key)
    problems: list[Problem] = []
    if isinstance(gateway, VPNGateway):
        for peer in peers:
            keys = sorted(missing.get(peer.meta.name, []))
            if not keys:
                continue
            kind, _, name = keys[0]
            field_name, granted = (
                ("exposures", peer.exposures)
                if kind == "exposure"
                else ("reverseExposures", peer.reverse_exposures)
            )
            more = f" ({len(keys)} of this peer's grants have none)" if len(keys) > 1 else ""
            problems.append(
                Problem(
                    str(peer.meta),
                    FieldError(
                        f"spec.authorization.{field_name}[{granted.index(name)}]",
                        why + more,
                        show(name),
                        ALLOCATION_FAILED,
                    ),
                )
            )
    else:
        for i, t in enumerate(gateway.tunnels):
            keys = missing.get(t.name, [])
            if keys:
                problems.append(
                    Problem(
                        str(gateway.meta),
                        FieldError(
                            f"spec.tunnels[{i}].name",
                            f"{why} (every tunnel is granted every exposure; {len(keys)} of this "
                            "tunnel's grants have none)",
                            show(t.name),
                            ALLOCATION_FAILED,
                        ),
                    )
                )
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
        tunnels.append(gwplan.Tunnel(name=name, initiate=p.type == "site", children=children, conn=conn))
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
            gwplan.IkeCertificate(id="ca", ref=gwplan.SecretRef(s, "ca.crt"), ca=True),
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
