"""init-nat fails closed per exposure, with real traffic: an exposure whose targetHost does not resolve is
left out with its grants, and the rest of the plan, a revocation included, is applied.

Live charon tunnels (kernel-libipsec), ``python -m initnat --watch`` as a real process in the gateway
namespace with the real resolver (getaddrinfo). The namespace's resolv.conf (``/etc/netns/<ns>/resolv.conf``,
bind-mounted by ``ip netns exec``) names a name server behind the pod's eth0, where cluster DNS would be,
that drops every query: a lookup hangs as it does with a dead or hostile DNS (glibc gives up after 10 s),
and init-nat's resolve deadline (2 s) is what bounds it. The name is ``nonexistent.invalid`` (RFC 6761:
never resolves).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gwplan import Exposure, Grant, Port, plan_hash
from lab import netns
from lab.wait import wait_for
from lab.world import CLUSTER_GW, SVC_ADDR, Lab
from tests.integration.test_initnat_traffic import (
    API_ADDR,
    API_VIP,
    ECHO_SERVER,
    GRANT_S1_API,
    GRANT_S1_WEB,
    LONG_CLIENT,
    ONE_SHOT,
    PY,
    WEB_VIP,
    Procs,
    marked,
    one_shot,
    plan,
    tunnels_up,
    write_plan,
)

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

GHOST = "nonexistent.invalid"
GHOST_VIP = "198.18.0.12"
GRANT_S1_GHOST = 0x00060000


@pytest.fixture
def dead_dns(pod_lab: Lab) -> Iterator[None]:
    """A name server in the cluster namespace (behind the pod's eth0) that never answers."""
    cluster = pod_lab.hosts["cl"]
    for proto in ("udp", "tcp"):
        cluster.run("iptables", "-A", "INPUT", "-p", proto, "--dport", "53", "-j", "DROP")
    etc = Path("/etc/netns") / pod_lab.gw.ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text(f"nameserver {CLUSTER_GW}\n")
    try:
        yield
    finally:
        shutil.rmtree(etc, ignore_errors=True)


async def test_an_unresolvable_exposure_host_does_not_block_a_revocation(
    pod_lab: Lab, procs: Procs, tmp_path: Path, dead_dns: None
) -> None:
    lab = pod_lab
    s1 = lab.add_site()
    netns.addr(lab.svc.ns, "lo", f"{API_ADDR}/32")
    netns.route(lab.rtr.ns, f"{API_ADDR}/32", "via", SVC_ADDR)
    for name, body in (("echo", ECHO_SERVER), ("long", LONG_CLIENT), ("once", ONE_SHOT)):
        (tmp_path / f"{name}.py").write_text(body)
    once = tmp_path / "once.py"
    for addr, port in ((SVC_ADDR, 8080), (API_ADDR, 9090)):
        procs.start(lab.svc, PY, str(tmp_path / "echo.py"), addr, str(port), name=f"echo{port}")
        wait_for(procs.says(f"echo{port}", "listening"), 10, f"echo server :{port}")

    # Two exposures (web, api), two grants of s1's.
    grant_web = Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB)
    grant_api = Grant("s1", "api", "exposure", (s1.lans[0],), GRANT_S1_API)
    v1 = plan(lab, (grant_web, grant_api))
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, v1)
    status_file = tmp_path / "initnat-status.json"
    initnat = procs.start(
        lab.gw, PY, "-m", "initnat", "--plan", str(plan_file), "--watch", "--resync", "5", name="initnat"
    )
    wait_for(lambda: "initnat.applied" in procs.output("initnat"), 15, "init-nat's first apply")
    assert await tunnels_up(lab, [s1]) == ["s1"]
    assert one_shot(s1, s1.lan_host, WEB_VIP, 8080, once) and one_shot(s1, s1.lan_host, API_VIP, 9090, once)

    # A flow through grant s1/web is open.
    c1 = procs.start(s1, PY, str(tmp_path / "long.py"), s1.lan_host, WEB_VIP, "8080", name="c1")
    wait_for(lambda: procs.output("c1").count("ok ") >= 3, 10, "c1 echoing")
    assert marked(lab, GRANT_S1_WEB, "ESTABLISHED") == 1

    # The next plan revokes s1/web AND adds an exposure whose host never resolves, with a grant.
    ghost = Exposure("ghost", GHOST_VIP, (Port(443),), target_host=GHOST)
    v2 = plan(lab, (grant_api, Grant("s1", "ghost", "exposure", (s1.lans[0],), GRANT_S1_GHOST)))
    v2 = dataclasses.replace(v2, nat=dataclasses.replace(v2.nat, exposures=(*v2.nat.exposures, ghost)))
    changed_at = time.time()
    write_plan(plan_file, v2)
    wait_for(lambda: c1.poll() is not None, 10, "the revoked grant's flow to be cut")
    last_ok = max(float(x.split()[1]) for x in procs.output("c1").splitlines() if x.startswith("ok "))
    # The resolve deadline (2 s) is all the unresolvable name may cost the revocation.
    assert last_ok - changed_at < 4.0, f"c1 still echoed {last_ok - changed_at:.2f} s after the change"
    print(f"initnat.measured what=revocation_with_unresolvable_host seconds={last_ok - changed_at:.2f}")
    assert marked(lab, GRANT_S1_WEB) == 0, "the revoked grant's conntrack entries are flushed"
    assert f"revoked_marks={GRANT_S1_WEB:#x}" in procs.output("initnat")

    # The other exposure still works; the revoked one does not; the ghost is left out, and said so.
    assert one_shot(s1, s1.lan_host, API_VIP, 9090, once), "the other exposure still works"
    assert not one_shot(s1, s1.lan_host, WEB_VIP, 8080, once), "s1/web is revoked"
    log = procs.output("initnat")
    (line,) = [x for x in log.splitlines() if "initnat.left_out" in x]
    assert f"exposure=ghost field=nat.exposures[2].targetHost vip={GHOST_VIP}" in line, line
    assert f"grants=s1/{GRANT_S1_GHOST:#x}" in line, line
    assert f"reason='{GHOST} does not resolve: no answer within 2 s'" in line, line
    assert "initnat.rejected" not in log and "initnat.failed" not in log
    doc = json.loads(status_file.read_text())
    assert doc["planHash"] == plan_hash(v2) and doc["lastError"] is None
    (entry,) = doc["leftOut"]
    assert (
        entry["exposure"] == "ghost"
        and entry["host"] == GHOST
        and entry["grants"] == [{"peer": "s1", "mark": f"{GRANT_S1_GHOST:#x}"}]
    )
    ghost_rules = lab.gw.run("iptables-save").stdout.decode()
    assert f'--ctorigdst {GHOST_VIP} -m comment --comment "vpngw not granted" -j DROP' in ghost_rules
    assert f"{GRANT_S1_GHOST:#x}/" not in ghost_rules, "no admission for the left-out exposure's grant"
    assert initnat.poll() is None
