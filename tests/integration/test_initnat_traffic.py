"""init-nat's acceptance with real traffic: remote sites whose packets arrive through live IPsec tunnels
(two charon daemons per site pair, driven over VICI), the gateway pod's netfilter and policy routing, and
TCP services behind NIC2. Everything is real: charon (kernel-libipsec), iptables, conntrack, netlink.

The gateway runs in ``pod_lab``: its default route leaves through eth0 (the cluster), its NIC2 is named
``ens7``. init-nat runs as a real ``python -m initnat --watch`` process inside the gateway namespace; the
plan file is changed by atomic rename.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from pyroute2 import IPRoute

from gwkit.vici import ViciSession
from gwplan import (
    Exposure,
    GatewayRef,
    Grant,
    Nat,
    Nic,
    Plan,
    Port,
    ReverseExposure,
    SecretRef,
    WireGuard,
    dumps,
)
from initnat.__main__ import Gateway
from initnat.conntrack import ConntrackError
from initnat.iptables import Completed, Iptables, run_process
from lab import netns
from lab.peers import psk_conn, wireguard_pair
from lab.wait import wait_for
from lab.world import CLUSTER_GW, CLUSTER_POD, GW_NIC2_ADDR, RTR_NIC2_ADDR, SERVICE_CIDR, SVC_ADDR, Host, Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

PSK = "initnat-lab-psk-7c1d"  # test-only value
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
API_ADDR = "192.0.2.100"  # a second fabric service, a /32 on svc's lo
FABRIC_CLIENT = "192.0.2.70"  # a fabric host (in svc's subnet, behind the router) that is no target
WEB_VIP, API_VIP = "198.18.0.10", "198.18.0.11"
MASK = 0x0FFF0000
GRANT_S1_WEB, GRANT_S2_WEB, GRANT_S1_API = 0x00010000, 0x00020000, 0x00030000

ECHO_SERVER = """
import socket, sys, threading
def serve(c):
    with c:
        while data := c.recv(4096):
            c.sendall(data)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); print("listening", flush=True)
while True:
    c, peer = s.accept(); print("from", peer[0], flush=True)
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# A long-lived connection: one echo every 0.1 s; prints "ok <t>" per echo, "cut <t> <why>" when an echo
# does not come back within 0.5 s (packets dropped) or the connection breaks, then exits.
LONG_CLIENT = """
import socket, sys, time
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(); s.bind((src, 0)); s.settimeout(3); s.connect((dst, port)); s.settimeout(0.5)
print("connected", s.getsockname()[1], flush=True)
while True:
    try:
        s.sendall(b"x\\n")
        if s.recv(16) != b"x\\n":
            raise OSError("bad echo")
    except OSError as e:
        print("cut", time.time(), type(e).__name__, flush=True); sys.exit(1)
    print("ok", time.time(), flush=True); time.sleep(0.1)
"""

ONE_SHOT = """
import socket, sys
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(); s.bind((src, 0)); s.settimeout(1.5)
try:
    s.connect((dst, port)); s.sendall(b"hi\\n"); ok = s.recv(16) == b"hi\\n"
except OSError:
    ok = False
sys.exit(0 if ok else 1)
"""


def conn(
    name: str, local: str, remote: str, lid: str, rid: str, lts: list[str], rts: list[str]
) -> dict[str, Any]:
    return psk_conn(name, local_addr=local, remote_addr=remote, local_id=lid, remote_id=rid,
                    children={f"{name}-0": (lts, rts)})  # fmt: skip


def plan(
    lab: Lab,
    grants: tuple[Grant, ...],
    reverse: tuple[ReverseExposure, ...] = (),
    internal: tuple[str, ...] = (),
) -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant", "gw"),
        type="ipsec",
        nic=Nic(mac=lab.nic2_mac, gateway=RTR_NIC2_ADDR),
        nat=Nat(
            service_cidr=SERVICE_CIDR,
            source_address="198.18.0.1",
            internal_source_cidrs=internal,
            exposures=(
                Exposure("web", WEB_VIP, (Port(8080),), target_address=SVC_ADDR),
                Exposure("api", API_VIP, (Port(9090),), target_address=API_ADDR),
            ),
            reverse_exposures=reverse,
            grants=grants,
            mark_mask=MASK,
        ),
    )


def write_plan(path: Path, p: Plan) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(dumps(p))
    os.replace(tmp, path)  # atomic rename, as a ConfigMap update lands


class Procs:
    """Processes this test starts inside the lab's namespaces; all stopped in teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, host: Host, *argv: str, name: str) -> subprocess.Popen[str]:
        out = open(self.tmp / f"{name}.out", "w")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            host.argv(*argv), stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_env()
        )
        out.close()
        self.procs.append(p)
        return p

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text()

    def says(self, name: str, text: str, times: int = 1) -> Callable[[], bool]:
        """A condition for ``wait_for``: ``name``'s output holds ``text`` at least ``times`` times."""
        return lambda: self.output(name).count(text) >= times

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def one_shot(host: Host, src: str, dst: str, port: int, script: Path) -> bool:
    return host.run(PY, str(script), src, dst, str(port), check=False, timeout=10).returncode == 0


def our_rules_with_counters(lab: Lab) -> list[tuple[int, str]]:
    """(packets, rule) of every line of ours in ``iptables-save -c`` (a rewrite resets the counters)."""
    save = lab.gw.run("iptables-save", "-c").stdout.decode()
    out = []
    for line in save.splitlines():
        if line.startswith("[") and "VPNGW" in line:
            counters, rule = line.split("] ", 1)
            out.append((int(counters.lstrip("[").split(":")[0]), rule))
    return out


