"""Warm-standby HA's pure decisions (controller/ha.py): the Lease observed by the controller's own clock,
who serves and when the floating IP may move, the pair's placement, status.ha, StandbyReady, the
failover's Event and metrics, HA switched on and off. Each rule of the module docstring has a case that
fails when the rule is broken."""

from __future__ import annotations

from typing import Any

import pytest

from controller import ha
from controller.ha import (
    LeaseRecord,
    Move,
    Observation,
    Pins,
    Serving,
    Tenure,
    decide,
    disable,
    expired,
    fenced,
    observe,
    place_pair,
    recorded_slot,
    serve,
    slot_of,
    valid_holder,
)
from controller.names import LABEL_HA_SLOT
from controller.placement import Placement

WALL = "2026-12-03T16:00:00Z"
LATER = "2026-12-03T16:05:00Z"


def node(
    name: str,
    *,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    cordoned: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": [], "unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(
    name: str,
    slot: ha.Slot,
    on: str | None,
    *,
    ready: bool = True,
    phase: str = "Running",
    deleting: bool = False,
    created: str = "2026-12-03T10:00:00Z",
) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": {"app": "gw"}, "creationTimestamp": created}
    if slot == "b":
        md["labels"][LABEL_HA_SLOT] = "b"
    if deleting:
        md["deletionTimestamp"] = "2026-12-03T11:00:00Z"
    return {
        "metadata": md,
        "spec": {"nodeName": on} if on else {},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def lease(
    holder: str, renew: str = "2026-12-03T16:00:00.000000Z", duration: Any = 3, rv: str = "1"
) -> dict[str, Any]:
    return {
        "metadata": {"name": "gw", "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration},
    }


def watch(*steps: tuple[float, dict[str, Any] | None]) -> Observation:
    """Feed ``observe`` each (time, Lease) in order, as the informer would."""
    obs: Observation | None = None
    for t, doc in steps:
        obs = observe(obs, doc, t)
    assert obs is not None
    return obs


def renewals(holder: str, start: float, end: float, every: float = 1.0) -> list[tuple[float, dict[str, Any]]]:
    """``holder`` renewing every ``every`` seconds from ``start`` to ``end`` (its renewTime changing)."""
    out = []
    t, i = start, 0
    while t <= end + 1e-9:
        out.append((t, lease(holder, renew=f"{holder}-renew-{i}", rv=f"{holder}{i}")))
        t, i = t + every, i + 1
    return out


PODS = [pod("a1", "a", "n1"), pod("b1", "b", "n2")]
PINS: Pins = {"a": "n1", "b": "n2"}
NODES = [node("n1"), node("n2"), node("n3")]


# --- the Lease, observed by our own clock -----------------------------------------------------------------


def test_the_first_sighting_starts_the_clock_and_assumes_unseen_history() -> None:
    obs = observe(None, lease("a1"), 100.0)
    assert obs.record == LeaseRecord("a1", "2026-12-03T16:00:00.000000Z", 3.0, "1")
    assert (obs.seen_at, obs.since, obs.previous) == (100.0, 100.0, None)
    # Someone may have renewed just before we looked: nobody else may be believed gone before 103 (+margin).
    assert obs.fence_until == 103.0
    assert not fenced(obs, 103.9) and fenced(obs, 104.0)


def test_an_unchanged_record_expires_after_its_duration_by_our_clock() -> None:
    obs = watch((0.0, lease("a1")), (2.0, lease("a1")), (2.9, lease("a1")))
    assert obs.seen_at == 0.0
    assert valid_holder(obs, 2.99) == "a1"
    assert valid_holder(obs, 3.0) is None
    assert expired(obs, 3.0) and not expired(obs, 3.0, margin=0.5) and expired(obs, 3.5, margin=0.5)


def test_a_renewal_is_a_change_of_renew_time_and_restarts_the_clock() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0))
    assert obs.seen_at == 10.0
    assert valid_holder(obs, 12.9) == "a1"
    assert valid_holder(obs, 13.0) is None


@pytest.mark.parametrize(
    "renew_times",
    [
        pytest.param(["2099-01-01T00:00:00.000000Z"] * 3, id="skewed-into-the-future-unchanged"),
        pytest.param(["1999-01-01T00:00:00.000000Z"] * 3, id="skewed-into-the-past-unchanged"),
    ],
)
def test_a_skewed_renew_time_that_does_not_change_still_expires(renew_times: list[str]) -> None:
    obs = watch(*((float(i), lease("a1", renew=r)) for i, r in enumerate(renew_times)))
    assert obs.seen_at == 0.0
    assert valid_holder(obs, 2.5) == "a1"
    assert valid_holder(obs, 3.0) is None  # the holder's far-future renewTime buys nothing


@pytest.mark.parametrize(
    "renew_times",
    [
        pytest.param([f"1999-01-01T00:00:0{i}.000000Z" for i in range(6)], id="in-the-past-but-renewing"),
        pytest.param([f"2099-01-01T00:00:0{i}.000000Z" for i in range(6)], id="in-the-future-and-renewing"),
    ],
)
def test_a_skewed_renew_time_that_changes_is_valid(renew_times: list[str]) -> None:
    obs = watch(*((float(i), lease("a1", renew=r)) for i, r in enumerate(renew_times)))
    assert obs.seen_at == 5.0
    assert valid_holder(obs, 7.9) == "a1"


def test_a_new_resource_version_alone_is_no_renewal() -> None:
    """Someone labelling the Lease bumps its resourceVersion; the holder did not renew."""
    obs = watch((0.0, lease("a1", rv="1")), (2.0, lease("a1", rv="2")))
    assert obs.seen_at == 0.0
    assert obs.record is not None and obs.record.resource_version == "2"
    assert valid_holder(obs, 3.0) is None


def test_a_replaced_holder_leaves_a_fence_at_its_last_sighted_renewal() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0), (13.5, lease("b1", renew="b1-0")))
    assert obs.previous == Tenure("a1", 10.0, 3.0, released=False)
    assert obs.fence_until == 13.0  # a1's last renewal (10) + its duration (3)
    assert valid_holder(obs, 13.5) == "b1"
    assert obs.seen_at == 13.5


