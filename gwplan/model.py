"""The gateway PLAN: the one document the controller hands to a gateway pod.

The controller renders it (pure, deterministic), stores it in the gateway's ConfigMap, and the pod's
containers read it from the mounted file:

* ``init-nat`` takes ``nic`` and ``nat`` (policy routing, NAT/authz rules, conntrack marks);
* ``status-agent`` takes ``ipsec`` (VICI connection dicts and secret references) or ``wireguard``
  (device and peers), and writes status for ``gateway``;
* the exporter takes tunnel and peer names, so configured-but-down tunnels still have a row.

Rules of the contract:

* Secret VALUES never appear here, only references (Secret name and key). A pod reads a value from
  ``<secrets-dir>/<name>/<key>``, the layout of a Kubernetes Secret volume.
* charon connections are structured VICI dicts (never swanctl.conf text), so no value can be parsed
  as syntax anywhere between the CR and charon.
* The serialised form is canonical JSON (sorted keys, no whitespace) and carries ``hash``, the SHA-256 of
  that form without the hash itself; same input, same bytes.

This module is pure: dataclasses and the JSON codec only.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

PLAN_VERSION = "plan.vpn.bnerd.net/v1"
DEFAULT_REPLY_MARK = 0x10000000
"""``nic.replyMark`` when the plan leaves it unset: the mark bit of everything that must leave through NIC2
(replies to connections that came in on it; in a WireGuard gateway the device's own packets)."""

_DEVICE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
DEVICE_NAME_RULE = "1-15 characters of A-Z a-z 0-9 _ . -, the first not . or -"
"""The one rule for a network device name, wherever one enters (plan, controller and exporter flags). A
subset of the kernel's (dev_valid_name: up to 15 bytes, no ``/``, ``:`` or white space, not ``.``/``..``)
that is also safe as an iptables argument (no leading ``-``) and as a file name (wireguard-go's
``<name>.sock``)."""


def is_device_name(name: object) -> bool:
    return isinstance(name, str) and _DEVICE_NAME.fullmatch(name) is not None


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RANGE_START = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}-")
IKE_ID_WILDCARDS = ("", "%any", "%any6", "0.0.0.0", "*", "::", "0::0")
"""The strings charon reads as ID_ANY, the identity that matches every peer (``identification_create_from_
string`` in strongSwan 5.9.8's identification.c)."""


def ike_id_wildcard(ike_id: str) -> str | None:
    """Why charon would read ``ike_id`` as more than one identity, or None (pure).

    A configured identity is a pattern to charon: a peer config and a shared key are selected when the
    identity a peer PRESENTS matches it (``identification_t.matches``). One that matches other peers' ids
    lets their exchanges select this peer's config and try this peer's key (LAB-FACTS.md, "Shared keys
    and identities"). strongSwan 5.9.8's identification.c reads as patterns: the ID_ANY strings, an IPv4
    range ``a.b.c.d-e.f.g.h`` (``create_ip_address_from_string``: the part before ``-`` an address), a
    subnet ``a.b.c.d/n``, a ``*`` wildcard (FQDN/email: a leading ``*``; DN: a ``*`` RDN value), and
    typed or hex-encoded forms (``ipv4range:``, ``{n}:``, ``@#``, ``fqdn:#2a...``) that can encode any of
    these. The controller's ``ike_id`` pattern admits none of the last three; this names the rest."""
    if ike_id in IKE_ID_WILDCARDS:
        return "is the wildcard identity to charon (ID_ANY, matching every peer)"
    if _IPV4_RANGE_START.match(ike_id):
        return "is an IPv4 address range to charon (matching every address in it)"
    if "/" in ike_id or "*" in ike_id or ":" in ike_id or "#" in ike_id or "=" in ike_id:
        return "is a subnet, wildcard, typed or DN identity to charon (use an FQDN, IPv4 or email id)"
    return None


SECRET_OPT_IN_LABEL = "vpn.bnerd.net/gateway-secret"  # noqa: S105 (a label key)
"""A Secret carrying this label with the value ``"true"`` was meant for gateways by its owner: the
controller grants a gateway pod only such Secrets, and the pod reads only such Secrets, whatever a CR
references (docs/security.md)."""


GatewayType: TypeAlias = Literal["ipsec", "wireguard"]
Protocol_: TypeAlias = Literal["TCP", "UDP"]
GrantKind: TypeAlias = Literal["exposure", "reverse"]
# A VICI message section: values are str, list[str] or nested sections (see strongSwan's vici README).
ViciDict: TypeAlias = Mapping[str, Any]