def conntrack_entries(lab: Lab) -> list[str]:
    """Every conntrack entry's id and tuples (a deleted-and-recreated entry gets a new id)."""
    out = lab.gw.run("conntrack", "-L", "-o", "id").stdout.decode()
    keep = ("src=", "dst=", "sport=", "dport=", "mark=", "id=")
    return sorted(" ".join(t for t in line.split() if t.startswith(keep)) for line in out.splitlines())


def granted(entry: str) -> bool:
    """A conntrack entry (conntrack_entries) with a grant's mark (within MASK; the reply bit is outside:
    IKE's and ESP's entries came in on NIC2 and carry it, and come and go with their timeouts)."""
    return any(int(t[5:]) & MASK for t in entry.split() if t.startswith("mark="))


def marked(lab: Lab, mark: int, *state: str) -> int:
    """Conntrack entries carrying ``mark`` (only TCP ones in ``state`` when given)."""
    filters = ["-p", "tcp", "--state", ",".join(state)] if state else []
    out = lab.gw.run("conntrack", "-L", "-m", f"{mark:#x}/{MASK:#x}", *filters, check=False).stdout.decode()
    return sum(1 for line in out.splitlines() if line.strip())


async def tunnels_up(lab: Lab, sites: list[Host]) -> list[str]:
    """charon in the gateway and each site, hand-written conns (local_ts serviceCIDR, remote_ts the site's
    LAN), initiated by the sites; returns the gateway's ESTABLISHED IKE_SAs."""
    charon_gw = lab.start_charon(lab.gw)
    async with await ViciSession.connect(charon_gw.vici_socket) as gv:
        for site in sites:
            sc = lab.start_charon(site)
            sid, gid = f"{site.role}.lab.example", "gw.lab.example"
            await gv.call("load-shared", {"id": site.role, "type": "IKE", "data": PSK, "owners": [gid, sid]})
            await gv.call(
                "load-conn",
                conn(site.role, GW_NIC2_ADDR, site.addresses[0], gid, sid, [SERVICE_CIDR], site.lans),
            )
            async with await ViciSession.connect(sc.vici_socket) as sv:
                await sv.call("load-shared", {"id": "gw", "type": "IKE", "data": PSK, "owners": [sid, gid]})
                await sv.call(
                    "load-conn",
                    conn("gw", site.addresses[0], GW_NIC2_ADDR, sid, gid, site.lans, [SERVICE_CIDR]),
                )
                await sv.stream("initiate", {"child": "gw-0", "timeout": "8000"}, "control-log")
        sas, _ = await gv.stream("list-sas", {}, "list-sa")
    return sorted(name for sa in sas for name, ike in sa.items() if ike["state"] == "ESTABLISHED")


