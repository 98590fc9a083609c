"""Which connection gives way when an HTTP server is full (pure: no I/O, no clock).

A server holds at most ``capacity`` connections (each is a descriptor and a task), and of them at most
``replies`` past their request head (each may hold its reply, a 4 MB body in the exporter's case). A
newcomer is always let in: turned away, or left waiting in the accept queue, a kubelet probe fails just
the same, and the connections that fill a server under a flood of slow clients are the slow clients.

When the server is full, the newcomer takes the slot of one connection, chosen by what that connection
is doing, in this order:

1. ``HEAD``, reading its request head (it has not yet said what it wants): the one reading longest;
2. ``SEND``, sending its reply (it asked, and is slow to take the answer): the one sending longest;
3. ``ANSWER``, being answered (the server is working for it): the one answered longest.

When a connection's head is read and ``replies`` connections are already past theirs, the one sending
longest gives way, else the one answered longest (never one still reading a head: it holds no reply).

A probe or a scrape sends its head in the packet after the handshake, so it is in ``HEAD`` for well
under a millisecond; to close it there, a flood would have to open ``capacity`` connections in that
time. A flood of clients that never send a head only ever displaces itself: a scrape that is being
answered or sent keeps its slot while anyone is still reading a head.

The shell (``gwkit.httpd.serve_connections``) closes the connection ``admit`` or ``move`` names;
``leave`` when a connection ends (a no-op for one already displaced).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Phase(enum.Enum):
    """What a connection is doing; the order is the order in which connections give way."""

    HEAD = "head"
    SEND = "send"
    ANSWER = "answer"


class Admission(Generic[K]):
    """The connections a server holds, by phase, each phase in the order its connections entered it."""

    def __init__(self, capacity: int, replies: int | None = None) -> None:
        replies = capacity if replies is None else replies
        if not 1 <= replies <= capacity:
            raise ValueError(f"capacity {capacity}, replies {replies}: need 1 <= replies <= capacity")
        self.capacity = capacity
        self.replies = replies
        self._by_phase: dict[Phase, dict[K, None]] = {p: {} for p in Phase}  # dicts keep insertion order
        self._phase: dict[K, Phase] = {}

    def __len__(self) -> int:
        return len(self._phase)

    def phase(self, key: K) -> Phase | None:
        """The phase of ``key``; None when it left or was displaced."""
        return self._phase.get(key)

    def admit(self, key: K) -> K | None:
        """Let ``key`` in, reading its head; returns the connection to close to make room, if any."""
        if key in self._phase:
            raise ValueError(f"connection {key!r} is already admitted")
        victim = self._displace(tuple(Phase)) if len(self._phase) >= self.capacity else None
        self._enter(key, Phase.HEAD)
        return victim

    def move(self, key: K, phase: Phase) -> K | None:
        """``key`` is now in ``phase`` (it queues behind those already there); returns the connection to
        close to keep ``replies``, if any. Ignored once ``key`` is gone."""
        was = self._phase.get(key)
        if was is None:
            return None
        self.leave(key)
        victim = None
        replying = len(self._by_phase[Phase.SEND]) + len(self._by_phase[Phase.ANSWER])
        if was is Phase.HEAD and phase is not Phase.HEAD and replying >= self.replies:
            victim = self._displace((Phase.SEND, Phase.ANSWER))
        self._enter(key, phase)
        return victim

    def leave(self, key: K) -> None:
        phase = self._phase.pop(key, None)
        if phase is not None:
            del self._by_phase[phase][key]

    def _displace(self, order: tuple[Phase, ...]) -> K:
        phase = next(p for p in order if self._by_phase[p])
        victim = next(iter(self._by_phase[phase]))
        self.leave(victim)
        return victim

    def _enter(self, key: K, phase: Phase) -> None:
        self._phase[key] = phase
        self._by_phase[phase][key] = None
