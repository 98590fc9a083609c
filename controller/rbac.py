"""The Kubernetes rights the controller needs, declared once, next to the code that uses them. Pure data.

The chart's ClusterRole and leader-election Role are generated from this (``python -m controller rbac``;
``make chart``), a test fails when the chart drifts from it, and another runs the controller with exactly
these rights in the API emulator (which enforces RBAC, escalation checks included) and compares them with
what it actually did: nothing is granted that the code does not use (the seed's config/rbac vs chart
drift, closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

CLUSTER: tuple[Right, ...] = (
    Right(VPN_GROUP, ("vpngateways", "vpnpeers"), WATCH, "controller.run informers"),
    Right(LEGACY_GROUP, ("ipsecgateways", "clusterlinks"), WATCH, "controller.run informers"),
    Right(VPN_GROUP, ("vpngateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
    Right(LEGACY_GROUP, ("ipsecgateways",), ("patch",), "controller.execute: the finalizer (JSON patch)"),
    Right(
        VPN_GROUP, ("vpngateways/status",), ("patch",), "controller.execute: conditions, nodeName, publicIP"
    ),
    Right(
        LEGACY_GROUP,
        ("ipsecgateways/status",),
        ("patch",),
        "controller.execute: conditions, nodeName, publicIP",
    ),
    Right("", ("configmaps", "serviceaccounts"), OWN, "controller.desired: the plan, the pod's identity"),
    Right(
        "",
        ("configmaps",),
        ("get",),
        "never used by the controller (its informer lists and watches): the gateway pods' Roles grant it",
    ),
    Right(
        "rbac.authorization.k8s.io", ("roles", "rolebindings"), OWN, "controller.desired: the pod's rights"
    ),
    Right("networking.k8s.io", ("networkpolicies",), OWN, "controller.desired: the pod's eth0 policy"),
    Right("apps", ("deployments",), OWN, "controller.desired: the gateway pod"),
    Right("k8s.cni.cncf.io", ("network-attachment-definitions",), OWN, "controller.desired: NIC2 by MAC"),
    Right("", ("pods", "nodes"), WATCH, "controller.run: PodReady, placement"),
    Right("", ("events",), ("create",), "controller.execute: Events on condition changes"),
    Right(
        "",
        ("secrets",),
        ("get", "list", "watch"),
        "never used by the controller: RBAC lets it create the gateway pods' Roles (get/list/watch on the "
        "Secrets their plan references) only if it holds those rights itself",
    ),
)
"""The controller's ClusterRole (gateways live in any namespace)."""

LEADER_ELECTION: tuple[Right, ...] = (
    Right("coordination.k8s.io", ("leases",), ("get", "create", "update"), "controller.leader"),
)
"""A Role in the operator's own namespace."""

UNUSED_BY_DESIGN = frozenset(
    {("", "secrets", "get"), ("", "secrets", "list"), ("", "secrets", "watch"), ("", "configmaps", "get")}
)
"""Held for RBAC's escalation rule only: creating a Role needs the rights it grants (a gateway pod's Role
grants get/list/watch of its Secrets and its ConfigMap). Never exercised: a test proves the controller
never reads a Secret."""


def cluster_role_rules() -> list[dict[str, Any]]:
    return [r.rule() for r in CLUSTER]


def leader_election_rules() -> list[dict[str, Any]]:
    return [r.rule() for r in LEADER_ELECTION]


def granted() -> set[tuple[str, str, str]]:
    """(api group, resource, verb) of every declared right."""
    return {
        (r.api_group, res, v) for r in (*CLUSTER, *LEADER_ELECTION) for res in r.resources for v in r.verbs
    }
