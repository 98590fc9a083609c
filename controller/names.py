"""Who owns what: the key of a gateway, the names and labels of the objects the controller makes for it.

Every owned object of a gateway has the same name, ``vpngw-<name>`` for a VPNGateway and
``ipsecgw-<name>`` for a legacy IPsecGateway (kinds differ, so names do not collide; a VPNGateway and an
IPsecGateway of one name in one namespace do not collide either), its labels name the gateway and the
operator instance, and an ownerReference points at the gateway (the API server's garbage collector
deletes them with it). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from controller.api.resources import LEGACY_GROUP, VERSION, VPN_GROUP

GatewayKind = Literal["VPNGateway", "IPsecGateway"]
GATEWAY_KINDS: tuple[GatewayKind, ...] = ("VPNGateway", "IPsecGateway")

LABEL_GATEWAY = "vpn.bnerd.net/gateway"
LABEL_KIND = "vpn.bnerd.net/gateway-kind"
LABEL_INSTANCE = "vpn.bnerd.net/operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "vpngw-controller"
FIELD_MANAGER = "vpngw-controller"
FINALIZER = "vpn.bnerd.net/cleanup"
ANNOTATION_HASH = "vpn.bnerd.net/desired-hash"
"""On every owned object: the hash of what the controller last wanted it to be. A different hash means
our wish changed (rewrite it, dropping fields we no longer set); an equal hash with fields that differ
means someone else edited it (restore it)."""
ANNOTATION_NIC_MAC = "vpn.bnerd.net/nic-mac"
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
PLAN_KEY = "plan.json"


@dataclass(frozen=True, order=True)
class GatewayKey:
    kind: GatewayKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def group(self) -> str:
        return VPN_GROUP if self.kind == "VPNGateway" else LEGACY_GROUP

    @property
    def api_version(self) -> str:
        return f"{self.group}/{VERSION}"

    @property
    def plural(self) -> str:
        return self.kind.lower() + "s"

    @property
    def object_name(self) -> str:
        """The name of every object owned by this gateway."""
        return f"{'vpngw' if self.kind == 'VPNGateway' else 'ipsecgw'}-{self.name}"


def key_of(obj: Mapping[str, Any]) -> GatewayKey:
    md = obj.get("metadata") or {}
    kind = obj.get("kind")
    if kind not in GATEWAY_KINDS:
        raise ValueError(f"{kind!r} is not a gateway kind")
    return GatewayKey(kind, str(md.get("namespace")), str(md.get("name")))


def selector_labels(key: GatewayKey) -> dict[str, str]:
    """The labels a gateway's pod is selected by (a Deployment's selector is immutable: never change)."""
    return {LABEL_GATEWAY: key.name, LABEL_KIND: key.kind}


def labels(key: GatewayKey, instance: str) -> dict[str, str]:
    return {
        **selector_labels(key),
        LABEL_INSTANCE: instance,
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "vpngw-gateway",
        "app.kubernetes.io/instance": key.object_name[:63].rstrip("-"),
    }


def owner_reference(key: GatewayKey, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": key.api_version,
        "kind": key.kind,
        "name": key.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_of(obj: Mapping[str, Any]) -> GatewayKey | None:
    """The gateway that owns ``obj`` (its controller ownerReference), if any."""
    md = obj.get("metadata") or {}
    for ref in md.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in GATEWAY_KINDS:
            api = str(ref.get("apiVersion", ""))
            if api in (f"{VPN_GROUP}/{VERSION}", f"{LEGACY_GROUP}/{VERSION}"):
                return GatewayKey(ref["kind"], str(md.get("namespace")), str(ref.get("name")))
    return None
