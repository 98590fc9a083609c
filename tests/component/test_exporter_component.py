"""Exporter shells without daemons: a missing VICI socket / UAPI socket (real OS behaviour: refused),
the HTTP server over real TCP on 127.0.0.1, plan reloads, event-follower backoff with injected sleep."""

from __future__ import annotations

import base64
import socket
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from exporter.app import MetricsApp
from exporter.http import serve
from exporter.service import Exporter, PlanFile
from exporter.sources import StrongswanSource, WireGuardSource, follow_events
from gwkit.vici import ViciSession, ViciUnavailable
from gwplan.model import Child, GatewayRef, Ipsec, Plan, Tunnel, dumps

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
        pytest.param(["--listen", "127.0.0.1:0"], 2, b"nothing-to-watch", id="nothing-to-watch"),
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
