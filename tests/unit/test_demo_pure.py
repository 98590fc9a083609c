"""lab.demo's decisions (pure): the status period that fits the kill interval, exit statuses, and how a
dead process is named."""

from __future__ import annotations

import signal

import pytest

from lab.demo import counter_period, exit_text, stop_status


@pytest.mark.parametrize(
    "kill_every, period",
    [
        pytest.param(20.0, 5.0, id="default-run"),
        pytest.param(6.0, 1.5, id="the-integration-test"),
        pytest.param(2.0, 1.0, id="never-below-the-agents-minimum"),
        pytest.param(600.0, 30.0, id="never-above-the-agents-default"),
        pytest.param(0.0, 5.0, id="no-kills"),
    ],
)
def test_counter_period(kill_every: float, period: float) -> None:
    assert counter_period(kill_every) == period


def test_the_default_run_refreshes_counters_several_times_between_kills() -> None:
    """The agent's default 30 s was longer than the 20 s between kills: in=0 out=0 all run long."""
    assert 20.0 / counter_period(20.0) >= 3


@pytest.mark.parametrize(
    "code, text",
    [
        (0, "exited with status 0"),
        (3, "exited with status 3"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        (-signal.SIGINT, "was killed by SIGINT"),
        (-200, "was killed by signal 200"),
    ],
)
def test_exit_text(code: int, text: str) -> None:
    assert exit_text(code) == text


def test_stop_statuses_are_the_shells() -> None:
    assert (stop_status(signal.SIGINT), stop_status(signal.SIGTERM)) == (130, 143)
