"""Leader election's safety rule: a leader stops leading within its renew deadline of its last renewal,
even while a renewal hangs (controller/leader.py)."""

from __future__ import annotations

import copy
from typing import Any

import anyio

from controller.leader import LeaderElector
from gwkit.kube import NotFound


class HangingLeases:
    """A stand-in for the API server's Lease endpoint (only what LeaderElector calls): answers at once
    until ``hang`` is set, then never answers (a half-open connection)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.hang = False

    async def _maybe_hang(self) -> None:
        if self.hang:
            await anyio.sleep_forever()

    async def get(self, res: Any, name: str, namespace: str) -> dict[str, Any]:
        await self._maybe_hang()
        if self.lease is None:
            raise NotFound(404, "NotFound", f"leases {name} not found")
        return copy.deepcopy(self.lease)

    async def create(self, res: Any, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        await self._maybe_hang()
        self.rv += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
        return copy.deepcopy(self.lease)

    async def replace(self, res: Any, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        await self._maybe_hang()
        self.rv += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
        return copy.deepcopy(self.lease)


def test_a_hanging_renewal_does_not_keep_the_leader_leading() -> None:
    leases = HangingLeases()
    elector = LeaderElector(
        leases,  # type: ignore[arg-type]  # the three calls it makes
        "ns",
        "lease",
        "me",
        lease_duration=1.5,
        renew_deadline=1.0,
        retry_period=0.1,
    )

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(elector.run)
            with anyio.fail_after(10):
                while not elector.leading:
                    await elector.changed.wait()
            leases.hang = True  # every request from now on hangs (the client's own timeout is 10 s)
            with anyio.fail_after(10):
                while elector.leading:
                    await elector.changed.wait()
            tg.cancel_scope.cancel()

    anyio.run(scenario)
    assert not elector.leading and elector.transitions == 2


def test_leads_is_false_by_the_clock_once_the_deadline_passed_even_before_the_loop_noticed() -> None:
    """``leads()`` is what a worker thread asks before each write or cloud step: it must not wait for the
    elector's task to flip ``leading`` (that task may be between two tries)."""
    now = [100.0]
    leases = HangingLeases()
    elector = LeaderElector(
        leases,  # type: ignore[arg-type]
        "ns",
        "lease",
        "me",
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        monotonic=lambda: now[0],
    )
    assert not elector.leads(), "not leading yet"

    async def acquire() -> None:
        with anyio.move_on_after(1):
            await elector.run()

    anyio.run(acquire)
    assert elector.leading and elector.leads()
    now[0] += 9.9
    assert elector.leads()
    now[0] += 0.1  # the renew deadline since the last renewal was sent: no write may go out now
    assert elector.leading and not elector.leads()
