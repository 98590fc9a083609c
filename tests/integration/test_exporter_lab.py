"""The exporter against live daemons in the lab (charon 5.9.8 over VICI, wireguard-go over UAPI).

Acceptance (issue 7): series and values match charon's list-sas and wireguard-go's UAPI tunnel by tunnel;
bytes_total never decreases across CHILD_SA rekeys while traffic flows; a killed charon gives
``strongswan_up 0`` / ``tunnel_up 0`` within the deadline and values return after a restart without
restarting the exporter; no secret in any output. Plans are built from gwplan dataclasses directly.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import Snapshot, SnapshotCollector, families
from exporter.family import Renderer
from exporter.ipsec import CHILD_INFO_LABELS
from exporter.service import Exporter, PlanFile
from exporter.sources import StrongswanSource, WireGuardSource, follow_events
from gwkit.vici import ViciSession
from gwkit.wireguard import uapi
from gwplan.model import Child, GatewayRef, Plan, SecretRef, Tunnel, WgPeer, WireGuard, dumps
from gwplan.model import Ipsec as PlanIpsec
from lab import ports
from lab.peers import wireguard_pair
from lab.wait import wait_for_async
from lab.world import SERVICE_CIDR, Host, Lab
from tests.integration.test_exporter_support import PSK, load_pair

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

GW_REF = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw1")


def registry(snap: Snapshot) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap))
    return reg


def value(snap: Snapshot, name: str, **labels: str) -> float | None:
    return registry(snap).get_sample_value(name, labels)


def ipsec_plan(tunnels: dict[str, dict[str, str]]) -> Plan:
    return Plan(
        gateway=GW_REF,
        type="ipsec",
        ipsec=PlanIpsec(
            tunnels=tuple(
                Tunnel(name, True, tuple(Child(c, s) for c, s in kids.items()), {name: {}})
                for name, kids in tunnels.items()
            )
        ),
    )


def write_plan(tmp: Path, plan: Plan) -> PlanFile:
    path = tmp / "plan.json"
    path.write_bytes(dumps(plan))
    pf = PlanFile(path)
    pf.load_initial()
    return pf


async def two_sites(lab: Lab) -> tuple[Host, Host, ViciSession, list[ViciSession]]:
    """Tunnel s1 (two children, one per LAN) and s2 (one child) from the gateway charon."""
    s1, s2 = lab.add_site(lans=2), lab.add_site()
    g = lab.start_charon(lab.gw)
    gv = await ViciSession.connect(g.vici_socket)
    sessions = []
    for site, tunnel in ((s1, "s1"), (s2, "s2")):
        c = lab.start_charon(site)
        sv = await ViciSession.connect(c.vici_socket)
        sessions.append(sv)
        kids = {f"{tunnel}-{i}": ([SERVICE_CIDR], [lan]) for i, lan in enumerate(site.lans)}
        await load_pair(
            gv, sv, lab, site, tunnel, "gw", kids, gw_id="gw.lab.example", site_id=f"{tunnel}.lab"
        )
        for child in kids:
            await gv.stream("initiate", {"child": child, "ike": tunnel, "timeout": "10000"}, "control-log")
    return s1, s2, gv, sessions


async def test_series_and_values_match_list_sas_tunnel_by_tunnel(lab: Lab, tmp_path: Path) -> None:
    s1, s2, gv, sessions = await two_sites(lab)
    try:
        assert lab.gw.ping(s1.lan_host, src="198.18.0.1", count=3, wait=0.5)
        assert lab.gw.ping(s2.lan_host, src="198.18.0.1", count=5, wait=0.5)
        plan = ipsec_plan(
            {
                "s1": {"s1-0": s1.lans[0], "s1-1": s1.lans[1]},
                "s2": {"s2-0": s2.lans[0]},
                "s9": {"s9-0": "192.0.2.128/28"},  # configured, never up
            }
        )
        assert lab.gw.charon is not None
        exporter = Exporter(
            strongswan=StrongswanSource(lab.gw.charon.vici_socket), plan=write_plan(tmp_path, plan)
        )
        snap = await exporter.snapshot()
        raw, _ = await gv.stream("list-sas", {}, "list-sa")
        now = time.time()
    finally:
        await gv.aclose()
        for s in sessions:
            await s.aclose()

    assert value(snap, "strongswan_up") == 1
    by_name = {name: sa for event in raw for name, sa in event.items()}
    assert set(by_name) == {"s1", "s2"}
    for tunnel, sa in by_name.items():
        kids = list(sa["child-sas"].values())
        for direction in ("in", "out"):
            want_bytes = sum(int(c[f"bytes-{direction}"]) for c in kids)
            want_packets = sum(int(c[f"packets-{direction}"]) for c in kids)
            assert (
                value(snap, "strongswan_tunnel_bytes_total", tunnel=tunnel, direction=direction) == want_bytes
            )
            assert (
                value(snap, "strongswan_tunnel_packets_total", tunnel=tunnel, direction=direction)
                == want_packets
            )
        assert value(snap, "strongswan_tunnel_up", tunnel=tunnel) == 1
        assert value(snap, "strongswan_tunnel_children_installed", tunnel=tunnel) == len(kids)
        est = value(snap, "strongswan_tunnel_established_timestamp_seconds", tunnel=tunnel)
        assert est is not None and abs(est - (now - int(sa["established"]))) <= 2
        rekey = value(snap, "strongswan_tunnel_rekey_timestamp_seconds", tunnel=tunnel)
        soonest = min(int(c["rekey-time"]) for c in kids)
        assert rekey is not None and abs(rekey - (now + soonest)) <= 2
        for c in kids:
            child_bytes = value(
                snap,
                "strongswan_child_bytes_total",
                tunnel=tunnel,
                child=c["name"],
                subnet=c["remote-ts"][0],
                direction="in",
            )
            assert child_bytes == int(c["bytes-in"])
            info = value(
                snap,
                "strongswan_child_sa_info",
                tunnel=tunnel,
                child=c["name"],
                subnet=c["remote-ts"][0],
                uniqueid=c["uniqueid"],
                reqid=c["reqid"],
                state="INSTALLED",
                mode="TUNNEL",
                protocol="ESP",
                encr_alg=c["encr-alg"],
                encr_keysize=c.get("encr-keysize", ""),
                integ_alg=c.get("integ-alg", ""),
                dh_group=c.get("dh-group", ""),
                local_ts=SERVICE_CIDR,
                remote_ts=c["remote-ts"][0],
            )
            assert info == 1
    assert value(snap, "strongswan_tunnel_bytes_total", tunnel="s2", direction="out") >= 5 * 84  # type: ignore[operator]
    assert value(snap, "strongswan_tunnel_up", tunnel="s9") == 0, "configured but down is a row with 0"
    assert value(snap, "strongswan_child_up", tunnel="s9", child="s9-0", subnet="192.0.2.128/28") == 0
    assert value(snap, "strongswan_tunnel_children_configured", tunnel="s1") == 2
    assert value(snap, "strongswan_ike_sas") == 2
    # Unique ids only on _info series: no other sample carries them.
    for fam in registry(snap).collect():
        for sample in fam.samples:
            if not sample.name.endswith("_info"):
                assert not {"uniqueid", "reqid", "local_ts", "remote_ts", "encr_alg"} & set(sample.labels)
    text = Renderer().render(families(snap)).decode()
    assert PSK not in text


async def test_wireguard_series_match_the_uapi_and_use_plan_names(lab: Lab, tmp_path: Path) -> None:
    site = lab.add_site()
    psk_b64 = "q2Yyr7B3xB9v8bQ0hE0oGqQ0gF9rWcN3c1b3ZgYw2Ew="  # test-only preshared key
    keys = wireguard_pair(lab, site, tmp_path, psk=psk_b64)
    absent_key = "x" * 42 + "A="
    plan = Plan(
        gateway=GW_REF,
        type="wireguard",
        wireguard=WireGuard(
            interface="wg0",
            listen_port=51820,
            address="10.99.0.1/24",
            private_key_ref=SecretRef("gw1-wg", "privateKey"),
            peers=(
                WgPeer(name="alice", public_key=keys["s1"][1], allowed_ips=("10.99.0.2/32",)),
                WgPeer(name="bob", public_key=absent_key, allowed_ips=("10.99.0.3/32",)),
            ),
        ),
    )
    wgd = lab.gw.wireguard["wg0"]
    exporter = Exporter(wireguard=WireGuardSource(wgd.uapi_dir), plan=write_plan(tmp_path, plan))
    before = await exporter.snapshot()
    assert before.wireguard is not None
    assert value(before, "wireguard_up", interface="wg0") == 1
    assert (
        value(before, "wireguard_peer_last_handshake_timestamp_seconds", interface="wg0", peer="alice")
        is None
    ), "never handshaked: absent, not 0"
    assert site.ping("10.99.0.1", count=3, wait=1.0)
    snap = await exporter.snapshot()
    raw = await uapi.get(wgd.uapi_socket)
    (peer,) = raw.peers
    assert value(snap, "wireguard_peer_receive_bytes_total", interface="wg0", peer="alice") == peer.rx_bytes
    assert value(snap, "wireguard_peer_transmit_bytes_total", interface="wg0", peer="alice") == peer.tx_bytes
    hs = value(snap, "wireguard_peer_last_handshake_timestamp_seconds", interface="wg0", peer="alice")
    assert peer.last_handshake is not None and hs == peer.last_handshake
    assert abs(hs - time.time()) < 60
    assert (
        value(
            snap,
            "wireguard_peer_info",
            interface="wg0",
            peer="alice",
            public_key=keys["s1"][1],
            endpoint=peer.endpoint or "",
        )
        == 1
    )
    assert value(snap, "wireguard_peers", interface="wg0") == 1
    assert value(snap, "wireguard_peer_present", interface="wg0", peer="alice") == 1
    assert value(snap, "wireguard_peer_present", interface="wg0", peer="bob") == 0, "configured but absent"
    for om in (False, True):
        text = Renderer().render(families(snap), openmetrics=om).decode()
        secrets = [keys["gw"][0], keys["s1"][0], psk_b64]
        secrets += [uapi_hex for uapi_hex in (bytes_hex(k) for k in secrets)]
        assert not [s for s in secrets if s in text], "a private or preshared key leaked into the metrics"
    wgd.kill()  # SIGKILL: the stale socket stays behind (LAB-FACTS)
    t0 = time.monotonic()
    down = await exporter.snapshot()
    assert time.monotonic() - t0 < 2.0
    assert value(down, "wireguard_up", interface="wg0") == 0
    assert value(down, "wireguard_peer_present", interface="wg0", peer="alice") == 0
    wgd.start()  # back, empty (the agent would re-apply the peers): up again, alice now missing
    back = await exporter.snapshot()
    assert value(back, "wireguard_up", interface="wg0") == 1
    assert value(back, "wireguard_peers", interface="wg0") == 0
    assert value(back, "wireguard_peer_present", interface="wg0", peer="alice") == 0


def bytes_hex(b64: str) -> str:
    import base64

    return base64.b64decode(b64).hex()


async def test_bytes_never_decrease_across_child_rekeys_while_traffic_flows(lab: Lab) -> None:
    site = lab.add_site()
    g, c = lab.start_charon(lab.gw), lab.start_charon(site)
    async with await ViciSession.connect(g.vici_socket) as gv, await ViciSession.connect(c.vici_socket) as sv:
        await load_pair(gv, sv, lab, site, "s1", "gw", {"s1-0": ([SERVICE_CIDR], site.lans)}, rekey_time=6)
        await gv.stream("initiate", {"child": "s1-0", "timeout": "10000"}, "control-log")
        source = StrongswanSource(g.vici_socket)
        exporter = Exporter(strongswan=source)
        ping = await anyio.open_process(
            lab.gw.argv("ping", "-n", "-q", "-i", "0.05", "-s", "200", "-I", "198.18.0.1", site.lan_host),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        totals: list[float] = []
        uids: set[str] = set()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow_events, g.vici_socket, source)
                # A sampling window, not a wait: 30 s of scrapes across the child rekeys, every one checked
                # (allowed in tests/unit/test_no_polling_loops_in_tests.py).
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    snap = await exporter.snapshot()
                    assert snap.strongswan is not None and snap.strongswan.up
                    totals.append(
                        value(snap, "strongswan_tunnel_bytes_total", tunnel="s1", direction="out") or 0
                    )
                    uids |= {
                        i.values[CHILD_INFO_LABELS.index("uniqueid")] for i in snap.strongswan.view.child_info
                    }
                    await anyio.sleep(0.3)
                tg.cancel_scope.cancel()
        finally:
            ping.terminate()
            await ping.wait()
        raw, _ = await gv.stream("list-sas", {}, "list-sa")
    assert len(uids) >= 3, f"premise: the CHILD_SA rekeyed at least twice (uids seen: {uids})"
    drops = [(a, b) for a, b in itertools.pairwise(totals) if b < a]
    assert not drops, f"bytes_total decreased across a rekey: {drops[:3]}"
    live = sum(int(ch["bytes-out"]) for e in raw for sa in e.values() for ch in sa["child-sas"].values())
    assert totals[-1] > live, "the total must include the retired SAs' bytes, not just the live SA's"
    assert totals[-1] > 100 * 228, "about 20 pings/s of 228 bytes for 30 s went out"


async def test_killed_charon_reports_down_within_the_deadline_and_returns_after_restart(lab: Lab) -> None:
    site = lab.add_site()
    g, c = lab.start_charon(lab.gw), lab.start_charon(site)
    kids = {"s1-0": ([SERVICE_CIDR], site.lans)}
    exporter = Exporter(strongswan=StrongswanSource(g.vici_socket), scrape_timeout=3.0)
    async with await ViciSession.connect(g.vici_socket) as gv, await ViciSession.connect(c.vici_socket) as sv:
        await load_pair(gv, sv, lab, site, "s1", "gw", kids)
        await gv.stream("initiate", {"child": "s1-0", "timeout": "10000"}, "control-log")
    up = await exporter.snapshot()
    assert value(up, "strongswan_up") == 1 and value(up, "strongswan_tunnel_up", tunnel="s1") == 1
    started_before = value(up, "strongswan_start_time_seconds")

    g.kill()
    t0 = time.monotonic()
    down = await exporter.snapshot()
    assert time.monotonic() - t0 < 3.0
    assert value(down, "strongswan_up") == 0
    assert value(down, "strongswan_tunnel_up", tunnel="s1") == 0

    # charon's start time wobbles by a second between calls, so only a jump of more than 2 s is a restart
    # (gwkit.vici.queries.settle_start); the wobble and whole seconds can eat up to 2 s of the gap, so
    # restart 3.5 s after the first start (a restarted pod container takes longer than that anyway).
    await anyio.sleep(3.5)
    g.start()
    async with await ViciSession.connect(g.vici_socket) as gv, await ViciSession.connect(c.vici_socket) as sv:
        await load_pair(gv, sv, lab, site, "s1", "gw", kids)
        await gv.stream("initiate", {"child": "s1-0", "timeout": "10000"}, "control-log")

    async def tunnel_up_again() -> Snapshot | None:
        snap = await exporter.snapshot()
        return snap if value(snap, "strongswan_tunnel_up", tunnel="s1") == 1 else None

    again = await wait_for_async(
        tunnel_up_again, 15, "the exporter to show s1 up after the restart", interval=0.2
    )
    assert value(again, "strongswan_up") == 1
    assert (value(again, "strongswan_start_time_seconds") or 0) > (started_before or 0), "restart visible"

    # A hung (SIGSTOPped) charon: the scrape still returns within the deadline. SIGSTOP takes effect when
    # each of charon's threads is next scheduled: a scrape sent at once was once answered (up=1) by a thread
    # not stopped yet, so the scrape waits until every thread is.
    g.pause()
    try:
        assert g.proc is not None
        await wait_for_async(functools.partial(all_stopped, g.proc.pid), 5, "every thread of charon stopped")
        t0 = time.monotonic()
        hung = await exporter.snapshot()
        assert time.monotonic() - t0 < 3.0 + 0.5
        assert value(hung, "strongswan_up") == 0
    finally:
        g.resume()


def all_stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is stopped (state T in /proc/PID/task/*/stat)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in "Tt" for state in states)


async def test_concurrent_scrapes_share_one_daemon_query(lab: Lab) -> None:
    g = lab.start_charon(lab.gw)
    exporter = Exporter(strongswan=StrongswanSource(g.vici_socket))
    await exporter.snapshot()
    assert exporter.queries == 1
    g.pause()  # hold the query in flight while the other scrapes arrive
    results: list[Snapshot] = []

    async def scrape() -> None:
        results.append(await exporter.snapshot())

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(scrape)
            await anyio.sleep(0.3)
            g.resume()
    finally:
        g.resume()
    assert len(results) == 10 and exporter.queries == 2
    assert len({id(r) for r in results}) == 1


def _get(url: str, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})  # noqa: S310
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (http to 127.0.0.1 only)
        return resp.headers["Content-Type"], resp.read().decode()


REPO = Path(__file__).resolve().parents[2]


async def test_command_line_serves_metrics_and_healthz_and_stops_cleanly(lab: Lab, tmp_path: Path) -> None:
    g = lab.start_charon(lab.gw)
    log_path = tmp_path / "exporter.log"
    argv = [
        sys.executable,
        "-m",
        "exporter",
        "--listen",
        "127.0.0.1:0",  # the exporter binds a port and announces it: no port to lose to another process
        "--vici-socket",
        str(g.vici_socket),
    ]
    with log_path.open("wb") as log_file:
        proc = await anyio.open_process(argv, stdout=log_file, stderr=log_file, cwd=REPO)
    try:
        port = await anyio.to_thread.run_sync(
            lambda: ports.wait_announced_port(
                lambda: log_path.read_text(errors="replace"),
                "exporter.http.listening",
                alive=lambda: proc.returncode is None,
                timeout=10,
                what="the exporter",
            )
        )
        ctype, body = await wait_for_async(
            lambda: anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/healthz"),
            10,
            "the exporter's /healthz to answer",
            interval=0.1,
            ignoring=(OSError,),
        )
        assert body == "ok\n"
        ctype, body = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
        assert ctype.startswith("text/plain; version=0.0.4")
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        assert fams["strongswan_up"].samples[0].value == 1
        prom_accept = (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )
        ctype, body = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics", prom_accept)
        assert ctype.startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith("# EOF\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            await proc.wait()
    logs = log_path.read_text()
    assert proc.returncode == 0, logs
    assert "exporter.http.listening" in logs and "exporter.stopped" in logs
    # A missing or invalid --plan is waited for (not ready), not an exit 2: see
    # test_command_line_waits_for_a_missing_plan_not_ready_then_serves_it (tests/component).


async def test_the_start_time_is_steady_across_charons_one_second_wobble(lab: Lab) -> None:
    """charon's ``since`` flips between two seconds from call to call; the start time must not follow it
    (a false "charon restarted" alert)."""
    _s1, _s2, gv, sessions = await two_sites(lab)
    try:
        assert lab.gw.charon is not None
        exporter = Exporter(strongswan=StrongswanSource(lab.gw.charon.vici_socket))
        starts: set[float | None] = set()
        sinces: set[str] = set()
        # How long charon shows the minority second depends on this boot's offset between its wall and
        # monotonic clocks: sample until both values were seen (a second-long window at the worst). A
        # sampling window, not a wait for lab.wait: every scrape's start time is kept and checked, and not
        # seeing the wobble in 10 s is a skip, not a failure.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and len(sinces) < 2:
            starts.add(value(await exporter.snapshot(), "strongswan_start_time_seconds"))
            for _ in range(5):
                sinces.add((await gv.call("stats"))["uptime"]["since"])
        if len(sinces) < 2:
            pytest.skip(f"charon's start time did not wobble on this boot in 10 s ({sinces}); "
                        "tests/unit/test_vici_start_time.py covers the settling rule")  # fmt: skip
        for _ in range(50):  # scrapes across both values of since
            starts.add(value(await exporter.snapshot(), "strongswan_start_time_seconds"))
        assert None not in starts and len(starts) == 1, f"start time must not follow the wobble: {starts}"
    finally:
        await gv.aclose()
        for sv in sessions:
            await sv.aclose()


async def test_bytes_total_is_the_live_sas_bytes_at_every_scrape(lab: Lab) -> None:
    """Without a rekey, a tunnel's bytes_total is its live CHILD_SAs' bytes at every scrape: nothing counted
    twice (the SA keys behind it must not follow charon's wobbling ``since`` either, whether or not it
    wobbles on this boot)."""
    s1, _s2, gv, sessions = await two_sites(lab)
    try:
        assert lab.gw.charon is not None
        exporter = Exporter(strongswan=StrongswanSource(lab.gw.charon.vici_socket))
        assert lab.gw.ping(s1.lan_host, src="198.18.0.1", count=4, wait=0.5)

        async def live() -> int:
            raw, _ = await gv.stream("list-sas", {"ike": "s1"}, "list-sa")
            return sum(
                int(ch["bytes-out"]) for e in raw for sa in e.values() for ch in sa["child-sas"].values()
            )

        before = await live()
        totals: list[float | None] = []
        sinces: set[str] = set()
        # At least 50 scrapes, and on a boot where charon's since wobbles, scrapes across both of its values.
        deadline = time.monotonic() + 10.0
        while len(totals) < 50 or (len(sinces) < 2 and time.monotonic() < deadline):
            snap = await exporter.snapshot()
            totals.append(value(snap, "strongswan_tunnel_bytes_total", tunnel="s1", direction="out"))
            sinces.add((await gv.call("stats"))["uptime"]["since"])
        assert await live() == before, "no traffic meanwhile"
        assert before >= 4 * 84, "the pings went through the tunnel"
        assert set(totals) == {before}, f"bytes_total against the live SAs' {before}: {set(totals)}"
    finally:
        await gv.aclose()
        for sv in sessions:
            await sv.aclose()
