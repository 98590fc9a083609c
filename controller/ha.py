"""Warm-standby HA (docs/ha.md): which nodes the pair runs on, who serves, and what status says. Pure.

An HA gateway has two slots, ``a`` and ``b``, each a Deployment pinned to its own node with its own
Neutron port attached to that node's server. Slot a's objects carry the names a gateway without HA has,
so enabling HA leaves the running pod alone; slot b's pods carry ``LABEL_HA_SLOT: b``. Whoever holds the
gateway's Lease serves; the controller moves the floating IP, the address pairs and the router routes to
the holder's slot. Everything here is a function of a snapshot and of a time passed in (the controller's
monotonic clock for the Lease, an RFC 3339 string for status): nothing reads a clock or does I/O.

**The Lease, as client-go's leader election reads it** (``observe``, ``expired``, ``valid_holder``). The
Lease's ``renewTime`` is the holder's clock: it is compared for change only, never with ours. The
controller records when it last saw ``holderIdentity`` or ``renewTime`` change (``seen_at``) and counts
a holder expired once ``leaseDurationSeconds`` have passed since then on its own clock. A holder that
stops being the holder leaves a ``Tenure`` behind (released, when it emptied the holder itself, which
the agent does when it stops gracefully) and, unless it released, a fence: until its last sighted
renewal plus its duration (plus ``margin``) it may still be serving by its own clock, and nothing moves
to anyone else before then (``Observation.fence_until``). A controller that starts watching knows no
history: it assumes someone renewed just before it started (``since`` plus the duration), as a client-go
candidate does. The observation is only as good as its sightings: the wiring must feed ``observe``
every version of the Lease its informer delivers (a renewal it never sees makes the previous holder's
fence end too early). The agent's own fence (it stops serving when it cannot renew) and the standby's
(it takes the Lease only once expired by its own clock) come first; this one is the third.

**Who serves** (``serve``). The floating IP, the address pairs and the routes belong to the slot of the
valid holder, and stay where they are (``current``: ``recorded_slot``) when there is none (no Lease, an
empty holder, an expired one, a pod that is not one of the gateway's, a pod running off its slot's node,
whose port is not where it runs): nobody serves then, and the next valid holder gets them. They never
move to a slot while another holder may still serve (the fence above); the decision says when to look
again. A move is data (``Move``): from slot, to slot, why (``Initial``: nothing was placed yet;
``Released``: the previous holder emptied the holder; ``LeaseExpired``: it stopped renewing, by our
clock) and, when the previous holder was seen, the failover's duration (its last sighted renewal to
now). A new pod of the serving slot taking over (a restarted pod) moves nothing: the port is the same.

**The pair's placement** (``place_pair``, built on ``controller.placement.place``). The two slots never
share a node. The active slot (the one serving) is placed first and is sticky as a single gateway is: it
keeps its node while the node keeps it, even when another node would be a better fit. A standby whose
node is lost is re-placed on another node (never the active's); the active is not touched. An active
whose node is lost is NOT re-pinned while the failover can still happen (``hold_lost_active``: its pod
still holds the Lease, i.e. it still serves whatever its kubelet says; or the standby is Ready and the
Lease has not been expired for longer than a second lease duration plus the margin): re-pinning it would
move its port and restart its pod, an outage the failover avoids. Once the standby holds the Lease it is
the active, the old active is the standby, and the rule for a lost standby re-places it. When the
failover cannot happen (no Ready standby, or one that does not take the Lease) the active is re-pinned
as a gateway without HA would be (no worse than without HA), off the standby's node. With one usable node
only, the active keeps it and the standby has none (``NoSecondNode``).

**Flipping HA.** On: slot a keeps its node and its port; ``recorded_slot`` says a gateway that ran
without HA is served by slot a, so the first holder (slot a's pod, which takes the free Lease at once)
moves nothing. Off (``disable``): the slot serving at that moment stays and the other goes, whichever it
is; the floating IP does not move. A gateway left in slot b keeps slot b's names and port until HA comes
back (``status.ha.activeSlot`` remembers it; ``HaOff.status``). The kept slot's plan keeps its ``ha``
section until the leaving slot's pods are gone, so the leaving standby can never take the Lease and
serve meanwhile; then the plan drops it and the Lease can go.

**Status** (``ha_status``, ``standby_condition``, ``failover_events``). ``status.ha`` says which slot,
node and pod are active and standby and when and why the last failover happened (kept while nothing
changes). ``StandbyReady`` is True only when the standby's pod is Ready on a Ready node other than the
active's; it is advisory (the gateway serves without a standby). A failover gets an Event ``Failover``
(Warning when the previous holder expired, Normal when it released), and metrics as data (``Sample``).

**For the wiring.** ``decide`` composes the pieces (serve, then place around the serving slot, then
status); each piece is public for a shell that needs them apart (the cloud step between placement and
status). Keep one ``Observation`` per gateway in every controller replica, fed from the Lease informer's
handler (every version, and None on delete), not only at reconcile. ``pinned`` counts the other gateways'
slots per node. ``StandbyReady`` is advisory (``status.ADVISORY``) and ``ha`` a controller status key
(``status.CONTROLLER_KEYS``; patch it with ``ha_patch``). ``requeue_at`` is monotonic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from controller.names import LABEL_HA_SLOT
from controller.placement import Placement, keeps, place, ready
from controller.status import Condition, StatusEvent

Slot = Literal["a", "b"]
SLOTS: tuple[Slot, Slot] = ("a", "b")
Pins = Mapping[Slot, str | None]
"""slot -> the node its Deployment is pinned to now (None: the slot has none)."""

DEFAULT_MARGIN = 1.0
"""Seconds added to a lease duration before the controller believes a holder stopped serving: the
clocks' rate difference and the watch's delivery latency (docs/ha.md, "Fencing")."""
DEFAULT_DURATION = 3.0
"""``leaseDurationSeconds`` assumed for a Lease that does not say (``gwplan.Ha``'s default)."""

STANDBY_READY = "StandbyReady"
FAILOVER = "Failover"
FAILOVERS_TOTAL = "vpngw_controller_ha_failovers"
"""Counter (``_total`` added by the client), label ``reason`` (``LeaseExpired``, ``Released``)."""
FAILOVER_SECONDS = "vpngw_controller_ha_failover_duration_seconds"
"""Histogram: from the previous holder's last sighted renewal to the decision to move."""

MoveReason = Literal["Initial", "Released", "LeaseExpired"]


def other(slot: Slot) -> Slot:
    return "b" if slot == "a" else "a"


# --- the Lease --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    """What the controller reads of the gateway's Lease."""

    holder: str
    """``spec.holderIdentity`` (a pod name); empty: nobody holds it (never created so, or released)."""
    renew_time: str
    """``spec.renewTime`` as the holder wrote it (its clock): compared for change only."""
    duration: float
    """``spec.leaseDurationSeconds``."""
    resource_version: str


@dataclass(frozen=True)
class Tenure:
    """The holder before the current one, as the controller last saw it."""

    holder: str
    renewed_at: float
    """The controller's monotonic clock when it last saw this holder's renewTime change."""
    duration: float
    released: bool
    """It emptied the holder itself (a graceful stop), rather than being replaced or losing the Lease."""


@dataclass(frozen=True)
class Observation:
    record: LeaseRecord | None
    """The Lease as last read (None: there is none)."""
    seen_at: float
    """When the holder or renewTime last changed, by the controller's monotonic clock."""
    since: float
    """When the controller began watching this Lease."""
    previous: Tenure | None = None
    """The last holder before the current one (None: none seen since ``since``)."""
    fence_until: float = 0.0
    """Until this time (plus the margin), a holder other than the current one may still serve by its
    own clock: the latest sighted renewal plus duration of every holder that lost the Lease without
    releasing it, and ``since`` plus a duration (the unseen history before we watched)."""


def record_of(
    lease: Mapping[str, Any] | None, default_duration: float = DEFAULT_DURATION
) -> LeaseRecord | None:
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    raw = spec.get("leaseDurationSeconds")
    duration = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) and raw > 0 else 0.0
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        duration=duration or default_duration,
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def observe(
    previous: Observation | None,
    lease: Mapping[str, Any] | None,
    now: float,
    *,
    default_duration: float = DEFAULT_DURATION,
) -> Observation:
    """The observation after reading ``lease`` (None: it does not exist) at ``now`` (monotonic).
    ``previous`` None: the first read (a controller that just started, or a gateway just seen)."""
    rec = record_of(lease, default_duration)
    if previous is None:
        # Unseen history: someone may have renewed (with the usual duration) just before we looked.
        assumed = max(default_duration, rec.duration if rec is not None else 0.0)
        return Observation(rec, now, now, None, now + assumed)
    old = previous.record
    changed = rec is None or old is None or (rec.holder, rec.renew_time) != (old.holder, old.renew_time)
    seen_at = now if changed else previous.seen_at
    tenure, fence = previous.previous, previous.fence_until
    new_holder = rec.holder if rec is not None else ""
    if old is not None and old.holder and new_holder != old.holder:
        released = rec is not None and new_holder == ""  # a deleted Lease is no release
        tenure = Tenure(old.holder, previous.seen_at, old.duration, released)
        if not released:
            fence = max(fence, previous.seen_at + old.duration)
    return Observation(rec, seen_at, previous.since, tenure, fence)