def test_a_released_holder_leaves_no_fence_and_is_remembered_through_the_empty_holder() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0), (10.5, lease("", renew="r", duration=1)))
    assert obs.previous == Tenure("a1", 10.0, 3.0, released=True)
    assert obs.fence_until == 3.0  # only the unseen history before we watched
    assert valid_holder(obs, 10.5) is None  # nobody holds it
    obs = observe(obs, lease("b1", renew="b1-0"), 11.0)
    assert obs.previous == Tenure("a1", 10.0, 3.0, released=True)
    assert valid_holder(obs, 11.0) == "b1"


def test_a_deleted_lease_is_no_release() -> None:
    obs = watch(*renewals("a1", 0.0, 5.0), (6.0, None))
    assert obs.record is None
    assert obs.previous == Tenure("a1", 5.0, 3.0, released=False)
    assert obs.fence_until == 8.0
    assert valid_holder(obs, 6.0) is None and expired(obs, 6.0)


def test_a_fence_survives_a_later_release() -> None:
    """a1 loses the Lease without releasing it (b1 takes it); b1 then releases: a1's fence still holds."""
    obs = watch(
        *renewals("a1", 0.0, 10.0),
        (11.0, lease("b1", renew="b1-0")),
        (11.5, lease("", renew="x", duration=1)),
    )
    assert obs.fence_until == 13.0
    assert obs.previous == Tenure("b1", 11.0, 3.0, released=True)


@pytest.mark.parametrize("duration", [None, 0, -1, "3", True])
def test_an_unreadable_duration_falls_back_to_the_default(duration: Any) -> None:
    obs = observe(None, lease("a1", duration=duration), 0.0)
    assert obs.record is not None and obs.record.duration == ha.DEFAULT_DURATION


def test_no_lease_and_an_empty_holder_have_no_valid_holder() -> None:
    assert valid_holder(observe(None, None, 0.0), 0.0) is None
    assert valid_holder(observe(None, lease(""), 0.0), 0.0) is None


# --- pods and slots ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "holder, expected",
    [
        pytest.param("a1", "a", id="no-label-is-slot-a"),
        pytest.param("b1", "b", id="labelled-b"),
        pytest.param("zz", None, id="unknown-pod"),
        pytest.param(None, None, id="no-holder"),
        pytest.param("", None, id="empty-holder"),
    ],
)
def test_slot_of(holder: str | None, expected: str | None) -> None:
    assert slot_of(holder, PODS) == expected


@pytest.mark.parametrize(
    "status, expected",
    [
        pytest.param({"ha": {"activeSlot": "b"}, "nodeName": "n1"}, "b", id="recorded"),
        pytest.param({"ha": {"activeSlot": "a"}}, "a", id="recorded-a"),
        pytest.param({"nodeName": "n1"}, "a", id="ran-without-ha-is-slot-a"),
        pytest.param({"ha": {"activeSlot": "c"}, "nodeName": "n1"}, None, id="garbage-is-nothing"),
        pytest.param({"ha": {}, "nodeName": "n1"}, None, id="ha-begun-nothing-served-yet"),
        pytest.param({}, None, id="nothing-placed-yet"),
    ],
)
def test_recorded_slot(status: dict[str, Any], expected: str | None) -> None:
    assert recorded_slot(status) == expected


