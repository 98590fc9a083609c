"""The four resources as frozen dataclasses, parsed from documents that passed the schema check.

``parse(doc)`` assumes ``controller.api.schema.check`` found nothing wrong with ``doc``
(``controller.api.validate`` runs it first); it never guesses. Defaults documented on each field are
applied here, once.

* ``vpn.bnerd.net/v1alpha1``: ``VPNGateway`` and ``VPNPeer`` (the unified model);
* ``ipsec.bnerd.net/v1alpha1``: ``IPsecGateway`` and ``ClusterLink`` (legacy, frozen, served in parallel).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from controller.api.resources import DEFAULT_ESP_PROPOSALS, DEFAULT_IKE_PROPOSALS
from controller.api.schema import show


@dataclass(frozen=True)
class Meta:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class Port:
    port: int
    protocol: Literal["TCP", "UDP"] = "TCP"


@dataclass(frozen=True)
class Exposure:
    name: str
    ports: tuple[Port, ...]
    address: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class ReverseExposure:
    name: str
    address: str
    ports: tuple[Port, ...]


@dataclass(frozen=True)
class GatewayIpsec:
    local_id: str
    ike_proposals: tuple[str, ...] = DEFAULT_IKE_PROPOSALS
    esp_proposals: tuple[str, ...] = DEFAULT_ESP_PROPOSALS
    psk_secret_ref: SecretKeyRef | None = None
    """Default PSK for peers without their own pskSecretRef."""
    certificate_secret: str | None = None
    """kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) for pubkey peers."""


@dataclass(frozen=True)
class GatewayWireGuard:
    listen_port: int
    address: str
    private_key_secret_ref: SecretKeyRef


@dataclass(frozen=True)
class VPNGateway:
    meta: Meta
    type: Literal["ipsec", "wireguard"]
    service_cidr: str
    exposures: tuple[Exposure, ...] = ()
    reverse_exposures: tuple[ReverseExposure, ...] = ()
    ipsec: GatewayIpsec | None = None
    wireguard: GatewayWireGuard | None = None
    ha_enabled: bool = False


@dataclass(frozen=True)
class PeerIpsec:
    id: str
    remote_subnets: tuple[str, ...]
    auth: Literal["psk", "pubkey"] = "psk"
    psk_secret_ref: SecretKeyRef | None = None


@dataclass(frozen=True)
class PeerWireGuard:
    public_key: str
    allowed_ips: tuple[str, ...]
    preshared_key_secret_ref: SecretKeyRef | None = None
    endpoint_port: int = 51820
    persistent_keepalive: int | None = None


@dataclass(frozen=True)
class VPNPeer:
    meta: Meta
    gateway: str
    type: Literal["site", "roadWarrior"]
    endpoint: str | None = None
    ipsec: PeerIpsec | None = None
    wireguard: PeerWireGuard | None = None
    exposures: tuple[str, ...] = ()
    """Granted exposure names."""
    reverse_exposures: tuple[str, ...] = ()
    """Granted reverse-exposure names."""

    @property
    def subnets(self) -> tuple[str, ...]:
        """The peer's own addresses: IPsec remoteSubnets or WireGuard allowedIPs."""
        if self.ipsec is not None:
            return self.ipsec.remote_subnets
        return self.wireguard.allowed_ips if self.wireguard is not None else ()


@dataclass(frozen=True)
class LegacyTunnel:
    name: str
    peer_address: str
    peer_id: str
    remote_subnets: tuple[str, ...]
    mode: Literal["snat", "routed"] = "snat"


@dataclass(frozen=True)
class IPsecGateway:
    meta: Meta
    service_cidr: str
    local_id: str
    psk_secret_ref: SecretKeyRef
    tunnels: tuple[LegacyTunnel, ...]
    ike_proposals: tuple[str, ...] = DEFAULT_IKE_PROPOSALS
    esp_proposals: tuple[str, ...] = DEFAULT_ESP_PROPOSALS
    exposures: tuple[Exposure, ...] = ()
    reverse_exposures: tuple[ReverseExposure, ...] = ()


@dataclass(frozen=True)
class ClusterLink:
    meta: Meta
    router_id: str
    gateways: tuple[str, ...] = ()


Resource: TypeAlias = VPNGateway | VPNPeer | IPsecGateway | ClusterLink
Gateway: TypeAlias = VPNGateway | IPsecGateway


# --- parsing (of schema-valid documents) ------------------------------------------------------------


def meta_of(doc: Mapping[str, Any]) -> Meta:
    """Identity of any document, however malformed (for error messages)."""
    md = doc.get("metadata") if isinstance(doc, Mapping) else None
    md = md if isinstance(md, Mapping) else {}
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    namespace, name = md.get("namespace"), md.get("name")
    return Meta(
        kind=kind if isinstance(kind, str) and _KIND.fullmatch(kind) else "?",
        namespace="default" if namespace is None else _shown(namespace),
        name=_shown(name),
    )


