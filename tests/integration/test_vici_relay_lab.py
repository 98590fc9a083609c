"""The read-only VICI relay (agent.ipsec.relay) in front of a live charon 5.9.8 in the lab.

(a) The exporter scraping through the relay produces the same metrics as through charon's control socket,
    and its rekey/down event session works through it.
(b) Control commands sent through the relay are refused and charon's state does not change; the same
    command on the control socket does change it (so each case can fail).
And charon itself answers an unknown command or event exactly as the relay answers a refused one.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.ipsec import relay
from exporter.collector import Snapshot
from exporter.service import Exporter
from exporter.sources import StrongswanSource, follow_events
from gwkit.vici import ViciCommandFailed, ViciSession, readonly, wire
from gwkit.vici.queries import DaemonInfo
from lab.world import SERVICE_CIDR, Host, Lab
from tests.integration.test_exporter_lab import ipsec_plan, registry, two_sites, write_plan
from tests.integration.test_exporter_support import conn, load_pair

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


@asynccontextmanager
async def relayed(charon_socket: Path, tmp: Path) -> AsyncIterator[Path]:
    """The relay on ``tmp/ro/charon.vici`` in front of ``charon_socket``, as the agent serves it."""
    (tmp / "ro").mkdir(exist_ok=True)
    path = tmp / "ro" / relay.SOCKET_NAME
    async with anyio.create_task_group() as tg:
        await tg.start(relay.serve, path, charon_socket)
        yield path
        tg.cancel_scope.cancel()


Key = tuple[str, tuple[tuple[str, str], ...]]


def samples(snap: Snapshot) -> dict[Key, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in registry(snap).collect()
        for s in fam.samples
        if s.name != "strongswan_scrape_duration_seconds"
    }


TIMES = ("_timestamp_seconds", "strongswan_start_time_seconds")
"""Values that are now +- charon's whole seconds: two scrapes a moment apart may differ by one."""


# --- (a) the same metrics -------------------------------------------------------------------------


async def test_the_scrape_through_the_relay_has_the_same_metrics_as_through_the_control_socket(
    lab: Lab, tmp_path: Path
) -> None:
    s1, s2, gv, sessions = await two_sites(lab)
    assert lab.gw.charon is not None
    control = lab.gw.charon.vici_socket
    try:
        assert lab.gw.ping(s1.lan_host, src="198.18.0.1", count=3, wait=0.5)
        assert lab.gw.ping(s2.lan_host, src="198.18.0.1", count=2, wait=0.5)
        plan = ipsec_plan(
            {
                "s1": {"s1-0": s1.lans[0], "s1-1": s1.lans[1]},
                "s2": {"s2-0": s2.lans[0]},
                "s9": {"s9-0": "192.0.2.128/28"},
            }
        )
        async with relayed(control, tmp_path) as ro:
            through = Exporter(strongswan=StrongswanSource(ro), plan=write_plan(tmp_path, plan))
            direct = Exporter(strongswan=StrongswanSource(control), plan=write_plan(tmp_path, plan))
            got, want = await through.snapshot(), await direct.snapshot()

            # the event session (rekeys, downs) through the relay too: a tunnel taken down on the
            # control socket reaches the exporter's follower
            events: list[str] = []

            class Sink:
                def observe_event(self, name: str, body: Mapping[str, object], epoch: str) -> None:
                    events.append(name)

                def epoch_for(self, info: DaemonInfo) -> str:
                    return "e"

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow_events, ro, Sink())
                await anyio.sleep(0.5)  # registered (no way to wait for it from outside)
                await gv.stream("terminate", {"ike": "s2", "timeout": "5000"}, "control-log")
                with anyio.fail_after(10):
                    while "ike-updown" not in events:  # noqa: ASYNC110 - events arrive in another task
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
    finally:
        await gv.aclose()
        for s in sessions:
            await s.aclose()
    a, b = samples(got), samples(want)
    assert set(a) == set(b), f"series differ: {sorted(set(a) ^ set(b))[:5]}"
    for k, v in b.items():
        if k[0].endswith(TIMES):
            assert abs(a[k] - v) <= 1, k
        else:
            assert a[k] == v, k
    assert a[("strongswan_up", ())] == 1
    assert a[("strongswan_tunnel_up", (("tunnel", "s1"),))] == 1
    assert a[("strongswan_tunnel_bytes_total", (("direction", "out"), ("tunnel", "s2")))] >= 2 * 84
    assert any(k[0] == "strongswan_messages_total" for k in a), "get-counters passed the relay"
    assert "child-updown" in events


# --- (b) control commands are refused, and change nothing ------------------------------------------------


@dataclass
class Gateway:
    lab: Lab
    site: Host
    control: ViciSession
    ro: ViciSession
    dir: Path


async def established(v: ViciSession) -> dict[str, str]:
    """conn name -> IKE_SA unique id of what charon has ESTABLISHED."""
    events, _ = await v.stream("list-sas", {}, "list-sa")
    return {n: sa["uniqueid"] for e in events for n, sa in e.items() if sa.get("state") == "ESTABLISHED"}


async def sas(gw: Gateway) -> dict[str, str]:
    return await established(gw.control)


async def conns(v: ViciSession) -> list[str]:
    return list((await v.call("get-conns"))["conns"])


async def keys(v: ViciSession) -> list[str]:
    return list((await v.call("get-shared"))["keys"])


def probe_log(gw: Gateway) -> Path:
    return gw.dir / "probe.log"


async def logs_to_probe(gw: Gateway) -> bool:
    """Whether charon writes to the probe logger, which only a reload-settings brings in (traffic first:
    a new VICI client is logged at level 2)."""
    async with await ViciSession.connect(gw.lab.gw.charon.vici_socket) as v:  # type: ignore[union-attr]
        await v.call("version")
    await anyio.sleep(0.3)
    return probe_log(gw).exists()