async def test_grants_admit_revocation_cuts_only_its_flows_and_reapply_changes_nothing(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    lab = pod_lab
    s1, s2 = lab.add_site(), lab.add_site()
    netns.addr(lab.svc.ns, "lo", f"{API_ADDR}/32")
    netns.route(lab.rtr.ns, f"{API_ADDR}/32", "via", SVC_ADDR)
    for name, body in (("echo", ECHO_SERVER), ("long", LONG_CLIENT), ("once", ONE_SHOT)):
        (tmp_path / f"{name}.py").write_text(body)
    once = tmp_path / "once.py"
    for addr, port in ((SVC_ADDR, 8080), (API_ADDR, 9090)):
        procs.start(lab.svc, PY, str(tmp_path / "echo.py"), addr, str(port), name=f"echo{port}")
        wait_for(procs.says(f"echo{port}", "listening"), 10, f"echo server :{port}")

    v1 = plan(
        lab,
        (
            Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),
            Grant("s2", "web", "exposure", (s2.lans[0],), GRANT_S2_WEB),
            Grant("s1", "api", "exposure", (s1.lans[0],), GRANT_S1_API),
        ),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, v1)
    route_get = ("ip", "route", "get", s1.addresses[0], "from", GW_NIC2_ADDR)
    assert "dev eth0" in lab.gw.run(*route_get).stdout.decode(), "a pod: replies would leave via eth0"
    initnat = procs.start(lab.gw, PY, "-m", "initnat", "--plan", str(plan_file), "--watch", name="initnat")
    wait_for(lambda: "initnat.applied" in procs.output("initnat"), 15, "init-nat's first apply")
    assert "nic=ens7" in procs.output("initnat"), "NIC2 must be found by MAC, whatever its name"
    assert "dev ens7" in lab.gw.run(*route_get).stdout.decode(), "replies to NIC2 traffic leave via NIC2"

    # Live tunnels, initiated by the sites: the gateway's IKE replies leave through NIC2 only because
    # of init-nat's source-policy routing (the pod's default route points at eth0).
    assert await tunnels_up(lab, [s1, s2]) == ["s1", "s2"]

    s1_ip, s2_ip = s1.lan_host, s2.lan_host
    # Granted clients reach the targets through the virtual IPs; an ungranted one does not.
    assert one_shot(s1, s1_ip, WEB_VIP, 8080, once), "s1 is granted web"
    assert one_shot(s1, s1_ip, API_VIP, 9090, once), "s1 is granted api"
    assert one_shot(s2, s2_ip, WEB_VIP, 8080, once), "s2 is granted web"
    drops = [n for n, r in our_rules_with_counters(lab) if f"--ctorigdst {API_VIP} " in r and "DROP" in r]
    assert not one_shot(s2, s2_ip, API_VIP, 9090, once), "s2 is NOT granted api"
    after = [n for n, r in our_rules_with_counters(lab) if f"--ctorigdst {API_VIP} " in r and "DROP" in r]
    assert after[0] > drops[0], "s2's SYNs reached the gateway and our authorisation dropped them"
    assert not one_shot(s1, s1_ip, WEB_VIP, 8081, once), "a port the exposure does not list is dropped"

    # Three long-lived connections: one under grant s1/web, two under grant s2/web.
    clients = {
        "c1": procs.start(s1, PY, str(tmp_path / "long.py"), s1_ip, WEB_VIP, "8080", name="c1"),
        "c2": procs.start(s2, PY, str(tmp_path / "long.py"), s2_ip, WEB_VIP, "8080", name="c2"),
        "c3": procs.start(s2, PY, str(tmp_path / "long.py"), s2_ip, WEB_VIP, "8080", name="c3"),
    }
    for name in clients:
        wait_for(procs.says(name, "ok ", 3), 10, f"{name} echoing")
    assert marked(lab, GRANT_S1_WEB, "ESTABLISHED") == 1 and marked(lab, GRANT_S2_WEB, "ESTABLISHED") == 2, (
        "each flow carries its grant's mark"
    )

    # Re-applying the same plan changes nothing: a one-shot run reports no change, and our chains
    # (with their packet counters: a rewrite would reset them), rules, routes and conntrack are as before.
    rules_before, cts_before = our_rules_with_counters(lab), conntrack_entries(lab)
    routing_before = [lab.gw.run("ip", *a).stdout for a in (["rule"], ["route", "show", "table", "100"])]
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()
    assert "changed=False routing_changed=False revoked_marks=-" in res.stderr.decode()
    rules_after = our_rules_with_counters(lab)
    assert [r for _, r in rules_before] == [r for _, r in rules_after]
    assert all(a >= b for (b, _), (a, _) in zip(rules_before, rules_after, strict=True)), "counters reset"
    assert routing_before == [
        lab.gw.run("ip", *a).stdout for a in (["rule"], ["route", "show", "table", "100"])
    ]
    assert [e for e in cts_before if granted(e)] == [e for e in conntrack_entries(lab) if granted(e)], (
        "the marked flows' conntrack entries are untouched"
    )

    # Revoke s1/web: its connection is cut within 2 s of the plan change; s2's two keep working.
    v2 = plan(lab, tuple(g for g in v1.nat.grants if g.mark != GRANT_S1_WEB))
    changed_at = time.time()
    write_plan(plan_file, v2)
    wait_for(lambda: clients["c1"].poll() is not None, 10, "c1 to be cut")
    last_ok = max(
        float(line.split()[1]) for line in procs.output("c1").splitlines() if line.startswith("ok ")
    )
    cut = next(line for line in procs.output("c1").splitlines() if line.startswith("cut "))
    assert last_ok - changed_at < 2.0, (
        f"c1 still echoed {last_ok - changed_at:.2f} s after the change ({cut})"
    )
    oks = {n: procs.output(n).count("ok ") for n in ("c2", "c3")}
    await anyio.sleep(1.5)
    for n in ("c2", "c3"):
        assert clients[n].poll() is None, f"{n} (grant s2/web) was cut: {procs.output(n)[-200:]}"
        assert procs.output(n).count("ok ") >= oks[n] + 5, f"{n} stopped echoing"
    assert marked(lab, GRANT_S1_WEB) == 0, "the revoked grant's conntrack entries are gone"
    assert marked(lab, GRANT_S2_WEB, "ESTABLISHED") == 2
    assert f"revoked_marks={GRANT_S1_WEB:#x}" in procs.output("initnat")
    assert not one_shot(s1, s1_ip, WEB_VIP, 8080, once), "s1 can no longer open connections to web"
    assert one_shot(s1, s1_ip, API_VIP, 9090, once), "s1's other grant is untouched"
    assert initnat.poll() is None, "the watcher keeps running"
    assert PSK not in procs.output("initnat")


async def test_reverse_exposure_admits_only_internal_sources_snated_into_the_tunnel(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """A cluster client (an internalSourceCIDR, behind the pod's eth0) reaches a service in the remote
    site's LAN through a reverse exposure's virtual IP; its packets are SNATed to the gateway's
    serviceCIDR address, which is what lets them match the tunnel's traffic selector. A fabric host
    outside internalSourceCIDRs is dropped."""
    lab = pod_lab
    s1 = lab.add_site()
    cluster = lab.hosts["cl"]
    netns.route(cluster.ns, SERVICE_CIDR, "via", CLUSTER_POD)
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    (tmp_path / "once.py").write_text(ONE_SHOT)
    procs.start(s1, PY, str(tmp_path / "echo.py"), s1.lan_host, "7070", name="echo7070")
    wait_for(lambda: "listening" in procs.output("echo7070"), 10, "the site's echo server")
    rvip, mark = "198.18.0.20", 0x00040000
    p = plan(
        lab,
        (Grant("s1", "db", "reverse", ("10.244.0.0/30",), mark),),
        reverse=(ReverseExposure("db", rvip, s1.lan_host, (Port(7070),)),),
        internal=("10.244.0.0/30",),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, p)
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()
    assert await tunnels_up(lab, [s1]) == ["s1"]

    assert one_shot(cluster, CLUSTER_GW, rvip, 7070, tmp_path / "once.py"), "an internal source is admitted"
    assert "from 198.18.0.1" in procs.output("echo7070"), "SNATed to nat.sourceAddress (inside serviceCIDR)"
    assert marked(lab, mark) >= 1, "the reverse grant's flow carries its mark"
    drops = [n for n, r in our_rules_with_counters(lab) if f"--ctorigdst {rvip} " in r and "DROP" in r]
    assert not one_shot(lab.svc, SVC_ADDR, rvip, 7070, tmp_path / "once.py"), "not an internalSourceCIDR"
    after = [n for n, r in our_rules_with_counters(lab) if f"--ctorigdst {rvip} " in r and "DROP" in r]
    assert after[0] > drops[0], "refused by our authorisation (the DROP rule counted it), not lost elsewhere"
    assert procs.output("echo7070").count("from ") == 1


def rp_filter_drops(lab: Lab) -> int:
    """The gateway namespace's reverse-path-filter drop counter (TcpExt IPReversePathFilter)."""
    out = lab.gw.run("nstat", "-az", "TcpExtIPReversePathFilter").stdout.decode()
    return int(next(line.split()[1] for line in out.splitlines() if line.startswith("TcpExtIPReverse")))


REPLY_BIT = 0x10000000  # rules.DEFAULT_REPLY_MARK: the plans here leave nic.replyMark unset
FABRIC_MARK, CLUSTER_MARK = 0x00040000, 0x00050000
RVIP = "198.18.0.20"


def reply_flagged(lab: Lab) -> list[str]:
    """Conntrack entries (TCP to the reverse exposure) that carry the reply bit: they came in on NIC2."""
    out = lab.gw.run("conntrack", "-L", "-p", "tcp", "-m", f"{REPLY_BIT:#x}/{REPLY_BIT:#x}", check=False)
    return [line for line in out.stdout.decode().splitlines() if f"dst={RVIP} " in line]


def mangle_counters(lab: Lab, variant: str) -> list[tuple[int, str]]:
    """(packets, rule) of our mangle chain in the variant's ``iptables-save -c``."""
    save = lab.gw.run(f"iptables-{variant}-save", "-c", "-t", "mangle").stdout.decode()
    return [
        (int(c.lstrip("[").split(":")[0]), r)
        for c, r in (line.split("] ", 1) for line in save.splitlines() if line.startswith("["))
        if r.startswith("-A VPNGW-MANGLE ")
    ]


def initnat_once(lab: Lab, plan_file: Path, variant: str) -> str:
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), "--iptables", variant, check=False)
    assert res.returncode == 0, res.stderr.decode()
    return res.stderr.decode()


