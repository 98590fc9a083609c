"""The controller's part of a VPNPeer's status (controller.peerstatus, pure): Admitted False with the
reason for a peer left out of the plan, observedGeneration for every peer, and nothing when the stored
status already says it."""

from __future__ import annotations

import json
from typing import Any

from controller.api.schema import FieldError
from controller.api.validate import Item, Problem
from controller.peerstatus import peer_patches

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"
BAD = Problem(
    "VPNPeer/t/s2",
    FieldError("spec.ipsec.remoteSubnets[0]", "overlaps the gateway's serviceCIDR", "10.0.0.0/24"),
    Item("peer", "s2"),
)


def peer(name: str, generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": generation}, **({"status": status} if status else {})}


def test_a_planned_peer_gets_only_its_observed_generation() -> None:
    out = peer_patches([peer("s1", 3)], {"s1"}, [], rendered=True, now=T0)
    assert out == {"s1": {"observedGeneration": 3}}, "the agent's keys are left alone"
    assert peer_patches([peer("s1", 3, {"observedGeneration": 3})], {"s1"}, [], rendered=True, now=T0) == {}


def test_a_peer_left_out_is_not_admitted_with_its_own_problem() -> None:
    out = peer_patches([peer("s2")], {"s1"}, [BAD], rendered=True, now=T0)["s2"]
    assert out["state"] == "NotAdmitted" and out["observedGeneration"] == 1
    assert "overlaps the gateway's serviceCIDR" in out["reason"]
    admitted = {c["type"]: c for c in out["conditions"]}
    assert admitted["Admitted"]["status"] == "False" and admitted["Admitted"]["reason"] == "FieldValueInvalid"
    assert admitted["Ready"] == {**admitted["Ready"], "status": "False", "reason": "NotAdmitted"}
    assert out["bytesIn"] is None and out["establishedAt"] is None, "the agent's last numbers are dropped"


def test_a_stored_not_admitted_status_is_not_written_again_and_keeps_its_transition_time() -> None:
    first = peer_patches([peer("s2")], set(), [BAD], rendered=True, now=T0)["s2"]
    stored = {k: v for k, v in first.items() if v is not None}
    assert peer_patches([peer("s2", 1, stored)], set(), [BAD], rendered=True, now=T1) == {}
    other = Problem("VPNPeer/t/s2", FieldError("spec.endpoint", "does not resolve"), Item("peer", "s2"))
    again = peer_patches([peer("s2", 1, stored)], set(), [other], rendered=True, now=T1)["s2"]
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {T0}, "still False: same transition"


def test_with_no_plan_the_gateways_problem_is_why() -> None:
    gw = Problem(
        "VPNGateway/t/acme", FieldError("metadata.namespace", "is not enabled", None, "NamespaceNotEnabled")
    )
    out = peer_patches([peer("s1")], set(), [gw], rendered=False, now=T0)["s1"]
    admitted = next(c for c in out["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "GatewayNotRendered" and "is not enabled" in admitted["message"]


def test_a_left_out_peers_status_stays_small_whatever_the_problems() -> None:
    """Found by review: the whole problem list went into three fields of every left-out peer; a tenant's
    thousands of peers then cost etcd and the controller's watch cache a GB."""
    many = [
        Problem(
            "VPNGateway/t/acme", FieldError(f"spec.exposures[{i}].target", "x" * 500), Item("gateway", "acme")
        )
        for i in range(200)
    ]
    out = peer_patches([peer("s1")], set(), many, rendered=False, now=T0)["s1"]
    assert len(json.dumps(out)) < 2048, len(json.dumps(out))
    admitted = next(c for c in out["conditions"] if c["type"] == "Admitted")
    assert admitted["message"].startswith(str(many[0])[:100]) and "and 199 more" in admitted["message"]
    assert len(out["reason"]) <= 256
