"""The controller's rights (controller/rbac.py): enough, and nothing it does not use.

The controller runs as a ServiceAccount bound to exactly the declared ClusterRole and leader-election Role,
in the API emulator, which enforces RBAC as Kubernetes does (escalation included: the gateway pods' Roles
can be created only by someone holding what they grant). Through a scenario that exercises every code path
that talks to the API (create, edit, a restored object, a re-pin, an invalid CR with its Event, deletion,
ClusterLinks, the legacy kind), it is never refused, and every declared right but the escalation-only
Secret read is used.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from controller.names import ANNOTATION_HASH
from controller.rbac import UNUSED_BY_DESIGN, cluster_role_rules, granted, leader_election_rules
from lab.cluster import Cluster, wait_for
from tests.component.test_controller_operator import CONFIG, OWNED, condition, converged, gateway, legacy_docs
from tests.examples import example_docs

SA = "system:serviceaccount:vpngw-system:vpngw-controller"


def bind(c: Cluster) -> Path:
    rbac = "rbac.authorization.k8s.io/v1"
    c.kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "vpngw-controller", "namespace": "vpngw-system"},
        }
    )
    c.kube.create(
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "vpngw-controller"},
            "rules": cluster_role_rules(),
        }
    )
    c.kube.create(
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vpngw-controller"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "vpngw-controller",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "vpngw-controller", "namespace": "vpngw-system"}],
        }
    )
    c.kube.create(
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": "vpngw-controller-leader", "namespace": "vpngw-system"},
            "rules": leader_election_rules(),
        }
    )
    c.kube.create(
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": "vpngw-controller-leader", "namespace": "vpngw-system"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "vpngw-controller-leader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "vpngw-controller", "namespace": "vpngw-system"}],
        }
    )
    token = c.kube.mint_token("vpngw-system", "vpngw-controller")
    return c.kube.write_kubeconfig(
        c.workdir / "controller.kubeconfig", token, "vpngw-system", "vpngw-controller"
    )


def used(c: Cluster) -> tuple[set[tuple[str, str, str]], list[Any]]:
    recs = c.kube.requests(user=SA)
    out = set()
    for r in recs:
        if r.resource:
            res = f"{r.resource}/{r.subresource}" if r.subresource else r.resource
            out.add((r.group, res, r.verb))
    return out, [r for r in recs if r.code == 403]


def test_the_declared_rights_are_enough_and_all_used(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        c.add_node("node-a", provider_id="openstack:///11111111-1111-4111-8111-111111111111")
        c.add_node("node-b", provider_id="openstack:///22222222-2222-4222-8222-222222222222")
        ctl = c.start_controller(CONFIG, kubeconfig=bind(c))
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 30, "ready")
        c.apply(example_docs("ipsec.yaml"))
        c.apply(legacy_docs())
        wait_for(
            lambda: converged(c) and converged(c, "legacy", "tenant-old", "ipsecgw"), 30, "both gateways"
        )
        c.kube.delete("v1", "ConfigMap", "vpngw-acme", "tenant-acme")  # restored: create
        edited = {"metadata": {"annotations": {ANNOTATION_HASH: "edited"}}}
        for api, kind in OWNED[1:]:  # each edited: restored with an update
            c.kube.patch(api, kind, "vpngw-acme", edited, "tenant-acme")

        def restored() -> bool:
            objs = [c.get(a, k, "vpngw-acme", "tenant-acme") for a, k in OWNED]
            return all(o and o["metadata"]["annotations"][ANNOTATION_HASH] != "edited" for o in objs)

        wait_for(restored, 20, "every owned object back")
        node = gateway(c)["status"]["nodeName"]
        c.set_node_ready(node, False)  # re-pin: the Deployment updated, an Event
        c.kube.patch(
            "vpn.bnerd.net/v1alpha1",
            "VPNPeer",
            "s1",
            {"spec": {"authorization": {"exposures": ["x"]}}},
            "tenant-acme",
        )
        wait_for(
            lambda: (x := condition(gateway(c), "ConfigRendered")) and x["status"] == "False", 20, "invalid"
        )
        c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme")
        c.kube.delete("ipsec.bnerd.net/v1alpha1", "IPsecGateway", "legacy", "tenant-old")
        wait_for(
            lambda: c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") is None, 20, "gone"
        )
        time.sleep(3)  # a lease renewal (every 2 s) at least
        c.kube.close_watches()  # a watch enters the request log when it ends
        time.sleep(1)
        got, refused = used(c)
        assert refused == [], [(r.verb, r.path) for r in refused]
        assert ctl.proc.poll() is None
    never = granted() - UNUSED_BY_DESIGN - got
    assert never == set(), f"declared but never used: {sorted(never)}"
    beyond = got - granted()
    assert beyond == set(), (
        f"used without being declared (the emulator should have refused): {sorted(beyond)}"
    )
    assert not any(res == "secrets" for _, res, _ in got), "the controller never reads a Secret"
