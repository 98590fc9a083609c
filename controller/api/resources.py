"""The four resources' schemas, written once in ``controller.api.schema``'s language.

``controller.api.validate`` checks documents against them; ``controller.api.crds`` turns them into CRDs. Every
string that can reach charon, swanctl.conf or iptables is constrained here by an allowlist pattern or
enum: names are DNS labels, IKE ids use FQDN/IP/email characters only, addresses and CIDRs are dotted
IPv4, hostnames are RFC 1123, proposals exact-match an allowlist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.api.schema import Arr, Bool, Int, Node, Obj, Rule, Str

VPN_GROUP = "vpn.bnerd.net"
LEGACY_GROUP = "ipsec.bnerd.net"
VERSION = "v1alpha1"

# --- patterns (RE2-compatible, unanchored; matched against the whole value) --------------------------

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
CIDR = rf"{IPV4}/(3[0-2]|[12]?[0-9])"
SERVICE_CIDR = rf"{IPV4}/(30|[12][0-9]|[89])"
DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_HOST_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
# RFC 1123 host name whose last label starts with a letter, so "300.1.1.1" is not a host name either.
HOSTNAME = rf"({_HOST_LABEL}\.)*[A-Za-z]([-A-Za-z0-9]{{0,61}}[A-Za-z0-9])?"
ENDPOINT = rf"({IPV4}|{HOSTNAME})"
# FQDN, IPv4 or email-style identities; first and last character alphanumeric, so charon's prefixes
# ("@", "%any", "#") and DN syntax ("=", ",", spaces) can never appear.
IKE_ID = r"[A-Za-z0-9]([-A-Za-z0-9._@]{0,253}[A-Za-z0-9])?"
SECRET_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"  # noqa: S105
# Secret keys become file names under the secret volume: never "." or "..", never a path.
SECRET_KEY = r"[-_A-Za-z0-9][-._A-Za-z0-9]*"  # noqa: S105
# Exactly the canonical base64 of 32 bytes: 43 characters, the last one with its low 2 bits zero, and "=".
WG_KEY = r"[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]="
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

IKE_PROPOSALS = (
    "aes256-sha256-modp2048",
    "aes256-sha256-modp3072",
    "aes256-sha384-modp3072",
    "aes256-sha256-ecp256",
    "aes256-sha384-ecp384",
    "aes128-sha256-modp2048",
    "aes128-sha256-ecp256",
    "aes256-sha256-curve25519",
    "aes256gcm16-prfsha256-modp2048",
    "aes256gcm16-prfsha384-ecp384",
    "aes128gcm16-prfsha256-ecp256",
    "aes256gcm16-prfsha256-curve25519",
)
ESP_PROPOSALS = (
    "aes256gcm16-modp2048",
    "aes256gcm16-ecp384",
    "aes256gcm16-curve25519",
    "aes256gcm16",
    "aes128gcm16-ecp256",
    "aes128gcm16",
    "aes256-sha256-modp2048",
    "aes256-sha256",
    "aes256-sha384-ecp384",
    "aes128-sha256-modp2048",
    "aes128-sha256",
)
DEFAULT_IKE_PROPOSALS = ("aes256-sha256-modp2048",)
DEFAULT_ESP_PROPOSALS = ("aes256gcm16-modp2048",)

MAX_EXPOSURES = 1024
MAX_REVERSE_EXPOSURES = 256
MAX_SUBNETS = 64
MAX_TUNNELS = 256

# --- building blocks --------------------------------------------------------------------------------


def said(node: Node, description: str) -> Node:
    """A shared node with what it means WHERE it is used (``kubectl explain`` shows this text)."""
    return replace(node, description=description)


ipv4 = Str(
    "IPv4 address, dotted quad.", pattern=IPV4, format="ipv4", max_length=15, rule="is not an IPv4 address"
)
# Addresses a gateway must never be pointed at: "this network" (0/8), loopback (127/8), link-local
# (169.254/16: the OpenStack metadata service lives at 169.254.169.254), multicast and reserved (224/3).
# Written as RE2 for CEL and checked with the same expressions in Python, so the two cannot disagree.
_SPECIAL_IPV4 = (r"^(0|127|22[4-9]|2[3-5][0-9])(\.[0-9]{1,3}){3}$", r"^169\.254(\.[0-9]{1,3}){2}$")
not_special = Rule(
    " && ".join(f"!self.matches('{p.replace(chr(92), chr(92) * 2)}')" for p in _SPECIAL_IPV4),
    "is a special-purpose address (this-network, loopback, link-local such as the metadata service, "
    "multicast or reserved), not a unicast host",
    lambda v: not any(re.search(p, v) for p in _SPECIAL_IPV4),
)
unicast_ipv4 = Str(
    "Unicast IPv4 address, dotted quad.",
    pattern=IPV4,
    format="ipv4",
    max_length=15,
    rule="is not an IPv4 address",
    rules=(not_special,),
)
cidr = Str("IPv4 CIDR.", pattern=CIDR, format="cidr", max_length=18, rule="is not an IPv4 CIDR")
dns_label = Str("RFC 1123 DNS label.", pattern=DNS_LABEL, max_length=63, rule="is not a DNS label (RFC 1123)")
hostname = Str(
    "RFC 1123 host name.",
    pattern=HOSTNAME,
    # No `format: hostname`: the API server's hostname format is stricter than RFC 1123 (one hyphen in a
    # single label, an alphabetic TLD) and would reject names like postgres-primary-0 that we accept.
    max_length=253,
    rule="is not an RFC 1123 host name",
)
# charon reads "a.b.c.d-<anything that is an address>" as an IPv4 range, a pattern matching every address
# in it (identification.c, create_ip_address_from_string): refused whatever follows the "-", as
# gwplan.ike_id_wildcard does for the plan.
_IKE_ID_RANGE = rf"^{IPV4}-"
ike_id = Str(
    "IKE identity: FQDN, IPv4 address or email-style (letters, digits, '.', '-', '_', '@'). Never a "
    "wildcard or a range: each peer's identity must name that peer alone.",
    pattern=IKE_ID,
    max_length=255,
    rule="is not an IKE id (FQDN, IPv4 or email-style characters only)",
    rules=(
        # Found by the live hostile-value test: charon parses the IPv4 id 0.0.0.0 as %any, the wildcard
        # identity that matches EVERY peer.
        Rule(
            "self != '0.0.0.0'",
            "is the wildcard identity to charon (it reads 0.0.0.0 as %any); name the peer",
            lambda v: v != "0.0.0.0",
        ),
        # A range would select this peer's config and key for any peer presenting an address in it.
        Rule(
            f"!self.matches('{_IKE_ID_RANGE.replace(chr(92), chr(92) * 2)}')",
            "is an IPv4 address range to charon (a.b.c.d-e.f.g.h matches every address in it); name the peer",
            lambda v: re.search(_IKE_ID_RANGE, v) is None,
        ),
    ),
)
secret_ref = Obj(
    {
        "name": Str(
            "Name of the Secret, in the same namespace as this resource (a DNS subdomain, at most 253 "
            "characters).",
            pattern=SECRET_NAME,
            max_length=253,
            rule="is not a Secret name",
        ),
        "key": Str(
            "Key within the Secret's data whose value is used (letters, digits, '-', '_', '.'; never '.', "
            "'..' or a path).",
            pattern=SECRET_KEY,
            max_length=253,
            rule="is not a Secret key",
        ),
    },
    required=("name", "key"),
    description="A key of a Secret in the resource's namespace (mounted into the gateway pod).",
)


def _ports() -> Arr:
    port = Obj(
        {
            "port": Int(
                "Port number (1-65535), the same on the virtual IP and on the target (no port mapping).",
                minimum=1,
                maximum=65535,
            ),
            "protocol": Str(
                "Transport protocol: TCP or UDP. Default TCP.", enum=("TCP", "UDP"), default="TCP"
            ),
        },
        required=("port",),
        description="One port forwarded from the virtual IP to the target.",
    )
    # A port twice (80/TCP and 80 with TCP defaulted) is one DNAT rule twice: refused by the API server.
    return Arr(
        port,
        "The ports forwarded (1 to 64), unique by port and protocol.",
        min_items=1,
        max_items=64,
        list_type="map",
        map_keys=("port", "protocol"),
    )


def _has(obj: Mapping[str, Any], key: str) -> bool:
    return key in obj


exposure = Obj(
    {
        "name": said(
            dns_label,
            "The exposure's name (a DNS label): what VPNPeer spec.authorization.exposures grants; unique "
            "across exposures and reverseExposures.",
        ),
        "target": Obj(
            {
                "address": said(
                    unicast_ipv4,
                    "The target's IPv4 address on the fabric (reached through the gateway's second NIC); "
                    "exclusive with host.",
                ),
                "host": said(
                    hostname,
                    "The target's fully qualified host name, resolved by init-nat as an absolute name (no "
                    "search domain); exclusive with address.",
                ),
            },
            rules=(
                Rule(
                    "has(self.address) != has(self.host)",
                    "exactly one of address or host must be set",
                    lambda o: _has(o, "address") != _has(o, "host"),
                ),
            ),
            description="The fabric-side target: an IPv4 address or a fully qualified host name (e.g. "
            "db.tenant-a.example.internal) init-nat resolves as an absolute name: the gateway pod runs in "
            "the operator's gateway namespace, so no search domain applies and a single-label name is "
            "left out.",
        ),
        "ports": _ports(),
    },
    required=("name", "target", "ports"),
    description="A fabric-side service that granted peers reach at a virtual IP from serviceCIDR.",
)
reverse_exposure = Obj(
    {
        "name": said(
            dns_label,
            "The reverse exposure's name (a DNS label): what VPNPeer spec.authorization.reverseExposures "
            "grants; unique across exposures and reverseExposures.",
        ),
        "target": Obj(
            {
                "address": said(
                    unicast_ipv4,
                    "The target's IPv4 address behind the peer (inside one of its remote subnets).",
                )
            },
            required=("address",),
            description="The peer-side target, reached through the tunnel.",
        ),
        "ports": _ports(),
    },
    required=("name", "target", "ports"),
    description="A peer-side service that internalSourceCIDRs reach at a virtual IP from serviceCIDR.",
)


def _exposure_lists() -> dict[str, Arr]:
    return {
        "exposures": Arr(
            exposure,
            f"Fabric-side services offered to the peers (at most {MAX_EXPOSURES}), each at a virtual IP "
            "allocated from serviceCIDR; a peer reaches only those its authorization grants. Default none.",
            max_items=MAX_EXPOSURES,
            list_type="map",
            map_keys=("name",),
        ),
        "reverseExposures": Arr(
            reverse_exposure,
            f"Peer-side services offered to the fabric (at most {MAX_REVERSE_EXPOSURES}), each at a virtual "
            "IP allocated from serviceCIDR, reachable from the operator's internal source CIDRs. Default "
            "none.",
            max_items=MAX_REVERSE_EXPOSURES,
            list_type="map",
            map_keys=("name",),
        ),
    }


def _names_disjoint(o: Mapping[str, Any]) -> bool:
    ex = {e["name"] for e in o.get("exposures", [])}
    return not any(r["name"] in ex for r in o.get("reverseExposures", []))


UNIQUE_EXPOSURE_NAMES = Rule(
    # `r.name in <the exposures' names>` rather than a nested exists(e, e.name == r.name): the same set
    # test, estimated by the API server at 3.9M instead of 8.9M of its 10M per-rule limit
    # (tests/integration/test_crd_cel_cost.py; sets.intersects would be 0.3M but needs Kubernetes 1.30).
    "!has(self.exposures) || !has(self.reverseExposures) || "
    "self.reverseExposures.all(r, !(r.name in self.exposures.map(e, e.name)))",
    "exposure names must be unique across exposures and reverseExposures",
    _names_disjoint,
    field_path=".reverseExposures",
    reason="FieldValueDuplicate",
)

ike = Obj(
    {
        "version": Int(
            "IKE protocol version: only 2 (IKEv2) is supported. Default 2.",
            minimum=2,
            maximum=2,
            rule="is not supported: IKE version 2 only",
        ),
        "proposals": Arr(
            Str(
                "An IKE proposal, encryption-integrity/PRF-DH group in strongSwan's syntax, from the "
                "allowlist.",
                enum=IKE_PROPOSALS,
            ),
            "The IKE_SA proposals offered and accepted, in order of preference (1 to 8, from an allowlist). "
            f"Default [{', '.join(DEFAULT_IKE_PROPOSALS)}].",
            min_items=1,
            max_items=8,
            list_type="set",
        ),
    },
    description="IKE (phase 1) settings: the version and the IKE_SA proposals.",
)
esp = Obj(
    {
        "proposals": Arr(
            Str(
                "An ESP proposal, encryption[-integrity][-DH group for PFS] in strongSwan's syntax, from "
                "the allowlist.",
                enum=ESP_PROPOSALS,
            ),
            "The CHILD_SA (ESP) proposals offered and accepted, in order of preference (1 to 8, from an "
            f"allowlist). Default [{', '.join(DEFAULT_ESP_PROPOSALS)}].",
            min_items=1,
            max_items=8,
            list_type="set",
        )
    },
    description="ESP (phase 2, CHILD_SA) settings: the proposals.",
)
ha = Obj(
    {
        "enabled": Bool(
            "Warm standby: a second gateway pod on another node, with its own NIC2, takes over in seconds "
            "when the serving one fails (docs/ha.md). Needs the operator's allowance (the chart's "
            "ha.allowed); without it the gateway runs one pod and StandbyReady says why. Default false."
        )
    },
    description="High availability: a warm-standby gateway pod (docs/ha.md).",
)


def _name_rule(kind: str) -> Rule:
    return Rule(
        "self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",
        f"{kind} names must be DNS labels: they name charon connections and status entries",
        _dns_label_name,
        report_at=".metadata.name",
        needs_valid=False,
    )


def _dns_label_name(o: Mapping[str, Any]) -> bool:
    md = o.get("metadata")
    name = md.get("name", "") if isinstance(md, Mapping) else ""
    return isinstance(name, str) and len(name) <= 63 and re.fullmatch(DNS_LABEL, name) is not None


# --- VPNGateway -------------------------------------------------------------------------------------

GATEWAY_SPEC = Obj(
    {
        "type": Str(
            "The VPN protocol: ipsec (strongSwan, IKEv2) or wireguard; the matching section (ipsec or "
            "wireguard) is required and the other forbidden.",
            enum=("ipsec", "wireguard"),
        ),
        "serviceCIDR": Str(
            "IPv4 CIDR (prefix /8 to /30) the virtual IPs of exposures and reverse exposures are allocated "
            "from; its first host is the gateway's own address (the source of reverse exposures' SNAT).",
            pattern=SERVICE_CIDR,
            format="cidr",
            max_length=18,
            rule="is not an IPv4 CIDR with a prefix from /8 to /30",
        ),
        **_exposure_lists(),
        "ipsec": Obj(
            {
                "localID": said(
                    ike_id,
                    "The gateway's own IKE identity, presented to every peer (FQDN, IPv4 address or "
                    "email-style; with certificates, the certificate's subjectAltName must carry it).",
                ),
                "ike": ike,
                "esp": esp,
                "pskSecretRef": said(
                    secret_ref,
                    "The default pre-shared key for psk peers (a peer's own pskSecretRef overrides it).",
                ),
                "certificateSecretRef": Obj(
                    {
                        "name": Str(
                            "Name of the kubernetes.io/tls Secret, in the same namespace as the gateway.",
                            pattern=SECRET_NAME,
                            max_length=253,
                            rule="is not a Secret name",
                        )
                    },
                    required=("name",),
                    description="A kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) for pubkey peers.",
                ),
            },
            required=("localID",),
            description="IPsec settings; required when type is ipsec, forbidden otherwise.",
        ),
        "wireguard": Obj(
            {
                "listenPort": Int(
                    "UDP port the gateway's WireGuard device listens on (1-65535), e.g. 51820.",
                    minimum=1,
                    maximum=65535,
                ),
                "address": Str(
                    "The gateway's tunnel address with prefix, e.g. 10.99.0.1/24.",
                    pattern=CIDR,
                    max_length=18,
                    rule="is not an IPv4 address with prefix",
                ),
                "privateKeySecretRef": said(
                    secret_ref,
                    "The gateway's WireGuard private key (base64 of 32 bytes, as wg genkey prints it).",
                ),
            },
            required=("listenPort", "address", "privateKeySecretRef"),
            description="WireGuard settings; required when type is wireguard, forbidden otherwise.",
        ),
        "ha": ha,
    },
    required=("type", "serviceCIDR"),
    description="The gateway's desired state: protocol, virtual-IP range, exposures and protocol settings.",
    rules=(
        Rule(
            "self.type != 'ipsec' || has(self.ipsec)",
            "is required when type is ipsec",
            lambda o: o["type"] != "ipsec" or _has(o, "ipsec"),
            field_path=".ipsec",
            reason="FieldValueRequired",
        ),
        Rule(
            "self.type != 'wireguard' || has(self.wireguard)",
            "is required when type is wireguard",
            lambda o: o["type"] != "wireguard" or _has(o, "wireguard"),
            field_path=".wireguard",
            reason="FieldValueRequired",
        ),
        Rule(
            "self.type == 'ipsec' || !has(self.ipsec)",
            "is not allowed when type is wireguard",
            lambda o: o["type"] == "ipsec" or not _has(o, "ipsec"),
            field_path=".ipsec",
            reason="FieldValueForbidden",
        ),
        Rule(
            "self.type == 'wireguard' || !has(self.wireguard)",
            "is not allowed when type is ipsec",
            lambda o: o["type"] == "wireguard" or not _has(o, "wireguard"),
            field_path=".wireguard",
            reason="FieldValueForbidden",
        ),
        UNIQUE_EXPOSURE_NAMES,
    ),
)

# --- VPNPeer ----------------------------------------------------------------------------------------

PEER_SPEC = Obj(
    {
        "gatewayRef": Obj(
            {"name": said(dns_label, "Name of the VPNGateway, in the same namespace as this peer.")},
            required=("name",),
            description="The VPNGateway this peer connects to.",
        ),
        "type": Str(
            "site: a fixed remote endpoint the gateway initiates to (endpoint required); roadWarrior: a "
            "client at a dynamic address that initiates itself (endpoint forbidden).",
            enum=("site", "roadWarrior"),
        ),
        "endpoint": Str(
            "The site peer's public address: an IPv4 literal or an RFC 1123 host name (no port; "
            "WireGuard: see wireguard.endpointPort). Required for site, forbidden for roadWarrior.",
            pattern=ENDPOINT,
            max_length=253,
            rule="is not an IPv4 address or an RFC 1123 host name",
            rules=(not_special,),
        ),
        "ipsec": Obj(
            {
                "id": said(
                    ike_id, "The peer's IKE identity, as it presents itself (FQDN, IPv4 or email-style)."
                ),
                "remoteSubnets": Arr(
                    said(cidr, "A remote subnet (IPv4 CIDR): one CHILD_SA (traffic selector) each."),
                    f"The peer's subnets routed through the tunnel (1 to {MAX_SUBNETS} IPv4 CIDRs, unique).",
                    min_items=1,
                    max_items=MAX_SUBNETS,
                    list_type="set",
                ),
                "auth": Str(
                    "How the peer authenticates: psk (pre-shared key, the default) or pubkey (X.509 "
                    "certificates: the gateway's certificateSecretRef).",
                    enum=("psk", "pubkey"),
                ),
                "pskSecretRef": said(
                    secret_ref,
                    "This peer's pre-shared key, overriding the gateway's pskSecretRef; not allowed with "
                    "auth pubkey.",
                ),
            },
            required=("id", "remoteSubnets"),
            description="IPsec settings of the peer (exactly one of ipsec or wireguard).",
            rules=(
                Rule(
                    "!has(self.auth) || self.auth != 'pubkey' || !has(self.pskSecretRef)",
                    "is not allowed with auth pubkey",
                    lambda o: o.get("auth") != "pubkey" or not _has(o, "pskSecretRef"),
                    field_path=".pskSecretRef",
                    reason="FieldValueForbidden",
                ),
            ),
        ),
        "wireguard": Obj(
            {
                "publicKey": Str(
                    "The peer's public key (base64 of 32 bytes).",
                    pattern=WG_KEY,
                    max_length=44,
                    rule="is not a WireGuard key (base64 of 32 bytes)",
                ),
                "allowedIPs": Arr(
                    said(cidr, "An IPv4 CIDR routed to this peer and accepted from it."),
                    f"The peer's tunnel address(es) and subnets (1 to {MAX_SUBNETS} IPv4 CIDRs, unique), "
                    "as WireGuard's AllowedIPs.",
                    min_items=1,
                    max_items=MAX_SUBNETS,
                    list_type="set",
                ),
                "presharedKeySecretRef": said(
                    secret_ref,
                    "An optional WireGuard preshared key for this peer (base64 of 32 bytes), an extra "
                    "symmetric layer.",
                ),
                "endpointPort": Int(
                    "UDP port of a site peer's endpoint (default 51820); not allowed for road warriors.",
                    minimum=1,
                    maximum=65535,
                ),
                "persistentKeepalive": Int(
                    "Seconds between keepalive packets sent to the peer (0-65535; 0 disables). Default 25 "
                    "for site peers.",
                    minimum=0,
                    maximum=65535,
                ),
            },
            required=("publicKey", "allowedIPs"),
            description="WireGuard settings of the peer (exactly one of ipsec or wireguard).",
        ),
        "authorization": Obj(
            {
                "exposures": Arr(
                    said(dns_label, "The name of one of the gateway's exposures."),
                    "The gateway's exposures this peer may reach, by name (unique). Default none.",
                    max_items=MAX_EXPOSURES,
                    list_type="set",
                ),
                "reverseExposures": Arr(
                    said(dns_label, "The name of one of the gateway's reverse exposures."),
                    "The gateway's reverse exposures this peer provides the target of, by name (unique). "
                    "Default none.",
                    max_items=MAX_REVERSE_EXPOSURES,
                    list_type="set",
                ),
            },
            description="What the peer is granted, by exposure name; nothing when absent.",
        ),
    },
    required=("gatewayRef", "type"),
    description="The peer's desired state: its gateway, kind, address, protocol settings and grants.",
    rules=(
        Rule(
            "self.type != 'site' || has(self.endpoint)",
            "is required for site peers",
            lambda o: o["type"] != "site" or _has(o, "endpoint"),
            field_path=".endpoint",
            reason="FieldValueRequired",
        ),
        Rule(
            "self.type != 'roadWarrior' || !has(self.endpoint)",
            "is not allowed for roadWarrior peers (their address is dynamic)",
            lambda o: o["type"] != "roadWarrior" or not _has(o, "endpoint"),
            field_path=".endpoint",
            reason="FieldValueForbidden",
        ),
        Rule(
            "has(self.ipsec) != has(self.wireguard)",
            "exactly one of ipsec or wireguard must be set",
            lambda o: _has(o, "ipsec") != _has(o, "wireguard"),
        ),
        Rule(
            "self.type != 'roadWarrior' || !has(self.wireguard) || !has(self.wireguard.endpointPort)",
            "is not allowed for roadWarrior peers: a road warrior initiates and we answer at whatever "
            "address and port it comes from; we never dial it, so a port would be silently unused",
            lambda o: o["type"] != "roadWarrior" or not _has(o.get("wireguard", {}), "endpointPort"),
            field_path=".wireguard.endpointPort",
            reason="FieldValueForbidden",
        ),
    ),
)

# --- legacy IPsecGateway ----------------------------------------------------------------------------

ROUTED_MISSING = (
    "mode routed is not implemented yet: it needs the remote subnets routed to the gateway "
    "(allowed-address-pairs and router routes for remoteSubnets) and SNAT-free forwarding, "
    "which are not built; use mode snat"
)

tunnel = Obj(
    {
        "name": said(dns_label, "The tunnel's name (a DNS label, unique): names its charon connection."),
        "peer": Obj(
            {
                "address": said(
                    unicast_ipv4, "The peer's public IPv4 address (the gateway initiates to it)."
                ),
                "id": said(ike_id, "The peer's IKE identity (FQDN, IPv4 or email-style)."),
            },
            required=("address", "id"),
            description="The remote site.",
        ),
        "remoteSubnets": Arr(
            said(cidr, "A remote subnet (IPv4 CIDR): one CHILD_SA (traffic selector) each."),
            f"The peer's subnets routed through the tunnel (1 to {MAX_SUBNETS} IPv4 CIDRs, unique).",
            min_items=1,
            max_items=MAX_SUBNETS,
            list_type="set",
        ),
        "mode": Str(
            "snat (the default: fabric traffic leaves with the gateway's address); routed is reserved and "
            "refused (not built).",
            enum=("snat", "routed"),
        ),
    },
    required=("name", "peer", "remoteSubnets"),
    description="One site-to-site tunnel.",
    rules=(
        Rule(
            "!has(self.mode) || self.mode != 'routed'",
            ROUTED_MISSING,
            lambda o: o.get("mode") != "routed",
            field_path=".mode",
        ),
    ),
)

LEGACY_GATEWAY_SPEC = Obj(
    {
        "serviceCIDR": GATEWAY_SPEC.fields["serviceCIDR"],
        "localID": said(
            ike_id, "The gateway's own IKE identity, presented to every peer (FQDN, IPv4 or email-style)."
        ),
        "ike": ike,
        "esp": esp,
        "auth": Obj(
            {"pskSecretRef": said(secret_ref, "The pre-shared key of every tunnel.")},
            required=("pskSecretRef",),
            description="Authentication: one pre-shared key for all tunnels.",
        ),
        "tunnels": Arr(
            tunnel,
            f"The site-to-site tunnels (1 to {MAX_TUNNELS}, unique by name); each is granted every exposure.",
            min_items=1,
            max_items=MAX_TUNNELS,
            list_type="map",
            map_keys=("name",),
        ),
        **_exposure_lists(),
    },
    required=("serviceCIDR", "localID", "auth", "tunnels"),
    description="The legacy gateway's desired state (frozen: new gateways use VPNGateway and VPNPeer).",
    rules=(UNIQUE_EXPOSURE_NAMES,),
)

# --- legacy ClusterLink -----------------------------------------------------------------------------

CLUSTER_LINK_SPEC = Obj(
    {
        "routerID": Str(
            "The OpenStack router (UUID, lower case) of the linked service cluster.",
            pattern=UUID,
            rule="is not a UUID",
        ),
        "gateways": Arr(
            said(dns_label, "The name of a gateway in this namespace."),
            "Gateways (in this namespace) whose reverse routes this link carries (per-customer scoping).",
            max_items=MAX_TUNNELS,
            list_type="set",
        ),
    },
    required=("routerID",),
    description="The linked service cluster's router and the gateways it carries routes for.",
)


# --- status ---------------------------------------------------------------------------------------------
#
# Structural: the API server PRUNES every status field not declared here, so every key a writer puts in
# status is listed with its type: the controller (controller.status: conditions, observedGeneration,
# nodeName, publicIP), the status-agent (agent.ipsec.status: tunnels, tunnelsSummary, agent;
# agent.wireguard.status: peers, tunnelsSummary, agent) and init-nat's report (agent.sink.init_nat_report:
# initNat). Types only, no enums, patterns or bounds: a status write the API refused would hide the
# gateway's state; the writers own the values. The agent writes a tunnel's unknown times and error as
# JSON null: a merge patch drops nulls inside the list items it writes (the API server's json-patch merge),
# so they are stored absent, with or without this schema. tests/status_schema.py writes each writer's full
# status and reads it back unchanged from the emulator and from the real kube-apiserver.

_RFC3339 = "RFC 3339 time in UTC, e.g. 2026-12-01T10:00:00Z"

condition = Obj(
    {
        "type": Str(
            "Condition type: Ready (the gateway serves its plan), ConfigRendered, CloudReady, PodReady, "
            "DeployedPlan, OwnedObjects, with OpenStack RoutingReady and SecurityGroupScoped, and with HA "
            "StandbyReady."
        ),
        "status": Str("True, False or Unknown."),
        "reason": Str("One CamelCase word for the condition's last transition, e.g. NoPod or Invalid."),
        "message": Str("Human-readable details (at most 32768 characters)."),
        "lastTransitionTime": Str(f"When status last changed ({_RFC3339})."),
        "observedGeneration": Int("The metadata.generation the condition was computed from."),
    },
    required=("type",),
    description="One aspect of the gateway's state, in Kubernetes' condition convention.",
)
_counters = {
    "bytesIn": Int("Bytes received from the peer through the tunnel (decrypted), since it came up."),
    "bytesOut": Int("Bytes sent to the peer through the tunnel (before encryption), since it came up."),
}
ipsec_child = Obj(
    {
        "name": Str("CHILD_SA name (charon's child config): one per remote subnet."),
        "remoteSubnet": Str("The remote subnet (IPv4 CIDR) this CHILD_SA carries."),
        "state": Str("Established, Connecting or Down."),
        "rekeyAt": Str(f"When the newest CHILD_SA is next rekeyed ({_RFC3339}); absent when not up."),
    },
    description="One CHILD_SA of the tunnel.",
)
ipsec_tunnel = Obj(
    {
        "name": Str("The tunnel: the VPNPeer's name (IPsecGateway: the tunnel's name)."),
        "state": Str(
            "Established (IKE_SA up and every CHILD_SA installed), Connecting, Down, or Failed (see "
            "lastError)."
        ),
        "establishedAt": Str(f"When the IKE_SA was established ({_RFC3339}); absent while down."),
        "rekeyAt": Str(
            f"When the IKE_SA is next rekeyed or reauthenticated ({_RFC3339}); absent while down."
        ),
        **_counters,
        "packetsIn": Int("Packets received through the tunnel since it came up."),
        "packetsOut": Int("Packets sent through the tunnel since it came up."),
        "children": Arr(ipsec_child, "The tunnel's CHILD_SAs, one per remote subnet, in plan order."),
        "lastError": Str(
            "Why the tunnel is not up (charon's reason, e.g. AUTHENTICATION_FAILED); absent when Established "
            "or when there is nothing to say."
        ),
    },
    description="An IPsec tunnel as charon (strongSwan) reports it.",
)
wireguard_peer = Obj(
    {
        "name": Str("The VPNPeer's name."),
        "publicKey": Str("The peer's WireGuard public key (base64)."),
        "allowedIPs": Arr(Str("IPv4 CIDR."), "The peer's allowed IPs (routed into its tunnel)."),
        **_counters,
        "state": Str(
            "Connected (handshake within 180 s), Stale (older), NeverConnected, or Failed (left off the "
            "device: see lastError)."
        ),
        "lastError": Str("Why the peer is Failed, e.g. its preshared key Secret is missing."),
        "endpoint": Str("Where the device last saw the peer (address:port), else the planned endpoint."),
        "latestHandshake": Str(f"The latest handshake ({_RFC3339}); absent if never."),
    },
    description="A WireGuard peer as the device reports it.",
)
agent_status = Obj(
    {
        "connected": Bool("IPsec: whether the agent can talk to charon (VICI)."),
        "daemon": Str("IPsec: charon's name and version, e.g. charon 5.9.8."),
        "planHash": Str("Hash of the plan the data plane runs (the last good one)."),
        "lastError": Str("What keeps the data plane from following the newest plan, if anything."),
    },
    description="The status-agent: the plan in force and what stands in its way.",
)
init_nat = Obj(
    {
        "leftOut": Arr(
            Obj(
                {
                    "exposure": Str("The exposure's name."),
                    "kind": Str("reverse for a reverse exposure; absent for an exposure."),
                    "reason": Str("Why init-nat left it out, e.g. its host does not resolve."),
                },
                description="An exposure init-nat left out of the data plane.",
            ),
            "Exposures init-nat left out of the data plane, and why.",
        ),
        "lastError": Str("init-nat's last error."),
        "ipv6": Obj(
            {
                "state": Str("unguarded: init-nat could not install its IPv6 guard."),
                "reason": Str("Why IPv6 is unguarded."),
            },
            description="IPv6 that init-nat could not guard; absent when all is well.",
        ),
    },
    description="What init-nat (the gateway pod's NAT rules) reports; absent when it has nothing to say.",
)
ha_status = Obj(
    {
        "activeSlot": Str("The slot serving (a or b): its pod holds the gateway's Lease."),
        "activePod": Str("The pod serving (holding the gateway's Lease)."),
        "activeNode": Str("The node the serving pod runs on."),
        "standbyPod": Str("The pod standing by."),
        "standbyNode": Str("The node the standby is pinned to."),
        "lastFailoverTime": Str(f"When the floating IP last moved to the other slot ({_RFC3339})."),
        "lastFailoverReason": Str(
            "Why: LeaseExpired (the serving pod stopped renewing its Lease) or Released (it stopped "
            "gracefully)."
        ),
    },
    description="Warm-standby HA (spec.ha.enabled): who serves, who stands by, the last failover; written "
    "by the controller.",
)
GATEWAY_STATUS = Obj(
    {
        "conditions": Arr(
            condition,
            "The gateway's conditions, Ready first (kubectl describe shows them).",
            list_type="map",
            map_keys=("type",),
        ),
        "observedGeneration": Int("The metadata.generation the controller last reconciled."),
        "nodeName": Str("The node the gateway pod is pinned to."),
        "publicIP": Str("The gateway's public (floating) IPv4 address that peers connect to."),
        "tunnels": Arr(ipsec_tunnel, "IPsec: one entry per tunnel (VPNPeer), written by the status-agent."),
        "peers": Arr(wireguard_peer, "WireGuard: one entry per VPNPeer, written by the status-agent."),
        "tunnelsSummary": Str(
            'How many tunnels (IPsec) or peers (WireGuard) are up, e.g. "3/4 up" (the Tunnels column); '
            "written by the status-agent."
        ),
        "agent": agent_status,
        "initNat": init_nat,
        "ha": ha_status,
    },
    description="The observed state, written by the controller (conditions, observedGeneration, nodeName, "
    "publicIP, ha) and by the gateway pod's status-agent (tunnels or peers, tunnelsSummary, agent, initNat).",
)
PEER_STATUS = Obj(
    {
        "state": Str(
            "Established, Connecting, Down, AuthFailed (IPsec: the authentication failed), or NotAdmitted "
            "(the controller left the peer out of its gateway's plan: see the Admitted condition). Written "
            "by the gateway's status-agent from the same data as the gateway's status.tunnels or "
            "status.peers (NotAdmitted: by the controller)."
        ),
        "reason": Str("Why the peer is not Established (charon's reason, a missing Secret...), if known."),
        "establishedAt": Str(f"IPsec: when the IKE_SA was established ({_RFC3339}); absent while down."),
        "latestHandshake": Str(f"WireGuard: the latest handshake ({_RFC3339}); absent if never."),
        **{
            k: Int(f"{v.description} Updated at least once a resync (30 s) while it moves.")
            for k, v in _counters.items()
        },
        "observedGeneration": Int("The metadata.generation the controller last reconciled."),
        "conditions": Arr(
            condition,
            "Admitted (the controller put the peer in its gateway's plan; False with the reason when it "
            "did not) and Ready (the tunnel is up).",
            list_type="map",
            map_keys=("type",),
        ),
    },
    description="The observed state of the peer: the status-agent of its gateway writes it while the peer "
    "is in the plan; the controller writes Admitted False when it is not.",
)
CLUSTER_LINK_STATUS = Obj(description="Unused: nothing writes a ClusterLink's status.")


# --- resources --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    group: str
    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: Obj
    description: str
    status: Obj

    @property
    def api_version(self) -> str:
        return f"{self.group}/{VERSION}"

    @property
    def root(self) -> Obj:
        """The whole object's schema: metadata.name constrained by a root CEL rule (as CRDs allow)."""
        return Obj(
            {
                "apiVersion": Str(
                    "The versioned schema of this representation of an object (group/version, e.g. "
                    f"{self.api_version})."
                ),
                "kind": Str(f"The REST resource this object represents: {self.kind}."),
                "metadata": Obj(preserve_unknown=True),
                "spec": self.spec,
                "status": self.status,
            },
            required=("metadata", "spec"),
            rules=(_name_rule(self.kind),),
            description=self.description,
        )


RESOURCES = (
    Resource(
        VPN_GROUP,
        "VPNGateway",
        "vpngateways",
        ("vpngw",),
        GATEWAY_SPEC,
        "An IPsec or WireGuard VPN gateway.",
        GATEWAY_STATUS,
    ),
    Resource(
        VPN_GROUP,
        "VPNPeer",
        "vpnpeers",
        ("vpnpeer",),
        PEER_SPEC,
        "A remote site or road warrior of a gateway.",
        PEER_STATUS,
    ),
    Resource(
        LEGACY_GROUP,
        "IPsecGateway",
        "ipsecgateways",
        ("ipsecgw",),
        LEGACY_GATEWAY_SPEC,
        "Legacy (frozen) IPsec gateway with tunnels[].",
        GATEWAY_STATUS,
    ),
    Resource(
        LEGACY_GROUP,
        "ClusterLink",
        "clusterlinks",
        ("clink",),
        CLUSTER_LINK_SPEC,
        "Legacy (frozen): a service cluster's router that carries reverse routes.",
        CLUSTER_LINK_STATUS,
    ),
)
BY_KIND = {r.kind: r for r in RESOURCES}
