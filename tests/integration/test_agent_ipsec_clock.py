"""A wall-clock step is not a charon restart: the IPsec keeper against live charon daemons in the lab.

charon's ``stats`` ``uptime.since`` is wall time minus its uptime, so an NTP step moves it. The machine's
clock cannot be stepped safely here (other tests and helpers share it), and a time namespace does not help
(it virtualises only CLOCK_MONOTONIC/BOOTTIME, never CLOCK_REALTIME, and charon computes ``since`` from
both), so the step is injected at the keeper's seams: its ``since`` parser (charon's real ``stats`` reply,
parsed, plus the step) and its wall clock (plus the same step), exactly what a real step looks like from
the agent. Everything else is real: charon, the sites, VICI, the tunnels. The keeper runs in-process so the
test can move its clock; charon is killed/stopped under it by the lab's handles.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from agent.fakes import ListSink, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.sources import FileSecrets
from gwkit.vici.queries import start_time
from lab.wait import WaitTimeout, wait_for_async
from lab.world import Lab
from tests.integration.test_agent_ipsec import PSK, gw_sas, ike_ids, make_plan, setup_site, start_sites

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


class Step:
    """A wall-clock step as the keeper sees it: charon's ``since`` and our wall clock move together."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def since(self, stats: dict[str, Any]) -> float | None:
        observed = start_time(stats)
        return None if observed is None else observed + self.seconds

    def wall(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.seconds)


class Running:
    def __init__(self, keeper: Keeper, sink: ListSink) -> None:
        self.keeper = keeper
        self.sink = sink

    def states(self, doc: dict[str, Any]) -> dict[str, str]:
        return {t["name"]: t["state"] for t in doc["tunnels"]}

    async def until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """``lab.wait.wait_for_async``, with the last status published in the failure."""
        try:
            await wait_for_async(cond, timeout, what, interval=0.02)
        except WaitTimeout as e:
            last = self.sink.published[-1] if self.sink.published else None
            raise AssertionError(f"{e}; last status {last}") from None

    def established(self) -> set[str]:
        docs = self.sink.published
        return {n for n, s in self.states(docs[-1]).items() if s == "Established"} if docs else set()

    def all_established(self) -> bool:
        docs = self.sink.published
        return bool(docs) and all(s == "Established" for s in self.states(docs[-1]).values())


def seen_steps(keeper: Keeper, n: int) -> Callable[[], bool]:
    return lambda: keeper.clock_steps >= n


def connected(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in (r.getMessage() for r in caplog.records) if m.startswith("vici.connected")]


@asynccontextmanager
async def running(
    lab: Lab,
    tmp_path: Path,
    step: Step,
    timing: Timing,
    *,
    sites: int = 3,
    offline: int = 0,
    sink: ListSink | None = None,
) -> AsyncIterator[Running]:
    """The keeper on ``sites`` site tunnels, the last ``offline`` of them with an unconfigured remote
    charon (every initiation fails); yields once the others are Established."""
    hosts = start_sites(lab, sites)
    for s in hosts[: sites - offline]:
        await setup_site(lab, s)
    (tmp_path / "tenant-psk").mkdir()
    (tmp_path / "tenant-psk" / "psk").write_text(PSK)
    assert lab.gw.charon is not None
    sink = sink or ListSink()
    keeper = Keeper(
        lab.gw.charon.vici_socket,
        StaticPlans(make_plan(lab, hosts)),
        FileSecrets(tmp_path),
        sink,
        HealthState(),
        timing=timing,
        wall=step.wall,
        since=step.since,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        try:
            r = Running(keeper, sink)
            up = {s.role for s in hosts[: sites - offline]}
            await r.until(lambda: r.established() == up, 30, f"{sorted(up)} Established")
            yield r
        finally:
            tg.cancel_scope.cancel()


async def test_a_wall_clock_step_while_connected_is_not_a_restart(
    lab: Lab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Steps of +1 h and then -90 s (far beyond the 2 s wobble tolerance) while the keeper stays
    connected: no reconnect, no re-push, no re-initiation, never a tunnel reported anything but
    Established. The old rule (start time moved by > 2 s = restart) failed every one of these."""
    caplog.set_level(logging.INFO, logger="agent")
    step = Step()
    timing = Timing(poll_interval=0.1, resync_seconds=1.0)
    async with running(lab, tmp_path, step, timing) as r:
        before = ike_ids(await gw_sas(lab))
        published = len(r.sink.published)
        caplog.clear()
        for seconds in (3600.0, 3600.0 - 90.0):
            step.seconds = seconds
            await r.until(seen_steps(r.keeper, r.keeper.clock_steps + 1), 5, f"probe saw step {seconds}")
            await anyio.sleep(2.5)  # several probes and at least two resyncs (list-sas, status, watchdog)
        after = ike_ids(await gw_sas(lab))
        assert r.keeper.cycles == 1, "no reconnect"
        assert r.keeper.daemon_error is None
        assert after == before, "the same IKE_SAs: nothing re-initiated"
        later = r.sink.published[published:]
        assert all(set(r.states(d).values()) == {"Established"} for d in later), later
        assert all(d["agent"]["connected"] for d in later)
        messages = [rec.getMessage() for rec in caplog.records]
        assert any(m.startswith("vici.start_time_moved") for m in messages)
        pushed = [m for m in messages if m.startswith(("conn.loaded", "secret.loaded", "tunnel.initiate"))]
        assert pushed == [], "nothing re-pushed or re-initiated"
        assert not [m for m in messages if m.startswith(("vici.lost", "vici.connected"))]


async def test_after_a_hang_a_stepped_clock_is_the_same_daemon_and_a_kill_is_a_new_one(
    lab: Lab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deadline (SIGSTOPped charon) leaves open whether charon restarted meanwhile: the start time
    decides, with the step taken out. A step of +1 h during the hang: the same daemon (its counter carry
    is kept, its SAs were never touched). Then kill -9 + restart: a new daemon, told by the EOF."""
    caplog.set_level(logging.INFO, logger="agent")
    step = Step()
    timing = Timing(poll_interval=0.1, resync_seconds=1.0, call_timeout=0.5)
    async with running(lab, tmp_path, step, timing) as r:
        assert lab.gw.charon is not None
        before = ike_ids(await gw_sas(lab))
        lab.gw.charon.pause()
        try:
            await r.until(lambda: r.keeper.daemon_error is not None, 10, "the hang noticed")
            step.seconds = 3600.0
        finally:
            lab.gw.charon.resume()
        await r.until(lambda: r.keeper.cycles == 2 and r.all_established(), 15, "reconnected")
        assert connected(caplog)[-1].endswith("fresh=False cycle=2"), connected(caplog)
        assert ike_ids(await gw_sas(lab)) == before, "the SAs survived the hang"

        lab.gw.charon.kill()
        lab.gw.charon.start()
        await r.until(lambda: r.keeper.cycles == 3 and r.all_established(), 15, "back after kill -9")
        assert connected(caplog)[-1].endswith("fresh=True cycle=3"), connected(caplog)
        assert ike_ids(await gw_sas(lab)).keys() == before.keys()
