"""agent.health.HealthState: not ready is said in the log too, at once and then every few seconds while
it lasts (a pod waiting for its plan must say why whenever someone reads its log), never while ready."""

from __future__ import annotations

import logging

import pytest

from agent.health import HealthState


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agent.health"]


def test_not_ready_is_repeated_every_period_with_the_reason_and_its_age(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.health")
    now = [0.0]
    state = HealthState(clock=lambda: now[0], remind_every=5.0)
    reason = "no valid plan at /etc/vpngw/plan.json: cannot read /etc/vpngw/plan.json: No such file"
    for t in range(13):  # the loop reports every second, as the agent's heartbeat does
        now[0] = float(t)
        state.set_ready(False, reason)
    said = lines(caplog)
    assert said[0] == f"health.ready ready=no reason={reason!r}"
    assert said[1:] == [
        f"health.not_ready reason={reason!r} for=5s",
        f"health.not_ready reason={reason!r} for=10s",
    ]
    assert [r.levelname for r in caplog.records][1:] == ["WARNING", "WARNING"]


def test_a_new_reason_is_said_at_once_and_ready_stops_the_reminders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.health")
    now = [0.0]
    state = HealthState(clock=lambda: now[0], remind_every=5.0)
    state.set_ready(False, "no valid plan at p: not JSON")
    now[0] = 3.0
    state.set_ready(False, "charon unreachable: connect: refused")
    now[0] = 7.0
    state.set_ready(False, "charon unreachable: connect: refused")  # 4 s after the new reason: quiet
    now[0] = 8.0
    state.set_ready(False, "charon unreachable: connect: refused")
    for t in (9.0, 20.0, 40.0):
        now[0] = t
        state.set_ready(True, "connected")
    assert lines(caplog) == [
        "health.ready ready=no reason='no valid plan at p: not JSON'",
        "health.ready ready=no reason='charon unreachable: connect: refused'",
        "health.not_ready reason='charon unreachable: connect: refused' for=8s",
        "health.ready ready=yes reason='connected'",
    ]
    now[0] = 41.0
    state.set_ready(False, "charon unreachable: connect: refused")
    now[0] = 46.0
    state.set_ready(False, "charon unreachable: connect: refused")
    assert lines(caplog)[-1] == "health.not_ready reason='charon unreachable: connect: refused' for=5s"
