"""exporter.uapifast (pure): the one-regex UAPI reader gives exactly the generic parser's view, falls
back (None) on any other reply shape, and never captures a private or preshared key."""

from __future__ import annotations

import base64

import pytest

from exporter.collector import Snapshot, WireGuardSnapshot, families
from exporter.family import Renderer
from exporter.uapifast import KeyCache, ReplyError, fast_view
from exporter.wireguard import interface_view
from gwkit.wireguard.uapi import parse_get

PRIV = bytes(range(32)).hex()
PSK = bytes(range(64, 96)).hex()
K1, K2, K3 = (bytes([i]) * 32 for i in (1, 2, 3))


def reply(*peers: str, errno: int = 0) -> str:
    return f"private_key={PRIV}\nlisten_port=51820\n" + "".join(peers) + f"errno={errno}\n\n"


def peer(
    key: bytes,
    *,
    endpoint: str | None = None,
    hs: tuple[int, int] = (0, 0),
    rx: int = 0,
    tx: int = 0,
    psk: str = "0" * 64,
) -> str:
    ep = f"endpoint={endpoint}\n" if endpoint else ""
    return (
        f"public_key={key.hex()}\npreshared_key={psk}\nprotocol_version=1\n{ep}"
        f"last_handshake_time_sec={hs[0]}\nlast_handshake_time_nsec={hs[1]}\ntx_bytes={tx}\nrx_bytes={rx}\n"
        "persistent_keepalive_interval=25\nallowed_ip=10.9.0.2/32\nallowed_ip=10.9.1.0/24\n"
    )


NAMES = {base64.b64encode(K1).decode(): "alice", base64.b64encode(bytes([9]) * 32).decode(): "zed"}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(reply(), id="no-peers"),
        pytest.param(
            reply(
                peer(K1, endpoint="192.0.2.1:51820", hs=(1790000000, 250000000), rx=10, tx=20, psk=PSK),
                peer(K2),
                peer(K3, endpoint="[2001:db8::1]:4500", hs=(1790000001, 0), rx=1),
            ),
            id="mixed",
        ),
    ],
)
def test_fast_view_equals_the_generic_parser(text: str) -> None:
    fast = fast_view("wg0", text, NAMES, KeyCache())
    generic = interface_view("wg0", parse_get(text), NAMES, backend="uapi")
    assert fast is not None
    assert (fast.up, fast.listen_port, fast.missing) == (generic.up, generic.listen_port, generic.missing)
    for column in ("peer", "public_key", "endpoint", "handshakes", "last_handshake"):
        assert list(getattr(fast.peers, column)) == list(getattr(generic.peers, column)), column
    for column in ("rx_bytes", "tx_bytes"):  # the fast path keeps the daemon's decimal text
        assert list(map(int, getattr(fast.peers, column))) == list(getattr(generic.peers, column)), column
    assert "zed" in fast.missing


def test_an_unexpected_shape_falls_back() -> None:
    odd = (
        reply(peer(K1))
        .replace("protocol_version=1\nlast_handshake", "last_handshake")
        .replace("tx_bytes=0\nrx_bytes=0", "rx_bytes=0\ntx_bytes=0")
    )
    assert fast_view("wg0", odd, {}, KeyCache()) is None
    assert len(parse_get(odd).peers) == 1, "the generic parser still reads it"


def test_errno_is_an_error() -> None:
    with pytest.raises(ReplyError, match="errno=1"):
        fast_view("wg0", reply(errno=1), {}, KeyCache())
    with pytest.raises(ReplyError, match="truncated"):
        fast_view("wg0", reply(peer(K1))[:-12], {}, KeyCache())


def test_no_secret_is_captured() -> None:
    view = fast_view("wg0", reply(peer(K1, psk=PSK)), {}, KeyCache())
    assert view is not None
    dump = repr(view)
    for secret in (PRIV, PSK):
        assert secret not in dump and base64.b64encode(bytes.fromhex(secret)).decode() not in dump


def test_fast_view_renders_byte_for_byte_like_the_generic_view() -> None:
    """The decimal text kept by the fast path is exposed exactly as the generic path's ints."""
    text = reply(
        peer(K1, endpoint="192.0.2.1:51820", hs=(1790000000, 250000000), rx=10**12, tx=20),
        peer(K2, rx=7),
    )
    fast = fast_view("wg0", text, NAMES, KeyCache())
    assert fast is not None
    generic = interface_view("wg0", parse_get(text), NAMES, backend="uapi")
    for om in (False, True):
        rendered = [
            Renderer().render(families(Snapshot(wireguard=WireGuardSnapshot(0.1, (v,)))), openmetrics=om)
            for v in (fast, generic)
        ]
        assert rendered[0] == rendered[1]
        line = b'wireguard_peer_receive_bytes_total{interface="wg0",peer="alice"} 1000000000000\n'
        assert line in rendered[0]


def test_a_key_that_is_not_hex_falls_back() -> None:
    text = reply(peer(K1)).replace(K1.hex(), "g" * 64)
    assert fast_view("wg0", text, {}, KeyCache()) is None


def test_one_odd_peer_among_good_ones_falls_back() -> None:
    odd = peer(K2).replace("tx_bytes=0\nrx_bytes=0", "rx_bytes=0\ntx_bytes=0")
    assert fast_view("wg0", reply(peer(K1), odd, peer(K3)), {}, KeyCache()) is None
