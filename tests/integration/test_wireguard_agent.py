"""Issue 5 acceptance against real daemons: a gateway wireguard-go programmed by ``python -m agent`` (run
inside the gateway's network namespace with ``ip netns exec``, as in the pod), and two independent peers
(a site with a LAN and a road-warrior-like peer), each its own wireguard-go configured with ``wg``.

Nothing is faked here: the plan file, the secret files, the status file, the UAPI socket, the TUN device,
addresses and routes are all real. The kernel NETLINK backend cannot run on this machine (no WireGuard
module); it is covered at the pyroute2 boundary in tests/component/test_wireguard_backend.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gwkit.wireguard import uapi
from gwkit.wireguard.model import DeviceState
from gwplan import GatewayRef, Plan, SecretRef, WgPeer, WireGuard, dumps
from lab import netns
from lab.daemons import WireGuardGo
from lab.wait import wait_for
from lab.world import Host, Lab

pytestmark = [pytest.mark.lab]

ROOT = Path(__file__).resolve().parents[2]
GW_TUNNEL = "10.99.0.1"
SITE_NAME = "site-a.lab.example"
THIRD_PSK = SecretRef("laptop-c-psk", "psk")


def keypair() -> tuple[str, str]:
    private = subprocess.run(["wg", "genkey"], capture_output=True, check=True).stdout.strip()
    public = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, check=True).stdout.strip()
    return private.decode(), public.decode()


@dataclass
class Peer:
    host: Host
    wg: WireGuardGo
    private: str
    public: str
    tunnel_ip: str


@dataclass
class World:
    lab: Lab
    dir: Path
    gw: WireGuardGo
    gw_private: str
    gw_public: str
    site: Peer
    roamer: Peer
    plan_path: Path
    secrets: Path
    status_path: Path
    log_path: Path
    site_psk: str
    agent: subprocess.Popen[bytes] | None = None
    third: Peer | None = None
    """laptop-c, with a preshared key of its own (``add_third_peer``)."""

    def plan(
        self,
        *peers: Peer,
        listen_port: int = 51820,
        site_host: str | None = None,
        third_psk: SecretRef = THIRD_PSK,
    ) -> Plan:
        wg_peers = []
        for p in peers:
            if p is self.third:
                wg_peers.append(
                    WgPeer(
                        name="laptop-c",
                        public_key=p.public,
                        allowed_ips=(f"{p.tunnel_ip}/32",),
                        preshared_key_ref=third_psk,
                    )
                )
            elif p is self.site:
                wg_peers.append(
                    WgPeer(
                        name="site-a",
                        public_key=p.public,
                        allowed_ips=(f"{p.tunnel_ip}/32", p.host.lans[0]),
                        endpoint=f"{site_host or p.host.addresses[0]}:51820",
                        preshared_key_ref=SecretRef("site-a-psk", "psk"),
                    )
                )
            else:
                wg_peers.append(
                    WgPeer(name="laptop-b", public_key=p.public, allowed_ips=(f"{p.tunnel_ip}/32",))
                )
        return Plan(
            gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant", "gw"),
            type="wireguard",
            wireguard=WireGuard(
                interface="wg0",
                listen_port=listen_port,
                address=f"{GW_TUNNEL}/24",
                private_key_ref=SecretRef("gw-key", "privateKey"),
                peers=tuple(wg_peers),
            ),
        )

    def write_plan(self, plan: Plan) -> None:
        tmp = self.plan_path.with_suffix(".tmp")
        tmp.write_bytes(dumps(plan))
        os.replace(tmp, self.plan_path)

    def write_secret(self, name: str, key: str, value: str) -> None:
        d = self.secrets / name
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.tmp"
        tmp.write_text(value + "\n")
        os.replace(tmp, d / key)

    def status(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {p["name"]: p for p in doc.get("peers", [])}

    def device(self) -> DeviceState:
        return uapi.parse_get(_uapi_get(self.gw.uapi_socket))

    def start_agent(self) -> None:
        argv = netns.ns_exec(
            self.lab.gw.ns,
            sys.executable,
            "-m",
            "agent",
            "--plan",
            str(self.plan_path),
            "--secrets-dir",
            str(self.secrets),
            "--status-file",
            str(self.status_path),
            "--wireguard-uapi-dir",
            str(self.gw.uapi_dir),
            "--poll-interval",
            "0.2",
            "--resync-seconds",
            "5",
            "--log-level",
            "DEBUG",
        )
        with open(self.log_path, "ab") as out:
            self.agent = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out, stdin=subprocess.DEVNULL)

    def stop_agent(self) -> int | None:
        if self.agent is None or self.agent.poll() is not None:
            return self.agent.returncode if self.agent else None
        self.agent.send_signal(signal.SIGTERM)
        try:
            return self.agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait(timeout=5)
            return None


def state_of(world: World, name: str) -> str | None:
    return world.status().get(name, {}).get("state")


def ip_show(world: World, what: str) -> str:
    return world.lab.gw.run("ip", "-4", what, "show", "dev", "wg0").stdout.decode()


def _uapi_get(path: Path) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(str(path))
        s.sendall(b"get=1\n\n")
        data = b""
        while not data.endswith(b"\n\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode()
    finally:
        s.close()


def configure_peer(
    p: Peer, world: World, keyfile: Path, *, gw_public: str | None = None, psk: str | None = None
) -> None:
    """A tenant's side, configured by hand with ``wg`` (no agent there)."""
    keyfile.write_text(p.private + "\n")
    args = ["set", "wg0", "private-key", str(keyfile)]
    if p is world.site:  # the site has a fixed port: the gateway's plan names it as the endpoint
        args += ["listen-port", "51820"]
    args += ["peer", gw_public or world.gw_public, "allowed-ips", "10.99.0.0/24"]
    args += ["endpoint", f"{world.lab.gw.addresses[0]}:51820"]
    psk = world.site_psk if p is world.site else psk
    if psk is not None:
        psk_file = keyfile.with_suffix(".psk")
        psk_file.write_text(psk + "\n")
        args += ["preshared-key", str(psk_file)]
    p.wg.wg(*args)