# --- who serves -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps, now",
    [
        pytest.param([(0.0, None)], 5.0, id="no-lease"),
        pytest.param([(0.0, lease(""))], 5.0, id="empty-holder"),
        pytest.param(renewals("a1", 0.0, 2.0), 5.0, id="expired-holder"),
        pytest.param(
            [*renewals("a1", 0.0, 2.0), (2.5, lease("b1", renew="b"))], 5.6, id="expired-new-holder"
        ),
    ],
)
@pytest.mark.parametrize("current", ["a", "b", None])
def test_without_a_valid_holder_everything_stays_where_it_is(
    steps: list[tuple[float, dict[str, Any] | None]], now: float, current: ha.Slot | None
) -> None:
    s = serve(current, watch(*steps), now, PODS, PINS)
    assert (s.slot, s.move, s.holder_slot) == (current, None, None)


def test_an_unknown_holder_pod_gets_nothing() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0), (11.0, lease("stranger", renew="s")))
    s = serve("a", obs, 11.5, PODS, PINS)
    assert (s.slot, s.holder, s.holder_slot, s.move) == ("a", "stranger", None, None)
    assert "not one of the gateway's pods" in s.why


def test_a_holder_off_its_slots_node_gets_nothing() -> None:
    """Slot b was re-pinned to n3 (its port follows); its old pod on n2 still holds the Lease."""
    obs = watch(*renewals("a1", 0.0, 10.0), (11.0, lease("b1", renew="b")))
    s = serve("a", obs, 12.0, PODS, {"a": "n1", "b": "n3"})
    assert (s.slot, s.holder_slot, s.move) == ("a", None, None)
    assert "not on slot b's node n3" in s.why


def test_the_holder_in_the_serving_slot_moves_nothing() -> None:
    s = serve("a", watch(*renewals("a1", 0.0, 10.0)), 10.5, PODS, PINS)
    assert (s.slot, s.holder, s.holder_slot, s.move) == ("a", "a1", "a", None)
    assert s.requeue_at == 13.0  # its expiry, by our clock


def test_a_new_pod_of_the_serving_slot_moves_nothing() -> None:
    pods = [pod("a1", "a", "n1", deleting=True), pod("a2", "a", "n1"), pod("b1", "b", "n2")]
    obs = watch(*renewals("a1", 0.0, 10.0), (14.0, lease("a2", renew="a2")))
    s = serve("a", obs, 15.0, pods, PINS)
    assert (s.slot, s.holder_slot, s.move) == ("a", "a", None)


def test_a_takeover_after_expiry_moves_to_the_new_holder() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0), (13.5, lease("b1", renew="b1-0")))
    s = serve("a", obs, 14.0, PODS, PINS)
    assert s.slot == "b"
    assert s.move == Move("a", "b", "LeaseExpired", "b1", "a1", 4.0)


def test_a_takeover_before_expiry_by_our_clock_waits_for_the_fence() -> None:
    """The standby took the Lease earlier than our observation allows (its clock, or a sighting of ours
    that came late): nothing moves until a1 expired by our clock plus the margin."""
    obs = watch(*renewals("a1", 0.0, 10.0), (11.0, lease("b1", renew="b1-0")))
    s = serve("a", obs, 11.0, PODS, PINS)
    assert (s.slot, s.holder_slot, s.move) == ("a", "b", None)
    assert s.requeue_at == 14.0  # a1's last renewal 10 + 3 + margin 1
    assert serve("a", obs, 13.99, PODS, PINS).move is None
    later = observe(obs, lease("b1", renew="b1-1"), 13.5)
    moved = serve("a", later, 14.0, PODS, PINS)
    assert moved.move == Move("a", "b", "LeaseExpired", "b1", "a1", 4.0)


def test_a_released_lease_moves_at_once() -> None:
    """a1's pod is being deleted (its agent released the Lease as it stopped): b1 gets it at once."""
    obs = watch(
        *renewals("a1", 0.0, 10.0),
        (10.2, lease("", renew="rel", duration=1)),
        (10.6, lease("b1", renew="b1-0")),
    )
    pods = [pod("a1", "a", "n1", deleting=True), pod("b1", "b", "n2")]
    s = serve("a", obs, 10.6, pods, PINS)
    assert s.move is not None
    assert (s.move.reason, s.move.from_pod, s.move.to_slot) == ("Released", "a1", "b")
    assert s.move.seconds == pytest.approx(0.6)


def test_a_release_by_a_pod_that_runs_on_waits_like_an_expiry() -> None:
    """a1 emptied the holder but its pod is not going (a compromised agent flapping the Lease): no move
    before its last renewal plus the duration, as if it had stopped renewing (found by review)."""
    obs = watch(
        *renewals("a1", 0.0, 10.0),
        (10.2, lease("", renew="rel", duration=1)),
        (10.6, lease("b1", renew="b1-0")),
    )
    early = serve("a", obs, 10.6, PODS, PINS)
    assert early.move is None and early.slot == "a"
    obs = watch(
        *renewals("a1", 0.0, 10.0),
        (10.2, lease("", renew="rel", duration=1)),
        *renewals("b1", 10.6, 14.6),
    )
    late = serve("a", obs, 14.1, PODS, PINS)
    assert late.move is not None and late.move.to_slot == "b"


