"""The HA elector's rules (``agent.election``, pure): fencing by the holder's own clock, expiry by the
contender's own observation (never by ``renewTime`` against a local clock), takes and renewals as updates
with the resourceVersion read, ``ha`` appearing on a serving pod, the release, and the Lease's wire
format."""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.election import (
    LeaseView,
    Memory,
    decide,
    lease_update,
    margin,
    micro_time,
    next_wait,
    release,
    renew_deadline,
    renew_period,
    request_budget,
    role,
    settle,
    shown,
    valid_holder,
    view,
)
from agent.ha import ROLE_FILE_RETRY, Api, LeaseElector
from gwplan import Ha
from initnat import rules as initnat_rules

HA = Ha(lease="gw-ha")  # duration 3 s, renew 1 s: margin 1 s, deadline 2 s
ME, OTHER = "gw-a-7d9f-x1", "gw-b-5c4e-y2"


def lease(
    holder: str = "",
    renew: str | None = "2026-12-03T16:00:00.123456Z",
    rv: str = "10",
    uid: str = "uid-1",
    **spec: Any,
) -> LeaseView:
    return view(
        {
            "metadata": {"name": "gw-ha", "resourceVersion": rv, "uid": uid},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 3, **spec},
        }
    )


# --- timings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "duration, renew, want_margin, want_deadline, want_period",
    [
        pytest.param(3, 1.0, 1.0, 2.0, 1.0, id="defaults"),
        pytest.param(3, 0.2, 0.5, 2.5, 0.2, id="fast-renew-margin-floor"),
        pytest.param(3, 2.0, 1.5, 1.5, 0.75, id="slow-renew-capped-at-half-the-duration"),
        pytest.param(1, 0.9, 0.5, 0.5, 0.25, id="tiny-duration-two-tries-in-the-window"),
        pytest.param(15, 2.0, 2.0, 13.0, 2.0, id="client-go-like"),
    ],
)
def test_margin_deadline_and_period(
    duration: int, renew: float, want_margin: float, want_deadline: float, want_period: float
) -> None:
    ha = Ha("l", duration, renew)
    assert (margin(ha), renew_deadline(ha), renew_period(ha)) == (want_margin, want_deadline, want_period)
    assert renew_period(ha) * 2 <= renew_deadline(ha) < duration


def test_micro_time_has_exactly_six_fraction_digits_in_utc() -> None:
    assert micro_time(0) == "1970-01-01T00:00:00.000000Z"
    assert micro_time(1796313600.123456) == "2026-12-03T16:00:00.123456Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", micro_time(1796313600.5))


# --- rule 1: the holder is fenced by its own clock ----------------------------------------------------------


@pytest.mark.parametrize(
    "renewed_at, now, want",
    [
        pytest.param(None, 5.0, "standby", id="never-renewed"),
        pytest.param(100.0, 100.0, "active", id="just-sent"),
        pytest.param(100.0, 101.999, "active", id="just-before-the-deadline"),
        pytest.param(100.0, 102.0, "standby", id="at-the-deadline"),
        pytest.param(100.0, 150.0, "standby", id="long-cut-off"),
    ],
)
def test_the_holder_is_active_only_within_its_deadline(
    renewed_at: float | None, now: float, want: str
) -> None:
    assert role(Memory(renewed_at=renewed_at), HA, now) == want


def test_a_holder_reading_its_own_lease_renews_and_is_fenced_past_its_deadline_whatever_the_lease_says() -> (
    None
):
    ours = lease(ME)
    fresh = decide(Memory(renewed_at=100.0), ours, ME, HA, 101.0)
    assert (fresh.role, fresh.action) == ("active", "renew")
    stale = decide(Memory(renewed_at=100.0), ours, ME, HA, 102.5)
    assert (stale.role, stale.action) == ("standby", "renew")
    assert stale.why.startswith("not renewed for 2.50 s")