@dataclass(frozen=True)
class SecretRef:
    """A key of a Kubernetes Secret, mounted into the pod as ``<secrets-dir>/<name>/<key>``."""

    name: str
    key: str

    def path(self, secrets_dir: Path) -> Path:
        return secrets_dir / self.name / self.key


@dataclass(frozen=True)
class GatewayRef:
    """The custom resource whose status the pod writes."""

    kind: str  # VPNGateway | IPsecGateway
    api_version: str  # vpn.bnerd.net/v1alpha1 | ipsec.bnerd.net/v1alpha1
    namespace: str
    name: str


@dataclass(frozen=True)
class Nic:
    """NIC2: the Neutron port moved into the pod by Multus. Found by MAC, never by name."""

    mac: str | None = None
    """The port's MAC address; None means "ask Multus' network-status annotation or --nic-mac"."""
    address: str | None = None
    """The port's fixed IP with prefix (e.g. 10.254.0.5/24); None: read it from the interface."""
    gateway: str | None = None
    """The subnet's router on NIC2; replies to traffic that arrived on NIC2 leave via it."""
    table: int = 100
    """Routing table of the source-policy route."""
    rule_priority: int = 1000
    """Priority of the ``from <address> lookup <table>`` rule; init-nat's other rules use the next three
    (exposure targets, then the two reply rules of ``reply_mark``)."""
    reply_mark: int | None = None
    """The conntrack/packet mark bit (one bit, outside ``Nat.mark_mask``) that makes replies to
    connections that came in on NIC2 leave through NIC2; None: ``DEFAULT_REPLY_MARK``. A WireGuard device
    marks its own packets with it, so they leave through NIC2 too."""

    @property
    def effective_reply_mark(self) -> int:
        return DEFAULT_REPLY_MARK if self.reply_mark is None else self.reply_mark


@dataclass(frozen=True)
class IkeSecret:
    """One ``load-shared`` call: an IKE PSK for the given identities."""

    id: str
    """Stable VICI id of the shared secret; loading the same id again replaces the key."""
    owners: tuple[str, ...]
    """The peer's IKE identity, and only that: charon returns a shared key for an exchange when ANY owner
    matches either side's identity and tries every key returned, so a key that also named our own local
    id would be tried for every peer, and one peer could authenticate as another with its own key (found
    live; LAB-FACTS.md "Shared keys and identities"). ``loads`` refuses an owner that is a local id of the
    plan, a wildcard or a range, and a secret without owners (which charon offers for every exchange)."""
    ref: SecretRef


@dataclass(frozen=True)
class IkeCertificate:
    """One ``load-cert`` call: an X.509 certificate (PEM) from a Secret key.

    ``ca`` False: the gateway's own certificate (``flag: NONE``), whose subjectAltName must carry the
    gateway's local IKE id, so charon finds it by identity; ``ca`` True: a CA trusted for peers'
    certificates (``flag: CA``)."""

    id: str
    ref: SecretRef
    ca: bool = False


@dataclass(frozen=True)
class IkePrivateKey:
    """One ``load-key`` call (``type: any``): the private key (PEM) of the gateway's certificate."""

    id: str
    ref: SecretRef


@dataclass(frozen=True)
class Child:
    """One CHILD_SA of a tunnel: exactly one remote subnet (never comma-joined)."""

    name: str
    """Child name inside the connection (also the key in conn[...]['children'])."""
    remote_subnet: str


@dataclass(frozen=True)
class Tunnel:
    """One IKE connection = one VPNPeer (unified model) or one tunnels[] entry (legacy model)."""

    name: str
    """Connection name in charon and ``status.tunnels[].name``."""
    initiate: bool
    """True for site peers (literal or hostname endpoint: charon resolves the name at each initiate); the
    agent initiates and keeps them up. Road-warrior peers only respond."""
    children: tuple[Child, ...]
    conn: ViciDict
    """``load-conn`` payload: ``{name: {...}}``, structured, no secrets, and no ``cacerts``: the CAs come
    from ``peer_cas``."""
    peer_cas: tuple[str, ...] | None = None
    """For a peer that authenticates with a certificate: the ids of the ``Ipsec.certificates`` (each ``ca``
    True) its certificate must chain to. The status-agent puts their PEM into ``cacerts`` of the conn's
    certificate-authenticated remote auth round(s), so charon accepts this peer only through one of them:
    every CA the gateway's charon holds is a trust anchor for every connection, and a round without
    ``cacerts`` accepts a chain to any of them (so a CA meant for one peer would vouch for another, and a
    CA the plan dropped would keep vouching while charon still held it). The agent refuses a plan whose
    certificate-authenticated tunnel names none, or names an id that is not a CA of the plan. None: the
    peer authenticates with a PSK (left out of the document, so PSK tunnels serialise as before)."""


