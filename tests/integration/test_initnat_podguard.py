"""The pod itself, with real traffic: a tunnel peer (IPsec or WireGuard) reaches only what it must (IKE and
ESP, or the WireGuard port, on NIC2; its exposures through their virtual IPs), never the pod's own
ports (the status-agent's probe port, the exporter's metrics port), and the pod cannot reach the cloud's
metadata service through NIC2, nor forward a tunnel's traffic to it.

Live charon (kernel-libipsec: decapsulated packets come in on the TUN ``ipsec0``) and wireguard-go,
init-nat as ``python -m initnat`` in the gateway namespace, listeners on the ports the controller's pod
spec gives the agent and the exporter (controller.settings.GatewayPod), a fake metadata service on the
router (169.254.169.254/32 on its lo).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from controller.settings import GatewayPod
from gwplan import Grant, Plan, SecretRef, WireGuard
from lab import netns
from lab.wait import wait_for
from lab.world import GW_NIC2_ADDR, SVC_ADDR, Host, Lab
from tests.integration.test_initnat_traffic import (
    ECHO_SERVER,
    GRANT_S1_WEB,
    ONE_SHOT,
    PY,
    WEB_VIP,
    Procs,
    our_rules_with_counters,
    peer_routing_into_its_tunnel,
    plan,
    tunnels_up,
    write_plan,
)

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

HEALTH, METRICS = GatewayPod().health_port, GatewayPod().metrics_port  # 8081, 9100
OWN_SERVICE_ADDR = "198.18.0.1"  # nat.sourceAddress: the gateway's own address inside serviceCIDR (on lo)
GW_TUNNEL = "10.99.0.1"
METADATA = "169.254.169.254"


def scripts(tmp_path: Path) -> Path:
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    (tmp_path / "once.py").write_text(ONE_SHOT)
    return tmp_path / "once.py"


def listen(procs: Procs, host: Host, tmp_path: Path, addr: str, port: int) -> None:
    name = f"listen-{host.role}-{port}"
    procs.start(host, PY, str(tmp_path / "echo.py"), addr, str(port), name=name)
    wait_for(lambda: "listening" in procs.output(name), 10, f"{name}")


def reaches(host: Host, src: str, dst: str, port: int, once: Path) -> bool:
    return host.run(PY, str(once), src, dst, str(port), check=False, timeout=10).returncode == 0


def pod_ports(procs: Procs, lab: Lab, tmp_path: Path) -> None:
    """The agent's probe port and the exporter's metrics port, as the pod spec opens them (0.0.0.0)."""
    for port in (HEALTH, METRICS):
        listen(procs, lab.gw, tmp_path, "0.0.0.0", port)


def initnat_once(lab: Lab, plan_file: Path) -> str:
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()
    return res.stderr.decode()


def guard_drops(lab: Lab, chain: str) -> int:
    """Packets the DROP rules of one of our chains (VPNGW-INPUT, VPNGW-OUTPUT, VPNGW-TARGETS) counted."""
    return sum(
        n for n, r in our_rules_with_counters(lab) if r.startswith(f"-A {chain} ") and r.endswith("DROP")
    )


async def test_an_ipsec_site_reaches_its_exposure_and_ike_but_not_the_pods_own_ports(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    lab = pod_lab
    s1 = lab.add_site()
    once = scripts(tmp_path)
    listen(procs, lab.svc, tmp_path, SVC_ADDR, 8080)
    pod_ports(procs, lab, tmp_path)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)))
    assert "changed=True" in initnat_once(lab, plan_file)
    assert "changed=False" in initnat_once(lab, plan_file), "the new chains read back as rendered"

    assert await tunnels_up(lab, [s1]) == ["s1"], "IKE (UDP 500, then 4500) comes in on NIC2"
    assert reaches(s1, s1.lan_host, WEB_VIP, 8080, once), "the exposure through the tunnel"
    before = guard_drops(lab, "VPNGW-INPUT")
    for port in (HEALTH, METRICS):
        # Through the tunnel (serviceCIDR is all its selectors carry: the gateway's own address in it) ...
        assert not reaches(s1, s1.lan_host, OWN_SERVICE_ADDR, port, once), f"port {port} through the tunnel"
        # ... and to NIC2's address, from the site's public address (the cloud routes it to the pod).
        assert not reaches(s1, s1.addresses[0], GW_NIC2_ADDR, port, once), f"port {port} on NIC2"
    assert guard_drops(lab, "VPNGW-INPUT") > before, "dropped by our INPUT chain, not lost elsewhere"
    assert reaches(lab.gw, "127.0.0.1", "127.0.0.1", HEALTH, once), "the pod still reaches its own ports"
    assert reaches(s1, s1.lan_host, WEB_VIP, 8080, once), "and the exposure still works"


async def test_a_wireguard_peer_reaches_its_exposure_but_not_the_pods_own_ports(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    lab = pod_lab
    s1 = lab.add_site()
    once = scripts(tmp_path)
    listen(procs, lab.svc, tmp_path, SVC_ADDR, 8080)
    pod_ports(procs, lab, tmp_path)
    wg_plan = dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, f"{GW_TUNNEL}/24", SecretRef("gw-wg", "privateKey")),
    )
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, wg_plan)
    initnat_once(lab, plan_file)
    peer_routing_into_its_tunnel(lab, s1, tmp_path, f"{GW_TUNNEL}/32")

    assert reaches(s1, s1.lan_host, WEB_VIP, 8080, once), "the handshake (listen port on NIC2) and exposure"
    before = guard_drops(lab, "VPNGW-INPUT")
    for dst in (GW_TUNNEL, OWN_SERVICE_ADDR):
        for port in (HEALTH, METRICS):
            assert not reaches(s1, s1.lan_host, dst, port, once), f"{dst}:{port} through the tunnel"
    for port in (HEALTH, METRICS):
        assert not reaches(s1, s1.addresses[0], GW_NIC2_ADDR, port, once), f"port {port} on NIC2"
    assert guard_drops(lab, "VPNGW-INPUT") > before
    assert reaches(s1, s1.lan_host, WEB_VIP, 8080, once)


def wireguard_plan(lab: Lab, site: Host) -> Plan:
    return dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (site.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, f"{GW_TUNNEL}/24", SecretRef("gw-wg", "privateKey")),
    )


def fake_metadata(procs: Procs, lab: Lab, tmp_path: Path) -> None:
    """The router stands in for the cloud's metadata service: 169.254.169.254 on its lo, a TCP listener."""
    netns.addr(lab.rtr.ns, "lo", f"{METADATA}/32")
    listen(procs, lab.rtr, tmp_path, METADATA, 80)