@pytest.fixture
def world(lab: Lab, tmp_path: Path) -> Iterator[World]:
    site_host, roam_host = lab.add_site(), lab.add_site()
    gw = lab.start_wireguard(lab.gw)
    peers = []
    for host, ip in ((site_host, "10.99.0.2"), (roam_host, "10.99.0.3")):
        daemon = lab.start_wireguard(host)
        priv, pub = keypair()
        netns.addr(host.ns, "wg0", f"{ip}/24")
        netns.run(["ip", "-n", host.ns, "link", "set", "wg0", "up"])
        peers.append(Peer(host, daemon, priv, pub, ip))
    gw_priv, gw_pub = keypair()
    secrets = tmp_path / "secrets"
    w = World(
        lab=lab,
        dir=tmp_path,
        gw=gw,
        gw_private=gw_priv,
        gw_public=gw_pub,
        site=peers[0],
        roamer=peers[1],
        plan_path=tmp_path / "plan.json",
        secrets=secrets,
        status_path=tmp_path / "status" / "status.json",
        log_path=tmp_path / "agent.log",
        site_psk=keypair()[0],
    )
    w.write_secret("gw-key", "privateKey", gw_priv)
    w.write_secret("site-a-psk", "psk", w.site_psk)
    w.write_plan(w.plan(w.site, w.roamer))
    # Name resolution inside the namespace: `ip netns exec` bind-mounts /etc/netns/<ns>/hosts on /etc/hosts.
    etc = Path("/etc/netns") / lab.gw.ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n{site_host.addresses[0]} {SITE_NAME}\n")
    w.start_agent()
    try:
        # The responder (gateway) is configured before the peers start talking (LAB-FACTS).
        wait_for(lambda: len(w.device().peers) == 2, 15.0, "the agent to configure the gateway")
        for p in peers:
            configure_peer(p, w, tmp_path / f"{p.host.role}.key")
        yield w
    finally:
        shutil.rmtree(etc, ignore_errors=True)
        code = w.stop_agent()
        log = w.log_path.read_text(errors="replace") if w.log_path.exists() else ""
        secrets_in_log = [s for s in (gw_priv, w.site_psk, *(p.private for p in peers)) if s in log]
        assert not secrets_in_log, "a secret reached the agent's log"
        assert code == 0, f"agent exit code {code}; log tail:\n{log[-3000:]}"


