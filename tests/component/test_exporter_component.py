"""Exporter shells without daemons: a missing VICI socket / UAPI socket (real OS behaviour: refused),
the HTTP server over real TCP on 127.0.0.1, plan reloads, event-follower backoff with injected sleep,
what is watched (an IPsec plan means strongswan_up in every scrape), and a missing or invalid plan at
start (waited for, not ready, said every few seconds; never an exit)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from exporter.app import MetricsApp
from exporter.http import serve
from exporter.service import DEFAULT_VICI_SOCKET, Exporter, PlanFile
from exporter.sources import StrongswanSource, WireGuardSource, follow_events
from gwkit.vici import ViciSession, ViciUnavailable
from gwplan.model import Child, GatewayRef, Ipsec, Plan, SecretRef, Tunnel, WgPeer, WireGuard, dumps
from lab import ports
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio


def plan(*tunnels: str) -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw"),
        type="ipsec",
        ipsec=Ipsec(
            tunnels=tuple(Tunnel(t, True, (Child(f"{t}-0", "10.0.0.0/24"),), {t: {}}) for t in tunnels)
        ),
    )


async def test_missing_sockets_give_up_zero_fast_and_backoff_skips_connects(tmp_path: Path) -> None:
    attempts: list[float] = []

    async def counting_connect(path: Any, *, timeout: float) -> ViciSession:
        attempts.append(time.monotonic())
        return await ViciSession.connect(path, timeout=timeout)

    source = StrongswanSource(tmp_path / "charon.vici", connect=counting_connect)
    pf = tmp_path / "plan.json"
    pf.write_bytes(dumps(plan("t1")))
    plan_file = PlanFile(pf)
    plan_file.load_initial()
    exporter = Exporter(
        strongswan=source, wireguard=WireGuardSource(tmp_path), interfaces=("wg0",), plan=plan_file
    )
    t0 = time.monotonic()
    snap = await exporter.snapshot()
    assert time.monotonic() - t0 < 1.0
    assert snap.strongswan is not None and not snap.strongswan.up
    assert [t.up for t in snap.strongswan.view.tunnels] == [False]
    assert snap.wireguard is not None and [i.up for i in snap.wireguard.interfaces] == [False]
    await exporter.snapshot()  # within the backoff window: no new connect attempt
    assert len(attempts) == 1 and source.failures == 1


async def test_plan_reload_keeps_the_last_good_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan("t1")))
    pf = PlanFile(path)
    pf.load_initial()
    assert [t.name for t in pf.current().tunnels] == ["t1"]
    path.write_text('{"version": "garbage"}')
    assert [t.name for t in pf.current().tunnels] == ["t1"]
    path.write_bytes(dumps(plan("t1", "t2")))
    assert [t.name for t in pf.current().tunnels] == ["t1", "t2"]


async def test_event_follower_reconnects_with_backoff(tmp_path: Path) -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 5:
            raise anyio.get_cancelled_exc_class()()

    class Sink:
        def observe_event(self, name: str, body: Any, epoch: str) -> None:
            raise AssertionError("no events without a daemon")

        def epoch_for(self, info: Any) -> str:
            raise AssertionError("no epoch without a daemon")

    with pytest.raises(anyio.get_cancelled_exc_class()):
        await follow_events(tmp_path / "none.vici", Sink(), sleep=sleep)
    assert sleeps == [0.25, 0.5, 1.0, 2.0, 4.0]


async def _http(port: int, request: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(request)
        data = b""
        while True:
            try:
                data += await s.receive()
            except anyio.EndOfStream:
                return data


async def test_http_server_routes(tmp_path: Path) -> None:
    exporter = Exporter(strongswan=StrongswanSource(tmp_path / "none.vici"))
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, "127.0.0.1", 0, MetricsApp(exporter))
        metrics = await _http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert metrics.startswith(b"HTTP/1.1 200 OK\r\n") and b"\nstrongswan_up 0\n" in metrics
        om = await _http(port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n")
        assert b"Content-Type: application/openmetrics-text" in om and om.endswith(b"# EOF\n")
        assert (await _http(port, b"GET /healthz HTTP/1.1\r\n\r\n")).endswith(b"\r\n\r\nok\n")
        assert (await _http(port, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await _http(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await _http(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
        head = await _http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head.endswith(b"\r\n\r\n") and b"strongswan_up" not in head
        tg.cancel_scope.cancel()


async def test_refused_socket_is_vici_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ViciUnavailable):
        await ViciSession.connect(tmp_path / "none.vici", timeout=1)


async def test_a_crashing_source_reports_down_without_failing_the_scrape(tmp_path: Path) -> None:
    class Broken(StrongswanSource):
        async def scrape(self, timeout: float, plan: Any) -> Any:
            raise KeyError("unexpected reply shape")

    exporter = Exporter(
        strongswan=Broken(tmp_path / "x.vici"), wireguard=WireGuardSource(tmp_path), interfaces=("wg0",)
    )
    snap = await exporter.snapshot()
    assert snap.strongswan is not None and not snap.strongswan.up
    assert snap.wireguard is not None and snap.wireguard.interfaces[0].interface == "wg0"
    again = await exporter.snapshot()
    assert exporter.queries == 2 and again.strongswan is not None


async def test_a_crashing_query_reports_every_daemon_down(tmp_path: Path) -> None:
    """A bug outside the sources (here: reading the plan) must still give *_up 0, which alerts, not a
    scrape without the up metrics."""

    class BrokenPlan(PlanFile):
        def current(self) -> Any:
            raise RuntimeError("bug")

    exporter = Exporter(
        strongswan=StrongswanSource(tmp_path / "x.vici"),
        wireguard=WireGuardSource(tmp_path),
        interfaces=("wg0",),
        plan=BrokenPlan(None),
    )
    snap = await exporter.snapshot()
    assert snap.strongswan is not None and not snap.strongswan.up
    assert snap.wireguard is not None and [(i.interface, i.up) for i in snap.wireguard.interfaces] == [
        ("wg0", False)
    ]


async def test_kernel_netlink_backend_feeds_the_same_metrics(tmp_path: Path) -> None:
    """No WireGuard module here: the netlink path runs against gwkit.wireguard.fakes.FakeKernelWireGuard
    (pyroute2's real AsyncWireGuard with an in-memory kernel behind its socket)."""
    from prometheus_client import CollectorRegistry

    from exporter.collector import SnapshotCollector
    from gwkit.wireguard.backend import NetlinkBackend, WireGuardBackend
    from gwkit.wireguard.fakes import FakeKernelWireGuard, FakeLinks, KernelPeer

    kernel = FakeKernelWireGuard(per_message=2)
    alice, bob, carol = (base64.b64encode(bytes([i]) * 32).decode() for i in (1, 2, 3))
    secret = base64.b64encode(bytes(range(32))).decode()
    kernel.devices["wg0"]["private_key"] = secret
    kernel.devices["wg0"]["peers"] = {
        alice: KernelPeer(
            alice, preshared_key=secret, endpoint=("192.0.2.7", 51820), handshake=(1790000000, 0), rx=5, tx=6
        ),
        bob: KernelPeer(bob),
        carol: KernelPeer(carol, rx=1),
    }

    async def detect(interface: str, uapi_dir: Path | None) -> WireGuardBackend:
        return NetlinkBackend(kernel, FakeLinks({"wg0"}, kernel=kernel))

    names = {"wg0": {alice: "alice"}}
    snap_wg = await WireGuardSource(detect_backend=detect).scrape(2.0, ["wg0"], names)
    from exporter.collector import Snapshot

    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: Snapshot(wireguard=snap_wg)))
    assert reg.get_sample_value("wireguard_interface_info", {"interface": "wg0", "backend": "netlink"}) == 1
    assert reg.get_sample_value("wireguard_peers", {"interface": "wg0"}) == 3
    assert (
        reg.get_sample_value("wireguard_peer_receive_bytes_total", {"interface": "wg0", "peer": "alice"}) == 5
    )
    assert (
        reg.get_sample_value("wireguard_peer_transmit_bytes_total", {"interface": "wg0", "peer": "alice"})
        == 6
    )
    hs = "wireguard_peer_last_handshake_timestamp_seconds"
    assert reg.get_sample_value(hs, {"interface": "wg0", "peer": "alice"}) == 1790000000
    assert reg.get_sample_value(hs, {"interface": "wg0", "peer": bob}) is None
    info = {"interface": "wg0", "peer": "alice", "public_key": alice, "endpoint": "192.0.2.7:51820"}
    assert reg.get_sample_value("wireguard_peer_info", info) == 1
    text = str([s for m in reg.collect() for s in m.samples])
    assert secret not in text and bytes(range(32)).hex() not in text


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args, code, needle",
    [
        pytest.param(["--listen", "nope"], 2, b"--listen: expected HOST:PORT", id="bad-listen"),
        pytest.param(
            ["--listen", "127.0.0.1:0", "--vici-socket", "/x", "--scrape-timeout", "10"],
            2,
            b"< 10",
            id="timeout",
        ),
        pytest.param(
            ["--listen", "127.0.0.1:0", "--wireguard-interface", "../../tmp/x"],
            2,
            b"argument --wireguard-interface: '../../tmp/x' is not an interface name",
            id="interface-is-a-path",
        ),
    ],
)
async def test_command_line_usage_errors_exit_2(args: list[str], code: int, needle: bytes) -> None:
    res = await anyio.run_process([sys.executable, "-m", "exporter", *args], check=False, cwd=REPO)
    assert res.returncode == code and needle in res.stderr