def reverse_plan(lab: Lab, site: Host, *grants: Grant) -> Plan:
    return plan(
        lab,
        grants,
        reverse=(ReverseExposure("db", RVIP, site.lan_host, (Port(7070),)),),
        internal=("192.0.2.64/26", "10.244.0.0/30"),
    )


@pytest.mark.parametrize("variant", ["legacy", "nft"])
async def test_a_fabric_client_behind_nic2_reaches_a_reverse_exposure_and_is_answered_through_nic2(
    pod_lab: Lab, procs: Procs, tmp_path: Path, variant: str
) -> None:
    """The gap this closes (docs/initnat.md, "Replies through NIC2"): a fabric host that is no exposure
    target reaches a reverse exposure through NIC2 (the cloud routes serviceCIDR to the gateway's port);
    the site answers through the tunnel, and after conntrack undoes the NAT the reply's destination is the
    fabric client, which the pod's main table routes via eth0. The reply bit of the connection (set in
    mangle PREROUTING because it came in on NIC2) routes its replies to NIC2's table instead. A cluster
    client behind eth0 keeps being answered via eth0 (its own namespace has no other way back). Live IPsec
    (charon, kernel-libipsec), the real iptables variant under test, policy routing, conntrack.

    Also: a restart finds the new chain and rules in sync (nothing written), each half of the reply routing
    deleted by hand (a mutant without it) loses the round trip and the next apply repairs it, revoking
    the fabric grant cuts its live connection within 2 s while the cluster's keeps echoing, and what
    init-nat's rp_filter setting is for: strict filtering on NIC2 drops the fabric's SYN before FORWARD."""
    lab = pod_lab
    s1 = lab.add_site()
    cluster = lab.hosts["cl"]
    netns.route(cluster.ns, SERVICE_CIDR, "via", CLUSTER_POD)
    netns.addr(lab.svc.ns, "lo", f"{FABRIC_CLIENT}/32")  # a fabric host that is no exposure target
    for name, body in (("echo", ECHO_SERVER), ("long", LONG_CLIENT), ("once", ONE_SHOT)):
        (tmp_path / f"{name}.py").write_text(body)
    once = tmp_path / "once.py"
    procs.start(s1, PY, str(tmp_path / "echo.py"), s1.lan_host, "7070", name="echo7070")
    wait_for(lambda: "listening" in procs.output("echo7070"), 10, "the site's echo server")
    both = reverse_plan(
        lab,
        s1,
        Grant("fabric", "db", "reverse", ("192.0.2.64/26",), FABRIC_MARK),
        Grant("cluster", "db", "reverse", ("10.244.0.0/30",), CLUSTER_MARK),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, both)
    assert "initnat.sysctl_set name=net.ipv4.conf.ens7.rp_filter value=2" in initnat_once(
        lab, plan_file, variant
    )
    assert await tunnels_up(lab, [s1]) == ["s1"]

    def fabric() -> bool:
        return one_shot(lab.svc, FABRIC_CLIENT, RVIP, 7070, once)

    def from_cluster() -> bool:
        return one_shot(cluster, CLUSTER_GW, RVIP, 7070, once)

    assert fabric(), "the fabric client's round trip: SYN via NIC2 into the tunnel, SYN-ACK back via NIC2"
    assert from_cluster(), "a client behind eth0 still works"
    assert "from 198.18.0.1" in procs.output("echo7070"), "SNATed to nat.sourceAddress, into the tunnel"
    flagged = reply_flagged(lab)
    assert flagged and all(f"src={FABRIC_CLIENT} " in line for line in flagged), (
        "only the connection that came in on NIC2 carries the reply bit"
    )
    assert all(f"mark={REPLY_BIT | FABRIC_MARK}" in line for line in flagged), "and its grant's mark"
    # Where routing sends a reply: to the fabric client via NIC2 only with the bit (main says eth0); into
    # the tunnel (charon's table 220, priority 220, before our reply rules) with or without it, as a
    # reply to a tunnel peer coming in on NIC2 under kernel XFRM would.
    route = ("ip", "route", "get", FABRIC_CLIENT, "from", s1.lan_host, "iif", "ipsec0")
    assert "dev eth0" in lab.gw.run(*route).stdout.decode()
    assert "dev ens7" in lab.gw.run(*route, "mark", hex(REPLY_BIT)).stdout.decode()
    to_tunnel = ("ip", "route", "get", s1.lan_host, "from", SVC_ADDR, "iif", "ens7", "mark", hex(REPLY_BIT))
    assert "dev ipsec0 table 220" in lab.gw.run(*to_tunnel).stdout.decode()

    # A restart (a re-run init container) finds everything in sync: nothing written, counters kept.
    counted = mangle_counters(lab, variant)
    assert len(counted) == 2 and all(n > 0 for n, _ in counted), counted
    assert "changed=False routing_changed=False" in initnat_once(lab, plan_file, variant)
    again = mangle_counters(lab, variant)
    assert [r for _, r in again] == [r for _, r in counted]
    assert all(a >= b for (b, _), (a, _) in zip(counted, again, strict=True)), "not rewritten: counters kept"

    # Mutants without the reply routing: each half deleted by hand loses the round trip (and only the
    # fabric's); the next apply repairs it.
    restore = next(r for _, r in counted if "--restore-mark" in r)
    lab.gw.run(f"iptables-{variant}", "-t", "mangle", "-D", *shlex.split(restore)[1:])
    assert not fabric(), "without restoring the bit on replies the SYN-ACK leaves via eth0"
    assert from_cluster()
    assert "changed=True routing_changed=False" in initnat_once(lab, plan_file, variant)
    assert fabric(), "drift in the mangle chain repaired"
    lab.gw.run("ip", "rule", "del", "priority", "1003")
    assert not fabric(), "without the fwmark rule to NIC2's table the SYN-ACK leaves via eth0"
    assert "changed=False routing_changed=True" in initnat_once(lab, plan_file, variant)
    assert fabric(), "the rule is back"

    # The sidecar (a fresh process: it finds the kernel in sync) and two long-lived connections.
    initnat = procs.start(
        lab.gw,
        PY,
        "-m",
        "initnat",
        "--plan",
        str(plan_file),
        "--watch",
        "--iptables",
        variant,
        name="initnat",
    )
    wait_for(lambda: "initnat.applied" in procs.output("initnat"), 15, "the sidecar's first apply")
    assert "changed=False routing_changed=False" in procs.output("initnat")
    clients = {
        "fabric": procs.start(lab.svc, PY, str(tmp_path / "long.py"), FABRIC_CLIENT, RVIP, "7070", name="lf"),
        "cluster": procs.start(cluster, PY, str(tmp_path / "long.py"), CLUSTER_GW, RVIP, "7070", name="lc"),
    }
    for name, out in (("fabric", "lf"), ("cluster", "lc")):
        wait_for(procs.says(out, "ok ", 3), 10, f"the {name} client echoing")
    assert marked(lab, FABRIC_MARK, "ESTABLISHED") == 1 and marked(lab, CLUSTER_MARK, "ESTABLISHED") == 1

    # Revoking the fabric grant cuts its live connection within 2 s; the cluster's keeps echoing.
    changed_at = time.time()
    write_plan(
        plan_file, dataclasses.replace(both, nat=dataclasses.replace(both.nat, grants=both.nat.grants[1:]))
    )
    wait_for(lambda: clients["fabric"].poll() is not None, 10, "the fabric client to be cut")
    last_ok = max(float(x.split()[1]) for x in procs.output("lf").splitlines() if x.startswith("ok "))
    assert last_ok - changed_at < 2.0, f"the fabric client still echoed {last_ok - changed_at:.2f} s later"
    oks = procs.output("lc").count("ok ")
    await anyio.sleep(1.5)
    assert clients["cluster"].poll() is None and procs.output("lc").count("ok ") >= oks + 5
    assert marked(lab, FABRIC_MARK) == 0, "the revoked grant's conntrack entries are gone"
    assert f"revoked_marks={FABRIC_MARK:#x}/{MASK:#x}" in procs.output("initnat")
    assert not fabric(), "revoked: no new connection either"
    assert initnat.poll() is None

    # What NIC2's loose rp_filter is for (measured): strict, the fabric's SYN never reaches FORWARD.
    initnat.terminate()
    initnat.wait(timeout=10)
    write_plan(plan_file, both)
    initnat_once(lab, plan_file, variant)
    assert fabric()
    netns.NsSysctls(lab.gw.ns).write("net.ipv4.conf.ens7.rp_filter", 1)
    lab.gw.run("conntrack", "-D", "-m", f"{FABRIC_MARK:#x}/{MASK:#x}", check=False)
    before = rp_filter_drops(lab)
    assert not fabric()
    assert marked(lab, FABRIC_MARK) == 0, "strict: nothing reached FORWARD"
    assert rp_filter_drops(lab) > before, "dropped by the reverse-path filter, not lost elsewhere"