def test_both_peers_handshake_ping_through_tunnel_and_show_connected(world: World) -> None:
    site, roamer = world.site, world.roamer
    assert site.host.ping(GW_TUNNEL, count=2)
    assert roamer.host.ping(GW_TUNNEL, count=2)
    # The site's LAN (a /32 on its lo) is routed through the device by the agent (wg-quick's route).
    assert world.lab.gw.ping(site.host.lan_host, count=2)
    routes = ip_show(world, "route")
    assert site.host.lans[0] in routes
    status = wait_for(
        lambda: s if (s := world.status()) and all(p["state"] == "Connected" for p in s.values()) else None,
        15.0,
        "both peers Connected",
    )
    assert set(status) == {"site-a", "laptop-b"}
    a = status["site-a"]
    assert a["publicKey"] == site.public
    assert a["allowedIPs"] == ["10.99.0.2/32", site.host.lans[0]]
    assert a["endpoint"] == f"{site.host.addresses[0]}:51820"
    assert a["latestHandshake"].endswith("Z") and a["bytesIn"] > 0 and a["bytesOut"] > 0
    addr = ip_show(world, "addr")
    assert f"{GW_TUNNEL}/24" in addr and "UP" in addr
    text = world.status_path.read_text()
    for secret in (world.gw_private, world.site_psk):
        assert secret not in text


def test_removing_a_peer_stops_its_traffic_and_leaves_the_other_untouched(world: World) -> None:
    site, roamer = world.site, world.roamer
    assert site.host.ping(GW_TUNNEL) and roamer.host.ping(GW_TUNNEL)
    wait_for(
        lambda: len([p for p in world.status().values() if p["state"] == "Connected"]) == 2,
        15.0,
        "both Connected",
    )
    before = {p.public_key: p for p in world.device().peers}[roamer.public]
    started = time.monotonic()
    world.write_plan(world.plan(roamer))
    wait_for(
        lambda: site.public not in {p.public_key for p in world.device().peers},
        5,
        "site-a removed from the device",
        interval=0.02,
    )
    removed_after = time.monotonic() - started
    assert removed_after < 2.0, f"peer removal took {removed_after:.2f}s"
    print(f"peer removal applied {removed_after:.3f}s after the plan file was replaced")
    assert not site.host.ping(GW_TUNNEL, wait=0.5)
    wait_for(lambda: set(world.status()) == {"laptop-b"}, 15.0, "site-a dropped from status")
    after = {p.public_key: p for p in world.device().peers}[roamer.public]
    assert after.last_handshake == before.last_handshake  # the reload did not touch the other peer
    assert after.rx_bytes >= before.rx_bytes and after.tx_bytes >= before.tx_bytes
    routes = ip_show(world, "route")
    assert site.host.lans[0] not in routes  # its LAN route went with it
    assert roamer.host.ping(GW_TUNNEL)


def test_rotating_the_gateway_private_key_is_applied_and_updated_peers_reconnect(world: World) -> None:
    roamer = world.roamer
    assert roamer.host.ping(GW_TUNNEL)
    new_private, new_public = keypair()
    world.write_secret("gw-key", "privateKey", new_private)
    wait_for(lambda: world.device().private_key == new_private, 15.0, "the new private key on the device")
    # The tenant updates its side with the gateway's new public key.
    roamer.wg.wg("set", "wg0", "peer", world.gw_public, "remove")
    keyfile = world.dir / "roamer-rotated.key"
    configure_peer(roamer, world, keyfile, gw_public=new_public)
    assert wait_for(lambda: roamer.host.ping(GW_TUNNEL), 10, "ping over the rotated key")
    wait_for(
        lambda: world.status().get("laptop-b", {}).get("state") == "Connected",
        15.0,
        "laptop-b Connected again",
    )
    log = world.log_path.read_text()
    assert new_private not in log


