"""status.peers as a pure function of plan, device state and an injected clock."""

from __future__ import annotations

import base64

import pytest

from agent.wireguard.status import (
    CONNECTED_WITHIN,
    peer_state,
    peers_status,
    peers_summary,
    rfc3339,
    without_counters,
)
from gwkit.wireguard.model import DeviceState, PeerState
from gwplan import WgPeer

A = base64.b64encode(b"a" * 32).decode()
B = base64.b64encode(b"b" * 32).decode()
NOW = 1_800_000_000.0
PEERS = (
    WgPeer("site-a", A, ("10.99.0.2/32", "203.0.113.0/28"), "198.51.100.2:51820"),
    WgPeer("laptop-b", B, ("10.99.0.3/32",)),
)


@pytest.mark.parametrize(
    ("handshake", "state"),
    [
        (None, "NeverConnected"),
        (NOW - 5, "Connected"),
        (NOW - CONNECTED_WITHIN + 0.5, "Connected"),
        (NOW - CONNECTED_WITHIN, "Stale"),
        (NOW - 3600, "Stale"),
    ],
)
def test_peer_state(handshake: float | None, state: str) -> None:
    assert peer_state(handshake, NOW) == state


def test_rfc3339_is_utc_seconds() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00Z"
    assert rfc3339(1_800_000_000.9) == "2027-01-15T08:00:00Z"


def test_entries_follow_the_plan_and_the_device() -> None:
    state = DeviceState(
        peers=(
            PeerState(
                B,
                endpoint="198.51.100.6:40000",
                allowed_ips=("10.99.0.3/32",),
                last_handshake=NOW - 10,
                rx_bytes=1000,
                tx_bytes=2000,
                preshared_key=base64.b64encode(b"s" * 32).decode(),
            ),
        )
    )
    out = peers_status(PEERS, state, NOW)
    assert out == [
        {
            "name": "site-a",
            "publicKey": A,
            "allowedIPs": ["10.99.0.2/32", "203.0.113.0/28"],
            "bytesIn": 0,
            "bytesOut": 0,
            "state": "NeverConnected",
            "endpoint": "198.51.100.2:51820",
        },
        {
            "name": "laptop-b",
            "publicKey": B,
            "allowedIPs": ["10.99.0.3/32"],
            "bytesIn": 1000,
            "bytesOut": 2000,
            "state": "Connected",
            "endpoint": "198.51.100.6:40000",
            "latestHandshake": rfc3339(NOW - 10),
        },
    ]
    assert "latestHandshake" not in out[0]
    assert base64.b64encode(b"s" * 32).decode() not in repr(out)


def test_roaming_peer_never_seen_has_no_endpoint() -> None:
    assert "endpoint" not in peers_status(PEERS[1:], None, NOW)[0]


def test_unavailable_device_reports_no_peer_connected_but_keeps_the_last_handshake() -> None:
    state = DeviceState(peers=(PeerState(A, last_handshake=NOW - 10),))
    entry = peers_status(PEERS[:1], state, NOW, available=False)[0]
    assert entry["state"] == "Stale" and entry["latestHandshake"] == rfc3339(NOW - 10)


def test_non_canonical_public_key_in_the_plan_still_matches() -> None:
    padded = " " + A + "\n"
    state = DeviceState(peers=(PeerState(A, last_handshake=NOW - 1),))
    assert peers_status((WgPeer("x", padded, ()),), state, NOW)[0]["state"] == "Connected"


def test_without_counters_drops_only_the_counters() -> None:
    out = peers_status(PEERS, None, NOW)
    assert without_counters(out)[0] == {k: v for k, v in out[0].items() if not k.startswith("bytes")}


def test_a_peer_left_out_is_failed_with_its_reason_and_the_others_as_usual() -> None:
    out = peers_status(
        PEERS, DeviceState(), NOW, left_out={"site-a": "preshared key: secret a key psk: not mounted"}
    )
    assert out[0] == {
        "name": "site-a",
        "publicKey": A,
        "allowedIPs": ["10.99.0.2/32", "203.0.113.0/28"],
        "endpoint": "198.51.100.2:51820",
        "bytesIn": 0,
        "bytesOut": 0,
        "state": "Failed",
        "lastError": "left out: preshared key: secret a key psk: not mounted",
    }
    assert out[1]["state"] == "NeverConnected" and "lastError" not in out[1]


def test_the_summary_counts_connected_peers() -> None:
    peers = [{"state": "Connected"}, {"state": "Stale"}, {"state": "Connected"}, {"state": "Failed"}]
    assert peers_summary(peers) == "2/4 up"
    assert peers_summary([]) == "0/0 up"
