"""The Kubernetes objects a gateway should have, as plain API documents. Pure: data in, documents out.

Per gateway, in the operator's gateway namespace (``controller.names``: named ``home_name``, labelled
with the gateway's namespace and uid in place of an ownerReference):

* ConfigMap: the plan (``plan.json``; gzip in ``binaryData`` past ``GZIP_ABOVE`` bytes, still under the
  key ``plan.json``: ``gwplan.loads`` tells the two apart, so the pod's volume never changes);
* NetworkAttachmentDefinition: the operator's NAD template with NIC2's MAC (host-device by MAC);
* ServiceAccount, Role, RoleBinding: the pod may read its plan ConfigMap (by name), nothing else there;
* NetworkPolicy for eth0: ingress to the metrics port from the monitoring namespace only; egress to
  cluster DNS and the API server only (NIC2 is outside NetworkPolicy's reach: docs/controller.md);
* Deployment: the gateway pod (``controller.podspec``).

And in the tenant's namespace (``object_name``, owned by the gateway): a Role and a RoleBinding for the
pod's ServiceAccount: patch its own CR's status and its planned VPNPeers' (``gwplan.peer_names``; a
VPNPeer lives in its gateway's namespace), read the Secrets its plan references, each by name and
only those their owners opted in (``names.LABEL_GATEWAY_SECRET``).

Each object has a slot: its kind, or ``Tenant<kind>`` for the two in the tenant's namespace.

A plan change (peers, grants, Secret references) changes the ConfigMap and the Role, never the pod
template: the pod follows its plan live. Only the image, the node, NIC2's MAC or the pod's shape
change the template (and roll the pod).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gwplan
from controller import podspec
from controller.names import (
    ANNOTATION_HASH,
    PLAN_KEY,
    GatewayKey,
    home_labels,
    labels,
    owner_reference,
    selector_labels,
)
from controller.settings import Settings

GZIP_ABOVE = 512 * 1024
"""A ConfigMap holds at most 1 MiB; JSON plans pass that at about 600 peers (gzip: ~10x smaller)."""

Obj = dict[str, Any]


@dataclass(frozen=True)
class Nic2:
    """NIC2 as the cloud backend reports it."""

    mac: str
    address: str
    gateway: str


@dataclass(frozen=True)
class Inputs:
    key: GatewayKey
    uid: str
    plan: gwplan.Plan
    """The plan in force: the one just rendered, or (when the CR is invalid) the one already deployed."""
    settings: Settings
    nic: Nic2 | None
    """None: the cloud has no NIC2 for this gateway yet (no NAD, no pod until it has)."""
    node: str | None
    """The node the gateway is pinned to; None: no node can take it (the Deployment is left as it is)."""
    secrets: frozenset[str] | None = None
    """The Secrets of the gateway's namespace its pod may be granted (opted in by their owners); None:
    every one the plan references (the offline tools)."""


@dataclass(frozen=True)
class Desired:
    objects: tuple[tuple[str, Obj], ...]
    """(slot, object) in the order they are to be written."""
    held: frozenset[str]
    """Slots to leave as they are (neither created, changed nor deleted): they cannot be decided now."""

    def get(self, slot: str) -> Obj | None:
        return next((o for s, o in self.objects if s == slot), None)


def content_hash(obj: Mapping[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != "metadata"}
    md = obj.get("metadata", {})
    body["metadata"] = {k: md.get(k) for k in ("labels", "annotations") if k in md}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def _meta(inputs: Inputs) -> Obj:
    """Metadata of an object in the gateway namespace."""
    return {
        "name": inputs.key.home_name,
        "namespace": inputs.settings.gateway_namespace,
        "labels": home_labels(inputs.key, inputs.settings.instance, inputs.uid),
    }


def _tenant_meta(inputs: Inputs) -> Obj:
    """Metadata of an object in the gateway's own (the tenant's) namespace."""
    return {
        "name": inputs.key.object_name,
        "namespace": inputs.key.namespace,
        "labels": labels(inputs.key, inputs.settings.instance),
        "ownerReferences": [owner_reference(inputs.key, inputs.uid)],
    }


def _stamped(obj: Obj) -> Obj:
    """``obj`` with its desired-hash annotation (the hash covers everything else of it)."""
    h = content_hash(obj)
    obj["metadata"].setdefault("annotations", {})[ANNOTATION_HASH] = h
    return obj


CONFIG_MAP_MAX = 1024 * 1024
"""The API server refuses a ConfigMap whose ``data`` and (decoded) ``binaryData`` hold more bytes
(``ValidateConfigMap``, kubernetes pkg/apis/core/validation/validation.go: ``core.MaxSecretSize``)."""
NIC_ROOM = 4096
"""What the NIC, filled in after the render, may add to a plan."""


def stored_plan(data: bytes) -> tuple[str, bytes]:
    """The ConfigMap field a plan (``gwplan.dumps``) goes to, and its bytes there (``binaryData``:
    before base64)."""
    if len(data) > GZIP_ABOVE:
        return "binaryData", gzip.compress(data, mtime=0)
    return "data", data


def too_large(plan: gwplan.Plan) -> str | None:
    """Why ``plan`` cannot be stored or loaded (None: it can): no ConfigMap write may fail on size,
    and no pod may be handed a plan it refuses."""
    raw = gwplan.dumps(plan)
    if len(raw) + NIC_ROOM > gwplan.MAX_PLAN_BYTES:
        return (
            f"renders a plan of {len(raw)} bytes; a gateway pod loads at most {gwplan.MAX_PLAN_BYTES}: "
            "split its peers over more gateways"
        )
    field, payload = stored_plan(raw)
    if len(payload) + NIC_ROOM > CONFIG_MAP_MAX:
        return (
            f"renders a plan of {len(payload)} bytes in the ConfigMap's {field} (gzip of {len(raw)}); the "
            f"API server takes at most {CONFIG_MAP_MAX}: split its peers over more gateways"
        )
    return None


def config_map(inputs: Inputs) -> Obj:
    """Exactly the plan, under one key: anything else someone added (another key, a ``binaryData``
    copy) is not ours and goes at the next write (``diff`` replaces the whole object's data)."""
    field, payload = stored_plan(gwplan.dumps(inputs.plan))
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(inputs)}
    if field == "binaryData":
        obj["binaryData"] = {PLAN_KEY: base64.b64encode(payload).decode()}
    else:
        obj["data"] = {PLAN_KEY: payload.decode()}
    return obj