async def test_command_line_cannot_bind_exits_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [sys.executable, "-m", "exporter", "--listen", f"127.0.0.1:{port}", "--vici-socket", "/x"]
        res = await anyio.run_process(argv, check=False, cwd=REPO)
    assert res.returncode == 1 and b"exporter.failed" in res.stderr and b"Traceback" not in res.stderr


FAULTS = """
import resource, sys
from exporter.__main__ import keep_heap
tuned = sys.argv[1] == "tuned" and keep_heap()
def scrape():  # like a scrape at 10,000 peers: the joined text and its encoding alive at once, then freed
    text = b"x" * (4 << 20)  # written, page by page (bytes(n) would be calloc'd and never touched)
    body = b"y" * (4 << 20)
    del text, body
scrape()  # warm up: the first buffers are new memory either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    scrape()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


async def test_keep_heap_serves_big_buffers_without_page_faults() -> None:
    """Real glibc, real kernel: freed multi-megabyte buffers come back without faulting their pages in."""
    runs = {}
    for mode in ("default", "tuned"):
        res = await anyio.run_process([sys.executable, "-c", FAULTS, mode], cwd=REPO)
        tuned, faults = res.stdout.split()
        runs[mode] = (tuned == b"True", int(faults))
    assert runs["tuned"][0], "glibc mallopt is available on this machine"
    # glibc's default gives freed megabytes back (trim) and faults them in again on the next scrape
    assert runs["default"][1] > 5_000, runs
    assert runs["tuned"][1] < 100, runs


class FakeCharon:
    """A fake VICI session standing in for charon (version, stats, a one-tunnel list-sas). Why a fake: the
    case is a wall-clock step, and stepping this machine's clock under a live charon would step it under
    every other test too. ``since`` is what charon prints: wall time minus its uptime, so a step moves it."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.bytes_in = 0
        self.closed = False

    async def call(self, command: str, message: Any = None, **_: Any) -> dict[str, Any]:
        if command == "version":
            return {"daemon": "charon", "version": "5.9.8"}
        assert command == "stats"
        since = time.strftime("%b %d %H:%M:%S %Y", time.localtime(self.started))
        return {"uptime": {"since": since}, "ikesas": {"total": "1"}, "plugins": []}

    async def stream(self, command: str, message: Any, event: str, **kw: Any) -> tuple[list[Any], Any]:
        child = {"name": "c0", "uniqueid": "1", "state": "INSTALLED", "bytes-in": str(self.bytes_in)}
        kw["on_event"]({"t1": {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {"c0-1": child}}})
        return [], {}

    async def aclose(self) -> None:
        self.closed = True


