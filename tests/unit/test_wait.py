"""lab.wait: the one polling helper and its async twin, on a fake clock (no real sleeping).

What the rest of the suite relies on: the first truthy value is returned; a check runs after the deadline
before the wait fails; the failure says what was awaited, for how long, and what was seen last; an
exception in the condition is a failure at once unless the caller said to ignore it.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from lab.wait import WaitTimeout, wait_for, wait_for_async

Waiter = Callable[..., Any]


class FakeClock:
    """``time.monotonic``/``time.sleep``/``anyio.sleep`` on a clock that only sleeping (or ``work``) moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def work(self, seconds: float) -> None:
        """A condition that takes time to check."""
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    # lab.wait reads the clock and sleeps through these modules' attributes.
    monkeypatch.setattr(time, "monotonic", fake.monotonic)
    monkeypatch.setattr(time, "sleep", fake.sleep)
    monkeypatch.setattr(anyio, "sleep", fake.async_sleep)
    return fake


def run(waiter: Waiter, cond: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
    """Call the sync helper, or run the async twin to completion: the same test covers both."""
    if waiter is wait_for:
        return wait_for(cond, *args, **kwargs)

    async def main() -> Any:
        return await wait_for_async(cond, *args, **kwargs)

    return anyio.run(main)


both = pytest.mark.parametrize("waiter", [wait_for, wait_for_async], ids=["sync", "async"])


@both
def test_the_first_truthy_value_is_returned_and_no_sleep_after_it(waiter: Waiter, clock: FakeClock) -> None:
    values = iter([None, 0, "", {}, {"ready": True}, {"later": True}])
    assert run(waiter, lambda: next(values), 10, "ready", 0.5) == {"ready": True}
    assert clock.sleeps == [0.5] * 4


@both
def test_a_condition_true_only_after_the_deadline_is_still_seen(waiter: Waiter, clock: FakeClock) -> None:
    start = clock.now
    got = run(waiter, lambda: clock.now >= start + 1.0 and "late", 1.0, "late", 0.3)
    assert got == "late"
    # The sleeps stop at the deadline (0.3 + 0.3 + 0.3 + 0.1), not past it by a whole interval.
    assert sum(clock.sleeps) == pytest.approx(1.0)
    assert clock.sleeps[-1] == pytest.approx(0.1)


@both
def test_a_slow_check_ending_past_the_deadline_gets_one_more_check(waiter: Waiter, clock: FakeClock) -> None:
    calls: list[float] = []

    def slow() -> bool:
        calls.append(clock.now)
        clock.work(0.7)  # the check itself outlasts the deadline
        return len(calls) == 3

    assert run(waiter, slow, 1.0, "the slow thing", 0.1) is True
    assert len(calls) == 3 and calls[-1] >= calls[0] + 1.0, "the last check started after the deadline"


@both
def test_the_failure_names_what_for_how_long_and_the_last_value(waiter: Waiter, clock: FakeClock) -> None:
    with pytest.raises(WaitTimeout) as err:
        run(waiter, lambda: [], 2, "the peers", 0.5)
    e = err.value
    assert isinstance(e, AssertionError), "a wait in vain is a failed assertion"
    assert (e.what, e.timeout, e.waited, e.checks, e.last) == ("the peers", 2, 2.0, 5, [])
    assert str(e) == (
        "timed out waiting for the peers: not within 2 s (waited 2.00 s, 5 checks); last seen: []"
    )


@both
def test_an_exception_in_the_condition_fails_at_once(waiter: Waiter, clock: FakeClock) -> None:
    def broken() -> bool:
        raise KeyError("status")

    with pytest.raises(KeyError):
        run(waiter, broken, 10, "status")
    assert clock.sleeps == [], "not retried: a broken condition is a bug, not 'not yet'"


@both
def test_an_ignored_exception_is_not_yet_and_is_reported_as_the_last_thing_seen(
    waiter: Waiter, clock: FakeClock
) -> None:
    def refused() -> bool:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(WaitTimeout) as err:
        run(waiter, refused, 1, "the API", 0.25, ignoring=(OSError,))
    assert err.value.checks == 5
    assert isinstance(err.value.__cause__, ConnectionRefusedError)
    assert str(err.value).endswith("last seen: ConnectionRefusedError: [Errno 111] Connection refused")

    answers: list[BaseException | str] = [ConnectionRefusedError(111, "refused"), "up"]

    def comes_up() -> str:
        a = answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return a

    assert run(waiter, comes_up, 1, "the API", 0.25, ignoring=(OSError,)) == "up"


def test_a_zero_timeout_checks_exactly_once(clock: FakeClock) -> None:
    with pytest.raises(WaitTimeout) as err:
        wait_for(lambda: None, 0, "nothing")
    assert err.value.checks == 1 and clock.sleeps == []


def test_a_nonsense_interval_is_refused(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="interval"):
        wait_for(lambda: True, 1, "x", interval=0)


def test_the_async_twin_awaits_an_async_condition(clock: FakeClock) -> None:
    seen: list[int] = []

    async def count() -> int | None:
        seen.append(1)
        return len(seen) if len(seen) == 3 else None

    def awaitable_lambda() -> Awaitable[int | None]:
        return count()

    assert run(wait_for_async, count, 5, "three checks", 0.1) == 3
    seen.clear()
    assert run(wait_for_async, awaitable_lambda, 5, "three checks", 0.1) == 3


def test_the_sync_helper_refuses_an_async_condition(clock: FakeClock) -> None:
    ran: list[int] = []

    async def ready() -> bool:
        ran.append(1)
        return True

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        with pytest.raises(TypeError, match="wait_for_async"):
            wait_for(ready, 5, "ready")  # type: ignore[unused-coroutine]
        gc.collect()
    assert ran == [] and clock.sleeps == [], "refused before any check ran or any sleep"
