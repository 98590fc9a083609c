"""When the IPsec keeper publishes status (``status.publish_due``, pure): significant changes at once,
counters (and the one-second wobble of charon-derived timestamps) at most once per interval."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from agent.fakes import ListSink, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.ipsec.plan import desired
from agent.ipsec.status import publish_due, significant_change
from agent.runtime import Secrets
from gwkit.vici.session import ViciSession
from gwplan import Child, GatewayRef, Ipsec, Plan, Tunnel


def doc() -> dict[str, Any]:
    def tunnel(name: str, state: str = "Established") -> dict[str, Any]:
        return {
            "name": name,
            "state": state,
            "establishedAt": "2026-11-30T02:00:00Z",
            "rekeyAt": "2026-11-30T03:00:00Z",
            "bytesIn": 100,
            "bytesOut": 200,
            "packetsIn": 1,
            "packetsOut": 2,
            "children": [
                {"name": f"{name}-0", "remoteSubnet": "10.1.0.0/24", "state": state,
                 "rekeyAt": "2026-11-30T02:50:00Z"}
            ],
            "lastError": None,
        }  # fmt: skip

    return {
        "tunnels": [tunnel("up"), tunnel("offline", "Failed")],
        "agent": {"connected": True, "daemon": "charon 5.9.8", "planHash": "sha256:ab", "lastError": None},
    }


Edit = Callable[[dict[str, Any]], None]


def _set(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(d: dict[str, Any]) -> None:
        target: Any = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


COUNTERS_ONLY: list[Any] = [
    pytest.param(_set(("tunnels", 0, "bytesIn"), 5000), id="bytesIn"),
    pytest.param(_set(("tunnels", 0, "packetsOut"), 9), id="packetsOut"),
    pytest.param(_set(("tunnels", 0, "establishedAt"), "2026-11-30T01:59:59Z"), id="establishedAt-wobble"),
    pytest.param(_set(("tunnels", 0, "rekeyAt"), "2026-11-30T03:00:01Z"), id="rekeyAt-wobble"),
    pytest.param(_set(("tunnels", 0, "children", 0, "rekeyAt"), "2026-11-30T02:50:01Z"), id="child-wobble"),
]

SIGNIFICANT: list[Any] = [
    pytest.param(_set(("tunnels", 1, "state"), "Connecting"), id="state"),
    pytest.param(_set(("tunnels", 0, "children", 0, "state"), "Down"), id="child-state"),
    pytest.param(_set(("tunnels", 1, "lastError"), "peer not responding"), id="lastError"),
    pytest.param(_set(("agent", "connected"), False), id="agent-connected"),
    pytest.param(_set(("agent", "lastError"), "plan rejected: x"), id="agent-lastError"),
    pytest.param(_set(("tunnels", 0, "rekeyAt"), "2026-11-30T04:00:00Z"), id="rekeyAt-after-a-rekey"),
    pytest.param(_set(("tunnels", 0, "establishedAt"), "2026-11-30T02:30:00Z"), id="re-established"),
    pytest.param(_set(("tunnels", 0, "rekeyAt"), None), id="rekeyAt-gone"),
    pytest.param(lambda d: d["tunnels"].pop(), id="tunnel-removed"),
    pytest.param(lambda d: d["tunnels"][0]["children"].append({"name": "x"}), id="child-added"),
    pytest.param(lambda d: d["tunnels"][0].pop("lastError"), id="field-removed"),
]


def edited(edit: Edit) -> dict[str, Any]:
    d = copy.deepcopy(doc())
    edit(d)
    return d


@pytest.mark.parametrize("edit", COUNTERS_ONLY)
def test_counters_only_wait_for_the_interval(edit: Edit) -> None:
    new = edited(edit)
    assert new != doc(), "the edit changes the document"
    assert not significant_change(doc(), new)
    assert not publish_due(doc(), new, now=105.0, last=100.0, interval=30.0)
    assert publish_due(doc(), new, now=130.0, last=100.0, interval=30.0)


@pytest.mark.parametrize("edit", SIGNIFICANT)
def test_significant_changes_publish_at_once(edit: Edit) -> None:
    new = edited(edit)
    assert significant_change(doc(), new)
    assert publish_due(doc(), new, now=100.1, last=100.0, interval=30.0)


def test_first_status_at_once_and_unchanged_never() -> None:
    assert publish_due(None, doc(), now=0.0, last=0.0, interval=30.0)
    assert not publish_due(doc(), doc(), now=1e9, last=0.0, interval=30.0)


def test_a_site_offline_for_a_minute_costs_two_counter_writes_not_one_per_poll() -> None:
    """The keeper lists SAs every 0.5 s poll while a site is being retried; the other tunnel's counters
    move every time. Only the interval's writes go out, each with the latest counters."""
    published, last = doc(), 0.0
    writes = []
    for tick in range(1, 121):
        now = tick * 0.5
        new = edited(_set(("tunnels", 0, "bytesIn"), 100 + tick))
        if publish_due(published, new, now=now, last=last, interval=29.5):
            published, last = new, now
            writes.append(now)
    assert writes == [29.5, 59.0]
    assert published["tunnels"][0]["bytesIn"] == 100 + 118


