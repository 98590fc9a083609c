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

An HA gateway (``Inputs.ha``, docs/ha.md "The build contract") has two pods, slots a and b. Slot a's
objects are the ones above, unchanged (enabling HA rolls no pod); its plan gains the ``ha`` section. Slot b
adds its own ConfigMap (the plan on slot b's NIC2), NAD and Deployment (pinned to its own node), all named
``<home_name>-b`` and labelled ``names.LABEL_HA_SLOT``; and a ``coordination.k8s.io/v1`` Lease named
``home_name``, created with no holder and never written again (``diff.CREATE_ONLY``: its holder and
renewals are the agents'). The pods' Role grants both ConfigMaps and ``get``/``update`` of that Lease,
each by name: RBAC cannot restrict ``create`` by name, so the agents never create it.

Each object has a slot: its kind, or ``Tenant<kind>`` for the two in the tenant's namespace; slot b's
``<kind>/b``; the Lease ``Lease`` (``HOME_SLOTS``).

A plan change (peers, grants, Secret references) changes the ConfigMap and the Role, never the pod
template: the pod follows its plan live. Only the image, the node, NIC2's MAC or the pod's shape
change the template (and roll the pod).
"""

from __future__ import annotations

import base64
import dataclasses
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
    LABEL_HA_SLOT,
    PLAN_KEY,
    GatewayKey,
    HaSlot,
    home_labels,
    labels,
    owner_reference,
    selector_labels,
)
from controller.plan.render import with_nic
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
class HaInputs:
    """What an HA gateway's slot b needs beyond slot a's (``Inputs``): which slot is active is the
    Lease's decision, never the slots'."""

    node: str | None
    """The node slot b is pinned to (never slot a's: ``controller.ha`` places the pair); None: no node can
    take it (its Deployment is left as it is)."""
    nic: Nic2 | None
    """Slot b's own NIC2 (its Neutron port, tagged ``vpngw-slot:b``); None: the cloud has none yet (no
    ConfigMap, NAD or pod for slot b until it has)."""
    lease: gwplan.Ha
    """The Lease's timings, for both slots' plans. Its name is always ``home_name``, whatever ``lease``
    says there: the Lease object, the pods' Role and both plans agree by construction."""
    public_slot: HaSlot | None = None
    """The slot the cloud put the gateway's public address on (``CloudState.floating_ip_slot``): only that
    slot's plan says ``publicHere``, so only its pod, once active, starts anything towards the peers.
    None: the cloud does not say (the static backend): both may."""


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
    ha: HaInputs | None = None
    """Warm-standby HA: ``nic`` and ``node`` are then slot a's, this is slot b's. None: a gateway without
    HA (slot a's objects only; the plan without ``ha``)."""


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


def _meta(inputs: Inputs, slot: HaSlot = "a") -> Obj:
    """Metadata of an object in the gateway namespace (of ``slot``'s: slot b's are named and labelled as
    such)."""
    return {
        "name": inputs.key.slot_name(slot),
        "namespace": inputs.settings.gateway_namespace,
        "labels": {
            **home_labels(inputs.key, inputs.settings.instance, inputs.uid),
            **podspec.slot_labels(slot),
        },
    }


def lease_settings(inputs: Inputs) -> gwplan.Ha | None:
    """The plans' ``ha`` section: the Lease named ``home_name`` (None: no HA)."""
    if inputs.ha is None:
        return None
    return dataclasses.replace(inputs.ha.lease, lease=inputs.key.home_name)


def slot_plan(inputs: Inputs, slot: HaSlot = "a") -> gwplan.Plan:
    """The plan ``slot``'s pod gets: the plan in force, with the ``ha`` section when HA is on; slot b's on
    its own NIC2 (``with_nic``, as the reconcile puts slot a's on slot a's). Slot b without a NIC2 has no
    plan (``desired`` holds its objects)."""
    plan = inputs.plan
    ha = lease_settings(inputs)
    if ha is not None:
        public = inputs.ha is None or inputs.ha.public_slot in (None, slot)
        plan = dataclasses.replace(plan, ha=dataclasses.replace(ha, public_here=public))
    if slot == "a":
        return plan
    nic = inputs.ha.nic if inputs.ha is not None else None
    if nic is None:
        raise ValueError("slot b has no plan without HA and its NIC2")
    return with_nic(
        plan, dataclasses.replace(plan.nic, mac=nic.mac, address=nic.address, gateway=nic.gateway)
    )


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


def config_map(inputs: Inputs, slot: HaSlot = "a") -> Obj:
    """Exactly ``slot``'s plan, under one key: anything else someone added (another key, a ``binaryData``
    copy) is not ours and goes at the next write (``diff`` replaces the whole object's data)."""
    field, payload = stored_plan(gwplan.dumps(slot_plan(inputs, slot)))
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(inputs, slot)}
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


def nad(inputs: Inputs, nic: Nic2, slot: HaSlot = "a") -> Obj:
    config = string.Template(inputs.settings.pod.nad_template).substitute(
        mac=nic.mac, name=inputs.key.slot_name(slot), namespace=inputs.settings.gateway_namespace
    )
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": _meta(inputs, slot),
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
    """In the gateway namespace: the pod reads its plan ConfigMap, by name, and nothing else. An HA
    gateway's pods (one ServiceAccount for both slots) read both slots' ConfigMaps and get and update
    their Lease, each by name; never ``create`` (RBAC cannot restrict it by name: the controller creates
    the Lease) nor ``delete``."""
    key = inputs.key
    rules: list[Obj] = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [key.home_name]
            if inputs.ha is None
            else [key.slot_name("a"), key.slot_name("b")],
            "verbs": ["get", "list", "watch"],
        }
    ]
    if inputs.ha is not None:
        rules.append(
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [key.home_name],
                "verbs": ["get", "update"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(inputs),
        "rules": rules,
    }


def lease(inputs: Inputs, ha: gwplan.Ha) -> Obj:
    """The HA gateway's Lease, with no holder: the first agent to find it free takes it. Created once and
    never written again by the controller (``diff.CREATE_ONLY``)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": _meta(inputs),
        "spec": {"leaseDurationSeconds": ha.lease_duration_seconds},
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


def deployment(inputs: Inputs, nic: Nic2, node: str, slot: HaSlot = "a") -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(inputs, slot),
        "spec": podspec.deployment_spec(inputs.key, inputs.plan, inputs.settings, nic.mac, node, slot),
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
    ]
    ha = lease_settings(inputs)
    if ha is not None:  # before the plans that name it: an agent never finds its Lease missing
        objects.append(("Lease", lease(inputs, ha)))
    objects.append(("ConfigMap", config_map(inputs)))
    held: set[str] = set()
    if inputs.nic is None:
        held |= {"NetworkAttachmentDefinition", "Deployment"}
    else:
        objects.append(("NetworkAttachmentDefinition", nad(inputs, inputs.nic)))
        if inputs.node is None:
            held.add("Deployment")
        else:
            objects.append(("Deployment", deployment(inputs, inputs.nic, inputs.node)))
    if inputs.ha is not None:
        if inputs.ha.nic is None:
            held |= set(SLOT_B)
        else:
            objects += [
                ("ConfigMap/b", config_map(inputs, "b")),
                ("NetworkAttachmentDefinition/b", nad(inputs, inputs.ha.nic, "b")),
            ]
            if inputs.ha.node is None:
                held.add("Deployment/b")
            else:
                objects.append(("Deployment/b", deployment(inputs, inputs.ha.nic, inputs.ha.node, "b")))
    return Desired(tuple((slot, _stamped(o)) for slot, o in objects), frozenset(held))


def slot_of(obj: Mapping[str, Any], gateway_namespace: str) -> str:
    """The slot of one of a gateway's objects: its kind in the gateway namespace (``<kind>/b`` for an HA
    gateway's slot b's); ``Tenant<kind>`` for its Role and RoleBinding in its own namespace;
    ``Leftover<kind>`` for what an earlier release made there."""
    kind = str(obj["kind"])
    md = obj.get("metadata") or {}
    if md.get("namespace") == gateway_namespace:
        return f"{kind}/b" if (md.get("labels") or {}).get(LABEL_HA_SLOT) == "b" else kind
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
"""The kinds a gateway owns in the gateway namespace (each its own slot), HA or not."""
SLOT_B: Mapping[str, str] = {
    "Deployment/b": "Deployment",
    "NetworkAttachmentDefinition/b": "NetworkAttachmentDefinition",
    "ConfigMap/b": "ConfigMap",
}
"""Slot -> kind of an HA gateway's slot b's objects (named ``<home_name>-b``)."""
HA_SLOTS: Mapping[str, str] = {**SLOT_B, "Lease": "Lease"}
"""Slot -> kind of what only an HA gateway has in the gateway namespace, in the order they go when HA is
turned off (``diff.surplus``): the pod first, the Lease last."""
HOME_SLOTS: Mapping[str, str] = {**{k: k for k in HOME_KINDS}, **HA_SLOTS}
"""Slot -> kind of everything a gateway may own in the gateway namespace: what its finalizer deletes,
what goes when it is gone (``orphans``)."""
HOME_INFORMER_KINDS: Sequence[str] = tuple(dict.fromkeys(HOME_SLOTS.values()))
"""The kinds the controller caches in the gateway namespace for its gateways."""


def home_slots(key: GatewayKey) -> dict[str, tuple[str, str]]:
    """Slot -> (kind, name) of everything ``key`` may own in the gateway namespace."""
    return {slot: (kind, key.slot_name("b" if slot in SLOT_B else "a")) for slot, kind in HOME_SLOTS.items()}


TENANT_SLOTS: Mapping[str, str] = {"TenantRole": "Role", "TenantRoleBinding": "RoleBinding"}
"""Slot -> kind of what a gateway owns in its own namespace."""
OWNED_SLOTS: Sequence[str] = (*HOME_SLOTS, *TENANT_SLOTS)
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