def test_a_successful_renewal_counts_from_when_it_was_sent_not_answered() -> None:
    mem = Memory(renewed_at=100.0)
    slow = settle(mem, "renew", "ok", sent_at=101.0, ha=HA, now=102.9)  # answered 1.9 s after sending
    assert slow.memory.renewed_at == 101.0 and slow.role == "active"
    too_slow = settle(mem, "renew", "ok", sent_at=101.0, ha=HA, now=103.0)
    assert too_slow.memory.renewed_at == 101.0 and too_slow.role == "standby"


@pytest.mark.parametrize("outcome", ["failed", "conflict"])
def test_a_renewal_that_did_not_succeed_leaves_the_clock_running(outcome: str) -> None:
    mem = Memory(renewed_at=100.0)
    within = settle(mem, "renew", outcome, sent_at=101.0, ha=HA, now=101.5)  # type: ignore[arg-type]
    assert within.memory.renewed_at == 100.0 and within.role == "active"
    past = settle(mem, "renew", outcome, sent_at=101.5, ha=HA, now=102.0)  # type: ignore[arg-type]
    assert past.role == "standby"


def test_the_loop_wakes_at_the_fence_instant_and_requests_never_outlast_it() -> None:
    mem = Memory(renewed_at=100.0)
    assert next_wait(mem, HA, 100.0) == 1.0  # the renew period
    assert next_wait(mem, HA, 101.8) == pytest.approx(0.2)  # not past the fence instant
    assert next_wait(mem, HA, 101.0, "failed") == 0.5  # retries sooner after a failure
    assert next_wait(mem, HA, 101.0, "conflict") == 0.0  # re-reads at once to learn who changed it
    assert next_wait(Memory(), HA, 101.0) == 1.0  # standby: every renewSeconds
    assert request_budget(mem, HA, 100.0) == 2.0
    assert request_budget(mem, HA, 101.5) == pytest.approx(0.5)
    assert request_budget(mem, HA, 103.0) == 0.05  # past it: the least, the role is standby anyway
    assert request_budget(Memory(), HA, 0.0) == renew_deadline(HA)


# --- rule 2: expiry by the contender's own observation ------------------------------------------------------


def walk(
    reads: list[tuple[float, LeaseView | None]], mem: Memory | None = None
) -> list[tuple[float, str, str]]:
    """Feeds reads to ``decide`` as the loop does: (now, role, action) of each."""
    mem = mem or Memory()
    out: list[tuple[float, str, str]] = []
    for now, seen in reads:
        step = decide(mem, seen, ME, HA, now)
        mem = step.memory
        out.append((now, step.role, step.action))
    return out


@pytest.mark.parametrize(
    "renew",
    [
        pytest.param("2026-12-03T16:00:00.123456Z", id="renewTime-now-ish"),
        pytest.param("2001-01-01T00:00:00.000000Z", id="renewTime-far-in-the-past"),
        pytest.param("2099-12-31T23:59:59.999999Z", id="renewTime-far-in-the-future"),
        pytest.param(None, id="renewTime-unset"),
    ],
)
def test_a_held_lease_is_taken_only_after_a_whole_duration_unchanged_by_our_own_clock(
    renew: str | None,
) -> None:
    held = lease(OTHER, renew)
    got = walk([(50.0, held), (51.0, held), (52.999, held), (53.0, held)])
    assert got == [
        (50.0, "standby", "none"),  # first sight: whatever renewTime says, the clock starts now
        (51.0, "standby", "none"),
        (52.999, "standby", "none"),
        (53.0, "standby", "take"),
    ]


def test_a_renewal_seen_restarts_the_wait() -> None:
    got = walk(
        [
            (50.0, lease(OTHER, "2026-12-03T16:00:00.000000Z", rv="1")),
            (52.5, lease(OTHER, "2026-12-03T16:00:01.000000Z", rv="2")),  # renewed
            (55.0, lease(OTHER, "2026-12-03T16:00:01.000000Z", rv="2")),
            (55.5, lease(OTHER, "2026-12-03T16:00:01.000000Z", rv="2")),
        ]
    )
    assert [a for _, _, a in got] == ["none", "none", "none", "take"]


def test_a_new_holder_restarts_the_wait_even_with_the_same_renew_time() -> None:
    same = "2026-12-03T16:00:00.000000Z"
    got = walk([(50.0, lease(OTHER, same)), (52.0, lease("third", same)), (53.0, lease("third", same))])
    assert [a for _, _, a in got] == ["none", "none", "none"]


