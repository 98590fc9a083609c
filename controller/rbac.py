"""The Kubernetes rights the controller needs, declared once, next to the code that uses them. Pure data.

Least privilege, per scope: cluster-wide only what gateways in any namespace need (their CRs, the pods'
rights in their namespaces, nodes, namespaces); the gateway pods' objects only in the gateway namespace;
Secrets only in the tenant namespaces the platform opts in (never cluster-wide); an earlier release's
leftovers only while migrating. The chart's Roles are generated from this (``python -m controller rbac``;
``make chart``), a test fails when the chart drifts from it, and another runs the controller with exactly
these rights in the API emulator (which enforces RBAC, escalation checks included) and compares them with
what it actually did: nothing is granted that the code does not use (the seed's config/rbac vs chart
drift, closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from controller.api.resources import LEGACY_GROUP, VPN_GROUP


@dataclass(frozen=True)
class Right:
    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def rule(self) -> dict[str, Any]:
        return {"apiGroups": [self.api_group], "resources": list(self.resources), "verbs": list(self.verbs)}


WATCH = ("list", "watch")
OWN = ("list", "watch", "create", "update")
OWN_DELETE = ("list", "watch", "create", "update", "delete")


@dataclass(frozen=True)
class Scope:
    """One Role or ClusterRole of the controller's, and where it is bound."""

    name: str
    """The chart's name suffix and its generated rules file (``files/controller-<name>-rules.yaml``)."""
    kind: Literal["ClusterRole", "Role"]
    bound: Literal["cluster", "gateway-namespace", "operator-namespace", "each-tenant-namespace", "migration"]
    """``cluster``: a ClusterRoleBinding; ``gateway-namespace``/``operator-namespace``: a Role and its
    RoleBinding there; ``each-tenant-namespace``: a ClusterRole bound by a RoleBinding in each tenant
    namespace the platform opts in (``tenants.namespaces`` in the chart); ``migration``: the same, only
    while the chart's ``migration.enabled`` is on."""
    rights: tuple[Right, ...]
    what: str


