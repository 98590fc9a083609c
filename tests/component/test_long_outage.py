"""A daemon or API server that stays away for long: the backoffs must hold at their cap for ever.

Each loop below doubled its delay by hand (``base * 2 ** failures``); past 1,024 failures in a row that
raised OverflowError: the agent's keeper died after ~4 minutes of charon being down (0.25 s reconnects),
the exporter's event follower after ~85 minutes (5 s). Sleep and clock are injected, so thousands of
failures take well under a second; the sockets are real (a path nobody listens on: refused at once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent.fakes import ListSink, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.sink import FakeStatusApi, KubeStatusSink, StatusWriteError
from exporter.sources import StrongswanSource, follow_events
from gwplan import Child, GatewayRef, Ipsec, Plan, Tunnel
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio
OUTAGE = 1_500  # failures in a row: past the 1,024 where 2 ** n stops fitting a float
GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw")


def plan() -> Plan:
    conn = {"s1": {"version": "2", "children": {"s1-0": {"remote_ts": ["10.1.0.0/24"]}}}}
    return Plan(
        gateway=GW,
        type="ipsec",
        ipsec=Ipsec(tunnels=(Tunnel("s1", True, (Child("s1-0", "10.1.0.0/24"),), conn),)),
    )


class NoSecrets:
    def read(self, ref: Any) -> bytes:
        raise AssertionError("no secrets in this plan")

    def version(self, ref: Any) -> str:
        raise AssertionError("no secrets in this plan")


async def test_the_keeper_keeps_reconnecting_through_a_long_charon_outage(tmp_path: Path) -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        if seconds > 0:  # 0: the (disabled) debounce
            delays.append(seconds)
        await anyio.lowlevel.checkpoint()

    sink, health = ListSink(), HealthState(stale_after=60)
    keeper = Keeper(
        tmp_path / "charon.vici",
        StaticPlans(plan()),
        NoSecrets(),
        sink,
        health,
        timing=Timing(poll_interval=0.01, debounce=0.0),
        sleep=sleep,
    )
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            await wait_for_async(lambda: len(delays) >= OUTAGE, 10, "the keeper's retries", 0.01)
            tg.cancel_scope.cancel()
    assert keeper.conn.failures >= OUTAGE
    assert set(delays[-100:]) == {0.25}, "held at the cap"
    snap = health.snapshot()
    assert not snap.ready and "charon unreachable" in snap.reason
    (tunnel,) = sink.published[-1]["tunnels"]
    assert tunnel["state"] == "Down"


async def test_the_exporters_event_follower_keeps_reconnecting(tmp_path: Path) -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == OUTAGE:
            raise anyio.get_cancelled_exc_class()()

    class Sink:
        def observe_event(self, name: str, body: Any, epoch: str) -> None:
            raise AssertionError("no events without a daemon")

        def epoch_for(self, info: Any) -> str:
            raise AssertionError("no epoch without a daemon")

    with pytest.raises(anyio.get_cancelled_exc_class()):
        await follow_events(tmp_path / "none.vici", Sink(), sleep=sleep)
    assert len(delays) == OUTAGE and set(delays[-100:]) == {5.0}


async def test_the_exporters_scrapes_keep_answering_up_0(tmp_path: Path) -> None:
    now = [0.0]
    source = StrongswanSource(tmp_path / "none.vici", clock=lambda: now[0])
    for _ in range(OUTAGE):
        now[0] += 10.0  # past any retry wait: every scrape tries to connect, and fails
        snap = await source.scrape(1.0, [])
        assert not snap.up
    assert source.failures == OUTAGE


async def test_the_status_writer_keeps_retrying_the_api_server() -> None:
    api = FakeStatusApi(failures=[StatusWriteError("HTTP 503", retry=True) for _ in range(OUTAGE)])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await anyio.lowlevel.checkpoint()

    sink = KubeStatusSink(GW, api, sleep=sleep, min_interval=0)
    await sink.publish({"tunnels": []})
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sink.run)
            await wait_for_async(lambda: api.writes, 10, "a write after the writer's retries", 0.01)
            tg.cancel_scope.cancel()
    assert len(slept) == OUTAGE and set(slept[-100:]) == {30.0}
    assert api.writes == [{"tunnels": []}] and sink.failures == 0