@pytest.mark.parametrize("stored", [1, 10, 2**31 - 1], ids=["shorter", "longer", "int32-max"])
def test_expiry_is_judged_by_the_plans_duration_never_the_one_stored_in_the_lease(stored: int) -> None:
    """Any gateway pod may update its Lease: one that writes leaseDurationSeconds 2^31-1 (and dies, or
    stops renewing) must not keep the standby from ever taking over; one that writes 1 must not make it
    take over early."""
    held = lease(OTHER, leaseDurationSeconds=stored)
    got = walk([(0.0, held), (1.0, held), (2.999, held), (3.0, held)])
    assert [a for _, _, a in got] == ["none", "none", "none", "take"]


@pytest.mark.parametrize(
    "holder",
    [
        "evil\nha.promoted identity=forged lease=x",
        "UPPER-case",
        " ",
        "-leading-dash",
        "a" * 254,
        "gw_a",
        "\x1b[31mred",
    ],
    ids=["newline", "uppercase", "blank", "leading-dash", "too-long", "underscore", "escape-sequence"],
)
def test_an_invalid_holder_is_some_other_holder_never_a_free_lease_and_never_shown_raw(holder: str) -> None:
    assert not valid_holder(holder)
    got = []
    mem = Memory()
    for now in (0.0, 0.5, 3.0):
        step = decide(mem, lease(holder), ME, HA, now)
        mem = step.memory
        got.append((step.role, step.action))
        assert shown(holder) in step.why, "only ever shown escaped (and cut)"
        assert step.why.isprintable() and len(step.why) < 250, "no newline, no escape sequence, no flood"
    assert got == [("standby", "none"), ("standby", "none"), ("standby", "take")], "not taken at once"
    assert shown(holder).startswith("invalid holderIdentity ")


def test_valid_holders_are_pod_names_and_shown_as_they_are() -> None:
    for name in (ME, OTHER, "a", "gw.example-1", "x" * 253):
        assert valid_holder(name) and shown(name) == name


# --- a free Lease: released, or first seen free (created, or re-created after a deletion) ------------------


def test_a_released_lease_is_taken_at_once_a_lease_first_seen_free_after_a_whole_duration() -> None:
    released = walk([(0.0, lease(OTHER, rv="1")), (0.5, lease("", "2026-12-03T16:00:01.000000Z", rv="2"))])
    assert released[-1] == (0.5, "standby", "take"), "seen held, then emptied: its holder released it"
    fresh = lease("", None)  # as the controller creates it
    got = walk([(10.0, fresh), (11.0, fresh), (12.999, fresh), (13.0, fresh)])
    assert [a for _, _, a in got] == ["none", "none", "none", "take"]


def test_a_lease_deleted_and_recreated_free_is_not_a_release() -> None:
    """The holder keeps serving until its deadline when its Lease is deleted (below): a contender that
    saw it held, then absent (or, between two reads, a new object), then free must wait a duration."""
    held, recreated = lease(OTHER, uid="uid-1"), lease("", None, uid="uid-2")
    via_404 = walk([(0.0, held), (1.0, None), (2.0, recreated), (4.999, recreated), (5.0, recreated)])
    assert [a for _, _, a in via_404] == ["none", "none", "none", "none", "take"]
    unseen = walk([(0.0, held), (1.0, recreated), (3.999, recreated), (4.0, recreated)])
    assert [a for _, _, a in unseen] == ["none", "none", "none", "take"]


def test_a_holder_whose_lease_is_deleted_serves_until_its_deadline_and_takes_a_recreated_one_at_once() -> (
    None
):
    mem = Memory(renewed_at=100.0, seen=("uid-1", ME, "t"), seen_at=100.0)
    gone = decide(mem, None, ME, HA, 100.5)
    assert (gone.role, gone.action, gone.memory.renewed_at) == ("active", "none", 100.0)
    assert "does not exist" in gone.why
    assert decide(gone.memory, None, ME, HA, 101.999).role == "active"
    fenced = decide(gone.memory, None, ME, HA, 102.0)
    assert (fenced.role, fenced.memory) == ("standby", Memory())
    # Re-created free before its deadline: the pod that serves takes it at once (nobody else may yet).
    back = decide(gone.memory, lease("", None, uid="uid-2"), ME, HA, 101.0)
    assert (back.role, back.action) == ("active", "take")
    assert next_wait(gone.memory, HA, 100.5, "failed") == 0.5


