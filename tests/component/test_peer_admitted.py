"""A VPNPeer the controller leaves out of its gateway's plan says so in its own status, and says it no
longer once fixed: the controller (with exactly its declared rights, against the API emulator) writes
``state: NotAdmitted``, ``Admitted`` False naming the field and the rule, and ``observedGeneration``
(controller/peerstatus.py); after the fix the peer is in the plan, and the status-agent (as the pod runs
it, with its ServiceAccount's token: tests/helpers.agent_as_pod) writes ``Admitted`` True for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gwplan
from lab.cluster import Cluster, Controller, home_of, wait_for
from tests.component.test_controller_operator import CONFIG, NS, apply_with_secrets, converged
from tests.component.test_controller_rbac import bind
from tests.examples import example_docs
from tests.helpers import agent_as_pod

VPN = "vpn.bnerd.net/v1alpha1"
OVERLAP = "198.18.0.16/28"
"""Inside the gateway's serviceCIDR (198.18.0.0/24): valid for the CRD, refused by the controller."""


def status(c: Cluster, name: str) -> dict[str, Any]:
    return dict((c.get(VPN, "VPNPeer", name, NS) or {}).get("status") or {})


def conditions(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(x["type"]): x for x in s.get("conditions") or []}


def planned(c: Cluster) -> tuple[str, set[str]]:
    cm = c.owned("v1", "ConfigMap", "acme", NS)
    assert cm is not None
    text = str(cm["data"]["plan.json"])
    return text, set(gwplan.peer_names(gwplan.loads(text)))


def start_with_s2_invalid(c: Cluster) -> Controller:
    """The controller (its declared rights, a 600 s resync) and the IPsec example with s2's remote subnet
    inside the gateway's serviceCIDR."""
    c.add_node("node-a", provider_id="openstack:///11111111-1111-4111-8111-111111111111")
    ctl = c.start_controller(CONFIG, "--resync-seconds", "600", kubeconfig=bind(c, (NS,)))
    docs = example_docs("ipsec.yaml")
    s2 = next(d for d in docs if d["kind"] == "VPNPeer" and d["metadata"]["name"] == "s2")
    s2["spec"]["ipsec"]["remoteSubnets"] = [OVERLAP]
    apply_with_secrets(c, docs)
    return ctl


def test_an_invalid_peer_is_not_admitted_with_the_field_and_rule_and_admitted_once_fixed(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path) as c:
        ctl = start_with_s2_invalid(c)

        def not_admitted() -> dict[str, Any] | None:
            s = status(c, "s2")
            return s if s.get("state") == "NotAdmitted" or ctl.proc.poll() is not None else None

        s = wait_for(not_admitted, 60, "s2's NotAdmitted status")
        assert ctl.proc.poll() is None, ctl.log()
        assert s["observedGeneration"] == 1
        admitted = conditions(s)["Admitted"]
        # The rule as the reason, the field, its value and the rule in words as the message.
        assert (admitted["status"], admitted["reason"]) == ("False", "OverlapsServiceCIDR"), admitted
        assert admitted["message"] == (
            f'VPNPeer/{NS}/s2: spec.ipsec.remoteSubnets[0]: "{OVERLAP}" overlaps the gateway\'s serviceCIDR '
            "198.18.0.0/24"
        )
        assert s["reason"] == admitted["message"]
        ready = conditions(s)["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "NotAdmitted")
        assert all(x["lastTransitionTime"] for x in s["conditions"])
        assert planned(c)[1] == {"s1"}, "s2 is out of the plan, s1 in"

        # The fix: a subnet of its own. A new generation, and s2 in the plan.
        c.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"ipsec": {"remoteSubnets": ["203.0.113.16/28"]}}}, NS)
        wait_for(lambda: "s2" in planned(c)[1] or ctl.proc.poll() is not None, 60, "s2 in the plan")
        assert ctl.proc.poll() is None, ctl.log()
        wait_for(lambda: converged(c), 60, "the gateway's objects, with s2 in its Role")
        _, home = home_of("acme", NS)
        sa = c.owned("v1", "ServiceAccount", "acme", NS)
        assert sa is not None
        plan_json, _ = planned(c)
        with agent_as_pod(c.kube, home, sa["metadata"]["name"], plan_json, tmp_path) as proc:

            def admitted_now() -> dict[str, Any] | None:
                s = status(c, "s2")
                ok = conditions(s).get("Admitted", {}).get("status") == "True"
                return s if (ok and s.get("observedGeneration") == 2) or proc.poll() is not None else None

            s = wait_for(admitted_now, 30, "s2 admitted by the status-agent")
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
        assert s["state"] != "NotAdmitted" and "serviceCIDR" not in json.dumps(s), s
        assert conditions(status(c, "s1"))["Admitted"]["status"] == "True"
        assert ctl.proc.poll() is None, ctl.log()


def test_a_stale_agent_write_over_not_admitted_is_undone_without_waiting_for_the_resync(
    tmp_path: Path,
) -> None:
    """Found by review: a status-agent's write queued under the old plan (Admitted True, Established) may
    land after the controller's NotAdmitted; status-only VPNPeer events drove no reconcile, so it stood
    until the resync (600 s here). An admission that flips is now a reconcile's business."""
    with Cluster(tmp_path) as c:
        ctl = start_with_s2_invalid(c)
        wait_for(lambda: status(c, "s2").get("state") == "NotAdmitted", 60, "s2's NotAdmitted status")
        stale = {
            "state": "Established",
            "reason": None,
            "conditions": [
                {"type": "Admitted", "status": "True", "reason": "InPlan", "message": "in the plan",
                 "lastTransitionTime": "2026-12-01T10:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "Established", "message": "the tunnel is up",
                 "lastTransitionTime": "2026-12-01T10:00:00Z"},
            ],
        }  # fmt: skip
        c.kube.patch(VPN, "VPNPeer", "s2", {"status": stale}, NS, subresource="status")
        assert status(c, "s2")["state"] == "Established", "premise: the stale write landed"
        s = wait_for(
            lambda: (st := status(c, "s2")).get("state") == "NotAdmitted" and st, 30, "NotAdmitted again"
        )
        assert conditions(s)["Admitted"]["status"] == "False"
        assert ctl.proc.poll() is None, ctl.log()
