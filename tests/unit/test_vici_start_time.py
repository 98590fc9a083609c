"""charon's start time wobbles by a second between calls (``since`` = now - uptime in whole seconds,
measured on a live 5.9.8) and moves with wall-clock steps; restarted_between takes both out. Agent and
exporter rely on this."""

from __future__ import annotations

import pytest

from gwkit.vici.queries import (
    StartSighting,
    parse_since,
    restarted_between,
    settle_start,
    sighting,
    start_drift,
    start_time,
)


@pytest.mark.parametrize(
    ("previous", "observed", "settled"),
    [
        pytest.param(None, 1000.0, 1000.0, id="first-sight"),
        pytest.param(1000.0, 1001.0, 1000.0, id="wobble-up"),
        pytest.param(1001.0, 1000.0, 1001.0, id="wobble-down"),
        pytest.param(1000.0, 1002.0, 1000.0, id="edge-of-wobble"),
        pytest.param(1000.0, 1060.0, 1060.0, id="restart"),
        pytest.param(1000.0, None, None, id="unparsable"),
    ],
)
def test_settle_start(previous: float | None, observed: float | None, settled: float | None) -> None:
    assert settle_start(previous, observed) == settled


def test_a_wobbling_series_settles_on_one_start_time() -> None:
    started: float | None = None
    for observed in [1000.0, 1001.0, 1000.0, 1001.0, 1001.0, 1000.0]:
        started = settle_start(started, observed)
        assert started == 1000.0


# --- wall-clock steps: restarted_between takes the step out (our wall minus monotonic delta) -----------

T0 = 1_700_000_000.0


def seen(since: float, wall: float, mono: float) -> StartSighting:
    return StartSighting(since=since, wall=wall, mono=mono)


@pytest.mark.parametrize(
    ("after", "is_restart"),
    [
        pytest.param(seen(T0, T0 + 500, 500), False, id="same-daemon-no-step"),
        pytest.param(seen(T0 + 1, T0 + 500, 500), False, id="same-daemon-wobble"),
        pytest.param(seen(T0 + 3600, T0 + 3600 + 500, 500), False, id="ntp-step-forward-1h"),
        pytest.param(seen(T0 - 5, T0 - 5 + 500, 500), False, id="ntp-step-back-5s"),
        pytest.param(seen(T0 + 3601, T0 + 3600 + 500, 500), False, id="step-and-wobble"),
        pytest.param(seen(T0 + 495, T0 + 500, 500), True, id="restarted-5s-ago"),
        pytest.param(seen(T0 + 3600 + 400, T0 + 3600 + 500, 500), True, id="restart-hidden-by-no-step"),
        pytest.param(seen(T0 + 400, T0 + 3600 + 500, 500), True, id="restart-during-a-step"),
    ],
)
def test_restarted_between_sees_restarts_not_clock_steps(after: StartSighting, is_restart: bool) -> None:
    before = seen(T0, T0 + 100, 100)  # charon started at T0, seen 100 s later
    assert restarted_between(before, after) is is_restart


def test_unknown_start_is_not_a_restart() -> None:
    assert not restarted_between(None, seen(T0, T0, 0))
    assert not restarted_between(seen(T0, T0, 0), None)
    assert sighting(None, wall=T0, mono=0) is None
    assert sighting(T0, wall=T0 + 1, mono=1) == seen(T0, T0 + 1, 1)


def test_start_time_reads_stats_uptime_since() -> None:
    since = start_time({"uptime": {"running": "5 minutes", "since": "Nov 30 02:15:54 2026"}})
    assert since == parse_since("Nov 30 02:15:54 2026")
    assert since is not None
    assert start_time({}) is None and start_time({"uptime": "junk"}) is None
    assert start_drift(seen(since, T0, 0), seen(since + 10, T0 + 10, 0)) == 0.0