@pytest.mark.parametrize("recreated_after", [0.0, 0.4, 1.0, 1.9, 2.5])
@pytest.mark.parametrize("phase", [0.0, 0.3, 0.99])
def test_no_two_active_when_the_lease_is_deleted_and_recreated_free(
    recreated_after: float, phase: float
) -> None:
    """The holder renews every second; its last successful renewal was sent at 10.0 (stored at once); the
    Lease is deleted at
    10.2 and re-created free ``recreated_after`` later, the holder cut off from the API meanwhile. The
    contender (reading every second from ``phase``) takes it only after the holder's fence instant."""
    deleted, recreated = 10.2, 10.2 + recreated_after
    holder = Memory(renewed_at=10.0)
    fenced = 10.0 + renew_deadline(HA)

    def stored(now: float) -> LeaseView | None:
        if now < deleted:  # renewed every second until 10.0
            return lease(OTHER, micro_time(1796313600 + int(min(now, 10.0))), uid="uid-1")
        if now < recreated:
            return None
        return lease("", None, uid="uid-2")

    mem, k, took = Memory(), 0, None
    while took is None:
        now = phase + k * HA.renew_seconds
        step = decide(mem, stored(now), ME, HA, now)
        mem = step.memory
        if step.action == "take":
            took = now
        k += 1
        assert k < 100
    assert role(holder, HA, fenced - 1e-6) == "active"
    assert took >= fenced + margin(HA) - 1e-9, (fenced, took)


def test_an_absent_lease_is_never_taken_and_a_standby_forgets_what_it_saw() -> None:
    step = decide(Memory(seen=("u", OTHER, "t"), seen_at=1.0), None, ME, HA, 100.5)
    assert (step.role, step.action, step.memory) == ("standby", "none", Memory())
    assert "does not exist" in step.why


def test_a_holder_that_reads_another_holder_is_standby_at_once() -> None:
    step = decide(Memory(renewed_at=100.0), lease(OTHER), ME, HA, 100.5)
    assert (step.role, step.action, step.memory.renewed_at) == ("standby", "none", None)


# --- rule 3: updates with the resourceVersion read; a 409 loses the race ------------------------------------


def test_a_take_that_meets_a_conflict_is_standby_even_for_a_serving_pod() -> None:
    step = settle(Memory.serving(100.0), "take", "conflict", sent_at=100.1, ha=HA, now=100.2)
    assert (step.role, step.memory.renewed_at) == ("standby", None)
    won = settle(Memory(), "take", "ok", sent_at=100.1, ha=HA, now=100.2)
    assert (won.role, won.memory.renewed_at) == ("active", 100.1)


def test_the_update_carries_the_resource_version_read_and_the_lease_fields() -> None:
    read: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gw-ha", "namespace": "ns", "resourceVersion": "42"},
        "spec": {
            "holderIdentity": OTHER,
            "leaseDurationSeconds": 3,
            "acquireTime": "2026-12-03T15:00:00.000000Z",
            "renewTime": "2026-12-03T15:59:00.000000Z",
            "leaseTransitions": 4,
        },
    }
    t = 1796313600.123456
    took = lease_update(read, "take", ME, HA, t)
    assert took["metadata"] == read["metadata"]
    assert took["spec"] == {
        "holderIdentity": ME,
        "leaseDurationSeconds": 3,
        "acquireTime": "2026-12-03T16:00:00.123456Z",
        "renewTime": "2026-12-03T16:00:00.123456Z",
        "leaseTransitions": 5,
    }
    renewed = lease_update(took, "renew", ME, HA, t + 1)
    assert renewed["spec"]["acquireTime"] == "2026-12-03T16:00:00.123456Z"
    assert renewed["spec"]["renewTime"] == "2026-12-03T16:00:01.123456Z"
    assert renewed["spec"]["leaseTransitions"] == 5
    released = lease_update(renewed, "release", ME, HA, t + 2)
    assert released["spec"]["holderIdentity"] == "" and released["spec"]["leaseDurationSeconds"] == 1
    assert released["spec"]["leaseTransitions"] == 5
    assert read["spec"]["holderIdentity"] == OTHER, "the read Lease is left alone"
    fresh = lease_update({"metadata": {"name": "gw-ha", "resourceVersion": "1"}}, "take", ME, HA, t)
    assert fresh["spec"]["leaseTransitions"] == 1
    with pytest.raises(ValueError):
        lease_update(read, "none", ME, HA, t)