def expired(observed: Observation, now: float, margin: float = 0.0) -> bool:
    """The current record has not changed for its whole duration plus ``margin`` on our clock (or there is
    no Lease). Its renewTime, the holder's clock, plays no part."""
    if observed.record is None:
        return True
    return now >= observed.seen_at + observed.record.duration + margin


def valid_holder(observed: Observation, now: float) -> str | None:
    """The pod holding the Lease by our observation; None when there is no Lease, nobody holds it, or
    its holder has not renewed for the Lease's duration."""
    if observed.record is None or not observed.record.holder or expired(observed, now):
        return None
    return observed.record.holder


def fenced(observed: Observation, now: float, margin: float = DEFAULT_MARGIN) -> bool:
    """No holder other than the current one can still be serving by its own clock (by our sightings)."""
    return now >= observed.fence_until + margin


def refence(observed: Observation, now: float, duration: float) -> Observation:
    """``observed`` after versions went unseen (the informer listed anew): any holder may have renewed
    just before ``now``, so nothing moves before ``now`` plus a duration, as for a controller that starts."""
    return replace(observed, fence_until=max(observed.fence_until, now + duration))


def release_fence(observed: Observation, pods: Sequence[Mapping[str, Any]]) -> Observation:
    """A release counts as one only while its holder's pod is gone or being deleted: a pod that emptied
    the holder and runs on (a compromised agent flapping the Lease between itself and the other slot's pod
    name) gets the fence of a holder that stopped renewing, so it cannot move the floating IP faster than
    once per lease duration (found by review)."""
    prev = observed.previous
    if prev is None or not prev.released:
        return observed
    pod = find_pod(pods, prev.holder)
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return observed
    return replace(
        observed,
        previous=replace(prev, released=False),
        fence_until=max(observed.fence_until, prev.renewed_at + prev.duration),
    )


