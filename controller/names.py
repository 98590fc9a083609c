"""Who owns what: the key of a gateway, the names and labels of the objects the controller makes for it.

The gateway pod is not the tenant's: it holds NET_ADMIN, NET_RAW and unsafe sysctls, so it runs in the
operator's gateway namespace (``Settings.gateway_namespace``), never in the tenant's (docs/security.md).
So a gateway's objects live in two places:

* in the gateway namespace: the plan ConfigMap, ServiceAccount, Role and RoleBinding (the plan), the
  NetworkPolicy, the NAD and the Deployment, all named ``home_name`` (``vpngw-<name>-<hash>``: unique
  across tenants, whatever their namespaces and names are called). An ownerReference cannot cross
  namespaces: their labels say whose they are (``LABEL_NAMESPACE``, ``LABEL_OWNER_UID``) and the gateway's
  finalizer deletes them. An HA gateway (docs/ha.md) also has there its Lease (``home_name``) and its slot
  b's ConfigMap, NAD and Deployment (``<home_name>-b``, labelled ``LABEL_HA_SLOT``);
* in the tenant's namespace: a Role and RoleBinding named ``object_name`` (``vpngw-<name>``, legacy
  ``ipsecgw-<name>``) that let the pod's ServiceAccount patch its CR's status and read the Secrets its
  plan references, each by name; they carry an ownerReference (the garbage collector deletes them).

Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import gwplan
from controller.api.resources import LEGACY_GROUP, VERSION, VPN_GROUP

GatewayKind = Literal["VPNGateway", "IPsecGateway"]
HaSlot = Literal["a", "b"]
"""An HA gateway's two pods (docs/ha.md): which one is active is the Lease's decision, not the slot's."""
GATEWAY_KINDS: tuple[GatewayKind, ...] = ("VPNGateway", "IPsecGateway")

LABEL_GATEWAY = "vpn.bnerd.net/gateway"
LABEL_KIND = "vpn.bnerd.net/gateway-kind"
LABEL_INSTANCE = "vpn.bnerd.net/operator"
LABEL_NAMESPACE = "vpn.bnerd.net/gateway-namespace"
"""On the objects in the gateway namespace: the namespace of the gateway they belong to."""
LABEL_OWNER_UID = "vpn.bnerd.net/owner-uid"
"""On the objects in the gateway namespace: the uid of the gateway (what an ownerReference would say)."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "vpngw-controller"
FIELD_MANAGER = "vpngw-controller"
FINALIZER = "vpn.bnerd.net/cleanup"
ANNOTATION_HASH = "vpn.bnerd.net/desired-hash"
"""On every owned object: the hash of what the controller last wanted it to be. A different hash means
our wish changed (rewrite it, dropping fields we no longer set); an equal hash with fields that differ
means someone else edited it (restore it)."""
ANNOTATION_NIC_MAC = "vpn.bnerd.net/nic-mac"
LABEL_TENANT = "vpn.bnerd.net/tenant"
"""On a namespace (``enabled``): its gateways are served. Set by whoever administers namespaces."""
TENANT_ENABLED = "enabled"
LABEL_GATEWAY_SECRET = gwplan.SECRET_OPT_IN_LABEL
"""On a Secret (``"true"``): its owner means it for gateways. Only such Secrets are ever granted to a
gateway pod or read by one, whatever a CR references (docs/security.md)."""
LABEL_HA_SLOT = "vpn.bnerd.net/ha-slot"
"""On slot b's objects and pods of an HA gateway (value ``b``, docs/ha.md "Slots"). Slot a's carry none:
its objects and pod template are those of a gateway without HA, so enabling HA leaves its pod alone."""
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
        """The name of the gateway's objects in its own (the tenant's) namespace."""
        return f"{self._prefix}-{self.name}"

    @property
    def home_name(self) -> str:
        """The name of the gateway's objects in the gateway namespace: unique across tenants (a hash of
        kind, namespace and name: ``a-b``/``c`` and ``a``/``b-c`` never meet), readable, and at most 63
        characters (a DNS label, so it fits every kind and a label value)."""
        digest = hashlib.sha256(f"{self.kind}/{self.namespace}/{self.name}".encode()).hexdigest()[:16]
        return f"{self._prefix}-{self.name[:36].rstrip('-')}-{digest}"

    def slot_name(self, slot: HaSlot) -> str:
        """The name of an HA slot's ConfigMap, NAD and Deployment: slot a's are ``home_name`` (a gateway
        without HA has slot a only), slot b's ``<home_name>-b`` (at most 61 characters; ``home_name``
        ends in its hash, so never in ``-b``)."""
        return self.home_name if slot == "a" else f"{self.home_name}-b"

    @property
    def _prefix(self) -> str:
        return "vpngw" if self.kind == "VPNGateway" else "ipsecgw"


def key_of(obj: Mapping[str, Any]) -> GatewayKey:
    md = obj.get("metadata") or {}
    kind = obj.get("kind")
    if kind not in GATEWAY_KINDS:
        raise ValueError(f"{kind!r} is not a gateway kind")
    return GatewayKey(kind, str(md.get("namespace")), str(md.get("name")))


def labels(key: GatewayKey, instance: str) -> dict[str, str]:
    return {
        **selector_labels(key),
        LABEL_INSTANCE: instance,
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "vpngw-gateway",
        "app.kubernetes.io/instance": key.object_name[:63].rstrip("-"),
    }


def selector_labels(key: GatewayKey) -> dict[str, str]:
    """The labels a gateway's pod is selected by (a Deployment's selector is immutable: never change).
    The gateway's namespace is one of them: in the gateway namespace, gateways of one name from two
    tenants meet."""
    return {LABEL_GATEWAY: key.name, LABEL_KIND: key.kind, LABEL_NAMESPACE: key.namespace}


def home_labels(key: GatewayKey, instance: str, uid: str) -> dict[str, str]:
    """The labels of the gateway's objects in the gateway namespace: whose they are, in place of an
    ownerReference (which cannot point across namespaces)."""
    return {**labels(key, instance), LABEL_OWNER_UID: uid}


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
    """The gateway that owns ``obj``: its labels in the gateway namespace, else its controller
    ownerReference, if any."""
    md = obj.get("metadata") or {}
    lbl = md.get("labels") or {}
    if lbl.get(LABEL_KIND) in GATEWAY_KINDS and LABEL_NAMESPACE in lbl and LABEL_GATEWAY in lbl:
        return GatewayKey(lbl[LABEL_KIND], str(lbl[LABEL_NAMESPACE]), str(lbl[LABEL_GATEWAY]))
    for ref in md.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in GATEWAY_KINDS:
            api = str(ref.get("apiVersion", ""))
            if api in (f"{VPN_GROUP}/{VERSION}", f"{LEGACY_GROUP}/{VERSION}"):
                return GatewayKey(ref["kind"], str(md.get("namespace")), str(ref.get("name")))
    return None
