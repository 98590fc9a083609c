"""The corpus of valid and invalid objects that Validate() and the CRDs (schema + CEL) must agree on.

Each invalid case is a valid base document with one change, plus the text the Python error must carry,
so every rule is shown to fire for the intended reason (not merely "something failed"). The agreement
itself is proven in test_crd_agreement.py; this module also checks the Python side's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from controller.api.validate import validate_object
from tests.examples import DELETE, example_docs, mutate

IPSEC = example_docs("ipsec.yaml")
WG = example_docs("wireguard.yaml")
LEGACY = example_docs("legacy-ipsecgateway.yaml")
GATEWAY, PEER, PEER2 = IPSEC
WG_GATEWAY, WG_SITE, WG_ROAD = WG
LEGACY_GW, CLUSTER_LINK = LEGACY


@dataclass(frozen=True)
class Case:
    id: str
    doc: dict[str, Any]
    expect: str | None
    """None: valid. Otherwise a substring of one of the Python errors."""


def _c(id: str, base: dict[str, Any], path: Sequence[str | int], value: Any, expect: str | None) -> Case:
    return Case(id, mutate(base, path, value), expect)


KEY_A = "ndMB0U9Tj4E4/5wKf/gWNO7jDafzWOAObYzbYEYkUiw="

VALID: list[Case] = [
    _c(
        "gw-port-same-number-other-protocol",
        GATEWAY,
        ["spec", "exposures", 0, "ports"],
        [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
        None,
    ),
    *(
        Case(f"example-{f}-{d['kind']}-{d['metadata']['name']}", d, None)
        for f, docs in (("ipsec", IPSEC), ("wg", WG), ("legacy", LEGACY))
        for d in docs
    ),
    _c("gw-no-exposures", GATEWAY, ["spec", "exposures"], DELETE, None),
    _c("peer-id-fqdn-with-dash", PEER, ["spec", "ipsec", "id"], "hq-1.acme-2.example", None),
    _c("peer-id-ipv4", PEER, ["spec", "ipsec", "id"], "198.51.100.2", None),
    _c("gw-no-reverse", GATEWAY, ["spec", "reverseExposures"], DELETE, None),
    _c("gw-default-proposals", GATEWAY, ["spec", "ipsec"], {"localID": "gw.example"}, None),
    _c("gw-service-cidr-8", GATEWAY, ["spec", "serviceCIDR"], "10.0.0.0/8", None),
    _c("gw-service-cidr-30", GATEWAY, ["spec", "serviceCIDR"], "10.0.0.4/30", None),
    _c("gw-ha-false", GATEWAY, ["spec", "ha"], {"enabled": False}, None),
    _c("gw-ha-empty", GATEWAY, ["spec", "ha"], {}, None),
    _c("gw-host-target", GATEWAY, ["spec", "exposures", 0, "target"], {"host": "db.svc.cluster.local"}, None),
    _c("gw-udp", GATEWAY, ["spec", "exposures", 0, "ports"], [{"port": 53, "protocol": "UDP"}], None),
    _c("gw-local-id-ip", GATEWAY, ["spec", "ipsec", "localID"], "192.0.2.2", None),
    _c("gw-local-id-email", GATEWAY, ["spec", "ipsec", "localID"], "vpn@acme.example", None),
    _c("gw-cert", GATEWAY, ["spec", "ipsec", "certificateSecretRef"], {"name": "acme-tls"}, None),
    _c(
        "gw-many-proposals",
        GATEWAY,
        ["spec", "ipsec", "ike", "proposals"],
        ["aes256gcm16-prfsha384-ecp384", "aes256-sha256-curve25519"],
        None,
    ),
    _c("peer-hostname", PEER, ["spec", "endpoint"], "vpn.hq.acme.example", None),
    _c("peer-single-label-host", PEER, ["spec", "endpoint"], "localhost", None),
    _c("peer-host-starting-like-loopback", PEER, ["spec", "endpoint"], "127.example.com", None),
    _c("peer-no-authz", PEER, ["spec", "authorization"], DELETE, None),
    _c(
        "peer-pubkey",
        PEER,
        ["spec", "ipsec"],
        {"id": "hq.acme.example", "auth": "pubkey", "remoteSubnets": ["10.1.0.0/16"]},
        None,
    ),
    _c("peer-host-bits", PEER, ["spec", "ipsec", "remoteSubnets"], ["192.168.10.5/24"], None),
    _c("peer-roadwarrior", mutate(PEER, ["spec", "endpoint"], DELETE), ["spec", "type"], "roadWarrior", None),
    _c("wg-keepalive-0", WG_SITE, ["spec", "wireguard", "persistentKeepalive"], 0, None),
    _c("wg-endpoint-port", WG_SITE, ["spec", "wireguard", "endpointPort"], 51821, None),
    _c("wg-rw-keepalive", WG_ROAD, ["spec", "wireguard", "persistentKeepalive"], 25, None),
    _c("wg-key-slash-plus", WG_SITE, ["spec", "wireguard", "publicKey"], "+/" * 21 + "A=", None),
    _c("legacy-mode-snat", LEGACY_GW, ["spec", "tunnels", 0, "mode"], "snat", None),
    _c("legacy-no-mode", LEGACY_GW, ["spec", "tunnels", 0, "mode"], DELETE, None),
    _c("link-no-gateways", CLUSTER_LINK, ["spec", "gateways"], DELETE, None),
    # The status schema is structural (its fields: tests/status_schema.py). A create discards the status,
    # so the real server does not refuse a status field of the wrong type there (Validate() would: no case),
    # but strict field validation refuses an unknown status field as it does an unknown spec field.
    _c(
        "status-known-fields",
        GATEWAY,
        ["status"],
        {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "observedGeneration": 1}],
            "tunnels": [{"name": "hq", "state": "Established", "bytesIn": 1, "children": []}],
            "tunnelsSummary": "1/1 up",
            "agent": {"connected": True, "planHash": "sha256:ab"},
        },
        None,
    ),
    # JSON null (YAML `field: ~`) for a known field: the API server drops it (none of our fields is
    # nullable) or, where the field has a default, applies the default; Validate() does the same.
    _c("null-rw-endpoint", mutate(PEER, ["spec", "type"], "roadWarrior"), ["spec", "endpoint"], None, None),
    _c("null-ha-enabled", GATEWAY, ["spec", "ha", "enabled"], None, None),
    _c("null-ha", GATEWAY, ["spec", "ha"], None, None),
    _c("null-protocol-defaults", GATEWAY, ["spec", "exposures", 0, "ports", 0, "protocol"], None, None),
    _c("null-authorization", PEER, ["spec", "authorization"], None, None),
    _c("null-rw-endpoint-port", WG_ROAD, ["spec", "wireguard", "endpointPort"], None, None),
    _c("null-status", GATEWAY, ["status"], None, None),
    _c("null-in-status", GATEWAY, ["status"], {"nodeName": None}, None),
]

INVALID: list[Case] = [
    _c(
        "status-unknown-field",
        GATEWAY,
        ["status"],
        {"anything": [1, 2]},
        "status.anything: is not a known field",
    ),
    # --- VPNGateway
    _c("gw-type", GATEWAY, ["spec", "type"], "l2tp", 'spec.type: "l2tp" is not one of: ipsec, wireguard'),
    _c("gw-cidr-31", GATEWAY, ["spec", "serviceCIDR"], "198.18.0.0/31", "prefix from /8 to /30"),
    _c("gw-cidr-7", GATEWAY, ["spec", "serviceCIDR"], "10.0.0.0/7", "prefix from /8 to /30"),
    _c("gw-cidr-octet", GATEWAY, ["spec", "serviceCIDR"], "198.18.0.256/24", "spec.serviceCIDR"),
    _c(
        "gw-cidr-newline",
        GATEWAY,
        ["spec", "serviceCIDR"],
        "198.18.0.0/24\n",
        'spec.serviceCIDR: "198.18.0.0/24\\n"',
    ),
    _c("gw-cidr-empty", GATEWAY, ["spec", "serviceCIDR"], "", "spec.serviceCIDR"),
    _c("gw-cidr-missing", GATEWAY, ["spec", "serviceCIDR"], DELETE, "spec.serviceCIDR: is required"),
    _c("gw-cidr-int", GATEWAY, ["spec", "serviceCIDR"], 24, "must be a string"),
    _c("gw-exposure-upper", GATEWAY, ["spec", "exposures", 0, "name"], "Web", "is not a DNS label"),
    _c("gw-exposure-underscore", GATEWAY, ["spec", "exposures", 0, "name"], "web_1", "is not a DNS label"),
    _c("gw-exposure-long", GATEWAY, ["spec", "exposures", 0, "name"], "a" * 64, "is not a DNS label"),
    _c(
        "gw-exposure-dup",
        GATEWAY,
        ["spec", "exposures", 1, "name"],
        "web",
        'spec.exposures[1].name: "web" is a duplicate',
    ),
    _c(
        "gw-port-dup",
        GATEWAY,
        ["spec", "exposures", 0, "ports"],
        [{"port": 80, "protocol": "TCP"}, {"port": 80}],  # the second's protocol defaults to TCP
        'spec.exposures[0].ports[1]: "80/TCP" is a duplicate',
    ),
    _c(
        "gw-exposure-reverse-dup",
        GATEWAY,
        ["spec", "reverseExposures", 0, "name"],
        "web",
        "exposure names must be unique across exposures and reverseExposures",
    ),
    _c("gw-target-none", GATEWAY, ["spec", "exposures", 0, "target"], {}, "exactly one of address or host"),
    _c(
        "gw-target-both",
        GATEWAY,
        ["spec", "exposures", 0, "target"],
        {"address": "10.0.0.1", "host": "a.example"},
        "exactly one of address or host",
    ),
    _c(
        "gw-target-octet",
        GATEWAY,
        ["spec", "exposures", 0, "target", "address"],
        "192.0.2.300",
        "is not an IPv4 address",
    ),
    _c(
        "gw-target-zero-pad",
        GATEWAY,
        ["spec", "exposures", 0, "target", "address"],
        "192.0.2.066",
        "is not an IPv4 address",
    ),
    _c(
        "gw-target-host-underscore",
        GATEWAY,
        ["spec", "exposures", 0, "target"],
        {"host": "bad_host"},
        "is not an RFC 1123 host name",
    ),
    _c(
        "gw-target-host-numeric",
        GATEWAY,
        ["spec", "exposures", 0, "target"],
        {"host": "300.1.1.1"},
        "is not an RFC 1123 host name",
    ),
    _c("gw-port-0", GATEWAY, ["spec", "exposures", 0, "ports", 0, "port"], 0, "must be between 1 and 65535"),
    _c(
        "gw-port-big",
        GATEWAY,
        ["spec", "exposures", 0, "ports", 0, "port"],
        65536,
        "must be between 1 and 65535",
    ),
    _c("gw-port-string", GATEWAY, ["spec", "exposures", 0, "ports", 0, "port"], "80", "must be an integer"),
    _c("gw-port-bool", GATEWAY, ["spec", "exposures", 0, "ports", 0, "port"], True, "must be an integer"),
    _c(
        "gw-protocol",
        GATEWAY,
        ["spec", "exposures", 0, "ports", 0, "protocol"],
        "SCTP",
        "is not one of: TCP, UDP",
    ),
    _c("gw-ports-empty", GATEWAY, ["spec", "exposures", 0, "ports"], [], "at least 1"),
    _c("gw-local-id-space", GATEWAY, ["spec", "ipsec", "localID"], "gw lab", "is not an IKE id"),
    _c("gw-local-id-at", GATEWAY, ["spec", "ipsec", "localID"], "@gw.example", "is not an IKE id"),
    _c("gw-local-id-brace", GATEWAY, ["spec", "ipsec", "localID"], "gw}{", "is not an IKE id"),
    _c("gw-local-id-dn", GATEWAY, ["spec", "ipsec", "localID"], "CN=gw,O=acme", "is not an IKE id"),
    _c("gw-local-id-any", GATEWAY, ["spec", "ipsec", "localID"], "%any", "is not an IKE id"),
    _c("gw-local-id-wildcard", GATEWAY, ["spec", "ipsec", "localID"], "0.0.0.0", "is the wildcard identity"),
    _c("gw-local-id-empty", GATEWAY, ["spec", "ipsec", "localID"], "", "is not an IKE id"),
    _c("gw-ike-v1", GATEWAY, ["spec", "ipsec", "ike", "version"], 1, "IKE version 2 only"),
    _c("gw-ike-v3", GATEWAY, ["spec", "ipsec", "ike", "version"], 3, "IKE version 2 only"),
    _c(
        "gw-ike-weak",
        GATEWAY,
        ["spec", "ipsec", "ike", "proposals"],
        ["aes128-sha1-modp1024"],
        "is not one of",
    ),
    _c("gw-ike-empty", GATEWAY, ["spec", "ipsec", "ike", "proposals"], [], "at least 1"),
    _c(
        "gw-ike-dup",
        GATEWAY,
        ["spec", "ipsec", "ike", "proposals"],
        ["aes256-sha256-modp2048"] * 2,
        "is a duplicate",
    ),
    _c("gw-esp-weak", GATEWAY, ["spec", "ipsec", "esp", "proposals"], ["3des-md5"], "is not one of"),
    _c(
        "gw-esp-case",
        GATEWAY,
        ["spec", "ipsec", "esp", "proposals"],
        ["AES256GCM16-MODP2048"],
        "is not one of",
    ),
    _c("gw-psk-key-dotdot", GATEWAY, ["spec", "ipsec", "pskSecretRef", "key"], "..", "is not a Secret key"),
    _c("gw-psk-key-path", GATEWAY, ["spec", "ipsec", "pskSecretRef", "key"], "a/b", "is not a Secret key"),
    _c(
        "gw-psk-name-upper",
        GATEWAY,
        ["spec", "ipsec", "pskSecretRef", "name"],
        "Acme",
        "is not a Secret name",
    ),
    _c(
        "gw-ipsec-on-wg",
        WG_GATEWAY,
        ["spec", "ipsec"],
        {"localID": "gw.example"},
        "is not allowed when type is wireguard",
    ),
    _c(
        "gw-wg-on-ipsec",
        GATEWAY,
        ["spec", "wireguard"],
        WG_GATEWAY["spec"]["wireguard"],
        "spec.wireguard: is not allowed when type is ipsec",
    ),
    _c("gw-ipsec-missing", GATEWAY, ["spec", "ipsec"], DELETE, "spec.ipsec: is required when type is ipsec"),
    _c(
        "gw-wg-missing",
        WG_GATEWAY,
        ["spec", "wireguard"],
        DELETE,
        "spec.wireguard: is required when type is wireguard",
    ),
    _c("gw-unknown-field", GATEWAY, ["spec", "routing"], "bgp", "spec.routing: is not a known field"),
    _c("gw-spec-missing", GATEWAY, ["spec"], DELETE, "spec: is required"),
    _c("gw-name-dotted", GATEWAY, ["metadata", "name"], "acme.gw", "names must be DNS labels"),
    _c("gw-metadata-string", GATEWAY, ["metadata"], "acme", "metadata: must be an object (got a string)"),
    # A secret pasted where its reference belongs: the error names the type, never the value.
    _c(
        "gw-psk-inline",
        GATEWAY,
        ["spec", "ipsec", "pskSecretRef"],
        "s3cr3t-psk-value",
        "spec.ipsec.pskSecretRef: must be an object (got a string)",
    ),
    _c("gw-name-missing", GATEWAY, ["metadata"], {"namespace": "x"}, "names must be DNS labels"),
    _c(
        "peer-namespace-upper",
        PEER,
        ["metadata", "namespace"],
        "Tenant",
        'metadata.namespace: "Tenant" is not a DNS',
    ),
    _c("peer-namespace-object", PEER, ["metadata", "namespace"], {"a": 1}, "metadata.namespace"),
    _c("gw-name-upper", GATEWAY, ["metadata", "name"], "Acme", "names must be DNS labels"),
    _c("gw-wg-port", WG_GATEWAY, ["spec", "wireguard", "listenPort"], 0, "must be between 1 and 65535"),
    _c(
        "gw-wg-address",
        WG_GATEWAY,
        ["spec", "wireguard", "address"],
        "10.99.0.1",
        "is not an IPv4 address with prefix",
    ),
    _c("gw-wg-key-missing", WG_GATEWAY, ["spec", "wireguard", "privateKeySecretRef"], DELETE, "is required"),
    _c("gw-api-version", GATEWAY, ["apiVersion"], "ipsec.bnerd.net/v1alpha1", "is not served for VPNGateway"),
    # --- VPNPeer
    _c(
        "peer-endpoint-octet",
        PEER,
        ["spec", "endpoint"],
        "198.51.100.256",
        "is not an IPv4 address or an RFC 1123",
    ),
    _c(
        "peer-endpoint-space",
        PEER,
        ["spec", "endpoint"],
        "vpn example",
        "is not an IPv4 address or an RFC 1123",
    ),
    _c(
        "peer-endpoint-dash",
        PEER,
        ["spec", "endpoint"],
        "-vpn.example",
        "is not an IPv4 address or an RFC 1123",
    ),
    _c("peer-endpoint-empty", PEER, ["spec", "endpoint"], "", "is not an IPv4 address or an RFC 1123"),
    # Special-purpose addresses: charon would treat 0.0.0.0 as any peer; an exposure of 169.254.169.254
    # would hand the tenant the OpenStack metadata service seen through the node's port.
    _c("peer-endpoint-any", PEER, ["spec", "endpoint"], "0.0.0.0", "special-purpose address"),
    _c(
        "gw-target-metadata",
        GATEWAY,
        ["spec", "exposures", 0, "target", "address"],
        "169.254.169.254",
        "special-purpose address",
    ),
    _c(
        "gw-target-loopback",
        GATEWAY,
        ["spec", "exposures", 0, "target", "address"],
        "127.0.0.1",
        "special-purpose address",
    ),
    _c(
        "gw-target-multicast",
        GATEWAY,
        ["spec", "exposures", 0, "target", "address"],
        "224.0.0.251",
        "special-purpose address",
    ),
    _c(
        "legacy-peer-broadcast",
        LEGACY_GW,
        ["spec", "tunnels", 0, "peer", "address"],
        "255.255.255.255",
        "special-purpose address",
    ),
    _c(
        "peer-endpoint-port",
        PEER,
        ["spec", "endpoint"],
        "198.51.100.7:500",
        "is not an IPv4 address or an RFC 1123",
    ),
    _c(
        "peer-endpoint-ipv6",
        PEER,
        ["spec", "endpoint"],
        "2001:db8::1",
        "is not an IPv4 address or an RFC 1123",
    ),
    _c("peer-type", PEER, ["spec", "type"], "hub", "is not one of: site, roadWarrior"),
    _c(
        "peer-site-no-endpoint",
        PEER,
        ["spec", "endpoint"],
        DELETE,
        "spec.endpoint: is required for site peers",
    ),
    _c("peer-rw-endpoint", PEER, ["spec", "type"], "roadWarrior", "is not allowed for roadWarrior peers"),
    _c("peer-id-space", PEER, ["spec", "ipsec", "id"], "hq acme", "is not an IKE id"),
    _c("peer-id-newline", PEER, ["spec", "ipsec", "id"], "hq\nacme", "is not an IKE id"),
    _c(
        "peer-id-wildcard",
        PEER,
        ["spec", "ipsec", "id"],
        "0.0.0.0",
        'spec.ipsec.id: "0.0.0.0" is the wildcard',
    ),
    _c(
        "legacy-peer-id-wildcard",
        LEGACY_GW,
        ["spec", "tunnels", 0, "peer", "id"],
        "0.0.0.0",
        "is the wildcard",
    ),
    # charon reads "a.b.c.d-e.f.g.h" as an address range matching every address in it (identification.c)
    _c("peer-id-range", PEER, ["spec", "ipsec", "id"], "0.0.0.1-255.255.255.254", "is an IPv4 address range"),
    _c("peer-id-range-host", PEER, ["spec", "ipsec", "id"], "10.0.0.1-10.0.0.9", "is an IPv4 address range"),
    _c("legacy-peer-id-range", LEGACY_GW, ["spec", "tunnels", 0, "peer", "id"], "1.2.3.4-5.6.7.8", "range"),
    _c("gw-local-id-range", GATEWAY, ["spec", "ipsec", "localID"], "1.2.3.4-5.6.7.8", "range"),
    _c("peer-id-quote", PEER, ["spec", "ipsec", "id"], 'hq"acme', "is not an IKE id"),
    _c(
        "peer-subnet-33",
        PEER,
        ["spec", "ipsec", "remoteSubnets", 1],
        "192.168.20.0/33",
        'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[1]: "192.168.20.0/33" is not an IPv4 CIDR',
    ),
    _c(
        "peer-subnet-bare", PEER, ["spec", "ipsec", "remoteSubnets", 0], "192.168.20.0", "is not an IPv4 CIDR"
    ),
    _c("peer-subnets-empty", PEER, ["spec", "ipsec", "remoteSubnets"], [], "at least 1"),
    _c(
        "peer-subnets-dup",
        PEER,
        ["spec", "ipsec", "remoteSubnets"],
        ["10.0.0.0/24", "10.0.0.0/24"],
        "is a duplicate",
    ),
    _c("peer-auth", PEER, ["spec", "ipsec", "auth"], "cert", "is not one of: psk, pubkey"),
    _c("peer-pubkey-psk", PEER, ["spec", "ipsec", "auth"], "pubkey", "is not allowed with auth pubkey"),
    _c(
        "peer-both",
        PEER,
        ["spec", "wireguard"],
        WG_SITE["spec"]["wireguard"],
        "exactly one of ipsec or wireguard",
    ),
    _c("peer-neither", PEER, ["spec", "ipsec"], DELETE, "exactly one of ipsec or wireguard"),
    _c("peer-grant-upper", PEER, ["spec", "authorization", "exposures"], ["DB"], "is not a DNS label"),
    _c("peer-grant-dup", PEER, ["spec", "authorization", "exposures"], ["web", "web"], "is a duplicate"),
    _c("peer-gwref-missing", PEER, ["spec", "gatewayRef"], DELETE, "spec.gatewayRef: is required"),
    _c("peer-gwref-upper", PEER, ["spec", "gatewayRef", "name"], "Acme", "is not a DNS label"),
    _c("peer-ipsec-string", PEER, ["spec", "ipsec"], "hq", "must be an object"),
    # --- WireGuard peers
    _c("wg-key-short", WG_SITE, ["spec", "wireguard", "publicKey"], "abc", "is not a WireGuard key"),
    _c("wg-key-no-pad", WG_SITE, ["spec", "wireguard", "publicKey"], KEY_A[:-1], "is not a WireGuard key"),
    _c(
        "wg-key-noncanonical",
        WG_SITE,
        ["spec", "wireguard", "publicKey"],
        KEY_A[:42] + "x=",
        "is not a WireGuard key",
    ),
    _c("wg-key-hex", WG_SITE, ["spec", "wireguard", "publicKey"], "ab" * 32, "is not a WireGuard key"),
    _c("wg-key-33-bytes", WG_SITE, ["spec", "wireguard", "publicKey"], "A" * 44, "is not a WireGuard key"),
    _c("wg-allowed-bare", WG_SITE, ["spec", "wireguard", "allowedIPs"], ["10.99.0.2"], "is not an IPv4 CIDR"),
    _c(
        "wg-keepalive-neg",
        WG_SITE,
        ["spec", "wireguard", "persistentKeepalive"],
        -1,
        "must be between 0 and 65535",
    ),
    # A road warrior initiates; we never dial it, so a port for it would be silently unused.
    _c(
        "wg-rw-endpoint-port",
        WG_ROAD,
        ["spec", "wireguard", "endpointPort"],
        51820,
        'spec.wireguard.endpointPort: "51820" is not allowed for roadWarrior peers: a road warrior initiates',
    ),
    _c(
        "wg-endpoint-port-big",
        WG_SITE,
        ["spec", "wireguard", "endpointPort"],
        70000,
        "must be between 1 and 65535",
    ),
    # --- legacy
    _c(
        "legacy-routed",
        LEGACY_GW,
        ["spec", "tunnels", 0, "mode"],
        "routed",
        'spec.tunnels[0].mode: "routed" mode routed is not implemented yet: it needs',
    ),
    _c("legacy-mode", LEGACY_GW, ["spec", "tunnels", 0, "mode"], "bgp", "is not one of: snat, routed"),
    _c(
        "legacy-peer-host",
        LEGACY_GW,
        ["spec", "tunnels", 0, "peer", "address"],
        "a.example",
        "is not an IPv4 address",
    ),
    _c(
        "legacy-tunnel-dup",
        LEGACY_GW,
        ["spec", "tunnels", 1, "name"],
        "s1",
        'spec.tunnels[1].name: "s1" is a duplicate',
    ),
    _c("legacy-no-tunnels", LEGACY_GW, ["spec", "tunnels"], [], "at least 1"),
    _c("legacy-no-auth", LEGACY_GW, ["spec", "auth"], DELETE, "spec.auth: is required"),
    _c("legacy-ike-v1", LEGACY_GW, ["spec", "ike", "version"], 1, "IKE version 2 only"),
    _c(
        "legacy-reverse-dup",
        LEGACY_GW,
        ["spec", "reverseExposures", 0, "name"],
        "web",
        "must be unique across",
    ),
    # --- ClusterLink
    _c("link-router", CLUSTER_LINK, ["spec", "routerID"], "router-1", "is not a UUID"),
    _c(
        "link-router-upper",
        CLUSTER_LINK,
        ["spec", "routerID"],
        "3F1C2A4E-8B7D-4C6E-9A10-2B3C4D5E6F70",
        "is not a UUID",
    ),
    _c("link-gateway", CLUSTER_LINK, ["spec", "gateways"], ["Legacy"], "is not a DNS label"),
    # --- nulls: dropped first, so a required field given as null is missing; a null list item stays and is
    # a type error; a null for an unknown field is still an unknown field
    _c("null-cidr", GATEWAY, ["spec", "serviceCIDR"], None, "spec.serviceCIDR: is required (it is null"),
    _c("null-spec", GATEWAY, ["spec"], None, "spec: is required"),
    _c("null-ipsec", GATEWAY, ["spec", "ipsec"], None, "spec.ipsec: is required when type is ipsec"),
    _c("null-site-endpoint", PEER, ["spec", "endpoint"], None, "spec.endpoint: is required for site peers"),
    _c("null-exposure-name", GATEWAY, ["spec", "exposures", 0, "name"], None, "spec.exposures[0].name: is"),
    _c(
        "null-subnet-item",
        PEER,
        ["spec", "ipsec", "remoteSubnets", 0],
        None,
        "spec.ipsec.remoteSubnets[0]: must be a string (got null)",
    ),
    _c("null-exposure-item", GATEWAY, ["spec", "exposures", 0], None, "must be an object (got null)"),
    _c("null-unknown-field", GATEWAY, ["spec", "routing"], None, "spec.routing: is not a known field"),
    _c("null-legacy-tunnels", LEGACY_GW, ["spec", "tunnels"], None, "spec.tunnels: is required"),
    # --- not our kinds
    _c("unknown-kind", GATEWAY, ["kind"], "VPNTunnel", 'kind: "VPNTunnel" is not one of'),
]

CORPUS = VALID + INVALID


def test_corpus_ids_are_unique() -> None:
    ids = [c.id for c in CORPUS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.id)
def test_valid_objects_have_no_problems(case: Case) -> None:
    assert [str(p) for p in validate_object(case.doc)] == []


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_objects_fail_for_the_intended_reason(case: Case) -> None:
    problems = [str(p) for p in validate_object(case.doc)]
    assert problems, "expected a problem"
    assert case.expect is not None
    assert any(case.expect in p for p in problems), problems
    md = case.doc.get("metadata")
    name = md.get("name") if isinstance(md, dict) else None
    assert all(
        p.startswith(f"{case.doc['kind']}/") and (name is None or f"/{name}:" in p) for p in problems
    ), problems
    assert "s3cr3t-psk-value" not in " ".join(problems), "a secret value was echoed in an error"
