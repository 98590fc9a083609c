"""An HA gateway's objects (``controller.desired``, docs/ha.md) on the REAL control plane
(kube-apiserver and kube-controller-manager, lab.controlplane): the real server takes every one of them
(its validation: the Lease, the slot b names and labels), the pods' Role lets the pod's ServiceAccount
get and update its own Lease and read its two plans, nothing else (the same table the emulator is asked
in tests/component/test_controller_rbac.py), and the real Deployment and ReplicaSet controllers run the two
slots' Deployments side by side although slot a's selector (a gateway's without HA: immutable) also
matches slot b's pods. No kubelet runs the pods: the ReplicaSet controller's pods are what is looked at.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from controller.desired import Desired
from lab.controlplane import ControlPlane
from lab.controlplane.operated import RealCluster
from lab.wait import wait_for
from tests.component.test_controller_rbac import POD_RIGHTS, ha_objects, pod_rights

pytestmark = pytest.mark.lab


def uid(obj: dict[str, Any] | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["uid"])


def controller_of(obj: dict[str, Any]) -> str | None:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return str(refs[0]["uid"]) if refs else None


def test_the_ha_objects_on_the_real_control_plane(controlplane: ControlPlane, tmp_path: Path) -> None:
    with RealCluster(controlplane, tmp_path, tag="ha1") as c:
        node_a, node_b = c.unique("node-a"), c.unique("node-b")
        c.add_node(node_a)
        c.add_node(node_b)
        ns = c.gateways

        def objects(name: str, namespace: str) -> Desired:
            d = ha_objects(name, namespace, gateway_namespace=ns)
            out = []
            for slot, obj in d.objects:
                o = copy.deepcopy(obj)
                if slot == "Deployment/b":
                    o["spec"]["template"]["spec"]["nodeName"] = node_b
                elif slot == "Deployment":
                    o["spec"]["template"]["spec"]["nodeName"] = node_a
                out.append((slot, o))
            return Desired(tuple(out), d.held)

        ours, theirs = objects("acme", "tenant-acme"), objects("other", "tenant-other")
        for d in (ours, theirs):
            for slot, obj in d.objects:
                if slot.startswith("Tenant") or (d is theirs and slot.startswith("Deployment")):
                    continue  # the tenant's Role needs the tenant's CR; one gateway's pods are enough
                c.kube.create(obj)
        dep_a, dep_b = ours.get("Deployment"), ours.get("Deployment/b")
        assert dep_a is not None and dep_b is not None
        name_a, name_b = dep_a["metadata"]["name"], dep_b["metadata"]["name"]

        def pods() -> list[dict[str, Any]]:
            return c.kube.list("v1", "Pod", ns)

        def replica_sets() -> dict[str, list[dict[str, Any]]]:
            """Deployment uid -> its ReplicaSets (by controllerRef)."""
            out: dict[str, list[dict[str, Any]]] = {}
            got = c.kube.http.get(f"/apis/apps/v1/namespaces/{ns}/replicasets")  # no client Resource
            assert got.status_code == 200, got.text
            for rs in got.json()["items"]:
                out.setdefault(controller_of(rs) or "", []).append(rs)
            return out

        def settled() -> bool:
            deps = [c.kube.get("apps/v1", "Deployment", n, ns) for n in (name_a, name_b)]
            return len(pods()) == 2 and all(
                d is not None and (d.get("status") or {}).get("replicas") == 1 for d in deps
            )

        wait_for(settled, 60, "one pod per slot, made by the real ReplicaSet controller")
        time.sleep(5)  # long enough for a fight over the pods to show (the controllers' sync is immediate)
        assert settled()
        a_uid = uid(c.kube.get("apps/v1", "Deployment", name_a, ns))
        b_uid = uid(c.kube.get("apps/v1", "Deployment", name_b, ns))
        rss = replica_sets()
        assert len(rss.get(a_uid, [])) == 1 and len(rss.get(b_uid, [])) == 1, rss.keys()
        rs_a, rs_b = uid(rss[a_uid][0]), uid(rss[b_uid][0])
        by_rs = {controller_of(p): p for p in pods()}
        assert set(by_rs) == {rs_a, rs_b}, "each slot's pod is its own ReplicaSet's"
        pod_a, pod_b = by_rs[rs_a], by_rs[rs_b]
        assert "vpn.bnerd.net/ha-slot" not in pod_a["metadata"]["labels"]
        assert pod_b["metadata"]["labels"]["vpn.bnerd.net/ha-slot"] == "b"
        assert (pod_a["spec"]["nodeName"], pod_b["spec"]["nodeName"]) == (node_a, node_b)
        for rs in (rss[a_uid][0], rss[b_uid][0]):
            assert (rs.get("status") or {}).get("replicas") == 1, rs["metadata"]["name"]

        # The pod's ServiceAccount (one for both slots) through the real authorizer.
        home = ours.get("ServiceAccount")["metadata"]["name"]  # type: ignore[index]
        with controlplane.client(controlplane.service_account_kubeconfig(ns, home)) as http:
            assert pod_rights(http, ns, ours, theirs) == POD_RIGHTS

        # HA turned off: slot b's Deployment deleted as the controller deletes it (Background). Its pod
        # goes with its ReplicaSet; slot a's ReplicaSet, whose selector matches it, never adopts it.
        c.kube.delete("apps/v1", "Deployment", name_b, ns, propagation="Background")
        wait_for(
            lambda: (
                not [
                    p
                    for p in pods()
                    if controller_of(p) == rs_b and not p["metadata"].get("deletionTimestamp")
                ]
            ),
            60,
            "slot b's pod deleted (Terminating: no kubelet confirms it)",
        )
        time.sleep(3)
        live = [p for p in pods() if not p["metadata"].get("deletionTimestamp")]
        assert [uid(p) for p in live] == [uid(pod_a)], "slot a's pod alone, the same one"
        assert all(controller_of(p) in (rs_a, rs_b) for p in pods()), "nothing adopted"
        dep = c.kube.get("apps/v1", "Deployment", name_a, ns)
        assert dep is not None and dep["status"].get("replicas") == 1