# --- pods and slots ---------------------------------------------------------------------------------------


def slot_of_pod(pod: Mapping[str, Any]) -> Slot:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return "b" if labels.get(LABEL_HA_SLOT) == "b" else "a"


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _node_of(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def find_pod(pods: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((p for p in pods if _name(p) == name), None)


def slot_of(holder: str | None, pods: Sequence[Mapping[str, Any]]) -> Slot | None:
    """The slot of the pod named ``holder`` among the gateway's pods; None: no holder, or not one of them."""
    if not holder:
        return None
    pod = find_pod(pods, holder)
    return slot_of_pod(pod) if pod is not None else None


def slot_pod(pods: Sequence[Mapping[str, Any]], slot: Slot, node: str | None) -> Mapping[str, Any] | None:
    """The slot's newest pod on ``node`` that is not being deleted (None: none there)."""
    if node is None:
        return None
    mine = [
        p
        for p in pods
        if slot_of_pod(p) == slot
        and _node_of(p) == node
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    if not mine:
        return None
    return sorted(mine, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))[-1]


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def _node(nodes: Sequence[Mapping[str, Any]], name: str | None) -> Mapping[str, Any] | None:
    return next((n for n in nodes if _name(n) == name), None) if name else None


def standby_ready(
    pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], slot: Slot, node: str | None
) -> bool:
    """The slot has a Ready pod on ``node``, and the node is Ready."""
    pod, n = slot_pod(pods, slot, node), _node(nodes, node)
    return pod is not None and pod_ready(pod) and n is not None and ready(n)


def recorded_slot(status: Mapping[str, Any]) -> Slot | None:
    """Where the floating IP, address pairs and routes were last decided to be (the ``current`` of
    ``serve``): ``status.ha.activeSlot``. Without ``status.ha`` at all, a gateway that ran without HA
    (``status.nodeName``) is served by slot a (enabling HA moves nothing). None: nothing was placed yet
    (``status.ha`` present without ``activeSlot``, which ``ha_status`` writes as ``{}`` until a first
    holder, or a gateway that never ran)."""
    recorded = status.get("ha")
    if isinstance(recorded, Mapping):
        slot = recorded.get("activeSlot")
        return ("a" if slot == "a" else "b") if slot in SLOTS else None
    return "a" if status.get("nodeName") else None


# --- who serves -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """Moving the floating IP, the address pairs and the routes (disassociate first, then associate:
    docs/ha.md)."""

    from_slot: Slot | None
    to_slot: Slot
    reason: MoveReason
    to_pod: str
    from_pod: str | None = None
    """The previous holder (None: not seen)."""
    seconds: float | None = None
    """From the previous holder's last sighted renewal to now; None when not seen (Initial, or a
    controller that started watching after it)."""

    @property
    def failover(self) -> bool:
        return self.from_slot is not None


@dataclass(frozen=True)
class Serving:
    slot: Slot | None
    """Where the floating IP, the address pairs and the routes belong after this decision (None: nothing
    was ever placed and nobody holds the Lease yet: associate nothing)."""
    holder: str | None
    """The valid holder (a pod name), whatever its slot."""
    holder_slot: Slot | None
    """The valid holder's slot when it can serve there (one of the gateway's pods, on its slot's node)."""
    move: Move | None
    why: str
    """Why things are where they are (for status messages and logs)."""
    requeue_at: float | None = None
    """Monotonic time at which the answer can change by time alone (a fence ending, the holder's expiry)."""


