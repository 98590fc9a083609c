"""The exporter's read-only access against live daemons in the lab (docs/exporter.md, "Privileges").

IPsec, through the status-agent's VICI relay (agent.ipsec.relay) in front of a live charon 5.9.8:
(a) the exporter's scrape has the same metrics as through charon's control socket, and its rekey/down
    event session works through the relay;
(b) control commands sent through the relay are refused and charon's state does not change; the same
    command on the control socket does change it (so each case can fail);
and charon itself answers an unknown command or event exactly as the relay answers a refused one.

WireGuard, through the read-only UAPI socket (agent.wireguard.readonly) in front of live wireguard-go:
(c) the exporter as an unprivileged process (uid/gid 65532, no capabilities, empty bounding set,
    no_new_privs, as the pod runs it) produces the same metrics as the exporter reading wireguard-go
    directly (as root), while it cannot open wireguard-go's own socket (0700 root); set=1 through the
    read-only socket is refused and changes nothing; neither the private key nor the preshared key
    crosses it.
The servers run in this (root) test process, reading the daemons as the agent does.
"""

from __future__ import annotations

import base64
import functools
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.ipsec import relay
from agent.wireguard import readonly as uapi_server
from exporter.collector import Snapshot, families
from exporter.family import Renderer
from exporter.service import Exporter, PlanFile
from exporter.sources import StrongswanSource, WireGuardSource, follow_events
from gwkit.vici import ViciCommandFailed, ViciSession, wire
from gwkit.vici import readonly as vici_readonly
from gwkit.vici.queries import DaemonInfo
from gwkit.wireguard import uapi
from gwplan.model import GatewayRef, Plan, SecretRef, WgPeer, WireGuard, dumps
from lab import ports
from lab.peers import wireguard_pair
from lab.wait import WaitTimeout, wait_for, wait_for_async
from lab.world import SERVICE_CIDR, Host, Lab
from tests.integration.test_exporter_lab import ipsec_plan, registry, two_sites, write_plan
from tests.integration.test_exporter_support import conn, load_pair

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

# --- IPsec: the VICI relay ------------------------------------------------------------------------------


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
BUSY = ("strongswan_workers_idle", "strongswan_jobs_queued", "strongswan_jobs_scheduled")
"""charon's threads and job queues at the moment of ``stats``: a scrape's own work moves them."""


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

            registered = anyio.Event()

            class Announcing(ViciSession):
                """The follower's session, saying when charon (through the relay) confirmed its
                registrations: the terminate below is sent after that, so its events cannot be missed."""

                def listen(
                    self, events: Sequence[str], *, on_registered: Callable[[], None] | None = None
                ) -> AsyncGenerator[wire.Frame, None]:
                    return super().listen(events, on_registered=registered.set)

            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(follow_events, ro, Sink(), connect=Announcing.connect))
                await wait_for_async(registered.is_set, 10, "the follower's registrations confirmed")
                await gv.stream("terminate", {"ike": "s2", "timeout": "5000"}, "control-log")
                # Both events, in whichever order charon sends them (waiting for ike-updown alone and then
                # asserting child-updown failed when child-updown came second).
                await wait_for_async(
                    lambda: {"ike-updown", "child-updown"} <= set(events), 10, "both updown events"
                )
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
        elif k[0] not in BUSY:
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
    # Charon writes the line a moment after the session: waited for, returning as soon as the file is
    # there; a second without it is "not logging" (the state before the reload, or after a refused one).
    try:
        return await wait_for_async(probe_log(gw).exists, 1.0, f"charon to write {probe_log(gw)}")
    except WaitTimeout:
        return False


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
        await anyio.sleep(1.0)  # the scenario: an initiate or terminate would have done its work by now
        assert await case.state(gw) == before, f"{case.command} through the relay changed charon's state"
        assert (await ro.call("version"))["daemon"] == "charon", "the session goes on after a refusal"

        # The same command on the control socket does change it: the check above can fail.
        if case.command in ("initiate", "terminate"):
            await gv.stream(case.command, case.args(gw), "control-log", timeout=15)
        else:
            await gv.call(case.command, case.args(gw), timeout=15)

        async def changed() -> bool:
            return await case.state(gw) != before

        await wait_for_async(changed, 5, f"{case.command} on the control socket to change charon's state")


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
    assert from_charon == vici_readonly.EVENT_UNKNOWN_REPLY