@dataclass(frozen=True)
class Ipsec:
    secrets: tuple[IkeSecret, ...] = ()
    tunnels: tuple[Tunnel, ...] = ()
    certificates: tuple[IkeCertificate, ...] = ()
    """For pubkey (certificate) peers; empty when every peer uses a PSK."""
    private_keys: tuple[IkePrivateKey, ...] = ()


@dataclass(frozen=True)
class WgPeer:
    name: str
    """VPNPeer name: ``status.peers[].name`` and the exporter's ``peer`` label."""
    public_key: str
    """Base64 public key (public, not a secret)."""
    allowed_ips: tuple[str, ...]
    endpoint: str | None = None
    """``host:port``; host is an IPv4 literal or a hostname the agent resolves and re-resolves."""
    preshared_key_ref: SecretRef | None = None
    persistent_keepalive: int | None = None


@dataclass(frozen=True)
class WireGuard:
    interface: str
    listen_port: int
    address: str
    """The gateway's tunnel address with prefix, e.g. 10.99.0.1/24."""
    private_key_ref: SecretRef
    peers: tuple[WgPeer, ...] = ()


@dataclass(frozen=True)
class Port:
    port: int
    protocol: Protocol_ = "TCP"


@dataclass(frozen=True)
class Exposure:
    """A fabric-side service reachable from peers at ``virtual_ip`` (DNAT to the target via NIC2)."""

    name: str
    virtual_ip: str
    ports: tuple[Port, ...]
    target_address: str | None = None
    target_host: str | None = None
    """A hostname resolved by init-nat when target_address is None."""


@dataclass(frozen=True)
class ReverseExposure:
    """A peer-side service reachable from internalSourceCIDRs at ``virtual_ip``."""

    name: str
    virtual_ip: str
    target_address: str
    ports: tuple[Port, ...]


@dataclass(frozen=True)
class Grant:
    """Permission for a peer to use one exposure (or to be reached through one reverse exposure).

    ``sources`` are the addresses allowed to open NEW connections: the peer's subnets for an
    exposure, internalSourceCIDRs for a reverse exposure. Every NEW connection admitted by this
    grant carries ``mark`` (within ``Nat.mark_mask``) in conntrack, so revoking the grant can delete
    exactly its flows. Marks are stable across renders while the grant exists.
    """

    peer: str
    exposure: str
    kind: GrantKind
    sources: tuple[str, ...]
    mark: int


@dataclass(frozen=True)
class Nat:
    service_cidr: str | None = None
    source_address: str | None = None
    """Our own address inside serviceCIDR (its first host): SNAT source for reverse exposures, so
    that their traffic matches the tunnels' local traffic selector."""
    internal_source_cidrs: tuple[str, ...] = ()
    exposures: tuple[Exposure, ...] = ()
    reverse_exposures: tuple[ReverseExposure, ...] = ()
    grants: tuple[Grant, ...] = ()
    mark_mask: int = 0x0FFF0000
    allowed_targets: tuple[str, ...] | None = None
    """The CIDRs an exposure's target must lie in: the operator's allowance for the gateway's namespace
    (docs/security.md). The controller leaves out an address target outside them; a ``targetHost`` is
    resolved in the pod, so init-nat leaves it out when its address falls outside. None: no restriction
    (a plan rendered offline)."""


@dataclass(frozen=True)
class Ha:
    """Warm-standby HA (docs/ha.md): the gateway's two pods contend for one Lease; its holder serves, the
    other stands by. Absent: the pod always serves."""

    lease: str
    """The ``coordination.k8s.io/v1`` Lease's name, in the pod's namespace."""
    lease_duration_seconds: int = 3
    """``spec.leaseDurationSeconds``: how long a holder that stopped renewing keeps the Lease. The holder
    stops serving by itself before that (by its own clock), so nobody serves twice."""
    renew_seconds: float = 1.0
    """How often the holder renews (and the standby checks whether the Lease expired)."""
    public_here: bool = True
    """The gateway's public address (its floating IP) reaches this pod's NIC2 now: the controller sets it
    once its cloud step moved it here. An active pod starts nothing towards its peers before (IKE
    initiations, WireGuard handshakes and keepalives): a router tracks the first packet of a flow and keeps
    its translation, so packets sent before the floating IP's NAT is in place leave from the wrong address
    for as long as they keep coming (found by the end-to-end failover: the tunnels never came back)."""