def serve(
    current: Slot | None,
    observed: Observation,
    now: float,
    pods: Sequence[Mapping[str, Any]],
    pins: Pins,
    *,
    margin: float = DEFAULT_MARGIN,
) -> Serving:
    """Where the floating IP, the address pairs and the routes belong (module docstring, "Who serves").
    ``current``: where they were last decided to be (``recorded_slot``); ``pins``: each slot's node now
    (where its port is attached)."""
    observed = release_fence(observed, pods)
    holder = valid_holder(observed, now)
    if holder is None:
        rec = observed.record
        if rec is None:
            why = "there is no Lease yet"
        elif not rec.holder:
            why = "nobody holds the Lease"
        else:
            why = (
                f"the Lease of {rec.holder} expired: not renewed for {now - observed.seen_at:.1f} s by the "
                f"controller's clock (duration {rec.duration:g} s)"
            )
        return Serving(current, None, None, None, why)
    expiry = observed.seen_at + (observed.record.duration if observed.record else 0.0)
    pod = find_pod(pods, holder)
    if pod is None:
        why = f"the Lease's holder {holder} is not one of the gateway's pods"
        return Serving(current, holder, None, None, why, expiry)
    slot = slot_of_pod(pod)
    if _node_of(pod) != pins.get(slot):
        why = (
            f"the Lease's holder {holder} runs on node {_node_of(pod)}, not on slot {slot}'s node "
            f"{pins.get(slot)}, where the slot's port is attached"
        )
        return Serving(current, holder, None, None, why, expiry)
    if slot == current:
        return Serving(current, holder, slot, None, f"{holder} (slot {slot}) holds the Lease", expiry)
    if not fenced(observed, now, margin):
        until = observed.fence_until + margin
        why = (
            f"{holder} (slot {slot}) holds the Lease, but a previous holder may still serve by its own "
            f"clock for {until - now:.1f} s more (never two pods serving)"
        )
        return Serving(current, holder, slot, None, why, min(until, expiry))
    prev = observed.previous
    reason: MoveReason
    if current is None:
        reason = "Initial"
    elif prev is not None and prev.released:
        reason = "Released"
    else:
        reason = "LeaseExpired"
    seconds = now - prev.renewed_at if current is not None and prev is not None else None
    move = Move(current, slot, reason, holder, prev.holder if prev else None, seconds)
    return Serving(slot, holder, slot, move, f"{holder} (slot {slot}) holds the Lease", expiry)