def test_view_reads_what_the_controller_created_and_what_a_holder_wrote() -> None:
    empty = view({"metadata": {"resourceVersion": "7", "uid": "u-1"}, "spec": {}})
    assert empty == LeaseView(holder="", renew_time=None, transitions=0, resource_version="7", uid="u-1")
    assert view({}).holder == "" and view({}).uid == ""


# --- rule 4: ha appearing on a serving pod ------------------------------------------------------------------


def test_a_serving_pod_whose_plan_gains_ha_stays_active_while_it_takes_the_free_lease() -> None:
    mem = Memory.serving(100.0)
    step = decide(mem, lease(""), ME, HA, 100.1)
    assert (step.role, step.action) == ("active", "take")
    took = settle(step.memory, "take", "ok", sent_at=100.1, ha=HA, now=100.15)
    assert took.role == "active"


def test_a_serving_pod_whose_plan_gains_ha_goes_standby_when_another_pod_holds_the_lease() -> None:
    step = decide(Memory.serving(100.0), lease(OTHER), ME, HA, 100.1)
    assert (step.role, step.action) == ("standby", "none")


def test_a_serving_pod_that_cannot_reach_the_api_is_fenced_at_the_deadline() -> None:
    assert role(Memory.serving(100.0), HA, 101.9) == "active"
    assert role(Memory.serving(100.0), HA, 102.0) == "standby"


def test_a_pod_starting_with_ha_starts_standby() -> None:
    assert role(Memory(), HA, 0.0) == "standby"


# --- rule 7: release ----------------------------------------------------------------------------------------


def test_only_the_holder_releases() -> None:
    assert release(lease(ME), ME) == "release"
    assert release(lease(OTHER), ME) == "none"
    assert release(lease(""), ME) == "none"
    assert release(None, ME) == "none"
    step = settle(Memory(renewed_at=100.0), "release", "ok", sent_at=100.5, ha=HA, now=100.6)
    assert (step.role, step.memory.renewed_at) == ("standby", None)


# --- the whole argument: a cut-off holder stops before anyone takes over ------------------------------------


@pytest.mark.parametrize("ha", [HA, Ha("l", 3, 0.2), Ha("l", 3, 2.0), Ha("l", 1, 0.9), Ha("l", 15, 2.0)])
@pytest.mark.parametrize("phase", [0.0, 0.01, 0.33, 0.5, 0.99])
@pytest.mark.parametrize("latency", [0.0, 0.3])
def test_a_partitioned_holder_is_fenced_a_margin_before_the_contender_takes_over(
    ha: Ha, phase: float, latency: float
) -> None:
    """The holder renews every period from 0 (each renewal stored ``latency`` after it was sent) until its
    last at about 20 s; then nothing of it reaches the API. The contender reads every ``renewSeconds`` from
    ``phase``."""
    last = 20.0
    sends = [k * renew_period(ha) for k in range(int(last / renew_period(ha)) + 1)]

    def stored(now: float) -> LeaseView:
        n = sum(1 for t in sends if t + latency <= now)
        return lease(
            OTHER, micro_time(1796313600 + n), rv=str(n), leaseDurationSeconds=ha.lease_duration_seconds
        )

    holder = Memory(renewed_at=sends[-1])
    fenced = sends[-1] + renew_deadline(ha)
    assert role(holder, ha, fenced - 1e-6) == "active" and role(holder, ha, fenced) == "standby"
    mem, k, took = Memory(), 0, None
    while took is None:
        now = phase + k * ha.renew_seconds
        step = decide(mem, stored(now), ME, ha, now)
        mem = step.memory
        if step.action == "take":
            took = now
        k += 1
    assert took >= fenced + margin(ha) - 1e-9, (fenced, took)
    # The contender sees the last renewal at its next read, and takes at its first read a duration later.
    assert took <= fenced + margin(ha) + latency + 2 * ha.renew_seconds + 1e-9, "and no later than it must"