GATEWAYS = "controller.run informers"
CLUSTER = Scope(
    "cluster",
    "ClusterRole",
    "cluster",
    (
        Right(VPN_GROUP, ("vpngateways", "vpnpeers"), WATCH, GATEWAYS),
        Right(LEGACY_GROUP, ("ipsecgateways", "clusterlinks"), WATCH, GATEWAYS),
        Right(VPN_GROUP, ("vpngateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
        Right(LEGACY_GROUP, ("ipsecgateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
        Right(
            VPN_GROUP,
            ("vpngateways/status",),
            ("patch",),
            "controller.execute: conditions, nodeName, publicIP",
        ),
        Right(
            VPN_GROUP,
            ("vpnpeers/status",),
            ("patch",),
            "controller.execute: a peer's observedGeneration, and Admitted False for one left out of the "
            "plan (and RBAC lets it grant a gateway pod patch on its planned VPNPeers' status only with it)",
        ),
        Right(
            LEGACY_GROUP,
            ("ipsecgateways/status",),
            ("patch",),
            "controller.execute: conditions, nodeName, publicIP",
        ),
        Right(
            VPN_GROUP,
            ("vpngateways/finalizers",),
            ("update",),
            "never used: OwnerReferencesPermissionEnforcement (OpenShift, hardened clusters) lets the "
            "controller set blockOwnerDeletion on the gateway's Role in its namespace only with it",
        ),
        Right(
            LEGACY_GROUP,
            ("ipsecgateways/finalizers",),
            ("update",),
            "never used: OwnerReferencesPermissionEnforcement (blockOwnerDeletion on the gateway's Role)",
        ),
        Right("", ("nodes",), WATCH, "controller.run: placement"),
        Right(
            "", ("namespaces",), WATCH, "controller.run: which namespaces are enabled (vpn.bnerd.net/tenant)"
        ),
        Right("", ("events",), ("create",), "controller.execute: Events on condition changes"),
    ),
    "The controller's ClusterRole: the CRs in every namespace, nodes, which namespaces are enabled.",
)
GATEWAY_NAMESPACE = Scope(
    "gateway-namespace",
    "Role",
    "gateway-namespace",
    (
        Right(
            "",
            ("configmaps", "serviceaccounts"),
            OWN_DELETE,
            "controller.desired: the plan, the pod's identity (deleted by the gateway's finalizer)",
        ),
        Right(
            "",
            ("configmaps",),
            ("get",),
            "never used by the controller (its informer lists and watches): the gateway pods' Roles grant it",
        ),
        Right(
            "rbac.authorization.k8s.io",
            ("roles", "rolebindings"),
            OWN_DELETE,
            "controller.desired: the pod's right to read its plan (deleted by the gateway's finalizer)",
        ),
        Right(
            "networking.k8s.io", ("networkpolicies",), OWN_DELETE, "controller.desired: the pod's eth0 policy"
        ),
        Right("apps", ("deployments",), OWN_DELETE, "controller.desired: the gateway pod"),
        Right(
            "k8s.cni.cncf.io",
            ("network-attachment-definitions",),
            OWN_DELETE,
            "controller.desired: NIC2 by MAC",
        ),
        Right(
            "coordination.k8s.io",
            ("leases",),
            ("list", "watch", "create", "delete"),
            "controller.desired: an HA gateway's Lease, created with no holder and never written again; "
            "deleted with its gateway or when HA is turned off",
        ),
        Right(
            "coordination.k8s.io",
            ("leases",),
            ("get", "update"),
            "never used by the controller in the gateway namespace (it never writes a Lease there after "
            "creating it): an HA gateway's pods' Role grants them on its Lease",
        ),
        Right("", ("pods",), WATCH, "controller.run: PodReady"),
        Right(
            "",
            ("pods",),
            ("delete",),
            "controller.run: a gateway pod left on a dead node once it cannot serve (placement.stranded), "
            "with grace 0",
        ),
    ),
    "The controller's Role in the gateway namespace: the gateway pods and their objects.",
)
TENANT_NAMESPACE = Scope(
    "tenant",
    "ClusterRole",
    "each-tenant-namespace",
    (
        Right(
            "",
            ("secrets",),
            WATCH,
            "controller.run: which Secrets are opted in for gateways (their metadata only); and RBAC lets "
            "the controller grant a gateway pod get/list/watch of its Secrets only if it holds them there",
        ),
        Right(
            "",
            ("secrets",),
            ("get",),
            "never used by the controller: RBAC lets it grant the gateway pods get on their Secrets only "
            "if it holds it there",
        ),
        Right(
            "rbac.authorization.k8s.io",
            ("roles", "rolebindings"),
            OWN,
            "controller.desired: the pod's rights in its tenant's namespace (its CR's status, its Secrets; "
            "RBAC's escalation check confines them to what the controller holds there)",
        ),
        Right(
            "rbac.authorization.k8s.io",
            ("roles", "rolebindings"),
            ("delete",),
            "never used (the garbage collector deletes them): OwnerReferencesPermissionEnforcement lets "
            "the controller set an object's ownerReferences only with delete on it",
        ),
    ),
    "Bound in each tenant namespace the platform opts in: its Secrets and the gateway pods' Roles there, "
    "never cluster-wide.",
)
MIGRATION = Scope(
    "migration",
    "ClusterRole",
    "migration",
    (
        Right(
            "",
            ("configmaps", "serviceaccounts", "pods"),
            WATCH,
            "controller.run (--migrate): what an earlier release left in the tenant's namespace",
        ),
        Right(
            "",
            ("configmaps", "serviceaccounts"),
            ("delete",),
            "controller.reconcile (--migrate): an earlier release's objects in the tenant's namespace",
        ),
        Right(
            "networking.k8s.io",
            ("networkpolicies",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in the tenant's namespace",
        ),
        Right(
            "apps",
            ("deployments",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in the tenant's namespace",
        ),
        Right(
            "k8s.cni.cncf.io",
            ("network-attachment-definitions",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in the tenant's namespace",
        ),
    ),
    "Bound in each tenant namespace while migrating from a release that ran gateways there "
    "(migration.enabled).",
)
LEADER_ELECTION = Scope(
    "leader-election",
    "Role",
    "operator-namespace",
    (Right("coordination.k8s.io", ("leases",), ("get", "create", "update"), "controller.leader"),),
    "The controller's Role in its own namespace: the leader-election Lease.",
)
SCOPES: tuple[Scope, ...] = (CLUSTER, GATEWAY_NAMESPACE, TENANT_NAMESPACE, MIGRATION, LEADER_ELECTION)

UNUSED_BY_DESIGN = frozenset(
    {
        ("", "secrets", "get"),
        ("", "configmaps", "get"),
        (VPN_GROUP, "vpngateways/finalizers", "update"),
        (LEGACY_GROUP, "ipsecgateways/finalizers", "update"),
    }
)
"""Held for RBAC's escalation rule and for OwnerReferencesPermissionEnforcement only: creating a Role needs
the rights it grants (a gateway pod's Roles grant get/list/watch of its Secrets and its ConfigMap), and
setting an ownerReference with blockOwnerDeletion needs update on the owner's finalizers. Never exercised:
a test proves the controller never gets a Secret (its Secret cache asks for metadata only). The delete of
roles and rolebindings in tenant namespaces is held for the same plugin (the controller uses that verb in
the gateway namespace only)."""


def rules(scope: Scope) -> list[dict[str, Any]]:
    return [r.rule() for r in scope.rights]


def granted(scopes: tuple[Scope, ...] = SCOPES) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) of every declared right."""
    return {(r.api_group, res, v) for s in scopes for r in s.rights for res in r.resources for v in r.verbs}