# --- the pair's placement ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairPlacement:
    a: Placement
    b: Placement
    active: Slot | None
    """The slot placed first (the serving one; None: nothing serves yet, slot a went first)."""

    def of(self, slot: Slot) -> Placement:
        return self.a if slot == "a" else self.b

    def node(self, slot: Slot) -> str | None:
        return self.of(slot).node


AWAITING_FAILOVER = "AwaitingFailover"
NO_SECOND_NODE = "NoSecondNode"


def hold_lost_active(
    serving: Serving,
    observed: Observation,
    now: float,
    standby_is_ready: bool,
    *,
    margin: float = DEFAULT_MARGIN,
) -> bool:
    """Whether an active slot whose node is lost keeps its pin (the failover still can happen): its pod
    holds the Lease (it serves, whatever its kubelet says), or the standby is Ready and the Lease has not
    been expired for longer than another lease duration plus the margin (a standby that does not take
    over by then will not)."""
    if serving.slot is not None and serving.holder_slot == serving.slot:
        return True
    duration = observed.record.duration if observed.record is not None else DEFAULT_DURATION
    return standby_is_ready and not expired(observed, now, duration + margin)


def place_pair(
    pins: Pins,
    nodes: Sequence[Mapping[str, Any]],
    pinned: Mapping[str, int],
    *,
    selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    cap: int = 0,
    active: Slot | None,
    hold_active: bool = False,
) -> PairPlacement:
    """Both slots' nodes, never the same (module docstring, "The pair's placement"). ``pinned``: how many
    OTHER gateways each node holds (this gateway's two slots excluded); ``active``: the serving slot
    (``Serving.slot``); ``hold_active``: ``hold_lost_active``."""
    first: Slot = active or "a"
    second = other(first)
    by_name = {_name(n): n for n in nodes}

    def usable(name: str | None) -> bool:
        return name is not None and name in by_name and keeps(by_name[name], selector)

    def without(name: str | None) -> list[Mapping[str, Any]]:
        return [n for n in nodes if _name(n) != name]

    pin = pins.get(first)
    kw: dict[str, Any] = {"selector": selector, "tolerations": tolerations, "cap": cap}
    if pin is not None and not usable(pin) and active is not None and hold_active:
        lead = Placement(
            pin,
            AWAITING_FAILOVER,
            f"node {pin} of the active slot {first} is lost: kept until the standby takes the Lease "
            "(re-pinning the active would restart it: an outage the failover avoids)",
        )
    else:
        # Off the other slot's node while that node keeps it (the other slot is not moved for us).
        avoid = pins.get(second) if usable(pins.get(second)) and pins.get(second) != pin else None
        lead = place(pin, without(avoid), pinned, **kw)
        if lead.node is None and pin is not None:
            lead = Placement(
                pin,
                lead.reason,
                f"node {pin} is lost and no other node can take slot {first}: {lead.message}",
            )
    spin = pins.get(second)
    if lead.node is None:
        # Never a standby without an active: what keeps the first slot off every node keeps this one.
        trail = Placement(
            None, lead.reason, f"slot {first} has no node, so slot {second} gets none: {lead.message}"
        )
    else:
        trail = place(spin, without(lead.node), pinned, **kw)
        if trail.node is None:
            trail = Placement(
                None,
                NO_SECOND_NODE,
                f"no second node can take slot {second} (two pods of one gateway never share a node; "
                f"slot {first} runs on {lead.node}): {trail.message}",
            )
        elif spin is not None and spin == lead.node:
            trail = Placement(
                trail.node,
                "Repinned",
                f"slot {second} shared node {spin} with slot {first}: re-pinned to {trail.node}",
                moved_from=spin,
            )
    a, b = (lead, trail) if first == "a" else (trail, lead)
    return PairPlacement(a, b, active)


# --- status, Events, metrics ------------------------------------------------------------------------------