def plan_of(config_map: Mapping[str, Any]) -> gwplan.Plan:
    """The plan stored in a ConfigMap (raises gwplan.PlanError)."""
    if PLAN_KEY in (config_map.get("binaryData") or {}):
        try:
            raw = base64.b64decode(config_map["binaryData"][PLAN_KEY], validate=True)
        except ValueError as exc:
            raise gwplan.PlanError(f"binaryData.{PLAN_KEY}: not base64") from exc
        return gwplan.loads(raw)
    text = (config_map.get("data") or {}).get(PLAN_KEY)
    if not isinstance(text, str):
        raise gwplan.PlanError(f"data.{PLAN_KEY}: missing")
    return gwplan.loads(text.encode())


def nad(inputs: Inputs, nic: Nic2) -> Obj:
    config = string.Template(inputs.settings.pod.nad_template).substitute(
        mac=nic.mac, name=inputs.key.home_name, namespace=inputs.settings.gateway_namespace
    )
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": _meta(inputs),
        "spec": {"config": config},
    }


def service_account(inputs: Inputs) -> Obj:
    """The pod's identity. No token is mounted by default: only the status-agent's container gets one
    (a projected volume, ``controller.podspec``); charon, init-nat and the exporter have none."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(inputs),
        "automountServiceAccountToken": False,
    }


def role(inputs: Inputs) -> Obj:
    """In the gateway namespace: the pod reads its plan ConfigMap, by name, and nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(inputs),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [inputs.key.home_name],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def granted_secrets(inputs: Inputs) -> list[str]:
    """The Secrets the pod may read: those its plan references that their owners opted in."""
    names = gwplan.secret_names(inputs.plan)
    return names if inputs.secrets is None else [n for n in names if n in inputs.secrets]


def tenant_role(inputs: Inputs) -> Obj:
    """In the tenant's namespace: the pod patches its own CR's status and its planned VPNPeers' statuses,
    and reads its Secrets, each by name."""
    key = inputs.key
    rules: list[Obj] = [
        {
            "apiGroups": [key.group],
            "resources": [f"{key.plural}/status"],
            "resourceNames": [key.name],
            "verbs": ["patch"],
        }
    ]
    secrets = granted_secrets(inputs)
    if secrets:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": secrets,
                "verbs": ["get", "list", "watch"],
            }
        )
    peers = gwplan.peer_names(inputs.plan)
    if peers:  # each planned VPNPeer's own status (agent.sink.WithPeerStatus), scoped as the CR's is
        rules.append(
            {
                "apiGroups": [key.group],
                "resources": ["vpnpeers/status"],
                "resourceNames": peers,
                "verbs": ["patch"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _tenant_meta(inputs),
        "rules": rules,
    }


def _binding(inputs: Inputs, meta: Obj, role_name: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": inputs.key.home_name,
                "namespace": inputs.settings.gateway_namespace,
            }
        ],
    }


def role_binding(inputs: Inputs) -> Obj:
    return _binding(inputs, _meta(inputs), inputs.key.home_name)


def tenant_role_binding(inputs: Inputs) -> Obj:
    return _binding(inputs, _tenant_meta(inputs), inputs.key.object_name)


