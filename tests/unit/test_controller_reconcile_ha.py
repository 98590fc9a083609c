"""The HA part of one reconcile (``controller.reconcile.plan_ha``), pure: which mode the pair is in (both
slots, slot b draining, nothing left), slot b held back while HA is turned on for a serving gateway, and
the handover when HA is turned off while slot b serves. The decisions inside (placement, the Lease, who
serves) are controller/ha.py's and tested in test_controller_ha.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from controller import ha
from controller.names import ANNOTATION_HASH, GatewayKey
from controller.reconcile import Snapshot, plan_ha, rollout_waits
from controller.settings import Settings
from tests.unit.test_controller_ha import lease, node
from tests.unit.test_controller_ha import pod as bare_pod

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")
ALLOWED = Settings(ha_allowed=True)
NOW = 1000.0
WALL = "2026-12-03T16:00:00Z"
NODES = (node("node-a"), node("node-b"))


def gateway(enabled: bool, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "acme", "namespace": "tenant-acme", "uid": "u1", "generation": 1},
        "spec": {"ha": {"enabled": enabled}},
        "status": status or {},
    }


def deployment(node_name: str) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"nodeName": node_name}}}}


def snap(
    enabled: bool,
    *,
    pods: tuple[dict[str, Any], ...] = (),
    owned: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> Snapshot:
    return Snapshot(
        key=KEY,
        gateway=gateway(enabled, status),
        pods=pods,
        owned=owned or {},
        nodes=NODES,
    )


def held(holder: str, *, at: float = NOW - 0.5) -> ha.Observation:
    """The Lease as a controller that has watched it a while saw it: ``holder`` renewed at ``at``."""
    first = ha.observe(None, lease(holder="", renew="t0"), NOW - 100)
    return ha.observe(first, lease(holder=holder, renew="t1"), at)


NONE = ha.observe(None, None, NOW - 100)


def pod(name: str, slot: ha.Slot, on: str, **kw: Any) -> dict[str, Any]:
    """A gateway pod in the gateway namespace (only those count for HA)."""
    p = bare_pod(name, slot, on, **kw)
    p["metadata"]["namespace"] = ALLOWED.gateway_namespace
    return p


def test_a_gateway_that_neither_wants_nor_had_ha_has_no_ha_part() -> None:
    assert plan_ha(snap(False), ALLOWED, NONE, NOW, WALL) is None


def test_ha_turned_on_for_a_serving_gateway_holds_slot_b_until_slot_a_holds_the_lease() -> None:
    serving = snap(
        True,
        pods=(pod("a-1", "a", "node-a"),),
        owned={"Deployment": deployment("node-a")},
        status={"nodeName": "node-a"},
    )
    first = plan_ha(serving, ALLOWED, NONE, NOW, WALL)
    assert first is not None and first.mode == "full" and first.hold_b
    assert first.slot_a.node == "node-a" and first.slot_b.node == "node-b"
    taken = plan_ha(serving, ALLOWED, held("a-1"), NOW, WALL)
    assert taken is not None and not taken.hold_b and taken.active == "a"


def test_a_new_ha_gateway_holds_nothing_back() -> None:
    fresh = plan_ha(snap(True), ALLOWED, NONE, NOW, WALL)
    assert fresh is not None and fresh.mode == "full" and not fresh.hold_b


def test_ha_the_operator_does_not_allow_is_no_ha() -> None:
    serving = snap(True, pods=(pod("a-1", "a", "node-a"),), owned={"Deployment": deployment("node-a")})
    off = plan_ha(serving, dataclasses.replace(ALLOWED, ha_allowed=False), NONE, NOW, WALL)
    assert off is not None and off.mode == "off" and off.active == "a"


def test_ha_turned_off_while_slot_b_serves_hands_over_once_slot_a_stands_by_ready() -> None:
    pods = (pod("a-1", "a", "node-a"), pod("b-1", "b", "node-b"))
    owned = {"Deployment": deployment("node-a"), "Deployment/b": deployment("node-b")}
    status = {"ha": {"activeSlot": "b"}, "nodeName": "node-b"}
    s = snap(False, pods=pods, owned=owned, status=status)
    plan = plan_ha(s, ALLOWED, held("b-1"), NOW, WALL)
    assert plan is not None and plan.mode == "full" and plan.active == "b"
    assert plan.handover is not None and plan.handover["metadata"]["name"] == "b-1"
    not_ready = (pod("a-1", "a", "node-a", ready=False), pod("b-1", "b", "node-b"))
    waiting = plan_ha(dataclasses.replace(s, pods=not_ready), ALLOWED, held("b-1"), NOW, WALL)
    assert waiting is not None and waiting.handover is None, "no handover to a standby that is not Ready"


def test_ha_turned_off_while_slot_a_serves_drains_slot_b_then_is_off() -> None:
    pods = (pod("a-1", "a", "node-a"), pod("b-1", "b", "node-b"))
    owned = {"Deployment": deployment("node-a"), "Deployment/b": deployment("node-b"), "Lease": {}}
    s = snap(False, pods=pods, owned=owned, status={"ha": {"activeSlot": "a"}})
    draining = plan_ha(s, ALLOWED, held("a-1"), NOW, WALL)
    assert draining is not None and draining.mode == "drain" and draining.handover is None
    gone = dataclasses.replace(s, pods=pods[:1], owned={"Deployment": deployment("node-a"), "Lease": {}})
    off = plan_ha(gone, ALLOWED, held("a-1"), NOW, WALL)
    assert off is not None and off.mode == "off"


def dep(
    hash_: str, *, generation: int = 2, observed: int = 2, updated: int = 1, available: int = 1
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation, "annotations": {ANNOTATION_HASH: hash_}},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": observed,
            "replicas": updated,
            "updatedReplicas": updated,
            "availableReplicas": available,
        },
    }


def want(hash_a: str, hash_b: str) -> list[tuple[str, dict[str, Any]]]:
    return [("Deployment", dep(hash_a)), ("Deployment/b", dep(hash_b))]


def test_a_new_template_rolls_the_standby_first_and_the_active_once_the_standby_rolled_out() -> None:
    old = {"Deployment": dep("old"), "Deployment/b": dep("old")}
    assert rollout_waits(old, want("new", "new"), "a") == "Deployment", "both change: the active waits"
    assert rollout_waits(old, want("new", "new"), "b") == "Deployment/b", "slot b serving: it waits"
    rolling = {"Deployment": dep("old"), "Deployment/b": dep("new", generation=3, observed=2)}
    assert rollout_waits(rolling, want("new", "new"), "a") == "Deployment", "standby not rolled out yet"
    starting = {"Deployment": dep("old"), "Deployment/b": dep("new", generation=3, observed=3, available=0)}
    assert rollout_waits(starting, want("new", "new"), "a") == "Deployment", "its new pod not available yet"
    rolled = {"Deployment": dep("old"), "Deployment/b": dep("new", generation=3, observed=3)}
    assert rollout_waits(rolled, want("new", "new"), "a") is None, "standby rolled out: the active rolls"


def test_nothing_waits_without_a_change_to_the_active_or_without_a_standby() -> None:
    same = {"Deployment": dep("h"), "Deployment/b": dep("h", available=0)}
    assert rollout_waits(same, want("h", "h"), "a") is None
    alone = {"Deployment": dep("old")}
    assert rollout_waits(alone, [("Deployment", dep("new"))], "a") is None, "no standby: roll as without HA"


def test_pods_outside_the_gateway_namespace_never_count_for_ha() -> None:
    """A pod in the tenant's own namespace with the gateway's labels and ha-slot b (anyone may make one
    there) switches nothing of HA on (found by review)."""
    decoy = bare_pod("b-decoy", "b", "node-b")
    decoy["metadata"]["namespace"] = "tenant-acme"
    assert plan_ha(snap(False, pods=(decoy,)), ALLOWED, NONE, NOW, WALL) is None


def test_a_status_claiming_slot_b_without_a_slot_b_is_not_believed() -> None:
    """status.ha.activeSlot is writable by the pod's own ServiceAccount: without a slot b the controller
    made, a gateway without HA stays without it, and the floating IP stays on slot a (found by review)."""
    forged = snap(False, owned={"Deployment": deployment("node-a")}, status={"ha": {"activeSlot": "b"}})
    assert plan_ha(forged, ALLOWED, NONE, NOW, WALL) is None
    asked = snap(True, owned={"Deployment": deployment("node-a")}, status={"ha": {"activeSlot": "b"}})
    plan = plan_ha(asked, ALLOWED, NONE, NOW, WALL)
    assert plan is not None and plan.active == "a"


def test_where_the_cloud_left_the_floating_ip_beats_a_stale_status() -> None:
    """A status write lost after a move (or one patched by the pod): this replica's own last cloud step
    says where the floating IP is."""
    owned = {"Deployment": deployment("node-a"), "Deployment/b": deployment("node-b")}
    s = snap(True, owned=owned, status={"ha": {"activeSlot": "a"}})
    plan = plan_ha(s, ALLOWED, NONE, NOW, WALL, cloud_slot="b")
    assert plan is not None and plan.active == "b"


def test_ha_off_keeps_the_lease_while_its_holder_renews_it() -> None:
    """Deleting it at once, a holder that reads the 404 before its plan without ha would stand down and
    cut every tunnel (found by review): the Lease goes once nobody renews it."""
    owned = {"Deployment": deployment("node-a"), "Lease": {}}
    s = snap(False, pods=(pod("a-1", "a", "node-a"),), owned=owned)
    renewing = plan_ha(s, ALLOWED, held("a-1"), NOW, WALL)
    assert renewing is not None and renewing.mode == "off" and renewing.keep_lease
    stale = plan_ha(s, ALLOWED, held("a-1", at=NOW - 10), NOW, WALL)
    assert stale is not None and not stale.keep_lease
