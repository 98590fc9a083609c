"""Desired device vs. what the device reports -> the minimal update (pure: no I/O, no clock).

The rule is ``wg syncconf``'s: peers not in the plan are removed, new peers are added, and a peer that
is on the device already gets only the fields that differ (``update_only``), so an unchanged peer is not
touched at all and its handshake, session and counters survive a plan reload. A peer without a planned
endpoint roams: whatever endpoint the device learnt is left alone. Allowed IPs are compared as sets of
normalised networks (``10.0.0.1/24`` and ``10.0.0.0/24`` are the same route for WireGuard).
"""

from __future__ import annotations

import dataclasses
import ipaddress

from gwkit.wireguard.model import (
    ZERO_KEY,
    DesiredDevice,
    DesiredPeer,
    DeviceState,
    DeviceUpdate,
    PeerState,
    PeerUpdate,
    clamped,
)


def normalise_ip(cidr: str) -> str:
    """``10.1.2.3/24`` -> ``10.1.2.0/24``; a bare address gets its full prefix."""
    return str(ipaddress.ip_network(cidr.strip(), strict=False))


def _ips(ips: tuple[str, ...]) -> frozenset[str]:
    return frozenset(normalise_ip(a) for a in ips)


def _peer_update(want: DesiredPeer, have: PeerState | None) -> PeerUpdate | None:
    if have is None:
        return PeerUpdate(
            public_key=want.public_key,
            new=True,
            endpoint=want.endpoint,
            preshared_key=want.preshared_key,
            persistent_keepalive=want.persistent_keepalive or None,
            allowed_ips=tuple(normalise_ip(a) for a in want.allowed_ips),
        )
    endpoint = want.endpoint if want.endpoint is not None and want.endpoint != have.endpoint else None
    psk: str | None = None
    if want.preshared_key is not None and want.preshared_key != have.preshared_key:
        psk = want.preshared_key
    elif want.preshared_key is None and (have.has_preshared_key or have.preshared_key is not None):
        psk = ZERO_KEY
    keepalive = want.persistent_keepalive if want.persistent_keepalive != have.persistent_keepalive else None
    same_ips = frozenset(want.allowed_ips) == frozenset(have.allowed_ips)  # fast path: same spelling
    allowed = (
        tuple(normalise_ip(a) for a in want.allowed_ips)
        if not same_ips and _ips(want.allowed_ips) != _ips(have.allowed_ips)
        else None
    )
    if endpoint is None and psk is None and keepalive is None and allowed is None:
        return None
    return PeerUpdate(
        public_key=want.public_key,
        endpoint=endpoint,
        preshared_key=psk,
        persistent_keepalive=keepalive,
        allowed_ips=allowed,
    )


def diff(want: DesiredDevice, have: DeviceState) -> DeviceUpdate:
    """The minimal update. Removals come first, so an allowed IP moving between peers is never held by
    two peers in one request (WireGuard would silently move it to whichever was written last)."""
    current = {p.public_key: p for p in have.peers}
    wanted = {p.public_key for p in want.peers}
    removals = [PeerUpdate(public_key=k, remove=True) for k in current if k not in wanted]
    changes = [u for p in want.peers if (u := _peer_update(p, current.get(p.public_key))) is not None]
    private_key = want.private_key if clamped(want.private_key) != clamped(have.private_key) else None
    listen_port = want.listen_port if want.listen_port != have.listen_port else None
    fwmark = want.fwmark if want.fwmark != have.fwmark else None
    return DeviceUpdate(
        private_key=private_key, listen_port=listen_port, peers=(*removals, *changes), fwmark=fwmark
    )


KICK_KEEPALIVE = 1
"""The keepalive a site peer without one gets for a moment to be kicked (``handshake_kick``): the next step's
``diff`` puts the plan's 0 back."""


def handshake_kick(want: DesiredDevice) -> DeviceUpdate:
    """Make every site peer (one with a planned endpoint) handshake now (pure): WireGuard handshakes only when
    it has something to send, and a promoted standby must not wait for traffic. Setting a peer's persistent
    keepalive from 0 to a value sends a keepalive at once on an up device (wireguard-go's and the kernel's
    ``set``), which starts the handshake; so each site peer's keepalive goes to 0 and then to its planned
    value (``KICK_KEEPALIVE`` when that is 0), in one request. Roaming peers are left alone: nowhere to
    send to."""
    peers: list[PeerUpdate] = []
    for p in want.peers:
        if p.endpoint is None:
            continue
        peers.append(PeerUpdate(public_key=p.public_key, persistent_keepalive=0))
        peers.append(
            PeerUpdate(public_key=p.public_key, persistent_keepalive=p.persistent_keepalive or KICK_KEEPALIVE)
        )
    return DeviceUpdate(peers=tuple(peers))


def for_role(want: DesiredDevice, *, standby: bool) -> DesiredDevice:
    """The device as a pod in that HA role runs it (pure). Active: as planned. Standby: every peer with
    persistent keepalive 0, so nothing on the device makes it send (no traffic reaches it: its link is
    down, and with it its routes). Measured here: wireguard-go 0.0.20220316 does not follow its TUN's link
    state (it keeps its socket, timers and sessions with the link down), so the link alone is not
    silence; the kernel module is (ndo_stop closes its socket)."""
    if not standby:
        return want
    return dataclasses.replace(
        want, peers=tuple(dataclasses.replace(p, persistent_keepalive=0) for p in want.peers)
    )


def forget_sessions(have: DeviceState) -> DeviceUpdate:
    """Remove every peer from the device (pure), which drops its sessions and handshake state: a fenced
    pod must keep no session a peer could go on using (WireGuard's equivalent of terminating the SAs).
    The next ``diff`` puts the peers back as planned, with no session."""
    return DeviceUpdate(peers=tuple(PeerUpdate(public_key=p.public_key, remove=True) for p in have.peers))