@dataclass(frozen=True)
class Plan:
    gateway: GatewayRef
    type: GatewayType
    nic: Nic = field(default_factory=Nic)
    ipsec: Ipsec | None = None
    wireguard: WireGuard | None = None
    nat: Nat = field(default_factory=Nat)
    ha: Ha | None = None
    version: str = PLAN_VERSION


def peer_names(plan: Plan) -> list[str]:
    """The VPNPeers in the plan (a VPNGateway's tunnels or WireGuard peers), sorted: the gateway pod
    writes each one's status, and its Role grants exactly these. An IPsecGateway's tunnels are no
    VPNPeers: none."""
    if plan.gateway.kind != "VPNGateway":
        return []
    names = [t.name for t in plan.ipsec.tunnels] if plan.ipsec is not None else []
    if plan.wireguard is not None:
        names += [p.name for p in plan.wireguard.peers]
    return sorted(set(names))


def secret_names(plan: Plan) -> list[str]:
    """Every Secret the plan references, sorted: the gateway pod reads each (by name) through the API, and
    its Role grants exactly these."""
    refs: list[SecretRef] = []
    if plan.ipsec is not None:
        refs += [s.ref for s in plan.ipsec.secrets]
        refs += [c.ref for c in plan.ipsec.certificates]
        refs += [k.ref for k in plan.ipsec.private_keys]
    if plan.wireguard is not None:
        refs.append(plan.wireguard.private_key_ref)
        refs += [p.preshared_key_ref for p in plan.wireguard.peers if p.preshared_key_ref is not None]
    return sorted({r.name for r in refs})


class PlanError(ValueError):
    """The plan document is not a valid plan; the message names the field path."""