# --- WireGuard: the read-only UAPI socket, the exporter unprivileged ---------------------------------

UID = 65532
REPO = Path(__file__).resolve().parents[2]
PSK = "q2Yyr7B3xB9v8bQ0hE0oGqQ0gF9rWcN3c1b3ZgYw2Ew="  # test-only preshared key
UNPRIVILEGED = [
    "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
    "--no-new-privs",
]  # fmt: skip
"""What the pod's securityContext gives the exporter: runAsUser/Group 65532, capabilities drop ALL,
allowPrivilegeEscalation false."""
DEBIAN_PYTHON = "/usr/bin/python3"
"""The venv's interpreter lives under /root (0700): the unprivileged process runs Debian's python3 with
the project and the venv's packages on PYTHONPATH, as the lab kubelet runs a container."""


def env() -> dict[str, str]:
    import sysconfig

    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/nonexistent",
    }


def as_exporter_user(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*UNPRIVILEGED, DEBIAN_PYTHON, "-c", code, *args], capture_output=True, text=True, env=env(), cwd="/",
        timeout=30, check=False,
    )  # fmt: skip


EXCHANGE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("ERR", exc.errno, exc.strerror)
    raise SystemExit(0)
s.sendall(sys.argv[2].encode().decode("unicode_escape").encode())
out = b""
while not out.endswith(b"\\n\\n"):
    d = s.recv(65536)
    if not d:
        break
    out += d