async def test_the_epoch_survives_wall_clock_steps_and_changes_on_a_restart(tmp_path: Path) -> None:
    """charon's unique ids restart with it, so a new epoch re-keys every SA: a step misread as a restart
    would count every live CHILD_SA twice (its carried and its re-keyed counts)."""
    wall, mono = [1_790_000_000.0], [0.0]
    charon = FakeCharon(started=wall[0] - 100)
    connects = 0

    async def connect(path: Any, *, timeout: float) -> Any:
        nonlocal connects
        connects += 1
        return charon

    source = StrongswanSource(
        tmp_path / "x.vici", connect=connect, clock=lambda: mono[0], wall=lambda: wall[0]
    )

    async def bytes_in(n: int) -> int:
        charon.bytes_in = n
        snap = await source.scrape(5.0, [])
        (tunnel,) = snap.view.tunnels
        return tunnel.counts.bytes_in

    assert await bytes_in(100) == 100
    epoch = source.epoch
    wall[0] += 3600  # NTP steps the clock an hour: charon's since moves with it, its session stays up
    charon.started += 3600
    mono[0] += 1
    assert await bytes_in(150) == 150 and source.epoch == epoch
    charon.closed = True  # the session drops (not a restart): on reconnect the step is taken out
    mono[0] += 1
    assert await bytes_in(170) == 170 and source.epoch == epoch and connects == 2
    charon = FakeCharon(started=wall[0] - 1)  # a real restart: unique ids start at 1 again
    mono[0] += 1
    assert await bytes_in(5) == 175, "the old SA's 170 retired, the new SA's 5 added"
    assert source.epoch != epoch and connects == 3


