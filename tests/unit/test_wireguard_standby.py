"""The WireGuard backend's HA decisions (pure): what a standby runs (``diff.for_role``), how a fenced pod
drops its sessions (``diff.forget_sessions``), how a promoted one makes its site peers handshake at once
(``diff.handshake_kick``), and how a standby's peers are reported (``status.peers_status``)."""

from __future__ import annotations

from agent.wireguard.diff import KICK_KEEPALIVE, diff, for_role, forget_sessions, handshake_kick
from agent.wireguard.status import STANDBY_REASON, peers_status
from gwkit.wireguard.model import DesiredDevice, DesiredPeer, DeviceState, PeerState, PeerUpdate
from gwplan import WgPeer

SITE, ROAMER, QUIET = "c2l0ZS1rZXk=", "cm9hbWVyLWtleQ==", "cXVpZXQta2V5"
DEVICE = DesiredDevice(
    private_key="cHJpdmF0ZQ==",
    listen_port=51820,
    peers=(
        DesiredPeer(SITE, ("10.1.0.0/24",), "192.0.2.10:51820", persistent_keepalive=25),
        DesiredPeer(ROAMER, ("10.99.0.3/32",)),
        DesiredPeer(QUIET, ("10.2.0.0/24",), "192.0.2.11:51820"),
    ),
)


def test_a_standby_runs_every_peer_without_keepalive_and_changes_nothing_else() -> None:
    standby = for_role(DEVICE, standby=True)
    assert [p.persistent_keepalive for p in standby.peers] == [0, 0, 0]
    assert [(p.public_key, p.endpoint, p.allowed_ips) for p in standby.peers] == [
        (p.public_key, p.endpoint, p.allowed_ips) for p in DEVICE.peers
    ], "keys, endpoints and allowed IPs stay configured"
    assert standby.listen_port == 51820 and standby.private_key == DEVICE.private_key
    assert for_role(DEVICE, standby=False) is DEVICE


def test_the_role_change_is_only_the_keepalives() -> None:
    on_device = DeviceState(
        listen_port=51820,
        has_private_key=True,
        private_key=DEVICE.private_key,
        peers=tuple(
            PeerState(p.public_key, p.endpoint, p.allowed_ips, persistent_keepalive=p.persistent_keepalive)
            for p in DEVICE.peers
        ),
    )
    update = diff(for_role(DEVICE, standby=True), on_device)
    assert update.peers == (PeerUpdate(SITE, persistent_keepalive=0),)


def test_a_fence_removes_every_peer_and_so_its_sessions() -> None:
    have = DeviceState(peers=(PeerState(SITE), PeerState(ROAMER)))
    assert forget_sessions(have).peers == (PeerUpdate(SITE, remove=True), PeerUpdate(ROAMER, remove=True))
    assert forget_sessions(DeviceState()).empty


def test_the_kick_turns_each_site_peers_keepalive_off_and_on_and_leaves_roamers_alone() -> None:
    kick = handshake_kick(DEVICE)
    assert kick.peers == (
        PeerUpdate(SITE, persistent_keepalive=0),
        PeerUpdate(SITE, persistent_keepalive=25),
        PeerUpdate(QUIET, persistent_keepalive=0),
        PeerUpdate(QUIET, persistent_keepalive=KICK_KEEPALIVE),
    )
    assert kick.private_key is None and kick.listen_port is None and not any(p.new for p in kick.peers)


def test_a_standby_reports_its_peers_standby_but_a_failed_one_failed() -> None:
    peers = (WgPeer("a", SITE, ("10.1.0.0/24",)), WgPeer("b", ROAMER, ("10.99.0.3/32",)))
    got = peers_status(
        peers, DeviceState(), 1000.0, left_out={"b": "its preshared key is missing"}, standby=True
    )
    assert [(p["state"], p["lastError"]) for p in got] == [
        ("Standby", STANDBY_REASON),
        ("Failed", "left out: its preshared key is missing"),
    ]
    active = peers_status(peers, DeviceState(), 1000.0)
    assert [p["state"] for p in active] == ["NeverConnected", "NeverConnected"]