async def test_the_pod_cannot_reach_the_metadata_service_through_nic2(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """From the gateway namespace, with NIC2's address as the source (the policy rule sends it out NIC2,
    as it does every reply to NIC2 traffic), the metadata service answers before init-nat runs, and not
    after (OUTPUT)."""
    lab = pod_lab
    s1 = lab.add_site()
    once = scripts(tmp_path)
    fake_metadata(procs, lab, tmp_path)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)))
    lab.gw.run("ip", "rule", "add", "from", GW_NIC2_ADDR, "lookup", "100", "priority", "1000")
    lab.gw.run("ip", "route", "add", "default", "via", "192.0.2.1", "dev", lab.nic2_name, "table", "100")
    route = lab.gw.run("ip", "route", "get", METADATA, "from", GW_NIC2_ADDR).stdout.decode()
    assert f"dev {lab.nic2_name}" in route, route
    assert reaches(lab.gw, GW_NIC2_ADDR, METADATA, 80, once), "before init-nat the pod reaches it via NIC2"

    initnat_once(lab, plan_file)
    before = guard_drops(lab, "VPNGW-OUTPUT")
    assert not reaches(lab.gw, GW_NIC2_ADDR, METADATA, 80, once), "through NIC2: dropped"
    assert guard_drops(lab, "VPNGW-OUTPUT") > before, "by our OUTPUT rule"
    assert procs.output("listen-rtr-80").count("from ") == 1, "only the connection made before init-nat"


async def test_a_tunnel_peer_is_not_forwarded_to_the_metadata_service(
    lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """A WireGuard peer routes 169.254.169.254 into its tunnel (its AllowedIPs constrain only its source).
    The tunnel-ingress rule drops it; deleted by hand, the metadata rule on the forwarding path still
    does (FORWARD). The plain lab: the gateway's default route leads out through NIC2 to the router."""
    s1 = lab.add_site()
    once = scripts(tmp_path)
    fake_metadata(procs, lab, tmp_path)
    listen(procs, lab.svc, tmp_path, SVC_ADDR, 8080)
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, wireguard_plan(lab, s1))
    initnat_once(lab, plan_file)
    peer_routing_into_its_tunnel(lab, s1, tmp_path, f"{METADATA}/32")
    assert reaches(s1, s1.lan_host, WEB_VIP, 8080, once), "the tunnel works"
    assert not reaches(s1, s1.lan_host, METADATA, 80, once), "a peer routing it into its tunnel: dropped"
    rules = lab.gw.run("iptables-nft", "-S", "VPNGW-FORWARD").stdout.decode().splitlines()
    (number,) = [i for i, r in enumerate(rules) if r.startswith("-A VPNGW-FORWARD -i wg0 ")]
    lab.gw.run("iptables-nft", "-D", "VPNGW-FORWARD", str(number))  # -S lists the -N line first
    before = guard_drops(lab, "VPNGW-TARGETS")
    assert not reaches(s1, s1.lan_host, METADATA, 80, once), "without the ingress rule: still dropped"
    assert guard_drops(lab, "VPNGW-TARGETS") > before, "by the metadata rule on the forwarding path"
    assert f"from {s1.lan_host}" not in procs.output("listen-rtr-80")
