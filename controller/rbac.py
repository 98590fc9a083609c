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
    namespace the platform opts in (``tenants.namespaces`` in the chart); ``migration``: a
    ClusterRoleBinding only while the chart's ``migration.enabled`` is on."""
    rights: tuple[Right, ...]
    what: str


CLUSTER = Scope(
    "cluster",
    "ClusterRole",
    "cluster",
    (
        Right(VPN_GROUP, ("vpngateways", "vpnpeers"), WATCH, "controller.run informers"),
        Right(LEGACY_GROUP, ("ipsecgateways", "clusterlinks"), WATCH, "controller.run informers"),
        Right(VPN_GROUP, ("vpngateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
        Right(LEGACY_GROUP, ("ipsecgateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
        Right(
            VPN_GROUP,
            ("vpngateways/status",),
            ("patch",),
            "controller.execute: conditions, nodeName, publicIP",
        ),
        Right(
            LEGACY_GROUP,
            ("ipsecgateways/status",),
            ("patch",),
            "controller.execute: conditions, nodeName, publicIP",
        ),
        Right(
            "rbac.authorization.k8s.io",
            ("roles", "rolebindings"),
            OWN,
            "controller.desired: the pod's rights in its tenant's namespace (RBAC's escalation check limits "
            "them to what the controller holds there: its CR's status, and Secrets only where a tenant "
            "RoleBinding lets it read them)",
        ),
        Right("", ("nodes",), WATCH, "controller.run: placement"),
        Right(
            "", ("namespaces",), WATCH, "controller.run: which namespaces are enabled (vpn.bnerd.net/tenant)"
        ),
        Right("", ("events",), ("create",), "controller.execute: Events on condition changes"),
    ),
    "The controller's ClusterRole: the CRs in every namespace, the pods' rights there, nodes.",
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
            ("delete",),
            "controller.reconcile.cleanup: the pod's rights in the gateway namespace, by the finalizer",
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
        Right("", ("pods",), WATCH, "controller.run: PodReady"),
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
            "controller.run: which Secrets are opted in for gateways (metadata only is kept); and RBAC lets "
            "the controller grant a gateway pod get/list/watch of its Secrets only if it holds them there",
        ),
        Right(
            "",
            ("secrets",),
            ("get",),
            "never used by the controller: RBAC lets it grant the gateway pods get on their Secrets only "
            "if it holds it there",
        ),
    ),
    "Bound in each tenant namespace the platform opts in: the Secrets there, never cluster-wide.",
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
            "controller.run (--migrate): what an earlier release left in tenant namespaces",
        ),
        Right(
            "",
            ("configmaps", "serviceaccounts"),
            ("delete",),
            "controller.reconcile (--migrate): an earlier release's objects in tenant namespaces",
        ),
        Right(
            "networking.k8s.io",
            ("networkpolicies",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in tenant namespaces",
        ),
        Right(
            "apps",
            ("deployments",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in tenant namespaces",
        ),
        Right(
            "k8s.cni.cncf.io",
            ("network-attachment-definitions",),
            ("list", "watch", "delete"),
            "controller.reconcile (--migrate): an earlier release's objects in tenant namespaces",
        ),
    ),
    "While migrating from a release that ran gateways in tenant namespaces (migration.enabled).",
)
LEADER_ELECTION = Scope(
    "leader-election",
    "Role",
    "operator-namespace",
    (Right("coordination.k8s.io", ("leases",), ("get", "create", "update"), "controller.leader"),),
    "The controller's Role in its own namespace: the leader-election Lease.",
)
SCOPES: tuple[Scope, ...] = (CLUSTER, GATEWAY_NAMESPACE, TENANT_NAMESPACE, MIGRATION, LEADER_ELECTION)

UNUSED_BY_DESIGN = frozenset({("", "secrets", "get"), ("", "configmaps", "get")})
"""Held for RBAC's escalation rule only: creating a Role needs the rights it grants (a gateway pod's Roles
grant get/list/watch of its Secrets and its ConfigMap). Never exercised: a test proves the controller
never reads a Secret's content (its Secret cache keeps metadata only)."""


def rules(scope: Scope) -> list[dict[str, Any]]:
    return [r.rule() for r in scope.rights]


def granted(scopes: tuple[Scope, ...] = SCOPES) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) of every declared right."""
    return {(r.api_group, res, v) for s in scopes for r in s.rights for res in r.resources for v in r.verbs}