def handshaken(site: Host) -> bool:
    """The site's wireguard-go has completed a handshake with the gateway."""
    out = site.wireguard["wg0"].wg("show", "wg0", "latest-handshakes")
    return any(int(line.split()[1]) > 0 for line in out.splitlines() if line.strip())


def peer_routing_into_its_tunnel(lab: Lab, site: Host, tmp_path: Path, extra: str) -> None:
    """A WireGuard tunnel gateway <-> ``site`` whose peer also routes ``extra`` into it (a peer's own
    AllowedIPs and routes are the tenant's to choose); the fabric router routes the site's LAN back to
    the gateway (what missing Neutron port security amounts to), so only our rules stop such traffic."""
    keys = wireguard_pair(lab, site, tmp_path)
    lab.gw.wireguard["wg0"].wg(
        "set", "wg0", "peer", keys[site.role][1], "allowed-ips", f"10.99.0.2/32,{site.lans[0]}"
    )
    site.wireguard["wg0"].wg(
        "set", "wg0", "peer", keys["gw"][1], "allowed-ips", f"10.99.0.1/32,{SERVICE_CIDR},{extra}"
    )
    netns.route(lab.gw.ns, site.lans[0], "dev", "wg0")
    for dst in (SERVICE_CIDR, extra):
        netns.route(site.ns, dst, "dev", "wg0")
    netns.route(lab.rtr.ns, site.lans[0], "via", GW_NIC2_ADDR)


