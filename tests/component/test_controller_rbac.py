"""The controller's rights (controller/rbac.py): enough, and nothing it does not use.

The controller runs as a ServiceAccount bound to exactly the declared scopes (cluster-wide, the gateway
namespace, each tenant namespace, the migration, its own namespace), in the API emulator, which enforces
RBAC as Kubernetes does (escalation included: the gateway pods' Roles can be created only by someone
holding what they grant). Through a scenario that exercises every code path that talks to the API
(create, edit, a restored object, a re-pin, an invalid CR with its Event, an earlier release's leftovers,
deletion, an HA gateway's Lease deleted with it, ClusterLinks, the legacy kind), it is never refused, and
every declared right but the escalation-only gets is used.
"""

from __future__ import annotations

import copy
import dataclasses
import ssl
from pathlib import Path
from typing import Any

import httpx

from controller.desired import Desired, desired
from controller.names import ANNOTATION_HASH, GatewayKey
from controller.rbac import SCOPES, UNUSED_BY_DESIGN, granted, rules
from lab.cluster import GATEWAY_NAMESPACE, Cluster, home_of
from lab.wait import wait_for
from tests.component.test_controller_operator import (
    CONFIG,
    OWNED,
    apply_with_secrets,
    converged,
    gateway,
    legacy_docs,
)
from tests.examples import example_docs
from tests.helpers import condition
from tests.unit.test_controller_desired_ha import ha_inputs

SA = "system:serviceaccount:vpngw-system:vpngw-controller"
LEASE = "coordination.k8s.io/v1"


def bind(c: Cluster, tenants: tuple[str, ...]) -> Path:
    """The controller's ServiceAccount with exactly controller/rbac.py's scopes, bound as the chart binds
    them (the tenant scope in each of ``tenants``)."""
    rbac = "rbac.authorization.k8s.io/v1"
    sa = {"kind": "ServiceAccount", "name": "vpngw-controller", "namespace": "vpngw-system"}
    c.kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": sa["name"], "namespace": sa["namespace"]},
        }
    )
    where = {
        "gateway-namespace": [GATEWAY_NAMESPACE],
        "operator-namespace": ["vpngw-system"],
        "each-tenant-namespace": list(tenants),
        "migration": list(tenants),
    }
    for scope in SCOPES:
        name = f"vpngw-controller-{scope.name}"
        role: dict[str, Any] = {
            "apiVersion": rbac,
            "kind": scope.kind,
            "metadata": {"name": name},
            "rules": rules(scope),
        }
        if scope.kind == "Role":
            role["metadata"]["namespace"] = where[scope.bound][0]
        c.kube.create(role)
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": scope.kind, "name": name}
        if scope.bound == "cluster":
            c.kube.create(
                {
                    "apiVersion": rbac,
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": ref,
                    "subjects": [sa],
                }
            )
            continue
        for ns in where[scope.bound]:
            c.namespace(ns)
            c.kube.create(
                {
                    "apiVersion": rbac,
                    "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": ns},
                    "roleRef": ref,
                    "subjects": [sa],
                }
            )
    token = c.kube.mint_token("vpngw-system", "vpngw-controller")
    return c.kube.write_kubeconfig(
        c.workdir / "controller.kubeconfig", token, "vpngw-system", "vpngw-controller"
    )