sys.stdout.write(out.decode())
"""


@pytest.fixture
def ro_dir() -> Iterator[Path]:
    """The read-only directory: under /tmp (pytest's tmp_path is under a 0700 directory), 0755."""
    d = Path(tempfile.mkdtemp(prefix="vpngw-ro-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name != "wireguard_scrape_duration_seconds"
    }


async def test_the_unprivileged_exporter_reads_every_peer_metric_through_the_agents_socket_only(
    lab: Lab, tmp_path: Path, ro_dir: Path
) -> None:
    site = lab.add_site()
    keys = wireguard_pair(lab, site, tmp_path, psk=PSK)
    wgd = lab.gw.wireguard["wg0"]
    assert site.ping("10.99.0.1", count=3, wait=1.0), "premise: a handshake and traffic"
    plan = Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw1"),
        type="wireguard",
        wireguard=WireGuard(
            interface="wg0", listen_port=51820, address="10.99.0.1/24",
            private_key_ref=SecretRef("gw1-wg", "privateKey"),
            peers=(WgPeer(name="alice", public_key=keys[site.role][1], allowed_ips=("10.99.0.2/32",)),
                   WgPeer(name="bob", public_key="x" * 42 + "A=", allowed_ips=("10.99.0.3/32",))),
        ),
    )  # fmt: skip
    (ro_dir / "plan.json").write_bytes(dumps(plan))
    (ro_dir / "plan.json").chmod(0o644)
    secrets = [keys["gw"][0], keys[site.role][0], PSK]
    secrets += [base64.b64decode(k).hex() for k in secrets]
    log = tmp_path / "exporter.log"
    async with anyio.create_task_group() as tg:
        tg.start_soon(uapi_server.serve_interface, ro_dir, "wg0", uapi_server.opener(wgd.uapi_dir))
        await wait_for_async(
            lambda: (ro_dir / "wg0.sock").exists(), 10, "the listener (started in a task)", 0.01
        )
        assert (ro_dir / "wg0.sock").stat().st_mode & 0o777 == 0o666
        argv = [
            *UNPRIVILEGED, DEBIAN_PYTHON, "-m", "exporter", "--listen", "127.0.0.1:0",
            "--wireguard-interface", "wg0", "--wireguard-uapi-dir", str(ro_dir),
            "--plan", str(ro_dir / "plan.json"),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = await anyio.open_process(argv, stdout=out, stderr=out, env=env(), cwd="/")
        try:
            port = await anyio.to_thread.run_sync(
                lambda: ports.wait_announced_port(
                    lambda: log.read_text(errors="replace"), "exporter.http.listening",
                    alive=lambda: proc.returncode is None, timeout=20, what="the unprivileged exporter",
                )
            )  # fmt: skip
            body = await anyio.to_thread.run_sync(wait_scrape, port, proc.pid)
            st = status(proc.pid)
            assert st["Uid"].split() == [str(UID)] * 4 and st["Gid"].split() == [str(UID)] * 4
            assert int(st["CapEff"], 16) == int(st["CapPrm"], 16) == int(st["CapBnd"], 16) == 0
            assert st["NoNewPrivs"] == "1"

            direct = Exporter(
                wireguard=WireGuardSource(wgd.uapi_dir), plan=plan_file(tmp_path, plan)
            )  # root, wireguard-go's own socket
            want = Renderer().render(families(await direct.snapshot())).decode()

            # The same user, by hand: wireguard-go's socket is closed to it; the read-only one answers
            # get without keys and refuses set.
            own = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(wgd.uapi_socket), "get=1\\n\\n"
            )
            got_ro = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(ro_dir / "wg0.sock"), "get=1\\n\\n"
            )
            before = await uapi.get(wgd.uapi_socket)
            peer_hex = base64.b64decode(keys[site.role][1]).hex()
            set_reply = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(ro_dir / "wg0.sock"),
                f"set=1\\nlisten_port=1\\npublic_key={peer_hex}\\nremove=true\\n\\n",
            )  # fmt: skip
            after = await uapi.get(wgd.uapi_socket)
        finally:
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                await proc.wait()
            tg.cancel_scope.cancel()

    assert own.stdout.startswith("ERR 13 Permission denied"), own.stdout + own.stderr
    assert got_ro.stdout.endswith("errno=0\n\n") and f"public_key={peer_hex}" in got_ro.stdout
    assert set_reply.stdout == "errno=1\n\n", set_reply.stdout + set_reply.stderr
    assert after == before and after.listen_port == 51820 and len(after.peers) == 1, "set reached nothing"
    for secret in secrets:
        assert secret not in got_ro.stdout, "a key crossed the read-only socket"
        assert secret not in body, "a key reached the metrics"

    a, b = series(body), series(want)
    # The process's own /metrics adds who it is (vpngw_build_info); the rest is the rendered snapshot.
    build = {k: v for k, v in a.items() if k[0] == "vpngw_build_info"}
    assert [dict(labels)["program"] for _, labels in build] == ["exporter"] and set(build.values()) == {1}
    a = {k: v for k, v in a.items() if k not in build}
    # And the HA role its agent copied beside the plan: active (0), the agent runs without ha.
    assert a.pop(("vpngw_ha_standby", ()), None) == 0, "the role the agent copied for the exporter"
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    assert a == b, "every metric, value for value"
    alice = (("interface", "wg0"), ("peer", "alice"))
    assert a[("wireguard_up", (("interface", "wg0"),))] == 1
    assert a[("wireguard_peer_receive_bytes_total", alice)] == before.peers[0].rx_bytes > 0
    assert a[("wireguard_peer_last_handshake_timestamp_seconds", alice)] == before.peers[0].last_handshake
    assert a[("wireguard_peer_present", (("interface", "wg0"), ("peer", "bob")))] == 0
    assert proc.returncode == 0, log.read_text()


def plan_file(tmp: Path, plan: Plan) -> PlanFile:
    path = tmp / "direct-plan.json"
    path.write_bytes(dumps(plan))
    pf = PlanFile(path)
    pf.load_initial()
    return pf


def wait_scrape(port: int, pid: int) -> str:
    def served() -> str | None:
        assert Path(f"/proc/{pid}").exists(), "the unprivileged exporter exited"
        body = scrape(port)
        return body if re.search(r'^wireguard_up\{interface="wg0"\} 1', body, re.M) else None

    return wait_for(served, 20, "the unprivileged exporter to serve wireguard_up 1", 0.1, ignoring=(OSError,))