def needs_dns(plan: gwplan.Plan) -> bool:
    """Whether the pod resolves names: an exposure's ``target.host`` (init-nat), a peer's hostname endpoint
    (charon or the WireGuard agent). Otherwise everything it talks to is an address (the API server's
    too: the in-cluster config carries its IP), and the pod gets no DNS at all (observed on eth0,
    docs/e2e.md)."""
    if any(e.target_host for e in plan.nat.exposures):
        return True
    if plan.ipsec is not None:
        for t in plan.ipsec.tunnels:
            for body in t.conn.values():
                for addr in body.get("remote_addrs") or []:
                    if addr != "%any" and not _is_ip(str(addr)):
                        return True
    if plan.wireguard is not None:
        for p in plan.wireguard.peers:
            if p.endpoint and not _is_ip(p.endpoint.rpartition(":")[0].strip("[]")):
                return True
    return False


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def scraped_ports(settings: Settings) -> tuple[int, ...]:
    """The pod's ports Prometheus scrapes (the chart's PodMonitor lists the same, by name): the exporter's
    (``metrics``: the tunnels) and the status-agent's (``health``: its ``/metrics``, vpngw_build_info and
    its process; its probes are there too, which tell nothing secret)."""
    return (settings.pod.metrics_port, settings.pod.health_port)


def network_policy(inputs: Inputs) -> Obj:
    np = inputs.settings.network_policy
    ns_label = "kubernetes.io/metadata.name"
    egress: list[Obj] = []
    if needs_dns(inputs.plan):
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {ns_label: np.dns_namespace}},
                        "podSelector": {"matchLabels": dict(np.dns_pod_labels)},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    if np.api_server:
        egress += [
            {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}
            for cidr, port in np.api_server
        ]
    else:
        egress.append({"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(inputs),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(inputs.key)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {ns_label: np.monitoring_namespace}}}],
                    "ports": [{"protocol": "TCP", "port": port} for port in scraped_ports(inputs.settings)],
                }
            ],
            "egress": egress,
        },
    }


def deployment(inputs: Inputs, nic: Nic2, node: str) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(inputs),
        "spec": podspec.deployment_spec(inputs.key, inputs.plan, inputs.settings, nic.mac, node),
    }


def desired(inputs: Inputs) -> Desired:
    """Every object the gateway should have now, each stamped with its desired hash."""
    # The Roles before the ConfigMap: a plan that references a new Secret reaches a pod that may read it.
    objects: list[tuple[str, Obj]] = [
        ("ServiceAccount", service_account(inputs)),
        ("Role", role(inputs)),
        ("RoleBinding", role_binding(inputs)),
        ("TenantRole", tenant_role(inputs)),
        ("TenantRoleBinding", tenant_role_binding(inputs)),
        ("NetworkPolicy", network_policy(inputs)),
        ("ConfigMap", config_map(inputs)),
    ]
    held: set[str] = set()
    if inputs.nic is None:
        held |= {"NetworkAttachmentDefinition", "Deployment"}
    else:
        objects.append(("NetworkAttachmentDefinition", nad(inputs, inputs.nic)))
        if inputs.node is None:
            held.add("Deployment")
        else:
            objects.append(("Deployment", deployment(inputs, inputs.nic, inputs.node)))
    return Desired(tuple((slot, _stamped(o)) for slot, o in objects), frozenset(held))


def slot_of(obj: Mapping[str, Any], gateway_namespace: str) -> str:
    """The slot of one of a gateway's objects: its kind in the gateway namespace; ``Tenant<kind>`` for
    its Role and RoleBinding in its own namespace; ``Leftover<kind>`` for what an earlier release made
    there."""
    kind = str(obj["kind"])
    if (obj.get("metadata") or {}).get("namespace") == gateway_namespace:
        return kind
    return f"Tenant{kind}" if f"Tenant{kind}" in TENANT_SLOTS else f"Leftover{kind}"


HOME_KINDS: Sequence[str] = (
    "ConfigMap",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "NetworkAttachmentDefinition",
    "Deployment",
)
"""The kinds a gateway owns in the gateway namespace (each its own slot)."""
TENANT_SLOTS: Mapping[str, str] = {"TenantRole": "Role", "TenantRoleBinding": "RoleBinding"}
"""Slot -> kind of what a gateway owns in its own namespace."""
OWNED_SLOTS: Sequence[str] = (*HOME_KINDS, *TENANT_SLOTS)
LEFTOVER_KINDS: Sequence[str] = (
    "Deployment",
    "ConfigMap",
    "NetworkAttachmentDefinition",
    "NetworkPolicy",
    "ServiceAccount",
)
"""What an earlier release made in the tenant's namespace (named ``object_name``) and this one makes in
the gateway namespace: deleted once found (``Settings.migrate``); the Role and RoleBinding of that name
are this release's tenant slots, rewritten in place."""