def leftovers(c: Cluster, uid: str) -> None:
    """What a release that ran the pod in the tenant's namespace left there (the controller deletes it)."""
    ref = [
        {
            "apiVersion": "vpn.bnerd.net/v1alpha1",
            "kind": "VPNGateway",
            "name": "acme",
            "uid": uid,
            "controller": True,
        }
    ]
    md = {
        "name": "vpngw-acme",
        "namespace": "tenant-acme",
        "ownerReferences": ref,
        "labels": {"vpn.bnerd.net/operator": "vpngw"},
    }
    c.kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": {"plan.json": "{}"}})
    c.kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": md})
    c.kube.create(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": md,
            "spec": {"podSelector": {}},
        }
    )
    c.kube.create(
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": md,
            "spec": {"config": "{}"},
        }
    )
    labels = {"app": "old"}
    c.kube.create(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": md,
         "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                  "spec": {"containers": [{"name": "x", "image": "x"}]}}}}
    )  # fmt: skip


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
        ctl = c.start_controller(CONFIG, kubeconfig=bind(c, ("tenant-acme", "tenant-old")))
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 30, "ready")
        apply_with_secrets(c, example_docs("ipsec.yaml"))
        apply_with_secrets(c, legacy_docs(c))
        wait_for(
            lambda: converged(c) and converged(c, "legacy", "tenant-old", "IPsecGateway"), 30, "both gateways"
        )
        leftovers(c, gateway(c)["metadata"]["uid"])
        wait_for(
            lambda: c.get("apps/v1", "Deployment", "vpngw-acme", "tenant-acme") is None,
            20,
            "leftovers deleted",
        )
        home, home_ns = home_of("acme", "tenant-acme")
        c.kube.delete("v1", "ConfigMap", home, home_ns)  # restored: create
        edited = {"metadata": {"annotations": {ANNOTATION_HASH: "edited"}}}
        for api, kind in OWNED[1:]:  # each edited: restored with an update
            c.kube.patch(api, kind, home, edited, home_ns)
        c.kube.patch("rbac.authorization.k8s.io/v1", "Role", "vpngw-acme", edited, "tenant-acme")

        def restored() -> bool:
            objs = [c.owned(a, k, "acme", "tenant-acme") for a, k in OWNED]
            objs.append(c.get("rbac.authorization.k8s.io/v1", "Role", "vpngw-acme", "tenant-acme"))
            return all(o and o["metadata"]["annotations"][ANNOTATION_HASH] != "edited" for o in objs)

        wait_for(restored, 20, "every owned object back")
        node = gateway(c)["status"]["nodeName"]
        # The gateway's pod on that node, as the ReplicaSet controller makes it (no kubelet here).
        template = c.owned("apps/v1", "Deployment", "acme", "tenant-acme")["spec"]["template"]  # type: ignore[index]
        c.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": "acme-old",
                        "namespace": home_ns,
                        "labels": template["metadata"]["labels"],
                        "finalizers": ["lab.example/held"],  # a terminating pod no kubelet confirms
                    },
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lab"}]},
                }
            ]
        )
        c.set_node_ready(node, False)  # re-pin: the Deployment updated, an Event
        c.kube.delete("v1", "Pod", "acme-old", home_ns)  # the Recreate rollout's delete: Terminating
        c.kube.delete("v1", "Node", node)  # gone: its pod is deleted without its kubelet (pods delete)
        wait_for(
            lambda: c.kube.requests(verb="delete", resource="pods", name="acme-old", user=SA),
            20,
            "the stranded pod force-deleted",
        )
        c.kube.patch("v1", "Pod", "acme-old", {"metadata": {"finalizers": None}}, home_ns)
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
        # The Lease an HA gateway has (controller.desired), held by its pod: it goes with its gateway.
        labels = c.owned("v1", "ConfigMap", "acme", "tenant-acme")["metadata"]["labels"]  # type: ignore[index]
        lease = {"name": home, "namespace": home_ns, "labels": labels}
        c.kube.create(
            {"apiVersion": LEASE, "kind": "Lease", "metadata": lease, "spec": {"holderIdentity": f"{home}-x"}}
        )
        c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme")
        c.kube.delete("ipsec.bnerd.net/v1alpha1", "IPsecGateway", "legacy", "tenant-old")
        wait_for(
            lambda: c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") is None, 20, "gone"
        )
        wait_for(lambda: c.get(LEASE, "Lease", home, home_ns) is None, 20, "its Lease deleted")
        wait_for(
            lambda: c.kube.requests(verb="update", resource="leases", user=SA),
            10,
            "a lease renewal (every 2 s)",
        )
        mark = c.kube.requests()[-1].seq
        closed = c.kube.close_watches()  # a watch enters the request log when it ends
        wait_for(
            lambda: len(c.kube.requests(verb="watch", since=mark)) >= closed,
            10,
            f"the {closed} watches closed in the request log",
        )
        got, refused = used(c)
        assert refused == [], [(r.verb, r.path) for r in refused]
        assert ctl.proc.poll() is None
    never = granted() - UNUSED_BY_DESIGN - got
    assert never == set(), f"declared but never used: {sorted(never)}"
    beyond = got - granted()
    assert beyond == set(), (
        f"used without being declared (the emulator should have refused): {sorted(beyond)}"
    )
    assert {v for _, res, v in got if res == "secrets"} == {"list", "watch"}, "never a get of a Secret"