async def test_a_wireguard_reverse_exposure_answers_the_fabric_through_nic2_also_with_src_valid_mark(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """WireGuard: the site's routes live in the MAIN table (wg0), not in charon's table 220. A fabric
    client's connection to a reverse exposure goes through wg0 and its replies come out of it with the
    reply bit. With ``src_valid_mark`` on (hosts running Calico's WireGuard mode set
    net.ipv4.conf.all.src_valid_mark=1, and a pod's namespace inherits it) the reverse-path check of such a
    reply is a route lookup WITH the mark: were NIC2's table its answer, the strict rp_filter of wg0 (the
    lab's namespace is strict, as many hosts leave pods) would drop it. The ``fwmark ... lookup main
    suppress_prefixlength 0`` rule lets main's specific routes (the peer's) win: measured here, deleting it
    drops the replies (the IPReversePathFilter counter moves) with src_valid_mark on, and not with it off."""
    lab = pod_lab
    s1 = lab.add_site()
    netns.addr(lab.svc.ns, "lo", f"{FABRIC_CLIENT}/32")
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    (tmp_path / "once.py").write_text(ONE_SHOT)
    procs.start(s1, PY, str(tmp_path / "echo.py"), s1.lan_host, "7070", name="echo7070")
    wait_for(lambda: "listening" in procs.output("echo7070"), 10, "the site's echo server")
    wg_plan = dataclasses.replace(
        reverse_plan(lab, s1, Grant("fabric", "db", "reverse", ("192.0.2.64/26",), FABRIC_MARK)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, "10.99.0.1/24", SecretRef("gw-wg", "privateKey")),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, wg_plan)
    initnat_once(lab, plan_file, "nft")
    keys = wireguard_pair(lab, s1, tmp_path)
    lab.gw.wireguard["wg0"].wg(
        "set", "wg0", "peer", keys[s1.role][1], "allowed-ips", f"10.99.0.2/32,{s1.lans[0]}"
    )
    s1.wireguard["wg0"].wg("set", "wg0", "peer", keys["gw"][1], "allowed-ips", f"10.99.0.1/32,{SERVICE_CIDR}")
    netns.route(lab.gw.ns, s1.lans[0], "dev", "wg0")  # the peer's route: main table
    netns.route(s1.ns, SERVICE_CIDR, "dev", "wg0")
    # The site initiates the handshake with its first packet into wg0. The ping itself is not answered:
    # the pod takes nothing new from its tunnels (VPNGW-INPUT), its tunnel address included.
    assert not s1.ping("10.99.0.1", src="10.99.0.2", count=1)
    wait_for(lambda: handshaken(s1), 10, "the handshake (the site initiates)")
    sysctls = netns.NsSysctls(lab.gw.ns)
    sysctls.write("net.ipv4.conf.all.src_valid_mark", 1)
    assert sysctls.read("net.ipv4.conf.wg0.rp_filter") == 1 == sysctls.read("net.ipv4.conf.all.rp_filter")

    def fabric() -> bool:
        return one_shot(lab.svc, FABRIC_CLIENT, RVIP, 7070, tmp_path / "once.py")

    assert fabric(), "into wg0 by the main table, answered through NIC2"
    assert reply_flagged(lab) and "from 198.18.0.1" in procs.output("echo7070")
    reply = ("ip", "route", "get", FABRIC_CLIENT, "from", s1.lan_host, "iif", "wg0", "mark", hex(REPLY_BIT))
    assert "dev ens7" in lab.gw.run(*reply).stdout.decode(), "a reply out of the tunnel leaves via NIC2"

    lab.gw.run("ip", "rule", "del", "priority", "1002")  # the suppress_prefixlength rule
    before = rp_filter_drops(lab)
    assert not fabric(), "with src_valid_mark on and no main-first rule the replies are dropped"
    assert rp_filter_drops(lab) > before, "by wg0's reverse-path filter (its lookup with the mark found NIC2)"
    sysctls.write("net.ipv4.conf.all.src_valid_mark", 0)
    assert fabric(), "with src_valid_mark off the same rules pass: the check ignores the mark"
    sysctls.write("net.ipv4.conf.all.src_valid_mark", 1)
    assert "changed=False routing_changed=True" in initnat_once(lab, plan_file, "nft")
    assert fabric(), "the rule is back"


def target_drops(lab: Lab) -> int:
    """Packets our VPNGW-TARGETS rule for the web target dropped so far."""
    return sum(
        n for n, r in our_rules_with_counters(lab) if r.startswith(f"-A VPNGW-TARGETS -d {SVC_ADDR}/32")
    )


async def test_a_wireguard_peer_reaches_a_target_only_through_its_virtual_ip(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """A WireGuard peer writes its own AllowedIPs: it can route an exposure target's REAL address into
    the tunnel (the gateway's AllowedIPs only constrain the peer's source; IPsec's selectors would refuse
    the packet). The gateway must not forward such a connection: only the virtual IP (DNAT + grant) is a
    way in. Live wireguard-go on both ends, the pod's NIC2 named ens7 and its default route via eth0.

    Here the fabric router routes the site's LAN back to the gateway (what a missing Neutron port
    security amounts to), so the direct connection fails only because of our rule: taking the rule out
    by hand lets it through, and the next apply puts it back.

    The tunnel-ingress rule would drop the connection first
    (test_a_wireguard_peer_gets_nowhere_but_our_virtual_ips): it is deleted by hand, so VPNGW-TARGETS is
    tested on its own. (This test used to name another device, ``wg9``, in the plan instead; exposures are
    DNATed only for what comes in through the plan's tunnel device now, so the virtual IP would not work.)"""
    lab = pod_lab
    s1 = lab.add_site()
    for name, body in (("echo", ECHO_SERVER), ("once", ONE_SHOT)):
        (tmp_path / f"{name}.py").write_text(body)
    once = tmp_path / "once.py"
    procs.start(lab.svc, PY, str(tmp_path / "echo.py"), SVC_ADDR, "8080", name="echo8080")
    wait_for(lambda: "listening" in procs.output("echo8080"), 10, "echo server :8080")

    plan_file = tmp_path / "plan.json"
    wg_plan = dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, "10.99.0.1/24", SecretRef("gw-wg", "privateKey")),
    )
    write_plan(plan_file, wg_plan)

    def delete(prefix: str) -> None:
        listed = lab.gw.run("iptables-nft", "-S", "VPNGW-FORWARD").stdout.decode().splitlines()
        (number,) = [i for i, r in enumerate(listed) if r.startswith(prefix)]  # -S lists the -N line first
        lab.gw.run("iptables-nft", "-D", "VPNGW-FORWARD", str(number))

    ingress = "-A VPNGW-FORWARD -i wg0 -m conntrack --ctstate NEW"

    def apply() -> str:
        res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), "--iptables", "nft", check=False)
        assert res.returncode == 0, res.stderr.decode()
        return res.stderr.decode()

    apply()  # before the handshake: the gateway's replies to the peer leave through NIC2 by policy
    # The peer's side is under the tenant's control: the target's real address goes into the tunnel too.
    peer_routing_into_its_tunnel(lab, s1, tmp_path, f"{SVC_ADDR}/32")

    s1_ip = s1.lan_host
    assert one_shot(s1, s1_ip, WEB_VIP, 8080, once), "the granted peer reaches the target via its virtual IP"
    assert "from 192.0.2.2" in procs.output("echo8080"), "SNATed to NIC2's address"
    delete(ingress)
    before = target_drops(lab)
    assert not one_shot(s1, s1_ip, SVC_ADDR, 8080, once), "the target's real address is not a way in"
    assert target_drops(lab) > before, "the SYNs came through the tunnel and VPNGW-TARGETS dropped them"
    assert f"from {s1_ip}" not in procs.output("echo8080")

    # Without the rule the same connection gets through (so nothing else stopped it above) ...
    delete(
        "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT "
        '-m comment --comment "vpngw new and not DNATed" -j VPNGW-TARGETS'
    )
    assert one_shot(s1, s1_ip, SVC_ADDR, 8080, once), "with the rule gone, the real address is reachable"
    assert f"from {s1_ip}" in procs.output("echo8080"), "unSNATed: the target saw the peer's own address"
    # ... and the next apply (a resync in --watch) repairs the drift: dropped again (by the ingress rule,
    # back in front of it, and the list behind it).
    assert "changed=True" in apply()
    dropped = sum(n for n, r in our_rules_with_counters(lab) if r.startswith(ingress))
    assert not one_shot(s1, s1_ip, SVC_ADDR, 8080, once)
    assert sum(n for n, r in our_rules_with_counters(lab) if r.startswith(ingress)) > dropped
    delete(ingress)
    before = target_drops(lab)
    assert not one_shot(s1, s1_ip, SVC_ADDR, 8080, once)
    assert target_drops(lab) > before
    assert one_shot(s1, s1_ip, WEB_VIP, 8080, once), "the virtual IP still works"