# ---------------------------------------------------------------------------------------------------
# JSON codec. Keys are camelCase in the document; the hash covers everything but itself.


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def to_dict(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        out: dict[str, Any] = {}
        for name in obj.__dataclass_fields__:
            value = getattr(obj, name)
            if value is None:
                continue
            out[_camel(name)] = to_dict(value)
        return out
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_hash(doc: Mapping[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()


def dumps(plan: Plan) -> bytes:
    """Canonical bytes of the plan, with its content hash."""
    doc = to_dict(plan)
    doc["hash"] = content_hash(doc)
    return _canonical(doc) + b"\n"


def plan_hash(plan: Plan) -> str:
    return content_hash(to_dict(plan))


# --- parsing: strict, with field paths in every error ------------------------------------------------


class _Reader:
    def __init__(self, doc: Any, path: str) -> None:
        if not isinstance(doc, Mapping):
            raise PlanError(f"{path or 'plan'}: expected an object, got {type(doc).__name__}")
        self.doc = doc
        self.path = path

    def _p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., /) -> Any:
        if key not in self.doc:
            if default is ...:
                raise PlanError(f"{self._p(key)}: required")
            return default
        value = self.doc[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise PlanError(f"{self._p(key)}: expected {getattr(kind, '__name__', kind)}")
        return value

    def str_(self, key: str, default: Any = ..., /) -> Any:
        return self.get(key, str, default)

    def strs(self, key: str) -> tuple[str, ...]:
        items = self.get(key, list, [])
        for i, v in enumerate(items):
            if not isinstance(v, str):
                raise PlanError(f"{self._p(key)}[{i}]: expected str")
        return tuple(items)

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, Mapping), self._p(key))

    def subs(self, key: str) -> list[_Reader]:
        return [_Reader(v, f"{self._p(key)}[{i}]") for i, v in enumerate(self.get(key, list, []))]

    def ref(self, key: str) -> SecretRef:
        r = self.sub(key)
        return SecretRef(name=r.str_("name"), key=r.str_("key"))

    def opt_ref(self, key: str) -> SecretRef | None:
        return self.ref(key) if key in self.doc else None

    def literal(self, key: str, allowed: tuple[str, ...], default: Any = ..., /) -> Any:
        value = self.str_(key, default)
        if value not in allowed:
            raise PlanError(f"{self._p(key)}: {value!r} is not one of {', '.join(allowed)}")
        return value


def _ports(r: _Reader) -> tuple[Port, ...]:
    return tuple(
        Port(port=p.get("port", int), protocol=p.literal("protocol", ("TCP", "UDP"), "TCP"))
        for p in r.subs("ports")
    )


def from_dict(doc: Any) -> Plan:
    r = _Reader(doc, "")
    version = r.str_("version")
    if version != PLAN_VERSION:
        raise PlanError(f"version: {version!r} is not supported (this build reads {PLAN_VERSION})")
    if "hash" in r.doc and r.doc["hash"] != content_hash(r.doc):
        raise PlanError("hash: does not match the document (truncated or edited by hand?)")
    g = r.sub("gateway")
    gateway = GatewayRef(
        kind=g.str_("kind"),
        api_version=g.str_("apiVersion"),
        namespace=g.str_("namespace"),
        name=g.str_("name"),
    )
    gw_type = r.literal("type", ("ipsec", "wireguard"))
    nic = Nic()
    if "nic" in r.doc:
        n = r.sub("nic")
        nic = Nic(
            mac=n.str_("mac", None),
            address=n.str_("address", None),
            gateway=n.str_("gateway", None),
            table=n.get("table", int, 100),
            rule_priority=n.get("rulePriority", int, 1000),
            reply_mark=n.get("replyMark", int, None),
        )
    ipsec = None
    if "ipsec" in r.doc:
        i = r.sub("ipsec")
        ipsec = Ipsec(
            secrets=tuple(
                IkeSecret(id=s.str_("id"), owners=s.strs("owners"), ref=s.ref("ref"))
                for s in i.subs("secrets")
            ),
            tunnels=tuple(
                Tunnel(
                    name=t.str_("name"),
                    initiate=t.get("initiate", bool),
                    children=tuple(
                        Child(name=c.str_("name"), remote_subnet=c.str_("remoteSubnet"))
                        for c in t.subs("children")
                    ),
                    conn=t.get("conn", Mapping),
                    peer_cas=t.strs("peerCas") if "peerCas" in t.doc else None,
                )
                for t in i.subs("tunnels")
            ),
            certificates=tuple(
                IkeCertificate(id=c.str_("id"), ref=c.ref("ref"), ca=c.get("ca", bool, False))
                for c in i.subs("certificates")
            ),
            private_keys=tuple(
                IkePrivateKey(id=k.str_("id"), ref=k.ref("ref")) for k in i.subs("privateKeys")
            ),
        )
        _check_owners(ipsec)
    wireguard = None
    if "wireguard" in r.doc:
        w = r.sub("wireguard")
        interface = w.str_("interface")
        if not is_device_name(interface):
            raise PlanError(
                f"{w._p('interface')}: {interface!r} is not a network device name ({DEVICE_NAME_RULE})"
            )
        wireguard = WireGuard(
            interface=interface,
            listen_port=w.get("listenPort", int),
            address=w.str_("address"),
            private_key_ref=w.ref("privateKeyRef"),
            peers=tuple(
                WgPeer(
                    name=p.str_("name"),
                    public_key=p.str_("publicKey"),
                    allowed_ips=p.strs("allowedIps"),
                    endpoint=p.str_("endpoint", None),
                    preshared_key_ref=p.opt_ref("presharedKeyRef"),
                    persistent_keepalive=p.get("persistentKeepalive", int, None),
                )
                for p in w.subs("peers")
            ),
        )
    nat = Nat()
    if "nat" in r.doc:
        n = r.sub("nat")
        nat = Nat(
            service_cidr=n.str_("serviceCidr", None),
            source_address=n.str_("sourceAddress", None),
            internal_source_cidrs=n.strs("internalSourceCidrs"),
            exposures=tuple(
                Exposure(
                    name=e.str_("name"),
                    virtual_ip=e.str_("virtualIp"),
                    ports=_ports(e),
                    target_address=e.str_("targetAddress", None),
                    target_host=e.str_("targetHost", None),
                )
                for e in n.subs("exposures")
            ),
            reverse_exposures=tuple(
                ReverseExposure(
                    name=e.str_("name"),
                    virtual_ip=e.str_("virtualIp"),
                    target_address=e.str_("targetAddress"),
                    ports=_ports(e),
                )
                for e in n.subs("reverseExposures")
            ),
            grants=tuple(
                Grant(
                    peer=gr.str_("peer"),
                    exposure=gr.str_("exposure"),
                    kind=gr.literal("kind", ("exposure", "reverse")),
                    sources=gr.strs("sources"),
                    mark=gr.get("mark", int),
                )
                for gr in n.subs("grants")
            ),
            mark_mask=n.get("markMask", int, 0x0FFF0000),
            allowed_targets=n.strs("allowedTargets") if "allowedTargets" in n.doc else None,
        )
    ha = None
    if "ha" in r.doc:
        h = r.sub("ha")
        ha = Ha(
            lease=h.str_("lease"),
            lease_duration_seconds=h.get("leaseDurationSeconds", int, 3),
            renew_seconds=float(h.get("renewSeconds", (int, float), 1.0)),
            public_here=h.get("publicHere", bool, True),
        )
        if not ha.lease:
            raise PlanError("ha.lease: empty")
        if ha.lease_duration_seconds < 1:
            raise PlanError("ha.leaseDurationSeconds: must be at least 1")
        if not 0 < ha.renew_seconds < ha.lease_duration_seconds:
            raise PlanError("ha.renewSeconds: must be above 0 and below ha.leaseDurationSeconds")
    return Plan(
        gateway=gateway,
        type=gw_type,
        nic=nic,
        ipsec=ipsec,
        wireguard=wireguard,
        nat=nat,
        ha=ha,
        version=version,
    )


def _local_ids(tunnel: Tunnel) -> set[str]:
    out = set()
    for body in tunnel.conn.values():
        local = body.get("local") if isinstance(body, Mapping) else None
        if isinstance(local, Mapping) and isinstance(local.get("id"), str):
            out.add(local["id"].lower())
    return out


def _check_owners(ipsec: Ipsec) -> None:
    """Each shared key is for its peer alone (``IkeSecret.owners``); charon compares FQDN and email ids
    without case, so the comparison with our local ids does too."""
    local = set().union(*(_local_ids(t) for t in ipsec.tunnels))
    for i, s in enumerate(ipsec.secrets):
        where = f"ipsec.secrets[{i}].owners"
        if not s.owners:
            raise PlanError(f"{where}: empty (charon would offer the key for every identity)")
        for owner in s.owners:
            if owner.lower() in local:
                raise PlanError(f"{where}: {owner!r} is a local id (the key would be tried for every peer)")
            why = ike_id_wildcard(owner)
            if why is not None:
                raise PlanError(f"{where}: {owner!r} {why}")


GZIP_MAGIC = b"\x1f\x8b"
MAX_PLAN_BYTES = 8 * 1024 * 1024
"""The largest plan read, as stored and again once decompressed: 8 MiB. Stored, a ConfigMap holds at most
1 MiB, so anything far larger is not a plan. Decompressed, it is the largest plan the pod's containers
can afford to parse: 8.35 MB is the 5,000-peer plan of docs/api.md, and parsing it peaks at 69 MB
(tracemalloc), against the exporter's 128 Mi and the agent's 192 Mi limits."""


def _gunzip(data: bytes, limit: int) -> bytes:
    """Every gzip member of ``data``, concatenated (what ``gzip.decompress`` returns), but never more than
    ``limit`` bytes of output in memory: each member is inflated with at most the room left (+1, to tell
    "exactly the limit" from "over it"), so a gzip bomb stops at the cap. Raises PlanError."""
    out = bytearray()
    while data:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16+: a gzip header and trailer, not raw zlib
        try:
            out += member.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise PlanError(f"plan: corrupt gzip data: {exc}") from exc
        if len(out) > limit:
            raise PlanError(f"plan: more than {limit} bytes once decompressed (the limit for a plan)")
        if not member.eof:  # all the input was read (the output had room) and the stream did not end
            raise PlanError("plan: corrupt gzip data: truncated")
        data = member.unused_data
    return bytes(out)


def loads(data: bytes | str) -> Plan:
    """Parse a plan file: canonical JSON, or gzip-compressed JSON (a large plan exceeds a ConfigMap's
    1 MiB as JSON from ~600 peers; compressed it fits in ``binaryData``: 104 KB at 1,000 peers). Either
    form may be at most ``MAX_PLAN_BYTES``, the JSON inside a gzip too."""
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(f"plan: {len(data)} bytes is larger than {MAX_PLAN_BYTES}")
    if isinstance(data, bytes) and data[:2] == GZIP_MAGIC:
        data = _gunzip(data, MAX_PLAN_BYTES)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan: not JSON: {exc}") from exc
    return from_dict(doc)
