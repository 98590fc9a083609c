"""The read-only UAPI view (gwkit.wireguard.uapi, pure): a get=1 reply without keys that the exporter
reads into exactly the metrics it reads from the daemon itself; set is refused, anything else invalid."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.collector import Snapshot, WireGuardSnapshot, families
from exporter.family import Renderer
from exporter.uapifast import KeyCache, fast_view
from exporter.wireguard import InterfaceView, interface_view
from gwkit.wireguard.model import DeviceState, PeerState
from gwkit.wireguard.uapi import (
    READ_ONLY_KEYS,
    UapiUnavailable,
    format_get,
    operation,
    parse_get,
    redact_get,
)
from tests.unit.test_exporter_uapifast import K1, K2, K3, NAMES, PRIV, PSK, peer, reply


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def rendered(view: InterfaceView) -> bytes:
    snap = Snapshot(wireguard=WireGuardSnapshot(0.1, (dataclasses.replace(view, backend="-"),)))
    return Renderer().render(families(snap), openmetrics=True)


DAEMON = reply(
    peer(K1, endpoint="192.0.2.1:51820", hs=(1790000000, 250000000), rx=10**12, tx=20, psk=PSK),
    peer(K2),
    peer(K3, endpoint="[2001:db8::1]:4500", hs=(1790000001, 0), rx=1),
).replace("listen_port=51820\n", "listen_port=51820\nfwmark=4096\n")
"""A reply as wireguard-go writes it (tests/integration/test_exporter_readonly.py checks the live one)."""


def test_redacted_reply_has_no_key_but_every_other_line_in_order() -> None:
    text = redact_get(DAEMON)
    for secret in (PRIV, PSK):
        assert secret not in text
    assert "private_key=" not in text and "preshared_key=" not in text
    kept = [line for line in DAEMON.split("\n") if not line.startswith(("private_key=", "preshared_key="))]
    assert text.split("\n") == kept
    assert text.endswith("errno=0\n\n")


def test_a_line_the_allowlist_does_not_name_is_dropped_whatever_it_is() -> None:
    later = DAEMON.replace("protocol_version=1\n", "protocol_version=1\nfuture_secret=abc\n", 1)
    assert "future_secret" not in redact_get(later)
    assert set(READ_ONLY_KEYS).isdisjoint({"private_key", "preshared_key"})


@pytest.mark.parametrize(
    "text, kept",
    [
        pytest.param("private_key=ab\nlisten_port=1\nerrno=0\n\n", "listen_port=1\nerrno=0\n\n", id="first"),
        pytest.param("listen_port=1\nprivate_key=ab\n\n", "listen_port=1\n\n", id="last-line"),
        pytest.param("public_key=aa\npreshared_key=bb\nallowed_ip=1\nerrno=0\n\n",
                     "public_key=aa\nallowed_ip=1\nerrno=0\n\n", id="between"),
        pytest.param("listen_port=1\nlisten_portx=2\npublic_key_b=3\nendpoint\n=4\nerrno=0\n\n",
                     "listen_port=1\nerrno=0\n\n", id="a-key-is-the-whole-name"),
        pytest.param("errno=0\n\n", "errno=0\n\n", id="nothing-to-drop"),
    ],
)  # fmt: skip
def test_redaction_edges(text: str, kept: str) -> None:
    assert redact_get(text) == kept


@pytest.mark.parametrize("cut", [1, 2, 13, len(DAEMON) - 1])
def test_a_truncated_reply_is_not_passed_on(cut: int) -> None:
    """It could end inside a key line (``private_key=d807`` is not a line the pattern sees)."""
    with pytest.raises(UapiUnavailable, match="truncated"):
        redact_get(DAEMON[:-cut])


def test_the_exporter_renders_the_same_metrics_from_the_redacted_reply() -> None:
    direct = fast_view("wg0", DAEMON, NAMES, KeyCache())
    relayed = fast_view("wg0", redact_get(DAEMON), NAMES, KeyCache())
    assert direct is not None and relayed is not None, "the fast path reads both (no fallback)"
    assert rendered(relayed) == rendered(direct)
    assert b"wireguard_peer_last_handshake_timestamp_seconds" in rendered(relayed)


def test_a_kernel_devices_state_written_out_renders_the_same_metrics() -> None:
    """The netlink backend's DeviceState (keys included, as the kernel reports them) -> format_get ->
    the exporter's fast parser: the same metrics as the exporter's own netlink path."""
    state = parse_get(DAEMON)
    assert state.private_key and state.peers[0].preshared_key, "premise: the state holds the keys"
    text = format_get(state)
    assert b64(bytes.fromhex(PRIV)) not in text and PRIV not in text
    assert PSK not in text and b64(bytes.fromhex(PSK)) not in text
    view = fast_view("wg0", text, NAMES, KeyCache())
    assert view is not None
    assert rendered(view) == rendered(interface_view("wg0", state, NAMES, backend="netlink"))


def test_format_get_follows_wireguard_gos_field_order() -> None:
    written = format_get(parse_get(DAEMON))
    assert written == redact_get(DAEMON), "byte for byte what the daemon's reply is without its keys"


ALLOWED = ["10.0.0.0/24", "10.1.0.1/32", "fd00::/64"]
states = st.builds(
    DeviceState,
    listen_port=st.integers(0, 65535),
    fwmark=st.integers(0, 2**32 - 1),
    has_private_key=st.just(True),
    private_key=st.just(b64(b"\x07" * 32)),
    peers=st.lists(
        st.builds(
            PeerState,
            public_key=st.binary(min_size=32, max_size=32).map(b64),
            endpoint=st.one_of(st.none(), st.just("192.0.2.9:51820"), st.just("[2001:db8::2]:1")),
            allowed_ips=st.lists(st.sampled_from(ALLOWED), max_size=3).map(tuple),
            last_handshake=st.one_of(st.none(), st.integers(1, 2**33).map(float)),
            rx_bytes=st.integers(0, 2**64 - 1),
            tx_bytes=st.integers(0, 2**64 - 1),
            persistent_keepalive=st.integers(0, 65535),
            has_preshared_key=st.just(True),
            preshared_key=st.just(b64(b"\x08" * 32)),
        ),
        max_size=5,
        unique_by=lambda p: p.public_key,
    ).map(tuple),
)


@given(states)
def test_format_get_round_trips_everything_but_the_keys(state: DeviceState) -> None:
    text = format_get(state)
    assert b"\x07".hex() * 32 not in text and b"\x08".hex() * 32 not in text
    back = parse_get(text)
    keyless = dataclasses.replace(
        state,
        has_private_key=False,
        private_key=None,
        peers=tuple(dataclasses.replace(p, has_preshared_key=False, preshared_key=None) for p in state.peers),
    )
    assert back == keyless
    assert fast_view("wg0", text, {}, KeyCache()) is not None, "the exporter's fast path reads it"


@pytest.mark.parametrize(
    "line, op",
    [
        (b"get=1", "get"),
        (b"set=1", "set"),
        (b"get=2", "invalid"),
        (b"get=1 ", "invalid"),
        (b"GET=1", "invalid"),
        (b"", "invalid"),
        (b"private_key=00", "invalid"),
    ],
)
def test_operation(line: bytes, op: str) -> None:
    assert operation(line) == op