class FailingThenToolFlusher:
    """Injects the fault: the conntrack flush fails while ``fail`` is set; afterwards it deletes for real
    with the conntrack tool inside the gateway namespace (pyroute2's socket would act on the test's)."""

    def __init__(self, gw: Host) -> None:
        self.gw, self.fail, self.flushed = gw, True, list[tuple[int, int]]()

    def flush_mark(self, mark: int, mask: int) -> None:
        if self.fail:
            raise ConntrackError(f"injected: conntrack flush of {mark:#x}/{mask:#x} failed")
        self.gw.run("conntrack", "-D", "-m", f"{mark:#x}/{mask:#x}", check=False)
        self.flushed.append((mark, mask))


async def test_a_revoked_grant_is_cut_by_iptables_even_when_the_conntrack_flush_fails(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """The revoked grant's established flow must stop although its conntrack entry (with its mark) is
    still there: the transaction that withdraws the admission also drops that mark's packets, until a
    flush succeeds. Live IPsec tunnels from two sites, the real kernel; init-nat's Gateway runs in this
    process against the gateway namespace so the flush failure can be injected."""
    lab = pod_lab
    s1, s2 = lab.add_site(), lab.add_site()
    for name, body in (("echo", ECHO_SERVER), ("long", LONG_CLIENT), ("once", ONE_SHOT)):
        (tmp_path / f"{name}.py").write_text(body)
    procs.start(lab.svc, PY, str(tmp_path / "echo.py"), SVC_ADDR, "8080", name="echo8080")
    wait_for(lambda: "listening" in procs.output("echo8080"), 10, "echo server :8080")

    def run(argv: Sequence[str], input: str | None = None) -> Completed:
        return run_process(lab.gw.argv(*argv), input)

    v1 = plan(
        lab,
        (
            Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),
            Grant("s2", "web", "exposure", (s2.lans[0],), GRANT_S2_WEB),
        ),
    )
    flusher = FailingThenToolFlusher(lab.gw)
    # pyroute2's synchronous IPRoute runs its own event loop: it lives in one worker thread of its own.
    with ThreadPoolExecutor(max_workers=1) as netlink_thread:
        ipr = netlink_thread.submit(IPRoute, netns=lab.gw.ns, flags=0).result()
        gw = Gateway(Iptables("nft", run), ipr, flusher, sysctls=netns.NsSysctls(lab.gw.ns))

        def apply(p: Plan) -> None:
            netlink_thread.submit(gw.apply, p).result()

        try:
            await _flush_failure_scenario(lab, procs, tmp_path, apply, flusher, v1, (s1, s2))
        finally:
            netlink_thread.submit(ipr.close).result()