def wg_plan(interface: str = "wg7") -> Plan:
    peer = WgPeer("alice", base64.b64encode(bytes([9]) * 32).decode(), ("10.99.0.2/32",))
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw"),
        type="wireguard",
        wireguard=WireGuard(interface, 51820, "10.99.0.1/24", SecretRef("wg", "key"), (peer,)),
    )


def metric_lines(body: bytes) -> dict[str, float]:
    text = body.split(b"\r\n\r\n", 1)[1].decode()
    return {
        k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln[:1] not in ("#", ""))
    }


async def test_an_ipsec_plan_means_strongswan_up_in_every_scrape_and_a_wireguard_plan_does_not(
    tmp_path: Path,
) -> None:
    """The exporter as the pod runs it (``--plan`` only): charon watched because the plan is IPsec, and
    its ``strongswan_up 0`` (which alerts) when nothing answers; a WireGuard plan watches its interface
    instead and never reports a charon it does not have."""
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan("t1")))
    pf = PlanFile(path)
    exporter = Exporter(
        strongswan=StrongswanSource(tmp_path / "no-charon.vici"),
        wireguard=WireGuardSource(tmp_path),
        plan=pf,
        charon="ipsec-plan",
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, "127.0.0.1", 0, MetricsApp(exporter))
        ipsec = metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        path.write_bytes(dumps(wg_plan()))
        wireguard = metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        tg.cancel_scope.cancel()
    assert ipsec["strongswan_up"] == 0 and ipsec['strongswan_tunnel_up{tunnel="t1"}'] == 0
    assert not any(k.startswith("wireguard_") for k in ipsec)
    assert wireguard['wireguard_up{interface="wg7"}'] == 0
    assert wireguard['wireguard_peer_present{interface="wg7",peer="alice"}'] == 0
    assert not any(k.startswith("strongswan_") for k in wireguard)
    assert ipsec["vpngw_exporter_plan_valid"] == wireguard["vpngw_exporter_plan_valid"] == 1


async def test_a_crashing_wireguard_source_still_reports_every_interface_down(tmp_path: Path) -> None:
    """A bug in the WireGuard source used to give a scrape without any wireguard_up: no alert."""

    class Broken(WireGuardSource):
        async def scrape(self, timeout: float, interfaces: Any, names: Any) -> Any:
            raise KeyError("unexpected reply shape")

    path = tmp_path / "plan.json"
    path.write_bytes(dumps(wg_plan("wg7")))
    exporter = Exporter(wireguard=Broken(tmp_path), interfaces=("wg0",), plan=PlanFile(path))
    snap = await exporter.snapshot()
    assert snap.wireguard is not None
    assert [(i.interface, i.up, i.missing) for i in snap.wireguard.interfaces] == [
        ("wg0", False, ()),
        ("wg7", False, ("alice",)),
    ]


def test_the_default_vici_socket_is_where_the_gateway_image_puts_it() -> None:
    conf = (REPO / "images" / "gateway" / "strongswan.conf").read_text()
    assert f"socket = unix://{DEFAULT_VICI_SOCKET}\n" in conf


