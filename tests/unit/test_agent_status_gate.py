"""The API status writers follow the pod's HA role (``agent.sink.due``, ``StatusGate``, ``KubeStatusSink``,
``WithPeerStatus``): both pods of a pair write the same CR and VPNPeers, so only the active one may. The
decision is table-tested; the writer runs against ``FakeStatusApi`` and a hand-flipped role in zero time
(tests/component/test_agent_ha_status.py runs a failover against the API emulator)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent.fakes import ListSink, ManualRole
from agent.runtime import ALWAYS_ACTIVE, Role, RoleSource
from agent.sink import (
    CopiedRole,
    FakeStatusApi,
    KubeStatusSink,
    StatusGate,
    WithPeerStatus,
    due,
)
from gwplan import GatewayRef
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio

GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw1")
A, B = b"{a}", b"{b}"


@pytest.mark.parametrize(
    "latest, written, role, expected",
    [
        pytest.param(None, None, "active", "idle", id="nothing-published"),
        pytest.param(A, A, "active", "idle", id="written-already"),
        pytest.param(B, A, "active", "write", id="new-while-active"),
        pytest.param(A, None, "active", "write", id="after-a-fence-written-again"),
        pytest.param(B, A, "standby", "hold", id="new-while-standby"),
        pytest.param(A, None, "standby", "hold", id="standby-after-a-fence"),
        pytest.param(A, A, "standby", "idle", id="standby-nothing-new"),
        pytest.param(None, None, "standby", "idle", id="standby-nothing-published"),
    ],
)
def test_due(latest: bytes | None, written: bytes | None, role: Role, expected: str) -> None:
    assert due(latest, written, role) == expected


class Run:
    """A writer (gateway's) and the gate's follower in a task group, with a recorded no-op sleep."""

    def __init__(self, role: RoleSource, api: FakeStatusApi, min_interval: float = 5.0) -> None:
        self.gate = StatusGate(role)
        self.slept: list[float] = []
        self.sink = KubeStatusSink(GW, api, sleep=self._sleep, min_interval=min_interval, gate=self.gate)

    async def _sleep(self, s: float) -> None:
        self.slept.append(s)
        await anyio.lowlevel.checkpoint()

    async def settle(self) -> None:
        """Let every task run until none has anything left to do (zero time: nothing really sleeps)."""
        for _ in range(50):
            await anyio.lowlevel.checkpoint()


def states(api: FakeStatusApi) -> list[Any]:
    return [w.get("state") for w in api.writes]


async def test_a_standby_holds_its_status_and_writes_the_latest_at_once_when_promoted() -> None:
    role, api = ManualRole("standby"), FakeStatusApi()
    run = Run(role, api)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run.gate.follow)
        tg.start_soon(run.sink.run)
        for state in ("Standby", "Standby-2"):
            await run.sink.publish({"state": state})
            await run.settle()
        assert api.attempts == 0 and run.sink.held, "nothing written while standby"
        role.set("active")
        await wait_for_async(lambda: states(api) == ["Standby-2"], 5, "the held status written", 0.001)
        assert run.slept == [], "at once: no pause before, none after the promotion's first write"
        await run.sink.publish({"state": "Connecting"})
        await wait_for_async(lambda: states(api)[-1:] == ["Connecting"], 5, "the next status", 0.001)
        tg.cancel_scope.cancel()
    assert run.slept == [5.0], "the usual pause after an ordinary write"


async def test_a_fenced_writer_holds_until_promoted_then_writes_even_an_unchanged_status() -> None:
    role, api = ManualRole("active"), FakeStatusApi()
    run = Run(role, api, min_interval=0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run.gate.follow)
        tg.start_soon(run.sink.run)
        await run.sink.publish({"state": "Established"})
        await wait_for_async(lambda: states(api) == ["Established"], 5, "the first write", 0.001)
        role.set("standby")
        await run.sink.publish({"state": "Standby"})
        await run.sink.publish({"state": "Down"})
        await run.settle()
        assert states(api) == ["Established"], "no write after the fence"
        # The other pod writes its status meanwhile (the CR is no longer what this one wrote).
        await api.patch_status(GW, {"state": "Established", "by": "other"})
        # Back to what this pod had written before the fence: nothing new to its eyes.
        await run.sink.publish({"state": "Established"})
        await run.settle()
        assert api.attempts == 2, "still standby"
        role.set("active")
        await wait_for_async(lambda: api.attempts == 3, 5, "the promotion's write", 0.001)
        assert api.status["state"] == "Established" and len(api.writes) == 3, (
            "written again although this pod wrote the same before its fence"
        )
        await run.settle()
        assert api.attempts == 3, "once"
        tg.cancel_scope.cancel()


class BlockingApi(FakeStatusApi):
    """A ``FakeStatusApi`` whose writes hang until ``release`` is set (a request in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = anyio.Event()
        self.started = 0
        self.cancelled = 0

    async def patch_status(self, gateway: GatewayRef, status: Mapping[str, Any]) -> None:
        self.started += 1
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        await super().patch_status(gateway, status)


async def test_a_write_in_flight_at_the_fence_is_cancelled_and_not_retried_while_standby() -> None:
    role, api = ManualRole("active"), BlockingApi()
    run = Run(role, api, min_interval=0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run.gate.follow)
        tg.start_soon(run.sink.run)
        await run.sink.publish({"state": "Down"})
        await wait_for_async(lambda: api.started == 1, 5, "the write in flight", 0.001)
        role.set("standby")
        await wait_for_async(lambda: api.cancelled == 1, 5, "the write cancelled", 0.001)
        api.release.set()
        await run.sink.publish({"state": "Standby"})
        await run.settle()
        assert (api.started, api.writes, run.sink.failures) == (1, [], 0), "held, not retried, no failure"
        role.set("active")
        await wait_for_async(lambda: states(api) == ["Standby"], 5, "the held status on promotion", 0.001)
        tg.cancel_scope.cancel()


async def test_the_peer_writers_share_the_gate() -> None:
    role, api = ManualRole("standby"), FakeStatusApi()
    gate = StatusGate(role)
    inner = ListSink()
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.follow)
        peers = WithPeerStatus(inner, GW, api, tg, clock=lambda: 1e9, gate=gate)
        await peers.publish({"tunnels": [{"name": "s1", "state": "Standby", "lastError": "HA standby"}]})
        for _ in range(50):
            await anyio.lowlevel.checkpoint()
        assert len(inner.published) == 1 and api.attempts == 0, "the inner sink has it; no VPNPeer write"
        role.set("active")
        await wait_for_async(lambda: api.attempts == 1, 5, "the peer's held status written", 0.001)
        tg.cancel_scope.cancel()


async def test_without_ha_the_gate_is_always_open() -> None:
    gate = StatusGate()
    assert gate.role is ALWAYS_ACTIVE and gate.open
    api = FakeStatusApi()
    sink = KubeStatusSink(GW, api, min_interval=0)
    assert sink.gate.open
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.follow)
        tg.start_soon(sink.run)
        await sink.publish({"state": "Established"})
        await wait_for_async(lambda: bool(api.writes), 5, "the write", 0.001)
        tg.cancel_scope.cancel()
    assert gate.term == 0


async def test_the_role_is_copied_for_the_exporter_atomically(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ro" / "ha-role"
    copy = CopiedRole(path)
    role = ManualRole("standby")
    async with anyio.create_task_group() as tg:
        tg.start_soon(copy.follow, role)
        await wait_for_async(lambda: path.exists() and path.read_text() == "standby\n", 5, "standby", 0.001)
        role.set("active")
        await wait_for_async(lambda: path.read_text() == "active\n", 5, "active copied", 0.001)
        tg.cancel_scope.cancel()
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["ha-role"], "no temp file left"
    # A directory that cannot be written: logged once, never raised.
    blocked = CopiedRole(tmp_path / "file" / "ha-role")
    (tmp_path / "file").write_text("not a directory")
    with caplog.at_level(logging.INFO, logger="agent.sink"):
        blocked.write("active")
        blocked.write("standby")
    assert [r.getMessage().split()[0] for r in caplog.records] == ["ha.role_copy_failed"]
    assert json.dumps(blocked.error)