def test_the_holder_switching_back_and_forth_follows_the_valid_holder() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0), (13.2, lease("b1", renew="b1-0")))
    first = serve("a", obs, 14.0, PODS, PINS)
    assert first.slot == "b"
    obs = watch(
        *renewals("a1", 0.0, 10.0),
        *renewals("b1", 13.2, 20.2),
        (20.4, lease("", renew="rel", duration=1)),
        (21.0, lease("a2", renew="a2-0")),
    )
    pods = [pod("a2", "a", "n1"), pod("b1", "b", "n2", deleting=True)]
    back = serve("b", obs, 21.0, pods, PINS)
    assert back.move is not None
    assert (back.move.from_slot, back.move.to_slot, back.move.reason) == ("b", "a", "Released")


def test_never_to_a_slot_whose_holder_is_no_longer_valid() -> None:
    """b1 took the Lease and then stopped renewing before we acted: nothing moves to it."""
    obs = watch(*renewals("a1", 0.0, 10.0), (13.5, lease("b1", renew="b1-0")))
    s = serve("a", obs, 16.5, PODS, PINS)
    assert (s.slot, s.move, s.holder) == ("a", None, None)


def test_the_first_holder_is_placed_initially_once_unseen_history_has_passed() -> None:
    obs = watch((0.0, lease("")), (0.5, lease("a1", renew="a1-0")))
    early = serve(None, obs, 0.5, PODS, PINS)
    assert (early.slot, early.move, early.requeue_at) == (None, None, 3.5)
    obs = watch((0.0, lease("")), *renewals("a1", 0.5, 4.5))
    s = serve(None, obs, 4.5, PODS, PINS)
    assert s.move == Move(None, "a", "Initial", "a1", None, None)


def test_a_controller_that_started_after_the_takeover_waits_a_duration_and_cannot_time_it() -> None:
    obs = watch(*renewals("b1", 100.0, 104.0))
    assert serve("a", obs, 103.5, PODS, PINS).move is None
    s = serve("a", obs, 104.0, PODS, PINS)
    assert s.move == Move("a", "b", "LeaseExpired", "b1", None, None)


# --- the pair's placement ---------------------------------------------------------------------------------


def pair(
    pins: Pins,
    nodes: list[dict[str, Any]],
    *,
    active: ha.Slot | None,
    hold: bool = False,
    pinned: dict[str, int] | None = None,
    **kw: Any,
) -> tuple[tuple[str | None, str], tuple[str | None, str]]:
    p = place_pair(
        pins,
        nodes,
        pinned or {},
        selector=kw.get("selector", {}),
        tolerations=[],
        cap=kw.get("cap", 0),
        active=active,
        hold_active=hold,
    )
    assert p.a.node is None or p.a.node != p.b.node, "two slots on one node"
    return (p.a.node, p.a.reason), (p.b.node, p.b.reason)


