"""The HA elector's decisions (pure): from what the agent remembers, the gateway's Lease as last read and its
own monotonic clock, the role now and the next write to the Lease. ``agent.ha`` is the loop that reads,
writes and sleeps around these functions; nothing here does I/O or reads a clock.

The rules (docs/ha.md, "Fencing"), as client-go's leaderelection has them:

* **Fenced by its own clock.** The holder counts itself active only until ``renewed_at + deadline``:
  ``renewed_at`` is the monotonic instant its last *successful* take or renewal was *sent* (what anyone saw
  of it is no older than that), ``deadline = leaseDurationSeconds - margin`` (``renew_deadline``). Past it
  the holder is standby whatever the API says, even when the API never answers again.
* **Expiry by observation.** A contender takes a Lease that another pod holds only once the holder and
  ``renewTime`` it reads have stayed the same for the PLAN's ``lease_duration_seconds`` measured on ITS OWN
  monotonic clock from when it first saw that pair (client-go's ``observedTime``). ``renewTime`` is the
  holder's wall clock and is never compared with ours: clocks skew. The Lease's own
  ``leaseDurationSeconds`` is never read for this: every pod that can write the Lease could set it to
  2^31-1 and no standby would ever take over (the holder still writes the plan's value, for readers).
* **A free Lease.** Taken at once only by a pod that serves (the holder, or a pod whose plan just gained
  ``ha``), or by a contender that SAW it released: the same object (``metadata.uid``) read held, then
  with the holder emptied. Any other free Lease (created so by the controller, re-created after a
  deletion, first seen free) is taken only after it stayed unchanged for a whole duration by our clock,
  like an expired one: a holder whose Lease was deleted keeps serving until its own fence deadline (the
  404 is a failed read for it), and a Lease re-created free meanwhile must not make a second pod active.
* **The holder is untrusted text.** ``holderIdentity`` is whatever a pod with ``update`` wrote. One that is
  not a DNS-1123 subdomain (pod names are) is some other holder, never a free Lease, and is only ever
  shown escaped (``shown``): never raw in a log line.
* **Optimistic concurrency.** Takes, renewals and the release are updates carrying the resourceVersion
  read (``lease_update``): a 409 on a take means another pod won; on a renewal it means the Lease changed
  under us, and the next read says by whom (the fence clock keeps running meanwhile: ``settle``).
* **Never created here.** An absent Lease means standby (the controller creates it with no holder; the
  pod's Role cannot be limited to one name for ``create``), except for the pod that serves: for it a 404
  is a failed read, it stays active until its fence deadline (nobody can hold a deleted Lease, and a
  re-created one is not taken by anyone else before that deadline: above).

Why a contender can never serve while a cut-off holder still does: the contender's first sight of the
holder's last renewal comes after the server stored it, which is after the holder sent it; it then waits
``leaseDurationSeconds`` more. The holder stopped ``margin`` seconds before that, by its own clock.

``margin`` is ``max(0.5 s, renewSeconds)``, never more than half the duration. At least 0.5 s: the time
the backends and init-nat need to act on the role (init-nat polls the role file), plus monotonic clocks
that run at slightly different rates; at least ``renewSeconds``: a contender polls every renewSeconds, so
that is its own lateness too, and a holder that missed one renewal still has one more try. The defaults
(3 s, renew every 1 s) give a 2 s deadline: the holder renews at +1 s, retries at +1.5 s after a failure,
and stops serving at +2 s, 1 s before a contender may take over.

A pod whose plan gains ``ha`` while it serves starts as if it had just renewed (``Memory.serving``): it
keeps serving while it takes the free Lease, goes standby at once when someone else holds it (it cannot
prove that holder dead without watching it for a whole duration), and is fenced at its deadline when the
Lease is absent. A pod whose first plan has ``ha`` starts standby (``Memory()``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from agent.runtime import Role
from gwplan import Ha

MIN_MARGIN = 0.5
"""Seconds: the least a holder stops serving before a contender may take over (see the module's docstring)."""

Action = Literal["none", "take", "renew", "release"]
Outcome = Literal["ok", "conflict", "failed"]


def margin(ha: Ha) -> float:
    """How long before the Lease could expire in anyone's eyes the holder stops counting itself active."""
    return min(max(MIN_MARGIN, ha.renew_seconds), ha.lease_duration_seconds / 2)


def renew_deadline(ha: Ha) -> float:
    """Seconds after a successful renewal was sent that the holder stays active without another one."""
    return ha.lease_duration_seconds - margin(ha)


def renew_period(ha: Ha) -> float:
    """How often the holder renews: every ``renewSeconds``, more often when that would leave it fewer
    than two tries before its deadline."""
    return min(ha.renew_seconds, renew_deadline(ha) / 2)


def micro_time(t: float) -> str:
    """A ``metav1.MicroTime`` as the API wants it (RFC 3339, UTC, exactly six fraction digits: the server's
    ``RFC3339Micro`` layout refuses anything else)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SHOWN_MAX = 63
"""The most characters of an invalid holderIdentity a log line shows (escaped)."""


def valid_holder(holder: str) -> bool:
    """A DNS-1123 subdomain, as every pod name is (at most 253 characters)."""
    return len(holder) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(holder) is not None


def shown(holder: str) -> str:
    """A holderIdentity for a log line: a valid one as it is, anything else escaped and cut (it is text a
    pod wrote: a newline in it must not forge a log line, a megabyte of it must not flood the log)."""
    if valid_holder(holder):
        return holder
    cut = holder[:SHOWN_MAX]
    more = f"... ({len(holder)} characters)" if len(holder) > SHOWN_MAX else ""
    return f"invalid holderIdentity {cut!a}{more}"


@dataclass(frozen=True)
class LeaseView:
    """What the elector reads of a Lease."""

    holder: str
    """``spec.holderIdentity``; "" when nobody holds it. Untrusted (any pod with ``update`` writes it): a
    value that is not :func:`valid_holder` is some other holder, and only :func:`shown` goes to a log."""
    renew_time: str | None
    transitions: int
    resource_version: str
    uid: str = ""
    """``metadata.uid``: a deleted and re-created Lease is another object (a release is told from a
    re-creation by it)."""


def view(lease: Mapping[str, Any]) -> LeaseView:
    """The Lease as read. Its ``leaseDurationSeconds`` is not kept: expiry is judged by the plan's."""
    spec = lease.get("spec") or {}
    meta = lease.get("metadata") or {}
    holder = spec.get("holderIdentity")
    return LeaseView(
        holder="" if holder is None else str(holder),
        renew_time=None if spec.get("renewTime") is None else str(spec["renewTime"]),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        uid=str(meta.get("uid") or ""),
    )


@dataclass(frozen=True)
class Memory:
    """What the elector remembers between two reads (monotonic seconds of its own clock)."""

    renewed_at: float | None = None
    """When its last successful take or renewal was sent (or when a serving pod's plan gained ``ha``);
    None: it does not hold the Lease."""
    seen: tuple[str, str, str | None] | None = None
    """The (uid, holder, renewTime) last read; None after a read that found no Lease."""
    seen_at: float = 0.0
    """When ``seen`` was first read with that value."""
    released: bool = False
    """``seen`` is free and the read before it showed the same object held: its holder released it."""

    @staticmethod
    def serving(now: float) -> Memory:
        """A pod that serves without HA and whose plan now has it: active as if it had just renewed."""
        return Memory(renewed_at=now)


@dataclass(frozen=True)
class Step:
    memory: Memory
    role: Role
    action: Action
    why: str
    """Why this role (for the log)."""


def role(mem: Memory, ha: Ha, now: float) -> Role:
    """Active only within the deadline of the last successful renewal sent, by our own clock."""
    if mem.renewed_at is not None and now < mem.renewed_at + renew_deadline(ha):
        return "active"
    return "standby"


def role_why(mem: Memory, ha: Ha, now: float) -> str:
    if mem.renewed_at is None:
        return "not the holder"
    ago = now - mem.renewed_at
    if ago < renew_deadline(ha):
        return "holder"
    return f"not renewed for {ago:.2f} s (deadline {renew_deadline(ha):g} s, by this pod's clock)"


def decide(mem: Memory, lease: LeaseView | None, me: str, ha: Ha, now: float) -> Step:
    """The role and the next action after reading ``lease`` (None: it does not exist) at ``now``."""
    if lease is None:
        if role(mem, ha, now) == "active":
            # Deleted under the pod that serves (HA turned off, or by hand): nobody can hold a deleted
            # Lease and a re-created one is not taken before this pod's deadline (below), so it is a
            # failed read: the clock decides. ``seen`` forgotten: a re-created Lease is a new object.
            why = (
                f"the Lease {ha.lease} does not exist: serving until the deadline ({role_why(mem, ha, now)})"
            )
            return Step(replace(mem, seen=None, released=False), "active", "none", why)
        return Step(
            Memory(), "standby", "none", f"the Lease {ha.lease} does not exist (the controller creates it)"
        )
    record = (lease.uid, lease.holder, lease.renew_time)
    if record != mem.seen:
        released = (
            not lease.holder and mem.seen is not None and mem.seen[0] == lease.uid and mem.seen[1] != ""
        )
        mem = replace(mem, seen=record, seen_at=now, released=released)
    if lease.holder and lease.holder == me:
        return Step(mem, role(mem, ha, now), "renew", role_why(mem, ha, now))
    duration = ha.lease_duration_seconds  # the plan's, never the Lease's (anyone may write that)
    unchanged = now - mem.seen_at
    if not lease.holder:
        if role(mem, ha, now) == "active":
            return Step(mem, "active", "take", "the Lease is free and this pod serves")
        if mem.released:
            return Step(mem, "standby", "take", "the Lease was released by its holder")
        if unchanged >= duration:
            why = f"the Lease is free, unchanged for {unchanged:.2f} s >= {duration} s by this pod's clock"
            return Step(mem, "standby", "take", why)
        why = f"the Lease is free but was not seen released: waiting {duration} s from first sight"
        return Step(mem, "standby", "none", why)
    # Somebody else holds it (they took it from us, or never gave it; or an invalid holderIdentity, which
    # is a holder all the same, never a free Lease): we do not.
    mem = replace(mem, renewed_at=None)
    if unchanged >= duration:
        who = shown(lease.holder)
        why = f"held by {who}, unrenewed for {unchanged:.2f} s >= {duration} s by this pod's clock"
        return Step(mem, "standby", "take", why)
    return Step(mem, "standby", "none", f"held by {shown(lease.holder)}")


def settle(mem: Memory, action: Action, outcome: Outcome, sent_at: float, ha: Ha, now: float) -> Step:
    """After the write ``action`` sent at ``sent_at`` came back with ``outcome`` at ``now``."""
    if action in ("take", "renew") and outcome == "ok":
        mem = replace(mem, renewed_at=sent_at)
        return Step(mem, role(mem, ha, now), "none", "took the Lease" if action == "take" else "renewed")
    if action == "take" and outcome == "conflict":
        return Step(
            replace(mem, renewed_at=None), "standby", "none", "another pod took the Lease first (409)"
        )
    if action == "release":
        return Step(replace(mem, renewed_at=None), "standby", "none", "released")
    # A failed write, or a renewal that found the Lease changed (409): the clock decides until the next read
    # says who holds it.
    return Step(mem, role(mem, ha, now), "none", role_why(mem, ha, now))


def release(lease: LeaseView | None, me: str) -> Action:
    """On a graceful stop: give the Lease up when the last read says we hold it."""
    return "release" if lease is not None and lease.holder == me else "none"


def next_wait(mem: Memory, ha: Ha, now: float, outcome: Outcome | None = None) -> float:
    """Seconds until the next read: the renew period while active, never past the fence instant (so the
    role flips on time even if nothing else happens); ``renewSeconds`` while standby; at once after a
    renewal found the Lease changed; half a period after a failed renewal."""
    if outcome == "conflict" and mem.renewed_at is not None:
        return 0.0
    if role(mem, ha, now) == "active":
        assert mem.renewed_at is not None
        fence = mem.renewed_at + renew_deadline(ha) - now
        period = renew_period(ha) / 2 if outcome == "failed" else renew_period(ha)
        return max(0.0, min(period, fence))
    return ha.renew_seconds


def request_budget(mem: Memory, ha: Ha, now: float) -> float:
    """The most one request may take: below the renew deadline, and for the holder never past its fence
    instant (a request hanging in a partition must not keep the loop from fencing)."""
    budget = renew_deadline(ha)
    if mem.renewed_at is not None:
        budget = min(budget, mem.renewed_at + renew_deadline(ha) - now)
    return max(0.05, budget)


def lease_update(lease: Mapping[str, Any], action: Action, me: str, ha: Ha, wall: float) -> dict[str, Any]:
    """The Lease to PUT for ``action`` at wall-clock time ``wall``. Its ``metadata.resourceVersion`` is the
    one read: the server refuses the write (409) when the Lease changed since. A take sets a new
    ``acquireTime`` and counts a transition; a release empties the holder with a 1 s duration, as client-go's
    ReleaseOnCancel does."""
    spec = dict(lease.get("spec") or {})
    now = micro_time(wall)
    if action == "take":
        spec.update(
            holderIdentity=me,
            leaseDurationSeconds=ha.lease_duration_seconds,
            acquireTime=now,
            renewTime=now,
            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        )
    elif action == "renew":
        spec.update(holderIdentity=me, leaseDurationSeconds=ha.lease_duration_seconds, renewTime=now)
        spec.setdefault("acquireTime", now)
    elif action == "release":
        spec.update(holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now)
    else:
        raise ValueError(f"no update for action {action!r}")
    return {**lease, "spec": spec}