def test_killing_and_restarting_wireguard_go_is_repaired_by_the_agent(world: World) -> None:
    site = world.site
    assert world.lab.gw.ping(site.host.lan_host)
    first_pid = world.gw.pid
    world.gw.kill()
    world.gw.start()
    assert world.gw.pid != first_pid
    wait_for(
        lambda: len(world.device().peers) == 2 and world.device().listen_port == 51820,
        15.0,
        "config restored",
    )
    wait_for(
        lambda: (
            f"{GW_TUNNEL}/24" in world.lab.gw.run("ip", "-4", "addr", "show", "dev", "wg0").stdout.decode()
            and site.host.lans[0]
            in world.lab.gw.run("ip", "-4", "route", "show", "dev", "wg0").stdout.decode()
        ),
        15.0,
        "address and route restored",
    )
    # The gateway initiates to the site's planned endpoint: a fresh handshake, traffic flows again.
    assert wait_for(lambda: world.lab.gw.ping(site.host.lan_host), 10, "ping through the restored tunnel")
    assert world.agent is not None and world.agent.poll() is None  # no restart of the agent needed
    wait_for(lambda: state_of(world, "site-a") == "Connected", 15.0, "site-a Connected")


def test_bad_input_is_named_and_the_last_good_config_keeps_running(world: World) -> None:
    roamer = world.roamer
    assert roamer.host.ping(GW_TUNNEL)
    world.write_secret("gw-key", "privateKey", "bm90LWEta2V5")  # valid base64, but 9 bytes
    wait_for(
        lambda: (
            "wireguard.config.rejected error='secret gw-key key privateKey: must decode to 32 bytes, got 9'"
            in world.log_path.read_text()
        ),
        15.0,
        "the rejection in the log",
    )
    world.plan_path.write_text('{"version": "plan.vpn.bnerd.net/v1", "type": "wireguard"')  # truncated
    wait_for(lambda: "plan.rejected" in world.log_path.read_text(), 15.0, "the plan rejection in the log")
    time.sleep(0.5)  # the scenario: a few more agent steps, which must leave the device as it was
    device = world.device()
    assert device.private_key == world.gw_private and len(device.peers) == 2
    assert roamer.host.ping(GW_TUNNEL)  # still serving with the last good configuration
    assert world.agent is not None and world.agent.poll() is None
    # Fixing the input applies it.
    world.write_secret("gw-key", "privateKey", world.gw_private)
    world.write_plan(world.plan(roamer))
    wait_for(
        lambda: [p.public_key for p in world.device().peers] == [roamer.public],
        15.0,
        "the fixed plan applied",
    )


def test_a_hostname_endpoint_is_resolved_inside_the_pods_namespace(world: World) -> None:
    site = world.site
    # The device learnt the site's address from the handshake already; make sure the plan, not roaming,
    # decides: point the device elsewhere first, then let the agent put the resolved address back.
    world.write_plan(world.plan(site, world.roamer, site_host="192.0.2.66"))
    wait_for(lambda: _endpoint(world, site.public) == "192.0.2.66:51820", 15.0, "literal endpoint applied")
    world.write_plan(world.plan(site, world.roamer, site_host=SITE_NAME))
    wait_for(
        lambda: _endpoint(world, site.public) == f"{site.host.addresses[0]}:51820",
        15.0,
        "resolved endpoint applied",
    )
    assert wait_for(
        lambda: world.lab.gw.ping(site.host.lan_host), 10, "ping the site LAN via the resolved endpoint"
    )
    assert f"wireguard.endpoint.resolved host={SITE_NAME} address={site.host.addresses[0]}" in (
        world.log_path.read_text()
    )


def _endpoint(world: World, public: str) -> str | None:
    return {p.public_key: p.endpoint for p in world.device().peers}.get(public)


def _pinger(p: Peer) -> Callable[[], bool]:
    return lambda: p.host.ping(GW_TUNNEL)