class _TimedCharon:
    """Stands in for the keeper's VICI control session, and only here: the point is the keeper's clock
    (injected) around a listing whose duration the test chooses, which a live charon cannot be made to
    give. Live-charon publishing is in tests/integration/test_agent_ipsec_publish.py. ``list-sas``
    advances the clock by ``took`` and lists tunnel s1 up with ``bytes_in`` on its child."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.took, self.bytes_in = clock, 0.0, 0

    async def call(self, command: str, message: object = None, **_: object) -> dict[str, Any]:
        assert command == "stats"
        return {"ikesas": {"total": "1"}}

    async def stream(self, command: str, message: object, event: str, **_: object) -> Any:
        assert command == "list-sas"
        self.clock[0] += self.took
        child = {"name": "s1-0", "uniqueid": "2", "state": "INSTALLED", "bytes-in": str(self.bytes_in)}
        ike = {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {"s1-0-2": child}}
        return [{"s1": ike}], {}


@pytest.mark.anyio
async def test_a_faster_listing_does_not_hold_the_resyncs_counters_back(tmp_path: Path) -> None:
    """The counters' spacing counts from the refresh's start, the point the next resync is measured from:
    a resync whose listing is 2 s faster than the previous one publishes its counters (measured from after
    the listing, 30.1 - 2.0 < 29.5 held them back a whole period)."""
    clock = [0.0]
    sink = ListSink()
    conn: dict[str, Any] = {"s1": {"children": {"s1-0": {}}}}
    plan = Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="ipsec",
        ipsec=Ipsec(
            secrets=(),
            tunnels=(Tunnel("s1", False, (Child("s1-0", "10.1.0.0/24"),), conn),),
        ),
    )
    keeper = Keeper(
        tmp_path / "charon.vici",
        StaticPlans(plan),
        cast(Secrets, None),  # no secrets in this plan
        sink,
        HealthState(stale_after=60),
        timing=Timing(resync_seconds=30.0, poll_interval=0.5),
        clock=lambda: clock[0],
    )
    keeper.plan, keeper.want = plan, desired(plan)
    keeper.applied = keeper.want
    charon = _TimedCharon(clock)
    control = cast(ViciSession, charon)
    async with anyio.create_task_group() as tg:
        charon.took, charon.bytes_in = 2.0, 100
        await keeper._refresh_status(control, tg)  # the resync at 0.0: a slow listing, the first status
        assert [d["tunnels"][0]["bytesIn"] for d in sink.published] == [100]
        clock[0] = 30.0  # the next resync (next_resync = 0.0 + 30.0)
        charon.took, charon.bytes_in = 0.1, 200
        await keeper._refresh_status(control, tg)
        clock[0] = 45.0  # a refresh between resyncs (a tunnel state poll): counters alone wait
        charon.took, charon.bytes_in = 0.1, 300
        await keeper._refresh_status(control, tg)
    assert [d["tunnels"][0]["bytesIn"] for d in sink.published] == [100, 200]
    assert sink.published[-1]["tunnels"][0]["state"] == "Established"