def ha_objects(name: str, namespace: str, gateway_namespace: str = GATEWAY_NAMESPACE) -> Desired:
    """An HA gateway's desired objects (``controller.desired``) for gateway ``namespace/name``."""
    inputs = ha_inputs()
    key = GatewayKey("VPNGateway", namespace, name)
    settings = dataclasses.replace(inputs.settings, gateway_namespace=gateway_namespace)
    return desired(dataclasses.replace(inputs, key=key, uid=f"uid-{name}", settings=settings))


POD_RIGHTS = {
    "get its Lease": 200,
    "update its Lease": 200,
    "get another gateway's Lease": 403,
    "update another gateway's Lease": 403,
    "create a Lease": 403,
    "delete its Lease": 403,
    "list Leases": 403,
    "get its slot a plan": 200,
    "get its slot b plan": 200,
    "get another gateway's plan": 403,
}
"""What an HA gateway pod's ServiceAccount may do in the gateway namespace: exactly its own Lease
(get, update: never create, which RBAC cannot restrict by name) and its slots' plans."""


def pod_rights(http: httpx.Client, namespace: str, ours: Desired, theirs: Desired) -> dict[str, int]:
    """Each of ``POD_RIGHTS`` tried with ``http`` (the pod's identity): the API's status codes."""
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    cms = f"/api/v1/namespaces/{namespace}/configmaps"

    def name(d: Desired, slot: str) -> str:
        obj = d.get(slot)
        assert obj is not None
        return str(obj["metadata"]["name"])

    own, other = name(ours, "Lease"), name(theirs, "Lease")
    got = http.get(f"{leases}/{own}")
    codes = {"get its Lease": got.status_code}
    held = got.json() if got.status_code == 200 else {"metadata": {"name": own}}
    held.setdefault("spec", {})["holderIdentity"] = f"{own}-7c9d8f6b5-x2x4z"
    codes["update its Lease"] = http.put(f"{leases}/{own}", json=held).status_code
    codes["get another gateway's Lease"] = http.get(f"{leases}/{other}").status_code
    stolen = {**held, "metadata": {"name": other, "namespace": namespace}}
    codes["update another gateway's Lease"] = http.put(f"{leases}/{other}", json=stolen).status_code
    new = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": f"{own}-new"}}
    codes["create a Lease"] = http.post(leases, json=new).status_code
    codes["delete its Lease"] = http.delete(f"{leases}/{own}").status_code
    codes["list Leases"] = http.get(leases).status_code
    codes["get its slot a plan"] = http.get(f"{cms}/{name(ours, 'ConfigMap')}").status_code
    codes["get its slot b plan"] = http.get(f"{cms}/{name(ours, 'ConfigMap/b')}").status_code
    codes["get another gateway's plan"] = http.get(f"{cms}/{name(theirs, 'ConfigMap')}").status_code
    return codes


POD_SLOTS = ("ServiceAccount", "Role", "RoleBinding", "Lease", "ConfigMap", "ConfigMap/b")


def test_an_ha_gateway_pod_gets_and_updates_its_own_lease_only(tmp_path: Path) -> None:
    """The pods' Role as ``controller.desired`` makes it, in the emulator (which enforces RBAC as
    Kubernetes does): its own Lease and plans by name, nothing else (tests/integration/test_ha_real.py
    asks the real kube-apiserver the same)."""
    with Cluster(tmp_path) as c:
        c.namespace(GATEWAY_NAMESPACE)
        ours, theirs = ha_objects("acme", "tenant-acme"), ha_objects("other", "tenant-other")
        for d in (ours, theirs):
            for slot in POD_SLOTS:
                obj = d.get(slot)
                assert obj is not None, slot
                c.kube.create(copy.deepcopy(obj))
        home = ours.get("ServiceAccount")["metadata"]["name"]  # type: ignore[index]
        token = c.kube.mint_token(GATEWAY_NAMESPACE, home)
        ssl_ctx = ssl.create_default_context(cafile=str(c.kube.ca_file))
        with httpx.Client(
            base_url=c.kube.url, verify=ssl_ctx, headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as http:
            assert pod_rights(http, GATEWAY_NAMESPACE, ours, theirs) == POD_RIGHTS