@pytest.mark.parametrize(
    "pins, nodes, active, hold, pinned, expected",
    [
        pytest.param(
            {"a": None, "b": None},
            NODES,
            None,
            False,
            {},
            (("n1", "Placed"), ("n2", "Placed")),
            id="fresh-pair",
        ),
        pytest.param(
            {"a": None, "b": None},
            NODES,
            None,
            False,
            {"n1": 2, "n2": 1},
            (("n3", "Placed"), ("n2", "Placed")),
            id="fresh-fewest-first",
        ),
        pytest.param(
            {"a": None, "b": None},
            [node("n1")],
            None,
            False,
            {},
            (("n1", "Placed"), (None, ha.NO_SECOND_NODE)),
            id="one-node",
        ),
        pytest.param(
            {"a": None, "b": None},
            [],
            None,
            False,
            {},
            ((None, "NoSchedulableNode"), (None, "NoSchedulableNode")),
            id="no-node",
        ),
        pytest.param(
            {"a": "n2", "b": "n1"},
            NODES,
            "a",
            False,
            {"n1": 3, "n2": 3},
            (("n2", "Pinned"), ("n1", "Pinned")),
            id="sticky-although-n3-is-emptier",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1"), node("n2", ready=False), node("n3")],
            "a",
            False,
            {},
            (("n1", "Pinned"), ("n3", "Repinned")),
            id="standby-node-lost-replaces-only-the-standby",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1"), node("n2", ready=False)],
            "a",
            False,
            {},
            (("n1", "Pinned"), (None, ha.NO_SECOND_NODE)),
            id="standby-node-lost-never-onto-the-actives",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1"), node("n3")],
            "b",
            False,
            {},
            (("n1", "Pinned"), ("n3", "Repinned")),
            id="active-b-node-deleted-not-held-repins",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1", ready=False), node("n2"), node("n3")],
            "a",
            True,
            {},
            (("n1", ha.AWAITING_FAILOVER), ("n2", "Pinned")),
            id="active-node-lost-held-for-the-failover",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1", ready=False), node("n2"), node("n3")],
            "a",
            False,
            {},
            (("n3", "Repinned"), ("n2", "Pinned")),
            id="active-node-lost-no-failover-repins-off-the-standbys-node",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1", ready=False), node("n2")],
            "a",
            False,
            {},
            (("n1", "NoSchedulableNode"), ("n2", "Pinned")),
            id="active-node-lost-nowhere-else-stays",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1", ready=False), node("n2"), node("n3")],
            None,
            False,
            {},
            (("n3", "Repinned"), ("n2", "Pinned")),
            id="nothing-serves-slot-a-repinned-as-without-ha",
        ),
        pytest.param(
            {"a": "n1", "b": "n1"},
            NODES,
            "a",
            False,
            {},
            (("n1", "Pinned"), ("n2", "Repinned")),
            id="a-shared-node-is-undone-on-the-standby",
        ),
        pytest.param(
            {"a": "n1", "b": None},
            [node("n1"), node("n2"), node("n3")],
            "a",
            False,
            {"n2": 1},
            (("n1", "Pinned"), ("n3", "Placed")),
            id="standby-placed-fewest",
        ),
        pytest.param(
            {"a": "n1", "b": "n2"},
            [node("n1", cordoned=True), node("n2", cordoned=True)],
            "b",
            False,
            {},
            (("n1", "Pinned"), ("n2", "Pinned")),
            id="cordons-keep-both",
        ),
    ],
)
def test_place_pair(
    pins: Pins,
    nodes: list[dict[str, Any]],
    active: ha.Slot | None,
    hold: bool,
    pinned: dict[str, int],
    expected: tuple[tuple[str | None, str], tuple[str | None, str]],
) -> None:
    assert pair(pins, nodes, active=active, hold=hold, pinned=pinned) == expected


def test_standby_cap_counts_other_gateways() -> None:
    got = pair({"a": "n1", "b": None}, [node("n1"), node("n2")], active="a", pinned={"n2": 1}, cap=1)
    assert got == (("n1", "Pinned"), (None, ha.NO_SECOND_NODE))


def test_the_active_b_keeps_its_node_and_is_placed_first() -> None:
    """Slot b serves on n3; slot a's node is lost. b is not moved although n1/n2 hold fewer gateways, and a
    goes anywhere but n3."""
    got = pair(
        {"a": "n1", "b": "n3"},
        [node("n1", ready=False), node("n2"), node("n3")],
        active="b",
        pinned={"n3": 5},
    )
    assert got == (("n2", "Repinned"), ("n3", "Pinned"))


def test_a_selector_change_moves_the_standby_only_while_the_active_node_matches() -> None:
    vpn = {"pool": "vpn"}
    got = pair(
        {"a": "n1", "b": "n2"},
        [node("n1", labels=vpn), node("n2"), node("n3", labels=vpn)],
        active="a",
        selector=vpn,
    )
    assert got == (("n1", "Pinned"), ("n3", "Repinned"))


def serving(slot: ha.Slot | None, holder_slot: ha.Slot | None) -> Serving:
    return Serving(slot, "x" if holder_slot else None, holder_slot, None, "why")


@pytest.mark.parametrize(
    "srv, standby_ready, now, expected",
    [
        pytest.param(serving("a", "a"), False, 100.0, True, id="active-still-holds"),
        pytest.param(serving("a", None), True, 10.0 + 3 + 3 + 0.9, True, id="standby-ready-within-grace"),
        pytest.param(serving("a", None), True, 10.0 + 3 + 3 + 1.0, False, id="standby-ready-past-grace"),
        pytest.param(serving("a", None), False, 11.0, False, id="no-ready-standby"),
        pytest.param(serving("a", "b"), False, 11.0, False, id="holder-in-the-other-slot-not-yet-moved"),
    ],
)
def test_hold_lost_active(srv: Serving, standby_ready: bool, now: float, expected: bool) -> None:
    obs = watch(*renewals("a1", 0.0, 10.0))
    assert ha.hold_lost_active(srv, obs, now, standby_ready) is expected


# --- status.ha, StandbyReady, Events, metrics -------------------------------------------------------------


def placed(a: str | None, b: str | None, active: ha.Slot | None = "a") -> ha.PairPlacement:
    return ha.PairPlacement(Placement(a, "Pinned", f"on {a}"), Placement(b, "Pinned", f"on {b}"), active)


