"""Liveness and readiness for the kubelet's probes (both backends).

``/healthz`` answers 200 while the agent's loop has called ``beat()`` within ``stale_after`` seconds: it
says the agent itself is alive. A daemon that is down, hung (SIGSTOP) or refusing connections is NOT a
liveness failure: the agent is the one that reconnects and re-pushes, restarting it would not help.
``/readyz`` answers 200 when the backend said it is connected and has pushed the plan, else 503 with the
reason. The decision is the pure ``respond``; ``serve`` is gwkit.httpd (a tiny HTTP/1.0 server on anyio that
caps its connections and puts a deadline on every read and send: see its docstring).

Not ready is also said in the log, not only on ``/readyz`` (which nobody may be probing, e.g. without
``--health-listen``): ``health.ready ready=no reason=...`` when the reason changes, then
``health.not_ready reason=... for=<s>`` every ``remind_every`` seconds while it lasts (a missing plan, an
unreachable charon), so a pod stuck waiting says why in ``kubectl logs`` whenever one looks.

``/metrics`` on the same port: ``vpngw_build_info{version,program="agent"} 1`` and the process's own
series (``process_*``, ``python_info``). The tunnels' metrics are the exporter's, not the agent's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agent.runtime import Health
from gwkit import httpd
from gwkit.logs import Reminder
from gwkit.version import version

log = logging.getLogger(__name__)

Clock = Callable[[], float]


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


def metrics_registry(*, process: bool = True) -> CollectorRegistry:
    """What the agent's ``/metrics`` serves: its build, and (``process``) its process."""
    r = CollectorRegistry()
    build = Gauge(
        "vpngw_build_info", "1, labelled with the program's version.", ["version", "program"], registry=r
    )
    build.labels(version(), "agent").set(1)
    if process:
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
    return r


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); raises ValueError naming the rule."""
    return httpd.split_listen(listen, "--health-listen")


async def serve(
    listen: str,
    state: HealthState,
    *,
    limits: httpd.Limits = httpd.LIMITS,
    registry: CollectorRegistry | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the probes and ``/metrics`` (``registry``, default ``metrics_registry()``) until cancelled
    (gwkit.httpd, with its connection cap and deadlines: a flood of slow clients on the probe port does
    not fail the kubelet's probes); ``task_status.started`` gets the bound port."""
    metrics = registry if registry is not None else metrics_registry()

    async def answer(path: str) -> httpd.Answer:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(metrics)
        code, body = respond(path, state.snapshot(), state.stale_after)
        return code, "text/plain", body.encode()

    await httpd.serve(listen, answer, limits=limits, task_status=_Announce(task_status, listen))


class _Announce:
    """Logs the bound port, then passes it on."""

    def __init__(self, inner: anyio.abc.TaskStatus[int], listen: str) -> None:
        self._inner = inner
        self._listen = listen

    def started(self, value: int | None = None) -> None:
        assert value is not None
        log.info("health.listening address=%s port=%d", split_listen(self._listen)[0], value)
        self._inner.started(value)


_conforms: Health = HealthState()