async def up(gw: Gateway) -> None:
    await gw.control.stream("initiate", {"child": "s1-0", "ike": "s1", "timeout": "10000"}, "control-log")


async def add_probe_logger(gw: Gateway) -> None:
    charon = gw.lab.gw.charon
    assert charon is not None
    conf = charon.conf_path.read_text()
    logger = f"  filelog {{\n    probe {{\n      path = {probe_log(gw)}\n      default = 2\n    }}\n"
    charon.conf_path.write_text(conf.replace("  filelog {\n", logger, 1))


PROBE_CONN = "probe"


def probe_conn(gw: Gateway) -> dict[str, Any]:
    return conn(
        PROBE_CONN,
        "192.0.2.250",
        "192.0.2.251",
        "probe.a",
        "probe.b",
        {"p-0": ([SERVICE_CIDR], ["10.250.0.0/24"])},
    )


@dataclass(frozen=True)
class Case:
    command: str
    args: Callable[[Gateway], dict[str, Any]]
    before: Callable[[Gateway], Awaitable[None]]
    """Brings charon to the state the command would change."""
    state: Callable[[Gateway], Awaitable[object]]


async def nothing(gw: Gateway) -> None:
    return None


async def load_probe(gw: Gateway) -> None:
    await gw.control.call("load-conn", probe_conn(gw))


CASES = [
    Case("initiate", lambda gw: {"child": "s1-0", "ike": "s1", "timeout": "10000"}, nothing, sas),
    Case("terminate", lambda gw: {"ike": "s1", "timeout": "5000"}, up, sas),
    Case("load-conn", probe_conn, nothing, lambda gw: conns(gw.control)),
    Case("unload-conn", lambda gw: {"name": PROBE_CONN}, load_probe, lambda gw: conns(gw.control)),
    Case(
        "load-shared",
        lambda gw: {"id": "probe-key", "type": "IKE", "data": "probe-secret", "owners": ["probe.a"]},
        nothing,
        lambda gw: keys(gw.control),
    ),
    Case("clear-creds", lambda gw: {}, nothing, lambda gw: keys(gw.control)),
    Case("reload-settings", lambda gw: {}, add_probe_logger, logs_to_probe),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.command for c in CASES])
async def test_a_control_command_through_the_relay_is_refused_and_changes_nothing(
    lab: Lab, tmp_path: Path, case: Case
) -> None:
    site = lab.add_site()
    g, c = lab.start_charon(lab.gw), lab.start_charon(site)
    async with (
        await ViciSession.connect(g.vici_socket) as gv,
        await ViciSession.connect(c.vici_socket) as sv,
        relayed(g.vici_socket, tmp_path) as ro_path,
        await ViciSession.connect(ro_path) as ro,
    ):
        await load_pair(gv, sv, lab, site, "s1", "gw", {"s1-0": ([SERVICE_CIDR], site.lans)})
        gw = Gateway(lab, site, gv, ro, Path(g.dir))
        await case.before(gw)
        before = await case.state(gw)
        with pytest.raises(ViciCommandFailed, match="unknown command"):
            await ro.call(case.command, case.args(gw), timeout=15)
        if case.command in ("initiate", "terminate"):  # as swanctl sends them: with the control log
            with pytest.raises(ViciCommandFailed, match="unknown event"):
                await ro.stream(case.command, case.args(gw), "control-log", timeout=15)
        await anyio.sleep(1.0)  # an initiate or terminate would have done its work by now
        assert await case.state(gw) == before, f"{case.command} through the relay changed charon's state"
        assert (await ro.call("version"))["daemon"] == "charon", "the session goes on after a refusal"

        # The same command on the control socket does change it: the check above can fail.
        if case.command in ("initiate", "terminate"):
            await gv.stream(case.command, case.args(gw), "control-log", timeout=15)
        else:
            await gv.call(case.command, case.args(gw), timeout=15)
        await anyio.sleep(0.3)
        assert await case.state(gw) != before, f"{case.command} on the control socket changed nothing"


@pytest.mark.parametrize("event", ["log", "control-log"])
async def test_log_events_are_refused(lab: Lab, tmp_path: Path, event: str) -> None:
    g = lab.start_charon(lab.gw)
    async with relayed(g.vici_socket, tmp_path) as ro_path, await ViciSession.connect(ro_path) as ro:
        with pytest.raises(ViciCommandFailed, match="unknown event"):
            async for _ in ro.listen([event]):
                pass


def exchange(path: Path, data: bytes) -> bytes:
    """One packet out, one packet back, on a plain blocking socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(data)
        (length,) = struct.unpack("!I", s.recv(4, socket.MSG_WAITALL))
        return struct.pack("!I", length) + s.recv(length, socket.MSG_WAITALL)


async def test_charon_answers_an_unknown_name_as_the_relay_answers_a_refused_one(
    lab: Lab, tmp_path: Path
) -> None:
    g = lab.start_charon(lab.gw)
    async with relayed(g.vici_socket, tmp_path) as ro_path:
        for name, refused, unknown in (
            ("initiate", wire.request("initiate"), wire.request("no-such-command")),
            ("log", wire.register("log"), wire.register("no-such-event")),
        ):
            from_charon = await anyio.to_thread.run_sync(exchange, g.vici_socket, unknown)
            from_relay = await anyio.to_thread.run_sync(exchange, ro_path, refused)
            assert from_relay == from_charon, name
    assert from_charon == readonly.EVENT_UNKNOWN_REPLY
