"""A work queue of keys, as controllers use it (client-go's workqueue semantics, on anyio).

* A key is in the queue at most once, however often it is added (events only say "look again").
* A key being processed is never handed to a second worker; added meanwhile, it is queued again when the
  first one is ``done`` (so the last change is always seen by a later reconcile).
* ``retry`` re-adds a key after a capped exponential backoff per key (``gwkit.backoff``); ``forget``
  resets it after a success. ``add_after`` delays a key (a requeue on a timer).
* ``add(key, background=True)`` (the periodic resync) queues behind every change: an edit made while a
  resync of 500 gateways is in flight is reconciled next, not after them (a key changed while waiting in
  the background lane moves to the front one).

What it measures (``/metrics``, ``controller.run.Metrics``), as controller-runtime's workqueue metrics do:
``on_wait(seconds)`` gets each key's time from being queued to being handed to a worker (a delay or a
backoff is not counted: the key is queued when it ends), ``retries`` counts ``retry`` calls,
``waiting`` is every key queued or held back by a delay, ``longest_running`` the seconds the oldest
key in a worker has been there.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import anyio

from gwkit.backoff import backoff

K = TypeVar("K", bound=Hashable)
Clock = Callable[[], float]


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base: float = 0.2,
        cap: float = 10.0,
        clock: Clock = anyio.current_time,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self.base = base
        self.cap = cap
        self._clock = clock
        self._ready: deque[K] = deque()
        self._background: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._later: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._wake = anyio.Event()
        self.adds = 0
        self.retries = 0
        self._on_wait = on_wait
        self._queued_at: dict[K, float] = {}
        self._started: dict[K, float] = {}

    def __len__(self) -> int:
        """Keys waiting to be processed now (delayed ones not counted)."""
        return len(self._queued)

    @property
    def delayed(self) -> int:
        return len(self._later)

    def waiting(self) -> int:
        """Keys queued now or held back by a delay (a backoff, ``add_after``), each counted once."""
        return len(self._queued | {key for _, _, key in self._later})

    def longest_running(self) -> float:
        """Seconds since the key that has been with a worker longest was handed out (0: none is)."""
        return self._clock() - min(self._started.values()) if self._started else 0.0

    def add(self, key: K, *, background: bool = False) -> None:
        self.adds += 1
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            if not background and key in self._background:
                self._background.remove(key)  # O(n), rare: a change to a key the resync queued
                self._ready.append(key)
            return
        self._queued.add(key)
        self._queued_at[key] = self._clock()
        (self._background if background else self._ready).append(key)
        self._wake.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        heapq.heappush(self._later, (self._clock() + delay, next(self._seq), key))
        self._wake.set()

    def retry(self, key: K) -> float:
        """Re-add ``key`` after its backoff; returns the delay."""
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        self.retries += 1
        delay = backoff(n, base=self.base, cap=self.cap)
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def _promote(self) -> float:
        """Move due delayed keys to the ready queue; seconds until the next one (inf: none)."""
        now = self._clock()
        while self._later and self._later[0][0] <= now:
            _, _, key = heapq.heappop(self._later)
            self.add(key)
        return self._later[0][0] - now if self._later else math.inf

    async def get(self) -> K:
        while True:
            wait = self._promote()
            while self._ready or self._background:
                key = self._ready.popleft() if self._ready else self._background.popleft()
                self._queued.discard(key)
                queued_at = self._queued_at.pop(key, None)
                if key in self._processing:  # cannot happen: add() parks it in _dirty
                    continue
                self._processing.add(key)
                now = self._clock()
                self._started[key] = now
                if self._on_wait is not None and queued_at is not None:
                    self._on_wait(now - queued_at)
                return key
            self._wake = anyio.Event()
            with anyio.move_on_after(wait):
                await self._wake.wait()

    def done(self, key: K) -> None:
        self._processing.discard(key)
        self._started.pop(key, None)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
