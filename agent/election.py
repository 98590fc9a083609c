"""The HA elector's decisions (pure): from what the agent remembers, the gateway's Lease as last read and its
own monotonic clock, the role now and the next write to the Lease. ``agent.ha`` is the loop that reads,
writes and sleeps around these functions; nothing here does I/O or reads a clock.

The rules (docs/ha.md, "Fencing"), as client-go's leaderelection has them:

* **Fenced by its own clock.** The holder counts itself active only until ``renewed_at + deadline``:
  ``renewed_at`` is the monotonic instant its last *successful* take or renewal was *sent* (what anyone saw
  of it is no older than that), ``deadline = leaseDurationSeconds - margin`` (``renew_deadline``). Past it
  the holder is standby whatever the API says, even when the API never answers again.
* **Expiry by observation.** A contender takes a Lease that another pod holds only once the holder and
  ``renewTime`` it reads have stayed the same for ``leaseDurationSeconds`` measured on ITS OWN monotonic
  clock from when it first saw that pair (client-go's ``observedTime``). ``renewTime`` is the holder's wall
  clock and is never compared with ours: clocks skew. A Lease with no holder (created so by the
  controller, or released) is taken at once.
* **Optimistic concurrency.** Takes, renewals and the release are updates carrying the resourceVersion
  read (``lease_update``): a 409 on a take means another pod won; on a renewal it means the Lease changed
  under us, and the next read says by whom (the fence clock keeps running meanwhile: ``settle``).
* **Never created here.** An absent Lease means standby (the controller creates it with no holder; the
  pod's Role cannot be limited to one name for ``create``).

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
keeps serving while it takes the free Lease, and goes standby at once when someone else holds it or the
Lease is absent (it cannot prove that holder dead without watching it for a whole duration). A pod whose
first plan has ``ha`` starts standby (``Memory()``).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class LeaseView:
    """What the elector reads of a Lease."""

    holder: str
    """``spec.holderIdentity``; "" when nobody holds it."""
    renew_time: str | None
    duration: int | None
    """``spec.leaseDurationSeconds`` (the holder's promise), if set."""
    transitions: int
    resource_version: str


def view(lease: Mapping[str, Any]) -> LeaseView:
    spec = lease.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return LeaseView(
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=None if spec.get("renewTime") is None else str(spec["renewTime"]),
        duration=duration if isinstance(duration, int) and duration > 0 else None,
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


@dataclass(frozen=True)
class Memory:
    """What the elector remembers between two reads (monotonic seconds of its own clock)."""

    renewed_at: float | None = None
    """When its last successful take or renewal was sent (or when a serving pod's plan gained ``ha``);
    None: it does not hold the Lease."""
    seen: tuple[str, str | None] | None = None
    """The (holder, renewTime) last read."""
    seen_at: float = 0.0
    """When ``seen`` was first read with that value."""

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
        return Step(
            Memory(), "standby", "none", f"the Lease {ha.lease} does not exist (the controller creates it)"
        )
    record = (lease.holder, lease.renew_time)
    if record != mem.seen:
        mem = replace(mem, seen=record, seen_at=now)
    if lease.holder == me:
        return Step(mem, role(mem, ha, now), "renew", role_why(mem, ha, now))
    if not lease.holder:
        return Step(mem, role(mem, ha, now), "take", "the Lease is free")
    # Somebody else holds it (they took it from us, or never gave it): we do not.
    mem = replace(mem, renewed_at=None)
    duration = lease.duration or ha.lease_duration_seconds
    unrenewed = now - mem.seen_at
    if unrenewed >= duration:
        why = f"held by {lease.holder}, unrenewed for {unrenewed:.2f} s >= {duration} s by this pod's clock"
        return Step(mem, "standby", "take", why)
    return Step(mem, "standby", "none", f"held by {lease.holder}")


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
