"""End to end with the OpenStack backend: the controller (``--cloud openstack``) allocates the gateway's
Neutron port in the REAL Neutron (lab/openstack), a floating IP 1:1 on it, and attaches the port to the
node's server through the Nova os-interface EMULATOR; the lab plays the hypervisor (the attached port
appears on the node with Neutron's MAC) and the Neutron router's floating-IP NAT (1:1 on the lab's
router, towards the sites only). The lab kubelet's host-device attachment moves that interface into the
pod; init-nat gives it the address Neutron allocated; the sites are configured with ``status.publicIP``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.cloudplan import tags
from controller.names import GatewayKey
from lab import netns
from lab.cluster import clouds_yaml, openstack_args
from lab.kubelet.world import E2EWorld, secret_doc
from lab.openstack.fixtures import OpenStackLab
from lab.world import Host
from tests.examples import example_docs

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

NS = "tenant-acme"
KEY = GatewayKey("VPNGateway", NS, "acme")
LANS = {"s1": ["198.19.1.0/28", "198.19.1.16/28"], "s2": ["198.19.2.0/28"]}
"""Outside 203.0.113.0/24: the cloud's floating IPs come from there."""


@pytest.fixture
def world(openstack_lab: OpenStackLab, tmp_path: Path) -> Iterator[tuple[E2EWorld, OpenStackLab]]:
    node = openstack_lab.cloud.nodes[0]
    cfg = clouds_yaml(tmp_path / "clouds.yaml", openstack_lab.network_url, openstack_lab.compute_url)
    net = openstack_lab.cloud
    args = openstack_args(net.gateway.network_id, net.gateway.subnet_id, net.external.network_id)
    with E2EWorld(
        tmp_path / "e2e",
        static_nic=None,
        provider_id=node.provider_id,
        controller_args=args,
        controller_env={"OS_CLIENT_CONFIG_FILE": str(cfg)},
    ) as w:
        run_id = w.k.run_id
        yield w, openstack_lab
    assert [n for n in netns.list_namespaces() if n.startswith(run_id)] == []


def port_of(lab: OpenStackLab, server_id: str) -> Any:
    conn = lab.connect(direct=True)
    ports = list(conn.network.ports(tags=",".join(tags(KEY, "vpngw"))))
    return ports[0] if ports and ports[0].device_id == server_id else None


def floating_ip_nat(world: E2EWorld, fip: str, fixed: str) -> None:
    """What the Neutron router does for a floating IP, on the lab's router: 1:1, towards the sites."""
    rules = [
        [
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-i",
            "r-s+",
            "-d",
            f"{fip}/32",
            "-j",
            "DNAT",
            "--to-destination",
            fixed,
        ],
        [
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            "r-s+",
            "-s",
            f"{fixed}/32",
            "-j",
            "SNAT",
            "--to-source",
            fip,
        ],
    ]
    for r in rules:
        world.lab.rtr.run("iptables", *r)


def test_the_ipsec_scenario_on_the_real_neutron_port_and_floating_ip(
    world: tuple[E2EWorld, OpenStackLab],
) -> None:
    w, lab = world
    server = lab.cloud.nodes[0].server_id
    sites: dict[str, Host] = {n: w.add_ipsec_site(lans) for n, lans in LANS.items()}
    gw_docs = example_docs("ipsec.yaml")
    gw_docs[0]["spec"]["reverseExposures"][0]["target"]["address"] = "198.19.1.1"  # inside s1's LAN here
    for p in gw_docs[1:]:
        site = sites[p["metadata"]["name"]]
        p["spec"]["endpoint"] = site.addresses[0]
        p["spec"]["ipsec"]["remoteSubnets"] = site.lans
    t0 = time.monotonic()
    w.apply(gw_docs)
    w.c.apply([secret_doc(NS, "acme-psk", {"psk": w.psk}), secret_doc(NS, "s1-psk", {"psk": w.psk + "-s1"})])
    port = w.wait(
        lambda: port_of(lab, str(server)), 60, "the gateway's Neutron port attached to the node's server"
    )
    mac, fixed = port.mac_address, port.fixed_ips[0]["ip_address"]
    # The hypervisor hot-plugs the attached port into the instance: the node sees a NIC with its MAC.
    netns.run(["ip", "-n", w.lab.gw.ns, "link", "set", "ens7", "address", mac])
    fip = w.wait(lambda: w.gateway().get("status", {}).get("publicIP"), 60, "status.publicIP")
    conn = lab.connect(direct=True)
    (ip,) = conn.network.ips(tags=",".join(tags(KEY, "vpngw")))
    assert fip == ip.floating_ip_address and ip.port_id == port.id
    floating_ip_nat(w, fip, fixed)
    for name, site in sites.items():
        w.configure_ipsec_site(
            site,
            psk=w.psk + "-s1" if name == "s1" else w.psk,
            site_id=f"{name}.lab.example",
            gateway_addr=fip,
        )
    w.wait(lambda: w.established(["s1", "s2"]), 60, "every tunnel Established on the CR")
    print(f"e2e.measured what=openstack_apply_to_established seconds={time.monotonic() - t0:.3f}")
    pod = w.pod()
    assert pod is not None
    shown = pod.sandbox.ns
    link = netns.run(["ip", "-n", shown, "-o", "addr", "show", "dev", "net1"]).stdout.decode()
    assert f"{fixed}/26" in link, link
    assert mac in netns.run(["ip", "-n", shown, "-o", "link", "show", "dev", "net1"]).stdout.decode()
    plan = w.plan()
    assert plan.nic.mac == mac and plan.nic.address == f"{fixed}/26"
    remote = w.site_sas(sites["s1"])["gw"]["remote-host"]
    assert (remote.decode() if isinstance(remote, bytes) else remote) == fip, (
        "the site talks to the floating IP"
    )
    assert w.reaches(sites["s1"], w.vip("db"), 5432) and not w.reaches(sites["s2"], w.vip("db"), 5432)
    w.kubectl("delete", "vpngateway", "acme", "-n", NS, "--wait=false")
    w.wait(lambda: w.gateway() == {}, 60, "the finalizer released after the cloud's resources")
    assert list(conn.network.ports(tags=",".join(tags(KEY, "vpngw")))) == []
    assert list(conn.network.ips(tags=",".join(tags(KEY, "vpngw")))) == []
