"""Liveness and readiness for the kubelet's probes (both backends).

``/healthz`` answers 200 while the agent's loop has called ``beat()`` within ``stale_after`` seconds: it
says the agent itself is alive. A daemon that is down, hung (SIGSTOP) or refusing connections is NOT a
liveness failure: the agent is the one that reconnects and re-pushes, restarting it would not help.
``/readyz`` answers 200 when the backend said it is connected and has pushed the plan, else 503 with the
reason. The decision is the pure ``respond``; ``serve`` is a tiny HTTP/1.0 server on anyio.

Not ready is also said in the log, not only on ``/readyz`` (which nobody may be probing, e.g. without
``--health-listen``): ``health.ready ready=no reason=...`` when the reason changes, then
``health.not_ready reason=... for=<s>`` every ``remind_every`` seconds while it lasts (a missing plan, an
unreachable charon), so a pod stuck waiting says why in ``kubectl logs`` whenever one looks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.abc

from agent.runtime import Health
from gwkit.logs import Reminder

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_REQUEST = 8192


@dataclass(frozen=True)
class Snapshot:
    seconds_since_beat: float | None
    ready: bool
    reason: str


REMIND_EVERY = 5.0


class HealthState:
    """``runtime.Health``: what the probes report. ``stale_after``: seconds without a beat before
    liveness fails (several resync periods, so a slow daemon call never trips it); ``remind_every``:
    seconds between the log lines that repeat why the agent is not ready."""

    def __init__(
        self, stale_after: float = 60.0, clock: Clock = time.monotonic, remind_every: float = REMIND_EVERY
    ) -> None:
        self.stale_after = stale_after
        self._clock = clock
        self._beat: float | None = None
        self._started = clock()
        self._ready = False
        self._reason = "starting"
        self._remind = Reminder(remind_every, clock)

    def beat(self) -> None:
        self._beat = self._clock()

    def set_ready(self, ready: bool, reason: str) -> None:
        if (ready, reason) != (self._ready, self._reason):
            log.info("health.ready ready=%s reason=%r", "yes" if ready else "no", reason)
            if not ready:
                self._remind.due(reason)  # said just now: the next reminder is one period away
        elif not ready and self._remind.due(reason):
            log.warning("health.not_ready reason=%r for=%.0fs", reason, self._remind.waited())
        if ready:
            self._remind.clear()
        self._ready, self._reason = ready, reason

    def snapshot(self) -> Snapshot:
        now = self._clock()
        # Before the first beat, count from start-up: a slow first plan read is not a dead loop.
        since = now - (self._beat if self._beat is not None else self._started)
        return Snapshot(since, self._ready, self._reason)


def respond(path: str, snap: Snapshot, stale_after: float) -> tuple[int, str]:
    """The probe's answer (pure): status code and a one-line body."""
    if path == "/healthz":
        since = snap.seconds_since_beat
        if since is not None and since > stale_after:
            return 503, f"loop stalled: no heartbeat for {since:.0f}s\n"
        return 200, "ok\n"
    if path == "/readyz":
        return (200, f"ready: {snap.reason}\n") if snap.ready else (503, f"not ready: {snap.reason}\n")
    return 404, "not found\n"


_REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request", 503: "Service Unavailable"}


def parse_request_line(head: bytes) -> str | None:
    """The path of a ``GET`` request head, or None (pure)."""
    line = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    parts = line.split()
    if len(parts) < 2 or parts[0] not in (b"GET", b"HEAD"):
        return None
    return parts[1].split(b"?", 1)[0].decode("ascii", errors="replace")


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); raises ValueError naming the rule."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--health-listen {listen!r}: expected HOST:PORT with a port 0-65535")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _handle(stream: anyio.abc.SocketStream, state: HealthState) -> None:
    async with stream:
        head = b""
        with anyio.move_on_after(5):
            while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_REQUEST:
                try:
                    head += await stream.receive(1024)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        path = parse_request_line(head)
        code, body = (
            (400, "bad request\n") if path is None else respond(path, state.snapshot(), state.stale_after)
        )
        payload = body.encode()
        reply = (
            f"HTTP/1.0 {code} {_REASONS.get(code, '')}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode() + (payload if not head.startswith(b"HEAD") else b"")
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await stream.send(reply)


async def serve(
    listen: str, state: HealthState, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve the probes until cancelled; ``task_status.started`` gets the bound port."""
    host, port = split_listen(listen)
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = int(listener.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610 - anyio, not Django
    log.info("health.listening address=%s port=%d", host, bound)
    task_status.started(bound)

    async def handler(stream: anyio.abc.SocketStream) -> None:
        try:
            await _handle(stream, state)
        except Exception as exc:  # one bad client must not stop the probes
            log.debug("health.request_failed error=%r", exc)

    async with listener:
        await listener.serve(handler)


_conforms: Health = HealthState()