_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_NAME = re.compile(r"[-A-Za-z0-9._]{1,253}")


def _shown(value: Any) -> str:
    """A name as it appears in ``Kind/namespace/name``: as is when well-formed, else quoted (one line)."""
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value
    return "?" if value is None else show(value)


def _ref(d: Mapping[str, Any] | None) -> SecretKeyRef | None:
    return SecretKeyRef(d["name"], d["key"]) if d else None


def _ports(items: list[Mapping[str, Any]]) -> tuple[Port, ...]:
    return tuple(Port(p["port"], p.get("protocol", "TCP")) for p in items)


def _exposures(spec: Mapping[str, Any]) -> tuple[tuple[Exposure, ...], tuple[ReverseExposure, ...]]:
    ex = tuple(
        Exposure(e["name"], _ports(e["ports"]), e["target"].get("address"), e["target"].get("host"))
        for e in spec.get("exposures", [])
    )
    rev = tuple(
        ReverseExposure(e["name"], e["target"]["address"], _ports(e["ports"]))
        for e in spec.get("reverseExposures", [])
    )
    return ex, rev


def _proposals(d: Mapping[str, Any] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(d["proposals"]) if d and "proposals" in d else default


def parse(doc: Mapping[str, Any]) -> Resource:
    meta = meta_of(doc)
    spec: Mapping[str, Any] = doc["spec"]
    if meta.kind == "VPNGateway":
        ex, rev = _exposures(spec)
        ip = spec.get("ipsec")
        wg = spec.get("wireguard")
        return VPNGateway(
            meta=meta,
            type=spec["type"],
            service_cidr=spec["serviceCIDR"],
            exposures=ex,
            reverse_exposures=rev,
            ipsec=GatewayIpsec(
                local_id=ip["localID"],
                ike_proposals=_proposals(ip.get("ike"), DEFAULT_IKE_PROPOSALS),
                esp_proposals=_proposals(ip.get("esp"), DEFAULT_ESP_PROPOSALS),
                psk_secret_ref=_ref(ip.get("pskSecretRef")),
                certificate_secret=ip.get("certificateSecretRef", {}).get("name"),
            )
            if ip is not None
            else None,
            wireguard=GatewayWireGuard(
                wg["listenPort"], wg["address"], SecretKeyRef(**wg["privateKeySecretRef"])
            )
            if wg is not None
            else None,
            ha_enabled=spec.get("ha", {}).get("enabled", False),
        )
    if meta.kind == "VPNPeer":
        ip = spec.get("ipsec")
        wg = spec.get("wireguard")
        authz = spec.get("authorization", {})
        return VPNPeer(
            meta=meta,
            gateway=spec["gatewayRef"]["name"],
            type=spec["type"],
            endpoint=spec.get("endpoint"),
            ipsec=PeerIpsec(
                ip["id"], tuple(ip["remoteSubnets"]), ip.get("auth", "psk"), _ref(ip.get("pskSecretRef"))
            )
            if ip is not None
            else None,
            wireguard=PeerWireGuard(
                wg["publicKey"],
                tuple(wg["allowedIPs"]),
                _ref(wg.get("presharedKeySecretRef")),
                wg.get("endpointPort", 51820),
                wg.get("persistentKeepalive"),
            )
            if wg is not None
            else None,
            exposures=tuple(authz.get("exposures", [])),
            reverse_exposures=tuple(authz.get("reverseExposures", [])),
        )
    if meta.kind == "IPsecGateway":
        ex, rev = _exposures(spec)
        psk = _ref(spec["auth"]["pskSecretRef"])
        assert psk is not None
        return IPsecGateway(
            meta=meta,
            service_cidr=spec["serviceCIDR"],
            local_id=spec["localID"],
            psk_secret_ref=psk,
            tunnels=tuple(
                LegacyTunnel(
                    t["name"],
                    t["peer"]["address"],
                    t["peer"]["id"],
                    tuple(t["remoteSubnets"]),
                    t.get("mode", "snat"),
                )
                for t in spec["tunnels"]
            ),
            ike_proposals=_proposals(spec.get("ike"), DEFAULT_IKE_PROPOSALS),
            esp_proposals=_proposals(spec.get("esp"), DEFAULT_ESP_PROPOSALS),
            exposures=ex,
            reverse_exposures=rev,
        )
    if meta.kind == "ClusterLink":
        return ClusterLink(meta=meta, router_id=spec["routerID"], gateways=tuple(spec.get("gateways", [])))
    raise ValueError(f"{meta}: unknown kind")  # validate() rejects unknown kinds before parse