async def test_plan_file_waits_says_why_every_period_and_logs_a_rejection_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.service")
    now = [0.0]
    path = tmp_path / "plan.json"
    pf = PlanFile(path, clock=lambda: now[0], remind_every=5.0)
    assert pf.readiness() == (False, f"no valid plan at {path}: not read yet")
    for t in range(12):  # a scrape or the watcher every second
        now[0] = float(t)
        pf.current()
    ready, reason = pf.readiness()
    assert not ready and reason.startswith(f"no valid plan at {path}: cannot read {path}: No such file")
    path.write_text("{not json")
    for t in range(12, 14):
        now[0] = float(t)
        pf.current()
    messages = [r.getMessage() for r in caplog.records]
    rejected = [m for m in messages if m.startswith("exporter.plan.rejected")]
    waiting = [m for m in messages if m.startswith("exporter.plan.waiting")]
    assert len(rejected) == 2, "once per distinct reason, not once per call"
    assert [re.search(r"for=(\d+)s", m).group(1) for m in waiting] == ["0", "5", "10", "12"]  # type: ignore[union-attr]
    assert all(f"path={path}" in m and "ready=no" in m for m in waiting)
    assert pf.valid is False and pf.names.tunnels == ()
    path.write_bytes(dumps(plan("t1")))
    now[0] = 14.0
    assert [t.name for t in pf.current().tunnels] == ["t1"]
    assert pf.readiness() == (True, f"plan {path} loaded") and pf.valid is True
    assert "exporter.plan.loaded" in caplog.records[-1].getMessage()
    path.write_text('{"version": "garbage"}')
    now[0] = 30.0
    pf.current()
    assert pf.readiness()[0] is True, "a rejected update keeps the last good plan, and readiness"
    assert pf.valid is False and [t.name for t in pf.names.tunnels] == ["t1"]
    assert not caplog.records[-1].getMessage().startswith("exporter.plan.waiting")


@contextlib.asynccontextmanager
async def exporter_process(*args: str, log: Path) -> AsyncIterator[tuple[anyio.abc.Process, int]]:
    """``python -m exporter --listen 127.0.0.1:0 ARGS``: the process and the port it bound; stopped with
    SIGTERM (killed if it hangs) on the way out."""
    with log.open("wb") as out:
        proc = await anyio.open_process(
            [sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0", *args],
            stdout=out,
            stderr=out,
            cwd=REPO,
            env={**os.environ, "TZ": "Asia/Kolkata"},
        )
    try:
        port = await anyio.to_thread.run_sync(
            lambda: ports.wait_announced_port(
                lambda: log.read_text(errors="replace"),
                "exporter.http.listening",
                alive=lambda: proc.returncode is None,
                timeout=20,
                what="the exporter",
            )
        )
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(10):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_command_line_plan_only_watches_charon_at_the_images_socket(tmp_path: Path) -> None:
    """``--listen ... --plan P`` without ``--vici-socket`` served an empty 200 body: no strongswan_up, so
    the "exporter cannot reach the daemon" alert could never fire."""
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan("t1")))
    async with exporter_process("--plan", str(path), log=tmp_path / "exporter.log") as (proc, port):
        got = metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        ready = await _http(port, b"GET /readyz HTTP/1.1\r\n\r\n")
    assert "strongswan_up" in got and 'strongswan_tunnel_up{tunnel="t1"}' in got
    if not DEFAULT_VICI_SOCKET.exists():
        assert got["strongswan_up"] == 0
    assert ready.startswith(b"HTTP/1.1 200 ") and ready.endswith(f"ready: plan {path} loaded\n".encode())
    assert proc.returncode == 0
    assert f"vici={DEFAULT_VICI_SOCKET} charon=ipsec-plan" in (tmp_path / "exporter.log").read_text()


