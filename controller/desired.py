"""The Kubernetes objects a gateway should have, as plain API documents. Pure: data in, documents out.

Per gateway (``controller.names`` names them all ``vpngw-<name>``, owned by the gateway):

* ConfigMap: the plan (``plan.json``; gzip in ``binaryData`` past ``GZIP_ABOVE`` bytes, still under the
  key ``plan.json``: ``gwplan.loads`` tells the two apart, so the pod's volume never changes);
* NetworkAttachmentDefinition: the operator's NAD template with NIC2's MAC (host-device by MAC);
* ServiceAccount, Role, RoleBinding: exactly what the pod does through the API (patch its own CR's
  status; read its plan ConfigMap and the Secrets the plan references, each by name);
* NetworkPolicy for eth0: ingress to the metrics port from the monitoring namespace only; egress to
  cluster DNS and the API server only (NIC2 is outside NetworkPolicy's reach: docs/controller.md);
* Deployment: the gateway pod (``controller.podspec``).

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


@dataclass(frozen=True)
class Desired:
    objects: tuple[Obj, ...]
    held: frozenset[str]
    """Kinds to leave as they are (neither created, changed nor deleted): they cannot be decided now."""


def content_hash(obj: Mapping[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != "metadata"}
    md = obj.get("metadata", {})
    body["metadata"] = {k: md.get(k) for k in ("labels", "annotations") if k in md}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def _meta(inputs: Inputs, annotations: Mapping[str, str] | None = None) -> Obj:
    md: Obj = {
        "name": inputs.key.object_name,
        "namespace": inputs.key.namespace,
        "labels": labels(inputs.key, inputs.settings.instance),
        "ownerReferences": [owner_reference(inputs.key, inputs.uid)],
    }
    if annotations:
        md["annotations"] = dict(annotations)
    return md


def _stamped(obj: Obj) -> Obj:
    """``obj`` with its desired-hash annotation (the hash covers everything else of it)."""
    h = content_hash(obj)
    obj["metadata"].setdefault("annotations", {})[ANNOTATION_HASH] = h
    return obj


def config_map(inputs: Inputs) -> Obj:
    data = gwplan.dumps(inputs.plan)
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(inputs)}
    if len(data) > GZIP_ABOVE:
        obj["binaryData"] = {PLAN_KEY: base64.b64encode(gzip.compress(data, mtime=0)).decode()}
    else:
        obj["data"] = {PLAN_KEY: data.decode()}
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
        mac=nic.mac, name=inputs.key.object_name, namespace=inputs.key.namespace
    )
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": _meta(inputs),
        "spec": {"config": config},
    }


def service_account(inputs: Inputs) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(inputs),
        "automountServiceAccountToken": True,
    }


def role(inputs: Inputs) -> Obj:
    key = inputs.key
    rules: list[Obj] = [
        {
            "apiGroups": [key.group],
            "resources": [f"{key.plural}/status"],
            "resourceNames": [key.name],
            "verbs": ["patch"],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [key.object_name],
            "verbs": ["get", "list", "watch"],
        },
    ]
    secrets = gwplan.secret_names(inputs.plan)
    if secrets:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": secrets,
                "verbs": ["get", "list", "watch"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(inputs),
        "rules": rules,
    }


def role_binding(inputs: Inputs) -> Obj:
    name = inputs.key.object_name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(inputs),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": inputs.key.namespace}],
    }


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
                    "ports": [{"protocol": "TCP", "port": inputs.settings.pod.metrics_port}],
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
    # The Role before the ConfigMap: a plan that references a new Secret reaches a pod that may read it.
    objects: list[Obj] = [service_account(inputs), role(inputs), role_binding(inputs), network_policy(inputs)]
    objects.append(config_map(inputs))
    held: set[str] = set()
    if inputs.nic is None:
        held |= {"NetworkAttachmentDefinition", "Deployment"}
    else:
        objects.append(nad(inputs, inputs.nic))
        if inputs.node is None:
            held.add("Deployment")
        else:
            objects.append(deployment(inputs, inputs.nic, inputs.node))
    return Desired(tuple(_stamped(o) for o in objects), frozenset(held))


OWNED_KINDS: Sequence[str] = (
    "ConfigMap",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "NetworkAttachmentDefinition",
    "Deployment",
)
