"""diff.diff: desired device vs. device state -> the minimal update (pure, table-driven)."""

from __future__ import annotations

import base64

import pytest

from agent.wireguard.diff import diff, normalise_ip
from gwkit.wireguard.model import ZERO_KEY, DesiredDevice, DesiredPeer, DeviceState, PeerState, PeerUpdate


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


PRIV, A, B, C, PSK, PSK2 = key(1), key(2), key(3), key(4), key(5), key(6)


def device(*peers: PeerState, port: int = 51820, private: str | None = PRIV) -> DeviceState:
    return DeviceState(
        listen_port=port, has_private_key=private is not None, peers=peers, private_key=private
    )


def want(*peers: DesiredPeer, port: int = 51820, private: str = PRIV) -> DesiredDevice:
    return DesiredDevice(private_key=private, listen_port=port, peers=peers)


SAME_A = PeerState(A, endpoint="198.51.100.2:51820", allowed_ips=("10.99.0.2/32",), last_handshake=5.0)
WANT_A = DesiredPeer(A, ("10.99.0.2/32",), endpoint="198.51.100.2:51820")


@pytest.mark.parametrize(
    ("desired", "state", "expected_peers"),
    [
        pytest.param(want(WANT_A), device(SAME_A), (), id="unchanged-peer-untouched"),
        pytest.param(
            want(WANT_A, DesiredPeer(B, ("10.99.0.3/32",))),
            device(SAME_A),
            (PeerUpdate(B, new=True, allowed_ips=("10.99.0.3/32",)),),
            id="add-one-leave-other",
        ),
        pytest.param(want(), device(SAME_A), (PeerUpdate(A, remove=True),), id="remove"),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32", "203.0.113.0/28"), endpoint="198.51.100.2:51820")),
            device(SAME_A),
            (PeerUpdate(A, allowed_ips=("10.99.0.2/32", "203.0.113.0/28")),),
            id="allowed-ips-follow-plan",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2",), endpoint="198.51.100.2:51820")),
            device(SAME_A),
            (),
            id="bare-address-is-its-/32",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32",))),
            device(SAME_A),
            (),
            id="roaming-peer-keeps-learnt-endpoint",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32",), endpoint="198.51.100.9:51820")),
            device(SAME_A),
            (PeerUpdate(A, endpoint="198.51.100.9:51820"),),
            id="endpoint-changed-by-dns",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32",), endpoint="198.51.100.2:51820", preshared_key=PSK)),
            device(SAME_A),
            (PeerUpdate(A, preshared_key=PSK),),
            id="psk-added",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32",), endpoint="198.51.100.2:51820", preshared_key=PSK2)),
            device(
                PeerState(
                    A, "198.51.100.2:51820", ("10.99.0.2/32",), has_preshared_key=True, preshared_key=PSK
                )
            ),
            (PeerUpdate(A, preshared_key=PSK2),),
            id="psk-rotated",
        ),
        pytest.param(
            want(WANT_A),
            device(
                PeerState(
                    A, "198.51.100.2:51820", ("10.99.0.2/32",), has_preshared_key=True, preshared_key=PSK
                )
            ),
            (PeerUpdate(A, preshared_key=ZERO_KEY),),
            id="psk-removed-with-zero-key",
        ),
        pytest.param(
            want(DesiredPeer(A, ("10.99.0.2/32",), endpoint="198.51.100.2:51820", persistent_keepalive=25)),
            device(SAME_A),
            (PeerUpdate(A, persistent_keepalive=25),),
            id="keepalive",
        ),
        pytest.param(
            want(DesiredPeer(B, ("10.99.0.2/32",))),
            device(SAME_A),
            (PeerUpdate(A, remove=True), PeerUpdate(B, new=True, allowed_ips=("10.99.0.2/32",))),
            id="ip-moves-between-peers-removal-first",
        ),
    ],
)
def test_peer_updates(
    desired: DesiredDevice, state: DeviceState, expected_peers: tuple[PeerUpdate, ...]
) -> None:
    update = diff(desired, state)
    assert update.peers == expected_peers
    assert update.private_key is None and update.listen_port is None


def test_empty_device_after_daemon_restart_gets_everything() -> None:
    desired = want(
        DesiredPeer(A, ("10.99.0.2/32",), "198.51.100.2:51820", PSK, 25), DesiredPeer(B, ("10.99.0.3/32",))
    )
    update = diff(desired, DeviceState(listen_port=40000))
    assert update.private_key == PRIV and update.listen_port == 51820
    assert [p.public_key for p in update.peers] == [A, B] and all(p.new for p in update.peers)
    assert update.peers[0] == PeerUpdate(
        A,
        new=True,
        endpoint="198.51.100.2:51820",
        preshared_key=PSK,
        persistent_keepalive=25,
        allowed_ips=("10.99.0.2/32",),
    )


def test_private_key_rotation_and_port_change_only_touch_the_device() -> None:
    update = diff(want(WANT_A, private=C, port=51821), device(SAME_A))
    assert update.private_key == C and update.listen_port == 51821 and update.peers == ()


def test_unknown_peers_on_the_device_are_removed() -> None:
    stray = PeerState(C, allowed_ips=("10.99.0.9/32",))
    update = diff(want(WANT_A), device(SAME_A, stray))
    assert update.peers == (PeerUpdate(C, remove=True),)


def test_secrets_stay_out_of_repr_and_summary() -> None:
    update = diff(want(DesiredPeer(A, ("10.99.0.2/32",), preshared_key=PSK), private=C), DeviceState())
    text = repr(update) + update.summary() + repr(want(private=C))
    assert C not in text and PSK not in text
    assert "added=1" in update.summary() and "private_key_changed=True" in update.summary()


def test_normalise_ip() -> None:
    assert normalise_ip("10.1.2.3/24") == "10.1.2.0/24"
    assert normalise_ip(" 10.1.2.3 ") == "10.1.2.3/32"
    with pytest.raises(ValueError):
        normalise_ip("10.1.2.300/24")


def test_an_unclamped_private_key_matches_the_clamped_key_the_device_reports() -> None:
    raw = bytes([0xFF] * 32)
    reported = base64.b64encode(bytes([0xF8]) + bytes([0xFF] * 30) + bytes([0x7F])).decode()
    assert diff(want(private=base64.b64encode(raw).decode()), device(private=reported)).empty


def test_the_device_fwmark_is_set_when_it_differs_and_only_then() -> None:
    """In a gateway pod the device marks its packets with the NIC2 reply bit (init-nat routes them out
    through NIC2); a device that already has it gets no write."""
    from gwkit.wireguard.uapi import update_lines

    want = DesiredDevice(private_key=PRIV, listen_port=51820, fwmark=0x10000000)
    update = diff(want, device())
    assert update.fwmark == 0x10000000 and ("fwmark", 0x10000000) in update_lines(update)
    have = DeviceState(listen_port=51820, fwmark=0x10000000, has_private_key=True, private_key=PRIV)
    assert diff(want, have).empty
