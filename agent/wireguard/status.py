"""status.peers from the plan and the device state (pure: the clock is an argument).

One entry per planned peer (VPNPeer), in plan order::

    {name, publicKey, endpoint, latestHandshake (RFC 3339 UTC, absent if never), bytesIn, bytesOut,
     allowedIPs, state: Connected | Stale | NeverConnected | Failed | Standby, lastError (with Failed
     and Standby)}

"Standby": the pod is its gateway's HA standby (docs/ha.md): the device is configured but down, the
active pod serves the peer; ``lastError`` says so (a Failed peer stays Failed: its key material is
missing whatever the role).

"Failed": the agent left the peer off the device because its key material is missing or unusable
(config.Desired.left_out); ``lastError`` says which Secret and why, as an IPsec tunnel's does.

"Connected" means the latest handshake is younger than 180 s: WireGuard re-handshakes every 120 s while
traffic flows (REKEY_AFTER_TIME) and a session is dead after 180 s (REJECT_AFTER_TIME). ``bytesIn`` is
what the gateway received from the peer (rx), ``bytesOut`` what it sent (tx). ``endpoint`` is where the
device last saw the peer (roaming), else the planned endpoint. No key other than the public key appears.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gwkit.wireguard.model import DeviceState, PeerState
from gwplan import WgPeer

CONNECTED_WITHIN = 180.0
CONNECTED, STALE, NEVER, FAILED, STANDBY = "Connected", "Stale", "NeverConnected", "Failed", "Standby"
STANDBY_REASON = (
    "standby: this pod is its gateway's HA standby; the active pod serves the peer (here the device is "
    "configured and down)"
)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def peer_state(last_handshake: float | None, now: float) -> str:
    if last_handshake is None:
        return NEVER
    return CONNECTED if now - last_handshake < CONNECTED_WITHIN else STALE


def _canonical(key: str) -> str:
    try:
        return base64.b64encode(base64.b64decode(key.strip(), validate=True)).decode()
    except (binascii.Error, ValueError):
        return key


def peers_status(
    peers: Sequence[WgPeer],
    state: DeviceState | None,
    now: float,
    *,
    available: bool = True,
    left_out: Mapping[str, str] | None = None,
    standby: bool = False,
) -> list[dict[str, Any]]:
    """``state`` is the device's latest reading (None: never read). While the device is unavailable
    (``available=False``: daemon dead, interface gone) the last reading is kept for handshake time and
    counters, but no peer is reported Connected. ``left_out``: peer name -> why the agent did not put it
    on the device (reported Failed with that reason). ``standby``: every other peer is Standby."""
    left_out = left_out or {}
    on_device: Mapping[str, PeerState] = {p.public_key: p for p in state.peers} if state else {}
    out = []
    for p in peers:
        have = on_device.get(_canonical(p.public_key))
        entry: dict[str, Any] = {
            "name": p.name,
            "publicKey": p.public_key,
            "allowedIPs": list(p.allowed_ips),
            "bytesIn": have.rx_bytes if have else 0,
            "bytesOut": have.tx_bytes if have else 0,
            "state": peer_state(have.last_handshake if have else None, now),
        }
        if not available and entry["state"] == CONNECTED:
            entry["state"] = STALE
        if p.name in left_out:
            entry["state"] = FAILED
            entry["lastError"] = f"left out: {left_out[p.name]}"
        elif standby:
            entry["state"] = STANDBY
            entry["lastError"] = STANDBY_REASON
        endpoint = (have.endpoint if have else None) or p.endpoint
        if endpoint:
            entry["endpoint"] = endpoint
        if have is not None and have.last_handshake is not None:
            entry["latestHandshake"] = rfc3339(have.last_handshake)
        out.append(entry)
    return out


def without_counters(peers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The part of status.peers worth an immediate write; byte counters move with every packet and are
    written with the next significant change or the periodic resync."""
    return [{k: v for k, v in p.items() if k not in ("bytesIn", "bytesOut")} for p in peers]


def peers_summary(peers: Sequence[Mapping[str, Any]]) -> str:
    """``status.tunnelsSummary``: how many planned peers are Connected, e.g. ``3/4 up`` (the VPNGateway's
    Tunnels column, as the IPsec agent says it of its tunnels)."""
    up = sum(1 for p in peers if p.get("state") == CONNECTED)
    return f"{up}/{len(peers)} up"
