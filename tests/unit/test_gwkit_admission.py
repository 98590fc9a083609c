"""Who gives way when an HTTP server is full (gwkit.admission): a pure decision, table-driven."""

from __future__ import annotations

import pytest

from gwkit.admission import Admission, Phase

H, S, A = Phase.HEAD, Phase.SEND, Phase.ANSWER


def held(phases: list[Phase], capacity: int, replies: int | None = None) -> Admission[int]:
    """Connections 0..n-1 admitted in order, then each moved to its phase, in order."""
    adm: Admission[int] = Admission(capacity, replies)
    for key in range(len(phases)):
        assert adm.admit(key) is None
    for key, phase in enumerate(phases):
        if phase is not H:
            assert adm.move(key, phase) is None
    return adm


@pytest.mark.parametrize(
    ("phases", "victim"),
    [
        pytest.param([A, S, H, H], 2, id="the-longest-reading-head-first"),
        pytest.param([A, S, S, A], 1, id="then-the-longest-sending"),
        pytest.param([A, A, A, A], 0, id="then-the-longest-answered"),
    ],
)
def test_a_newcomer_to_a_full_server_displaces_by_phase_then_age(phases: list[Phase], victim: int) -> None:
    adm = held(phases, capacity=len(phases))
    assert adm.admit(99) == victim
    assert adm.phase(victim) is None and adm.phase(99) is H and len(adm) == len(phases)


def test_below_the_cap_nobody_is_displaced() -> None:
    adm = held([H, H], capacity=3)
    assert adm.admit(2) is None and len(adm) == 3


def test_age_in_a_phase_counts_from_entering_it() -> None:
    """0 started sending after 1 did: 1 has been sending longer and gives way first."""
    adm = held([H, H], capacity=2)
    adm.move(1, A)
    adm.move(0, A)
    adm.move(1, S)
    adm.move(0, S)
    assert adm.admit(2) == 1


def test_a_flood_of_heads_only_displaces_itself() -> None:
    """A probe being answered keeps its slot while a thousand never-sending clients come and go."""
    adm = held([H, H, H], capacity=3)
    adm.move(0, A)
    victims = {adm.admit(k) for k in range(100, 1100)}
    assert 0 not in victims and adm.phase(0) is A


@pytest.mark.parametrize(
    ("phases", "victim"),
    [
        pytest.param([S, A, H], 0, id="the-longest-sending-first"),
        pytest.param([A, A, H], 0, id="then-the-longest-answered"),
    ],
)
def test_past_the_replies_cap_a_read_head_displaces_a_reply(phases: list[Phase], victim: int) -> None:
    adm = held(phases, capacity=10, replies=2)
    assert adm.move(2, A) == victim
    assert adm.phase(2) is A and adm.phase(victim) is None


def test_moving_between_reply_phases_displaces_nobody() -> None:
    adm = held([A, A], capacity=10, replies=2)
    assert adm.move(0, S) is None and adm.move(1, S) is None


def test_a_displaced_connection_reports_nothing_and_leaves_quietly() -> None:
    adm = held([H], capacity=1)
    assert adm.admit(1) == 0
    assert adm.move(0, A) is None and adm.phase(0) is None
    adm.leave(0)
    assert len(adm) == 1


@pytest.mark.parametrize(("capacity", "replies"), [(0, None), (2, 0), (2, 3)])
def test_impossible_caps_are_refused(capacity: int, replies: int | None) -> None:
    with pytest.raises(ValueError, match="capacity"):
        Admission(capacity, replies)


def test_a_key_is_admitted_once() -> None:
    adm = held([H], capacity=2)
    with pytest.raises(ValueError, match="already"):
        adm.admit(0)