def add_third_peer(world: World) -> tuple[Peer, str]:
    """laptop-c: its own namespace and wireguard-go, a preshared key in Secret laptop-c-psk; the plan
    then holds three peers. Returns the peer and its preshared key."""
    host = world.lab.add_site()
    daemon = world.lab.start_wireguard(host)
    priv, pub = keypair()
    netns.addr(host.ns, "wg0", "10.99.0.4/24")
    netns.run(["ip", "-n", host.ns, "link", "set", "wg0", "up"])
    third = world.third = Peer(host, daemon, priv, pub, "10.99.0.4")
    psk = keypair()[0]
    world.write_secret("laptop-c-psk", "psk", psk)
    world.write_plan(world.plan(world.site, world.roamer, third))
    wait_for(lambda: len(world.device().peers) == 3, 15.0, "three peers on the device")
    configure_peer(third, world, world.dir / "laptop-c.key", psk=psk)
    return third, psk


def test_a_peer_whose_preshared_key_is_missing_is_left_out_and_the_rest_of_the_plan_is_applied(
    world: World,
) -> None:
    """One plan change removes laptop-b AND points laptop-c at a preshared-key Secret that does not exist.
    The removal takes effect, site-a keeps its session and its traffic, and laptop-c is removed from the
    device (it must not keep running on its old key) and reported with the reason; once the Secret
    appears, laptop-c is configured again."""
    site, roamer = world.site, world.roamer
    third, psk = add_third_peer(world)
    for p in (site, roamer, third):
        assert wait_for(_pinger(p), 10, f"{p.host.role} through the tunnel")
    before = {p.public_key: p for p in world.device().peers}[site.public]

    missing = SecretRef("laptop-c-psk-rotated", "psk")  # the plan names it; it was never created
    world.write_plan(world.plan(site, third, third_psk=missing))
    wait_for(
        lambda: roamer.public not in {p.public_key for p in world.device().peers},
        5,
        "laptop-b removed from the device",
        interval=0.05,
    )
    wait_for(
        lambda: third.public not in {p.public_key for p in world.device().peers},
        5,
        "laptop-c removed from the device",
        interval=0.05,
    )
    device = {p.public_key: p for p in world.device().peers}
    assert set(device) == {site.public}, "site-a alone is configured"
    assert device[site.public].last_handshake == before.last_handshake, "site-a's session was not touched"
    assert device[site.public].preshared_key == world.site_psk
    assert site.host.ping(GW_TUNNEL, count=2), "site-a still passes traffic"
    assert world.lab.gw.ping(site.host.lan_host), "and its LAN route is still there"
    assert not roamer.host.ping(GW_TUNNEL, wait=0.5) and not third.host.ping(GW_TUNNEL, wait=0.5)

    status = wait_for(
        lambda: (s := world.status()).get("laptop-c", {}).get("lastError") and s, 15.0, "laptop-c reported"
    )
    assert set(status) == {"site-a", "laptop-c"}
    assert status["laptop-c"]["state"] == "Failed"
    assert status["laptop-c"]["lastError"] == (
        "left out: preshared key: secret laptop-c-psk-rotated key psk: not mounted"
    )
    assert status["site-a"]["state"] == "Connected" and "lastError" not in status["site-a"]
    assert "wireguard.peer.left_out name=laptop-c" in world.log_path.read_text()

    world.write_secret("laptop-c-psk-rotated", "psk", psk)
    wait_for(
        lambda: third.public in {p.public_key for p in world.device().peers},
        15.0,
        "laptop-c configured again",
    )
    # laptop-c still holds the session the gateway dropped: its data goes unanswered until WireGuard's
    # own timers make it handshake again (keepalive 10 s + rekey 5 s after its last answered packet).
    assert wait_for(lambda: third.host.ping(GW_TUNNEL), 30, "laptop-c through the tunnel")
    wait_for(lambda: state_of(world, "laptop-c") == "Connected", 15.0, "laptop-c Connected")
    assert "lastError" not in world.status()["laptop-c"]
    assert psk not in world.log_path.read_text() and psk not in world.status_path.read_text()