def test_status_ha_names_active_and_standby_and_keeps_the_last_failover() -> None:
    prev = {"activeSlot": "a", "lastFailoverTime": "2026-12-01T00:00:00Z", "lastFailoverReason": "Released"}
    st = ha.ha_status(prev, Serving("a", "a1", "a", None, "why"), placed("n1", "n2"), PODS, WALL)
    assert st == {
        "activeSlot": "a",
        "activeNode": "n1",
        "activePod": "a1",
        "standbyNode": "n2",
        "standbyPod": "b1",
        "lastFailoverTime": "2026-12-01T00:00:00Z",
        "lastFailoverReason": "Released",
    }


def test_status_ha_records_a_failover_but_not_the_initial_placement() -> None:
    move = Move("a", "b", "LeaseExpired", "b1", "a1", 4.0)
    st = ha.ha_status({}, Serving("b", "b1", "b", move, "why"), placed("n1", "n2", "b"), PODS, WALL)
    assert (st["activePod"], st["standbyPod"], st["lastFailoverTime"], st["lastFailoverReason"]) == (
        "b1",
        "a1",
        WALL,
        "LeaseExpired",
    )
    first = Move(None, "a", "Initial", "a1")
    st = ha.ha_status({}, Serving("a", "a1", "a", first, "why"), placed("n1", "n2"), PODS, WALL)
    assert "lastFailoverTime" not in st


def test_status_ha_without_a_holder_names_no_active_pod() -> None:
    st = ha.ha_status(None, Serving("a", None, None, None, "why"), placed("n1", None), [], WALL)
    assert st == {"activeSlot": "a", "activeNode": "n1"}
    assert (
        ha.ha_status(None, Serving(None, None, None, None, "why"), placed(None, None, None), [], WALL) == {}
    )


@pytest.mark.parametrize(
    "current, wanted, expected",
    [
        pytest.param({"activeSlot": "a"}, {"activeSlot": "a"}, None, id="same"),
        pytest.param(
            {"activeSlot": "a", "activePod": "a1"},
            {"activeSlot": "a"},
            {"ha": {"activePod": None}},
            id="a-key-that-goes-is-nulled",
        ),
        pytest.param(None, {"activeSlot": "a"}, {"ha": {"activeSlot": "a"}}, id="new"),
        pytest.param({"activeSlot": "b"}, None, {"ha": None}, id="removed"),
        pytest.param(None, None, None, id="absent-stays-absent"),
        pytest.param(None, {}, {"ha": {}}, id="ha-begun-is-written-as-an-empty-object"),
        pytest.param({}, {}, None, id="empty-stays"),
    ],
)
def test_ha_patch(
    current: dict[str, Any] | None, wanted: dict[str, Any] | None, expected: dict[str, Any] | None
) -> None:
    assert ha.ha_patch(current, wanted) == expected


HOLDS_A = Serving("a", "a1", "a", None, "a1 (slot a) holds the Lease")


@pytest.mark.parametrize(
    "srv, where, pods, nodes, reason",
    [
        pytest.param(HOLDS_A, placed("n1", None), PODS, NODES, ha.NO_SECOND_NODE, id="no-second-node"),
        pytest.param(
            Serving("a", None, None, None, "nobody holds the Lease"),
            placed("n1", "n2"),
            PODS,
            NODES,
            "NoHolder",
            id="no-holder",
        ),
        pytest.param(
            Serving("a", "b1", "b", None, "fence"),
            placed("n1", "n2"),
            PODS,
            NODES,
            "NoHolder",
            id="not-yet-moved",
        ),
        pytest.param(
            HOLDS_A, placed("n1", "n3"), PODS, NODES, "StandbyPending", id="no-standby-pod-on-its-node"
        ),
        pytest.param(
            HOLDS_A,
            placed("n1", "n2"),
            [pod("a1", "a", "n1"), pod("b1", "b", "n2", phase="Pending", ready=False)],
            NODES,
            "StandbyPending",
            id="standby-pod-pending",
        ),
        pytest.param(
            HOLDS_A,
            placed("n1", "n2"),
            [pod("a1", "a", "n1"), pod("b1", "b", "n2", ready=False)],
            NODES,
            "StandbyNotReady",
            id="standby-pod-not-ready",
        ),
        pytest.param(
            HOLDS_A,
            placed("n1", "n2"),
            PODS,
            [node("n1"), node("n2", ready=False)],
            "StandbyNotReady",
            id="standby-node-not-ready",
        ),
        pytest.param(
            HOLDS_A,
            placed("n1", "n2"),
            [pod("a1", "a", "n1"), pod("b1", "b", "n2", deleting=True)],
            NODES,
            "StandbyPending",
            id="standby-pod-being-deleted",
        ),
        pytest.param(
            HOLDS_A,
            placed("n1", "n1"),
            [pod("a1", "a", "n1"), pod("b1", "b", "n1")],
            NODES,
            "SameNode",
            id="same-node",
        ),
        pytest.param(HOLDS_A, placed("n1", "n2"), PODS, NODES, "StandbyReady", id="ready"),
    ],
)
def test_standby_ready(
    srv: Serving,
    where: ha.PairPlacement,
    pods: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    reason: str,
) -> None:
    c = ha.standby_condition(srv, where, pods, nodes)
    assert c.type == ha.STANDBY_READY
    assert (c.status, c.reason) == (reason == "StandbyReady", reason)
    assert c.message


