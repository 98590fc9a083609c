"""The one way the lab and the tests wait for something to happen: poll a condition until it gives a truthy
value, or fail saying what was awaited, for how long, and what was last seen.

``wait_for`` (blocking) and ``wait_for_async`` (sleeps with anyio) share one signature and one meaning:

* ``cond()`` returns the value awaited, or something falsy for "not yet". The first truthy value is
  returned. ``wait_for_async`` also awaits ``cond()``'s result when it is awaitable (an ``async def``
  condition); ``wait_for`` refuses one with ``TypeError`` (a coroutine is truthy: it would "succeed" at once
  without the condition ever running).
* An exception from ``cond()`` ends the wait at once (a broken condition is a bug, not "not yet"), unless
  its type is in ``ignoring``: then it counts as "not yet" and is remembered as the last thing seen.
* The condition is checked once more after the deadline before the wait fails: a condition that became
  true while the last sleep or a slow check ran is not reported as a timeout.
* The failure is :class:`WaitTimeout`, an ``AssertionError`` (a test that waited in vain failed its
  assertion), whose message names ``what``, the timeout, how long was actually waited and how many checks
  ran, and the last value or exception seen (chained as ``__cause__``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

T = TypeVar("T")

INTERVAL = 0.05
"""The default pause between two checks, in seconds."""


class WaitTimeout(AssertionError):
    """``what`` did not happen within ``timeout`` seconds; ``last`` is the last value or exception seen."""

    def __init__(self, what: str, timeout: float, waited: float, checks: int, last: object) -> None:
        seen = f"{type(last).__name__}: {last}" if isinstance(last, BaseException) else repr(last)
        super().__init__(
            f"timed out waiting for {what}: not within {timeout:g} s "
            f"(waited {waited:.2f} s, {checks} checks); last seen: {seen}"
        )
        self.what = what
        self.timeout = timeout
        self.waited = waited
        self.checks = checks
        self.last = last


class _Poll:
    """The bookkeeping both waiters share: the clock, the deadline, the last thing seen."""

    def __init__(self, what: str, timeout: float, interval: float) -> None:
        if timeout < 0 or interval <= 0:
            raise ValueError(f"timeout {timeout!r} must be >= 0 and interval {interval!r} > 0")
        self.what, self.timeout, self.interval = what, timeout, interval
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.checks = 0
        self.last: object = None
        self.final = False

    def begin(self) -> None:
        """Before a check: it is the final one when it starts at or after the deadline."""
        self.final = time.monotonic() >= self.deadline
        self.checks += 1

    def pause(self) -> float:
        """How long to sleep before the next check: ``interval``, but never past the deadline by more than
        is needed to make the next check the final one."""
        return max(0.0, min(self.interval, self.deadline - time.monotonic()))

    def failure(self) -> WaitTimeout:
        exc = WaitTimeout(self.what, self.timeout, time.monotonic() - self.started, self.checks, self.last)
        if isinstance(self.last, BaseException):
            exc.__cause__ = self.last
        return exc


def wait_for(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = INTERVAL,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """``cond()``'s first truthy value within ``timeout`` seconds, checking every ``interval`` seconds;
    :class:`WaitTimeout` naming ``what`` otherwise (see the module's docstring)."""
    poll = _Poll(what, timeout, interval)
    while True:
        poll.begin()
        try:
            got = cond()
        except ignoring as exc:
            poll.last = exc
        else:
            if inspect.isawaitable(got):
                if inspect.iscoroutine(got):
                    got.close()  # never awaited on purpose: no "was never awaited" warning
                raise TypeError(
                    f"wait_for({what!r}): the condition returned an awaitable ({type(got).__name__}); "
                    "an async condition needs wait_for_async"
                )
            if got:
                return got
            poll.last = got
        if poll.final:
            raise poll.failure()
        time.sleep(poll.pause())


@overload
async def wait_for_async(
    cond: Callable[[], Awaitable[T | None]],
    timeout: float,
    what: str,
    interval: float = INTERVAL,
    ignoring: tuple[type[Exception], ...] = (),
) -> T: ...


@overload
async def wait_for_async(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = INTERVAL,
    ignoring: tuple[type[Exception], ...] = (),
) -> T: ...


async def wait_for_async(
    cond: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = INTERVAL,
    ignoring: tuple[type[Exception], ...] = (),
) -> Any:
    """``wait_for``'s twin for async code: the same semantics, sleeping with ``anyio.sleep``; ``cond`` may be
    an ``async def`` (its result is awaited)."""
    poll = _Poll(what, timeout, interval)
    while True:
        poll.begin()
        try:
            got = cond()
            if inspect.isawaitable(got):
                got = await got
        except ignoring as exc:
            poll.last = exc
        else:
            if got:
                return got
            poll.last = got
        if poll.final:
            raise poll.failure()
        await anyio.sleep(poll.pause())