# --- the role file init-nat reads: never a stale "active" ------------------------------------------------


def _failing_writes(monkeypatch: pytest.MonkeyPatch, errno_: int = errno.ENOSPC) -> list[Path]:
    """Every write_text fails as on a full emptyDir (the temp file is where the agent writes)."""
    tried: list[Path] = []

    def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
        tried.append(self)
        raise OSError(errno_, os.strerror(errno_), str(self))

    monkeypatch.setattr(Path, "write_text", write_text)
    return tried


async def _no_api() -> Api:
    raise RuntimeError("no API in this test")


def test_a_standby_that_cannot_write_the_role_file_empties_a_stale_active(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent restarted (or went standby) on a full emptyDir: the old ``active`` must not stay for
    init-nat, which reads an empty file as standby."""
    role_file = tmp_path / "ha-role"
    role_file.write_text("active\n")  # the previous container's word
    tried = _failing_writes(monkeypatch)
    caplog.set_level(logging.WARNING, "agent.ha")
    elector = LeaseElector(_no_api, ME, HA, role_file=role_file)
    assert elector.current == "standby" and tried
    assert role_file.read_bytes() == b"", "emptied, not left saying active"
    assert initnat_rules.role_of(role_file.read_bytes(), ha=True).role == "standby"
    assert initnat_rules.role_of(role_file.read_bytes(), ha=False).role == "standby"
    assert not (tmp_path / ".ha-role.tmp").exists()
    assert any(
        "ha.role_file_failed" in r.getMessage() and "emptied" in r.getMessage() for r in caplog.records
    )


def test_a_standby_with_no_role_file_that_cannot_write_it_leaves_an_empty_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    role_file = tmp_path / "ha-role"
    _failing_writes(monkeypatch)
    LeaseElector(_no_api, ME, HA, role_file=role_file)
    assert role_file.read_bytes() == b"", "a standby even for an init-nat whose plan has no ha yet"


def test_a_failed_role_file_write_is_retried_also_without_ha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod serving without HA whose start-up write failed must still get ``active`` into the file before
    its plan gains ``ha`` (init-nat reads a missing file under ``ha`` as standby: a blip on a serving pod)."""
    role_file = tmp_path / "ha-role"
    with monkeypatch.context() as m:
        _failing_writes(m)
        elector = LeaseElector(_no_api, ME, None, role_file=role_file)
    assert elector.current == "active" and not role_file.exists()

    async def run() -> None:
        with anyio.move_on_after(ROLE_FILE_RETRY + 0.5):
            await elector.run()

    anyio.run(run)
    assert role_file.read_text() == "active\n"
    assert initnat_rules.role_of(role_file.read_bytes(), ha=True).role == "active"


def test_a_serving_pod_has_written_active_before_its_plan_gains_ha(tmp_path: Path) -> None:
    """The order at a serving pod: the agent wrote ``active`` when it started (its first plan had no
    ``ha``), long before the live plan file, which init-nat's watch reads too, gains ``ha``; whichever of
    the two reads the new plan first, init-nat finds ``active``. Then the elector, following the plan,
    stays active (``Memory.serving``) and rewrites ``active``."""
    role_file = tmp_path / "ha-role"
    elector = LeaseElector(_no_api, ME, None, role_file=role_file)
    before = initnat_rules.role_of(role_file.read_bytes(), ha=True)
    assert before.role == "active" and not before.absent, "init-nat first: active"
    elector.follow(HA)
    assert elector.current == "active"
    assert initnat_rules.role_of(role_file.read_bytes(), ha=True).role == "active", "the agent first: active"