def test_the_failover_event_names_both_pods_nodes_and_why() -> None:
    move = Move("a", "b", "LeaseExpired", "b1", "a1", 4.0)
    (e,) = ha.failover_events(Serving("b", "b1", "b", move, "why"), PINS)
    assert (e.type, e.reason) == ("Warning", "Failover")
    for part in ("pod a1", "node n1", "pod b1", "node n2", "expired", "4.0 s"):
        assert part in e.message
    released = Move("b", "a", "Released", "a2", "b1", 0.5)
    (r,) = ha.failover_events(Serving("a", "a2", "a", released, "why"), PINS)
    assert (r.type, r.reason) == ("Normal", "Failover")
    assert "released" in r.message


def test_no_event_without_a_failover() -> None:
    assert ha.failover_events(Serving("a", "a1", "a", None, "why"), PINS) == []
    initial = Move(None, "a", "Initial", "a1")
    assert ha.failover_events(Serving("a", "a1", "a", initial, "why"), PINS) == []


def test_failover_metrics() -> None:
    m = ha.failover_metrics(Move("a", "b", "Released", "b1", "a1", 0.6))
    assert m == (
        ha.Sample(ha.FAILOVERS_TOTAL, "inc", 1.0, (("reason", "Released"),)),
        ha.Sample(ha.FAILOVER_SECONDS, "observe", 0.6),
    )
    assert ha.failover_metrics(Move("a", "b", "LeaseExpired", "b1")) == (
        ha.Sample(ha.FAILOVERS_TOTAL, "inc", 1.0, (("reason", "LeaseExpired"),)),
    )
    assert ha.failover_metrics(Move(None, "a", "Initial", "a1")) == ()
    assert ha.failover_metrics(None) == ()


# --- HA switched off --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "current, pods, expected",
    [
        pytest.param("a", PODS, ha.HaOff("a", "b", True, None), id="a-serves-b-goes"),
        pytest.param("a", [pod("a1", "a", "n1")], ha.HaOff("a", "b", False, None), id="b-gone-plan-drops-ha"),
        pytest.param("b", PODS, ha.HaOff("b", "a", True, {"activeSlot": "b"}), id="b-serves-a-goes"),
        pytest.param(None, [], ha.HaOff("a", "b", False, None), id="nothing-serves-keep-a"),
    ],
)
def test_disable(current: ha.Slot | None, pods: list[dict[str, Any]], expected: ha.HaOff) -> None:
    assert disable(current, pods) == expected


def test_a_gateway_left_in_slot_b_is_served_by_slot_b_when_ha_returns() -> None:
    off = disable("b", PODS)
    assert off.status is not None
    assert recorded_slot({"nodeName": "n2", "ha": off.status}) == "b"


# --- whole decisions over time ----------------------------------------------------------------------------


def run(
    status: dict[str, Any],
    pins: Pins,
    obs: Observation,
    now: float,
    pods: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    wall: str = WALL,
) -> ha.HaDecision:
    return decide(
        status=status,
        pins=pins,
        observed=obs,
        now=now,
        wall=wall,
        pods=pods,
        nodes=nodes,
        pinned={},
        selector={},
        tolerations=[],
    )


def test_enabling_ha_on_a_running_gateway_keeps_slot_a_and_moves_nothing() -> None:
    status = {"nodeName": "n2", "publicIP": "203.0.113.5"}
    running = [pod("a1", "a", "n2")]
    nodes = [node("n1"), node("n2"), node("n3")]
    # The controller created the Lease with no holder; slot a's pod has not taken it yet.
    obs = watch((0.0, lease("")))
    d = run(status, {"a": "n2", "b": None}, obs, 0.5, running, nodes)
    assert (d.placement.a.node, d.placement.a.reason) == ("n2", "Pinned")
    assert d.placement.b.node in ("n1", "n3")
    assert (d.serving.slot, d.serving.move) == ("a", None)
    assert d.status == {"activeSlot": "a", "activeNode": "n2", "standbyNode": d.placement.b.node}
    assert d.condition.reason == "NoHolder"
    # Slot a's pod takes the free Lease at once: it is the first holder, and nothing moves.
    obs = observe(obs, lease("a1", renew="a1-0"), 1.0)
    d = run({**status, "ha": d.status}, {"a": "n2", "b": d.placement.b.node}, obs, 1.0, running, nodes)
    assert (d.serving.slot, d.serving.holder_slot, d.serving.move) == ("a", "a", None)
    assert (d.events, d.metrics) == ((), ())
    assert d.status["activePod"] == "a1"
    assert d.condition.reason == "StandbyPending"