async def _flush_failure_scenario(
    lab: Lab,
    procs: Procs,
    tmp_path: Path,
    apply: Callable[[Plan], None],
    flusher: FailingThenToolFlusher,
    v1: Plan,
    sites: tuple[Host, Host],
) -> None:
    s1, s2 = sites
    apply(v1)
    assert await tunnels_up(lab, [s1, s2]) == ["s1", "s2"]
    clients = {
        "c1": procs.start(s1, PY, str(tmp_path / "long.py"), s1.lan_host, WEB_VIP, "8080", name="c1"),
        "c2": procs.start(s2, PY, str(tmp_path / "long.py"), s2.lan_host, WEB_VIP, "8080", name="c2"),
    }
    for name in clients:
        wait_for(procs.says(name, "ok ", 3), 10, f"{name} echoing")

    v2 = plan(lab, tuple(g for g in v1.nat.grants if g.mark != GRANT_S1_WEB))
    changed_at = time.time()
    with pytest.raises(ConntrackError):
        apply(v2)
    wait_for(lambda: clients["c1"].poll() is not None, 10, "c1 to be cut")
    last_ok = max(float(x.split()[1]) for x in procs.output("c1").splitlines() if x.startswith("ok "))
    assert last_ok - changed_at < 2.0, f"c1 still echoed {last_ok - changed_at:.2f} s after the change"
    assert marked(lab, GRANT_S1_WEB, "ESTABLISHED") == 1, (
        "its conntrack entry is still there: iptables cut it"
    )
    tombstone = f"-A VPNGW-FORWARD -m connmark --mark {GRANT_S1_WEB:#x}/{MASK:#x}"
    assert any(r.startswith(tombstone) and n > 0 for n, r in our_rules_with_counters(lab)), (
        "the revoked mark's DROP counted c1's packets"
    )
    oks = procs.output("c2").count("ok ")
    await anyio.sleep(1.0)
    assert clients["c2"].poll() is None and procs.output("c2").count("ok ") >= oks + 5, "s2 unaffected"

    flusher.fail = False  # ctnetlink is back: the retry flushes with the mask it was marked under
    apply(v2)
    assert flusher.flushed == [(GRANT_S1_WEB, MASK)]
    assert marked(lab, GRANT_S1_WEB) == 0 and marked(lab, GRANT_S2_WEB, "ESTABLISHED") == 1
    assert not any(r.startswith(tombstone) for _, r in our_rules_with_counters(lab)), "lifted"
    oks = procs.output("c2").count("ok ")
    await anyio.sleep(1.0)
    assert clients["c2"].poll() is None and procs.output("c2").count("ok ") >= oks + 5
    assert not one_shot(s1, s1.lan_host, WEB_VIP, 8080, tmp_path / "once.py"), "s1 stays revoked"


def tunnel_ingress_drops(lab: Lab) -> int:
    """Packets our rule for new, not-DNATed connections in from wg0 dropped so far."""
    return sum(n for n, r in our_rules_with_counters(lab) if r.startswith("-A VPNGW-FORWARD -i wg0 "))


async def test_a_wireguard_peer_gets_nowhere_but_our_virtual_ips(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """VPNGW-TARGETS covers exposure targets; a WireGuard peer can route ANY address into its tunnel (its
    AllowedIPs constrain only its source): the fabric router, NIC2's neighbours, the cluster behind eth0.
    With a WireGuard plan, a NEW connection coming in through wg0 that we did not DNAT is dropped. Live
    wireguard-go on both ends, pod mode; the router routes the site's LAN back to the gateway, so only our
    rule stops the ping (removing it by hand lets it through)."""
    lab = pod_lab
    s1 = lab.add_site()
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    (tmp_path / "once.py").write_text(ONE_SHOT)
    procs.start(lab.svc, PY, str(tmp_path / "echo.py"), SVC_ADDR, "8080", name="echo8080")
    wait_for(lambda: "listening" in procs.output("echo8080"), 10, "echo server :8080")
    wg_plan = dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, "10.99.0.1/24", SecretRef("gw-wg", "privateKey")),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, wg_plan)
    for changed in ("changed=True", "changed=False"):  # the device rule reads back as rendered
        res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), "--iptables", "nft", check=False)
        assert res.returncode == 0 and changed in res.stderr.decode(), res.stderr.decode()
    peer_routing_into_its_tunnel(lab, s1, tmp_path, f"{RTR_NIC2_ADDR}/32")

    s1_ip = s1.lan_host
    assert one_shot(s1, s1_ip, WEB_VIP, 8080, tmp_path / "once.py"), "the virtual IP is a way in"

    def ping() -> bool:
        return s1.run("ping", "-c", "2", "-W", "1", "-I", s1_ip, RTR_NIC2_ADDR, check=False).returncode == 0

    before = tunnel_ingress_drops(lab)
    assert not ping(), "the fabric router is not reachable from the tunnel"
    assert tunnel_ingress_drops(lab) > before, "dropped by the tunnel-ingress rule"
    rules = lab.gw.run("iptables-nft", "-S", "VPNGW-FORWARD").stdout.decode().splitlines()
    (number,) = [i for i, r in enumerate(rules) if r.startswith("-A VPNGW-FORWARD -i wg0 ")]
    lab.gw.run("iptables-nft", "-D", "VPNGW-FORWARD", str(number))  # -S lists the -N line first
    assert ping(), "without the rule the router answers: nothing else stopped it"