def ha_status(
    previous: Mapping[str, Any] | None,
    serving: Serving,
    placed: PairPlacement,
    pods: Sequence[Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    """``status.ha`` (keys with no value left out, as the API stores them: ``ha_patch`` nulls the ones
    that go). ``previous``: the ``status.ha`` the decision saw; ``now``: RFC 3339, for a failover."""
    out: dict[str, Any] = {}
    if serving.slot is not None:
        act, stb = serving.slot, other(serving.slot)
        standby_pod = slot_pod(pods, stb, placed.node(stb))
        out = {
            "activeSlot": act,
            "activeNode": placed.node(act),
            "activePod": serving.holder if serving.holder_slot == act else None,
            "standbyNode": placed.node(stb),
            "standbyPod": _name(standby_pod) if standby_pod is not None else None,
        }
    prev = previous or {}
    if serving.move is not None and serving.move.failover:
        out["lastFailoverTime"] = now
        out["lastFailoverReason"] = serving.move.reason
    else:
        out["lastFailoverTime"] = prev.get("lastFailoverTime")
        out["lastFailoverReason"] = prev.get("lastFailoverReason")
    return {k: v for k, v in out.items() if v is not None}


def ha_patch(current: Mapping[str, Any] | None, wanted: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The merge patch of ``status.ha`` (a merge patch merges nested objects: a key that goes must be sent
    as null); None: already so. ``wanted`` None: remove ``status.ha``."""
    cur = dict(current or {})
    if wanted is None:
        return None if current is None else {"ha": None}
    patch: dict[str, Any] = {k: v for k, v in wanted.items() if cur.get(k) != v}
    patch.update({k: None for k in cur if k not in wanted})
    return {"ha": patch} if patch or current is None else None


def standby_condition(
    serving: Serving,
    placed: PairPlacement,
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
) -> Condition:
    """``StandbyReady``: True only when the standby slot's pod is Ready on a Ready node other than the
    active's. The first failing rule gives the reason."""
    act = serving.slot if serving.slot is not None else "a"
    stb = other(act)
    where = placed.of(stb)
    if where.node is None:
        return Condition(
            STANDBY_READY,
            False,
            NO_SECOND_NODE,
            f"no standby: {where.message} (the gateway serves without one; a failover is not possible)",
        )
    if serving.holder_slot is None or serving.holder_slot != serving.slot:
        return Condition(
            STANDBY_READY,
            False,
            "NoHolder",
            f"no pod serves: {serving.why} (a standby stands by for a valid Lease holder; the next "
            "valid holder gets the floating IP)",
        )
    if where.node == placed.node(act):
        return Condition(
            STANDBY_READY,
            False,
            "SameNode",
            f"the standby (slot {stb}) and the active share node {where.node}: one node's loss would take "
            "both (the controller never places them so; this is a bug)",
        )
    pod = slot_pod(pods, stb, where.node)
    if pod is None or (pod.get("status") or {}).get("phase", "Pending") == "Pending":
        what = f"pod {_name(pod)} is Pending" if pod is not None else "no pod yet"
        return Condition(
            STANDBY_READY,
            False,
            "StandbyPending",
            f"the standby (slot {stb}) on node {where.node}: {what} (a standby must run and be Ready "
            "to take over)",
        )
    node = _node(nodes, where.node)
    if node is None or not ready(node):
        return Condition(
            STANDBY_READY,
            False,
            "StandbyNotReady",
            f"the standby's node {where.node} is not Ready (a standby on a lost node cannot take over)",
        )
    if not pod_ready(pod):
        return Condition(
            STANDBY_READY,
            False,
            "StandbyNotReady",
            f"the standby pod {_name(pod)} (slot {stb}) on node {where.node} is not Ready (a standby "
            "must be Ready to take over)",
        )
    return Condition(
        STANDBY_READY,
        True,
        "StandbyReady",
        f"pod {_name(pod)} (slot {stb}) stands by on node {where.node}; the active runs on "
        f"{placed.node(act)}",
    )


def failover_events(serving: Serving, pins: Pins) -> list[StatusEvent]:
    """The Event of a failover (none for the first placement or when nothing moves). ``pins``: each
    slot's node before this decision (where the previous holder ran)."""
    move = serving.move
    if move is None or move.from_slot is None:
        return []
    frm = f"pod {move.from_pod}" if move.from_pod else f"slot {move.from_slot}"
    why = {
        "LeaseExpired": "its Lease expired (not renewed for a lease duration by the controller's clock)",
        "Released": "it released the Lease (a graceful stop)",
        "Initial": "",
    }[move.reason]
    took = f" after {move.seconds:.1f} s" if move.seconds is not None else ""
    return [
        StatusEvent(
            "Warning" if move.reason == "LeaseExpired" else "Normal",
            FAILOVER,
            f"from {frm} on node {pins.get(move.from_slot)} (slot {move.from_slot}) to pod {move.to_pod} on "
            f"node {pins.get(move.to_slot)} (slot {move.to_slot}): {why}; the floating IP, address pairs "
            f"and routes follow{took}",
        )
    ]


@dataclass(frozen=True)
class Sample:
    """One metric update for the wiring to record."""

    name: str
    kind: Literal["inc", "observe"]
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def failover_metrics(move: Move | None) -> tuple[Sample, ...]:
    """``FAILOVERS_TOTAL{reason}`` +1 per failover, and ``FAILOVER_SECONDS`` when its duration is known.
    The first placement (``Initial``) is no failover."""
    if move is None or not move.failover:
        return ()
    out = [Sample(FAILOVERS_TOTAL, "inc", 1.0, (("reason", move.reason),))]
    if move.seconds is not None:
        out.append(Sample(FAILOVER_SECONDS, "observe", move.seconds))
    return tuple(out)


# --- HA off -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HaOff:
    keep: Slot
    """The slot that stays: the one serving (slot a when none does)."""
    drop: Slot
    plan_keeps_ha: bool
    """The kept slot's plan still carries ``ha`` (its agent keeps the Lease) while a pod of the dropped
    slot exists; once they are gone the plan drops it and the Lease may be deleted."""
    status: dict[str, Any] | None
    """``status.ha`` while HA is off: ``{"activeSlot": "b"}`` when slot b stays (its names and port are
    the gateway's now), None (no ``status.ha``) for slot a."""


def disable(current: Slot | None, pods: Sequence[Mapping[str, Any]]) -> HaOff:
    """HA switched off: keep the serving slot, drop the other (module docstring, "Flipping HA")."""
    keep: Slot = current or "a"
    drop = other(keep)
    leaving = any(slot_of_pod(p) == drop for p in pods)
    return HaOff(keep, drop, leaving, {"activeSlot": keep} if keep == "b" else None)


# --- one decision -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HaDecision:
    placement: PairPlacement
    serving: Serving
    status: dict[str, Any]
    """``status.ha`` (``ha_patch`` against the one seen)."""
    condition: Condition
    """``StandbyReady`` (advisory: not part of Ready)."""
    events: tuple[StatusEvent, ...]
    metrics: tuple[Sample, ...]
    requeue_at: float | None
    """Monotonic time at which to decide again though nothing else changed (None: no need)."""


def decide(
    *,
    status: Mapping[str, Any],
    pins: Pins,
    observed: Observation,
    now: float,
    wall: str,
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pinned: Mapping[str, int],
    selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    cap: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> HaDecision:
    """One HA gateway's decision: who serves (from ``recorded_slot(status)`` and the Lease), then the
    pair's placement around the serving slot, then ``status.ha``, ``StandbyReady``, the failover's Event
    and metrics. ``status``: the gateway's status as the decision saw it; ``pins``: each slot's
    Deployment's node now; ``observed``: ``observe`` fed every Lease version; ``now``: monotonic;
    ``wall``: RFC 3339 (status times)."""
    serving = serve(recorded_slot(status), observed, now, pods, pins, margin=margin)
    hold = False
    if serving.slot is not None:
        stb = other(serving.slot)
        hold = hold_lost_active(
            serving, observed, now, standby_ready(pods, nodes, stb, pins.get(stb)), margin=margin
        )
    placed = place_pair(
        pins,
        nodes,
        pinned,
        selector=selector,
        tolerations=tolerations,
        cap=cap,
        active=serving.slot,
        hold_active=hold,
    )
    times = [t for t in (serving.requeue_at,) if t is not None and t > now]
    if placed.active is not None and placed.of(placed.active).reason == AWAITING_FAILOVER:
        duration = observed.record.duration if observed.record is not None else DEFAULT_DURATION
        times.append(observed.seen_at + 2 * duration + margin)  # when the hold gives up
    return HaDecision(
        placement=placed,
        serving=serving,
        status=ha_status(status.get("ha"), serving, placed, pods, wall),
        condition=standby_condition(serving, placed, pods, nodes),
        events=tuple(failover_events(serving, pins)),
        metrics=failover_metrics(serving.move),
        requeue_at=min(times) if times else None,
    )