def test_the_active_node_dies_the_standby_takes_over_and_the_old_active_is_replaced() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    status: dict[str, Any] = {"nodeName": "n1", "ha": {"activeSlot": "a"}}
    obs = watch(*renewals("a1", 0.0, 10.0))
    d = run(status, PINS, obs, 10.0, PODS, nodes)
    assert d.condition.status and d.serving.move is None
    assert d.requeue_at == 13.0  # a1's expiry by our clock, unless it renews meanwhile
    # n1 dies after 10: a1 stops renewing; b1 takes the expired Lease at 13.5 (its own clock).
    obs = observe(obs, lease("b1", renew="b1-0"), 13.5)
    d = run(status, PINS, obs, 13.5, PODS, nodes)
    assert (d.serving.slot, d.serving.move) == ("a", None)  # a1's fence: 10 + 3 + margin 1
    assert d.requeue_at == 14.0
    d = run(status, PINS, obs, 14.0, PODS, nodes, LATER)
    assert d.serving.move == Move("a", "b", "LeaseExpired", "b1", "a1", 4.0)
    assert d.placement.active == "b"  # placed around the new active in the same decision
    assert (d.placement.b.reason, d.placement.a.reason) == ("Pinned", "Pinned")
    assert d.status["activeSlot"] == "b" and d.status["lastFailoverTime"] == LATER
    assert (d.status["activePod"], d.status["standbyPod"]) == ("b1", "a1")
    assert [e.reason for e in d.events] == ["Failover"]
    assert d.metrics[0] == ha.Sample(ha.FAILOVERS_TOTAL, "inc", 1.0, (("reason", "LeaseExpired"),))
    # n1 turns NotReady much later (the node monitor's grace): slot a, now the standby, is re-placed; b stays.
    status = {"nodeName": "n1", "ha": d.status}
    obs = watch(*renewals("a1", 0.0, 10.0), *renewals("b1", 13.5, 50.5))
    lost = [node("n1", ready=False), node("n2"), node("n3")]
    d = run(status, PINS, obs, 50.5, PODS, lost)
    assert (d.placement.b.node, d.placement.b.reason) == ("n2", "Pinned")
    assert (d.placement.a.node, d.placement.a.reason) == ("n3", "Repinned")
    assert (d.events, d.metrics) == ((), ())
    assert d.condition.reason == "StandbyPending"  # no slot a pod on n3 yet


def test_the_active_node_reported_lost_before_the_failover_is_held() -> None:
    """The node is gone from the API at once (deleted): the active is not re-pinned while the ready
    standby can take the Lease; past the grace, it is."""
    gone = [node("n2"), node("n3")]
    status: dict[str, Any] = {"nodeName": "n1", "ha": {"activeSlot": "a"}}
    obs = watch(*renewals("a1", 0.0, 10.0))
    d = run(status, PINS, obs, 11.0, PODS, gone)
    assert (d.placement.a.node, d.placement.a.reason) == ("n1", ha.AWAITING_FAILOVER)  # a1 still holds
    d = run(status, PINS, obs, 14.0, PODS, gone)
    assert (d.placement.a.node, d.placement.a.reason) == ("n1", ha.AWAITING_FAILOVER)  # expired, b1 is Ready
    assert d.requeue_at == 17.0  # 10 + 3 + 3 + margin 1: when the hold gives up
    d = run(status, PINS, obs, 17.0, PODS, gone)
    assert (d.placement.a.node, d.placement.a.reason) == ("n3", "Repinned")
    assert d.placement.b.node == "n2"


def test_a_lost_active_without_a_ready_standby_is_repinned_at_once() -> None:
    gone = [node("n2"), node("n3")]
    pods = [pod("a1", "a", "n1"), pod("b1", "b", "n2", ready=False)]
    status: dict[str, Any] = {"nodeName": "n1", "ha": {"activeSlot": "a"}}
    obs = watch(*renewals("a1", 0.0, 10.0))
    d = run(status, PINS, obs, 13.0, pods, gone)
    assert (d.placement.a.node, d.placement.a.reason) == ("n3", "Repinned")


def test_one_usable_node_keeps_the_active_and_says_why_there_is_no_standby() -> None:
    obs = watch(*renewals("a1", 0.0, 10.0))
    d = run(
        {"ha": {"activeSlot": "a"}}, {"a": "n1", "b": None}, obs, 10.0, [pod("a1", "a", "n1")], [node("n1")]
    )
    assert (d.placement.a.node, d.placement.b.node) == ("n1", None)
    assert (d.condition.status, d.condition.reason) == (False, ha.NO_SECOND_NODE)
    assert "never share a node" in d.condition.message
    assert d.status == {"activeSlot": "a", "activeNode": "n1", "activePod": "a1"}
