"""End to end, WireGuard: a VPNGateway of type wireguard with two site peers, the controller rendering a
pod with a wireguard-go container (``--wireguard-mode wireguard-go``: the lab kernel has no WireGuard
module), the lab kubelet running it (``/dev/net/tun`` as the hostPath volume the spec names), remote
sites running their own wireguard-go configured with ``wg`` as a tenant would.

Handshakes happen, ``status.peers`` shows both Connected, each site reaches its granted exposure, and a
removed peer is cut (its packets no longer pass, it leaves ``status.peers``) while the other stays up.
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.kubelet.world import VPN, E2EWorld, secret_doc
from lab.peers import keypair
from lab.world import GW_NIC2_ADDR, SERVICE_CIDR, Host
from tests.integration.test_e2e_ipsec import exporter_metrics

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

NS = "tenant-wg"
LANS = {"s1": ["203.0.113.0/28"], "s2": ["203.0.113.16/28"]}
TUNNEL_ADDR = {"s1": "10.99.0.2", "s2": "10.99.0.3", "s3": "10.99.0.4"}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[E2EWorld]:
    with E2EWorld(
        tmp_path, static_nic=f"{NS}/acme-wg", controller_args=["--wireguard-mode", "wireguard-go"]
    ) as w:
        run_id = w.k.run_id
        yield w
    assert [n for n in netns.list_namespaces() if n.startswith(run_id)] == []


def docs(keys: dict[str, tuple[str, str]], sites: dict[str, Host]) -> list[dict[str, Any]]:
    gw: dict[str, Any] = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "metadata": {"name": "acme-wg", "namespace": NS},
        "spec": {
            "type": "wireguard",
            "serviceCIDR": SERVICE_CIDR,
            "exposures": [{"name": "web", "target": {"address": "192.0.2.66"}, "ports": [{"port": 80}]}],
            "wireguard": {
                "listenPort": 51820,
                "address": "10.99.0.1/24",
                "privateKeySecretRef": {"name": "acme-wg", "key": "privateKey"},
            },
        },
    }
    peers = []
    for name, site in sites.items():
        peers.append(
            {
                "apiVersion": "vpn.bnerd.net/v1alpha1",
                "kind": "VPNPeer",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "gatewayRef": {"name": "acme-wg"},
                    "type": "site",
                    "endpoint": site.addresses[0],
                    "wireguard": {
                        "publicKey": keys[name][1],
                        "allowedIPs": [f"{TUNNEL_ADDR[name]}/32", *site.lans],
                    },
                    "authorization": {"exposures": ["web"]},
                },
            }
        )
    return [gw, *peers]


def configure_site(
    world: E2EWorld,
    site: Host,
    name: str,
    keys: dict[str, tuple[str, str]],
    gw_public: str,
    *,
    keepalive: bool = True,
) -> None:
    """The tenant's side: its wireguard-go, key, the gateway as peer (its public address, the gateway's
    serviceCIDR and tunnel address as allowed IPs), a keepalive, a route for serviceCIDR into wg0."""
    wg = world.lab.start_wireguard(site)
    keyfile = world.workdir / f"{name}.key"
    keyfile.write_text(keys[name][0])
    keyfile.chmod(0o600)
    wg.wg(
        "set",
        "wg0",
        "private-key",
        str(keyfile),
        "listen-port",
        "51820",
        "peer",
        gw_public,
        "endpoint",
        f"{GW_NIC2_ADDR}:51820",
        "allowed-ips",
        f"10.99.0.1/32,{SERVICE_CIDR}",
        "persistent-keepalive",
        "1" if keepalive else "0",
    )
    netns.addr(site.ns, "wg0", f"{TUNNEL_ADDR[name]}/24")
    netns.run(["ip", "-n", site.ns, "link", "set", "wg0", "up"])
    netns.route(site.ns, SERVICE_CIDR, "dev", "wg0")


def connected(world: E2EWorld, names: list[str]) -> bool:
    peers = world.wg_peers("acme-wg", NS)
    return set(peers) == set(names) and all(p.get("state") == "Connected" for p in peers.values())


def bring_up(world: E2EWorld, names: tuple[str, ...]) -> tuple[dict[str, Host], dict[str, tuple[str, str]]]:
    """Sites configured by their tenant, then the gateway and its peers applied with the gateway's key;
    every peer Connected. Returns the sites and the key pairs (the gateway's under ``gw``)."""
    sites = {n: world.lab.add_site(lans=LANS[n]) for n in names}
    keys = {n: keypair() for n in ("gw", *sites)}
    for name, site in sites.items():
        configure_site(world, site, name, keys, keys["gw"][1])
    t0 = time.monotonic()
    world.apply(docs(keys, sites))
    world.c.apply([secret_doc(NS, "acme-wg", {"privateKey": keys["gw"][0]})])
    world.wait(lambda: connected(world, list(names)), 30, "every peer Connected in status.peers")
    print(f"e2e.measured what=wireguard_apply_to_connected seconds={time.monotonic() - t0:.3f}")
    return sites, keys


def test_two_wireguard_peers_handshake_connect_and_a_removed_peer_is_cut(world: E2EWorld) -> None:
    sites, _ = bring_up(world, ("s1", "s2"))
    peers = world.wg_peers("acme-wg", NS)
    assert all(p.get("latestHandshake") for p in peers.values()), peers
    own = world.wait(
        lambda: (
            ((world.c.get(VPN, "VPNPeer", "s1", NS) or {}).get("status") or {}).get("state") == "Established"
        ),
        15,
        "VPNPeer s1's own status.state Established (the status-agent)",
    )
    assert own
    pod = world.pod("acme-wg", NS)
    assert pod is not None
    assert {c["name"] for c in world.pod_object("acme-wg", NS)["status"]["containerStatuses"]} == {  # type: ignore[index]
        "init-nat-watch",
        "wireguard-go",
        "status-agent",
        "exporter",
    }
    web = world.vip("web", "acme-wg", NS)
    assert world.reaches(sites["s1"], web, 80) and world.reaches(sites["s2"], web, 80)
    world.wait(
        lambda: exporter_metrics(
            world,
            'wireguard_up{interface="wg0"}',
            'wireguard_peer_present{interface="wg0",peer="s2"}',
            name="acme-wg",
            ns=NS,
        ),
        30,
        "the exporter's metrics through the agent's read-only UAPI socket",
    )
    kept = world.long_client(sites["s1"], web, 80, "s1-web")
    world.wait(kept.alive, 10, "s1's long-lived flow")
    world.kubectl("delete", "vpnpeer", "s2", "-n", NS)
    world.wait(lambda: set(world.wg_peers("acme-wg", NS)) == {"s1"}, 30, "s2 gone from status.peers")
    world.wait(lambda: not world.reaches(sites["s2"], web, 80), 15, "s2 cut")
    assert kept.alive() and kept.cut_at() is None, "s1's flow is untouched"
    assert connected(world, ["s1"])


def test_a_site_that_never_initiates_connects_through_nic2_and_nothing_leaves_eth0(world: E2EWorld) -> None:
    """Found by running the pod (docs/e2e.md): the gateway's own WireGuard initiations followed the pod's
    main table out of eth0. The device now marks its packets with the NIC2 reply bit (agent), and
    init-nat's fwmark rules send them out through NIC2."""
    bring_up(world, ("s1",))
    site = world.lab.add_site(lans=["203.0.113.32/28"])
    keys = {"s3": keypair()}
    gw = world.c.get("v1", "Secret", "acme-wg", NS)
    assert gw is not None
    public = (
        subprocess.run(
            ["wg", "pubkey"],
            input=base64.b64decode(gw["data"]["privateKey"]),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    configure_site(world, site, "s3", keys, public, keepalive=False)
    world.apply(docs(keys, {"s3": site})[1:])
    world.wait(lambda: connected(world, ["s1", "s3"]), 15, "s3 Connected: the gateway initiated")
    pod = world.pod("acme-wg", NS)
    assert pod is not None and pod.capture is not None
    egress = {(f.protocol, f.peer, f.port) for f in pod.capture.egress()}
    print("e2e.egress", sorted(egress))
    assert ("TCP", "10.96.0.1", 443) in egress, f"the capture saw the agent reach the API server: {egress}"
    assert egress <= {("TCP", "10.96.0.1", 443), ("UDP", "10.96.0.10", 53)}, (
        "WireGuard's UDP must stay on NIC2"
    )