async def test_command_line_waits_for_a_missing_plan_not_ready_then_serves_it(tmp_path: Path) -> None:
    """A missing plan at start made the exporter exit 2 (in a pod: a crash loop) while the agent waited.
    Now both wait: live, not ready with the path and the reason, said in the log; the plan then
    appearing is picked up without a restart."""
    path = tmp_path / "plan.json"
    log = tmp_path / "exporter.log"
    async with exporter_process("--plan", str(path), log=log) as (proc, port):
        health = await _http(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        waiting = await _http(port, b"GET /readyz HTTP/1.1\r\n\r\n")
        before = metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        path.write_bytes(dumps(plan("t1")))

        async def readyz_ok() -> bytes | None:  # the exporter re-checks the plan file every second
            got = await _http(port, b"GET /readyz HTTP/1.1\r\n\r\n")
            return got if got.startswith(b"HTTP/1.1 200") else None

        ready = await wait_for_async(readyz_ok, 10, "the exporter to turn ready on the plan", interval=0.1)
        after = metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        assert proc.returncode is None
    text = log.read_text()
    assert health.endswith(b"\r\n\r\nok\n")
    assert waiting.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert f"not ready: no valid plan at {path}: cannot read {path}: No such file".encode() in waiting
    build = {k: v for k, v in before.items() if k.startswith("vpngw_build_info{")}
    assert list(build.values()) == [1.0] and 'program="exporter"' in next(iter(build)), before
    assert {k: v for k, v in before.items() if k not in build} == {
        "vpngw_exporter_plan_valid": 0.0,
        "vpngw_ha_standby": 0.0,
    }, "nothing to watch until the plan says what (beside the build's info and the pod's role)"
    assert ready.endswith(f"ready: plan {path} loaded\n".encode())
    assert after["vpngw_exporter_plan_valid"] == 1 and "strongswan_up" in after
    assert f"exporter.plan.waiting path={path} reason=" in text and "exporter.plan.loaded" in text
    assert proc.returncode == 0, text
    lines = [ln for ln in text.splitlines() if ln]
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ \S+ \S+", ln) for ln in lines), lines


async def test_the_role_file_beside_the_plan_is_vpngw_ha_standby(tmp_path: Path) -> None:
    """As the pod runs it (``--plan <read-only dir>/plan.json``): the agent's copy of the HA role beside
    the plan is read at every scrape; absent is active (0), ``standby`` is 1, a content that says neither
    counts as active (the gauge only silences alerts) and is logged once."""
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "plan.json").write_bytes(dumps(plan("t1")))
    role = ro / "ha-role"

    def put(text: str) -> None:
        (ro / ".ha-role.tmp").write_text(text)
        (ro / ".ha-role.tmp").replace(role)

    log = tmp_path / "exporter.log"
    async with exporter_process("--plan", str(ro / "plan.json"), log=log) as (proc, port):

        async def standby() -> float:
            return metric_lines(await _http(port, b"GET /metrics HTTP/1.1\r\n\r\n"))["vpngw_ha_standby"]

        seen = [await standby()]
        put("standby\n")
        seen.append(await standby())
        put("active\n")
        seen.append(await standby())
        put("standby\n")
        seen.append(await standby())
        put("passive\n")
        seen += [await standby(), await standby()]
        role.unlink()
        seen.append(await standby())
    assert seen == [0, 1, 0, 1, 0, 0, 0]
    text = log.read_text()
    assert (
        text.count("exporter.ha_role.invalid") == 1
        and "error=\"neither active nor standby: 'passive'\"" in text
    )
    assert "counted=active" in text and "exporter.ha_role.valid" in text
    assert proc.returncode == 0, text


async def test_help_says_what_is_watched_and_that_a_bad_plan_is_waited_for() -> None:
    res = await anyio.run_process([sys.executable, "-m", "exporter", "--help"], cwd=REPO)
    out = b" ".join(res.stdout.split())
    assert f"default: {DEFAULT_VICI_SOCKET}".encode() in out
    assert b"is waited for, not an exit" in out and b"/readyz" in out
    assert b"exit codes: 0 stopped by SIGINT/SIGTERM, 1 runtime failure" in out


def test_the_exporter_needs_no_flag_but_listen() -> None:
    """With nothing else named the exporter watches charon at the image's socket (no 'nothing to
    watch' exit any more): it starts, serves strongswan_up, and stops on SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "exporter.http.listening" in line:
                port = int(line.rsplit("port=", 1)[1])
                break
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            body = b"".join(iter(lambda: s.recv(65536), b""))
        assert b"\nstrongswan_up " in body
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0
