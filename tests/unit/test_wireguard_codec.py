"""The backends' pure edges: UAPI text (hex keys), pyroute2 peer dicts (base64), wg-quick routes."""

from __future__ import annotations

import base64

import pytest

from gwkit.wireguard.backend import netlink_peer, split_endpoint
from gwkit.wireguard.model import ZERO_KEY, DeviceUpdate, KeyError_, PeerUpdate, key_from_b64
from gwkit.wireguard.netdev import AF_INET, AF_INET6, RouteChanges, manages_ipv6, peer_routes, route_changes
from gwkit.wireguard.uapi import (
    UapiRejected,
    UapiUnavailable,
    format_set,
    parse_get,
    parse_set_reply,
    update_lines,
)

RAW_A, RAW_PSK, RAW_PRIV = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
A, PSK, PRIV = (base64.b64encode(r).decode() for r in (RAW_A, RAW_PSK, RAW_PRIV))

GET_REPLY = (
    f"private_key={RAW_PRIV.hex()}\nlisten_port=51820\nfwmark=0\n"
    f"public_key={RAW_A.hex()}\npreshared_key={RAW_PSK.hex()}\nprotocol_version=1\n"
    "endpoint=198.51.100.2:51820\nlast_handshake_time_sec=1800000000\nlast_handshake_time_nsec=500000000\n"
    "tx_bytes=92\nrx_bytes=148\npersistent_keepalive_interval=25\nallowed_ip=10.99.0.2/32\n"
    "allowed_ip=203.0.113.0/28\n"
    f"public_key={'04' * 32}\npreshared_key={'00' * 32}\n"
    "last_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
    "tx_bytes=0\nrx_bytes=0\npersistent_keepalive_interval=0\nerrno=0\n\n"
)


def test_parse_get() -> None:
    state = parse_get(GET_REPLY)
    assert state.listen_port == 51820 and state.has_private_key and state.private_key == PRIV
    a, b = state.peers
    assert a.public_key == A and a.preshared_key == PSK and a.has_preshared_key
    assert a.last_handshake == 1_800_000_000.5 and (a.rx_bytes, a.tx_bytes) == (148, 92)
    assert a.allowed_ips == ("10.99.0.2/32", "203.0.113.0/28") and a.persistent_keepalive == 25
    assert (
        b.last_handshake is None
        and not b.has_preshared_key
        and b.preshared_key is None
        and b.endpoint is None
    )
    assert PRIV not in repr(state) and PSK not in repr(state) and RAW_PRIV.hex() not in repr(state)


def test_parse_get_errors() -> None:
    with pytest.raises(UapiRejected, match="errno=1"):
        parse_get("errno=1\n\n")
    with pytest.raises(UapiUnavailable, match="truncated"):
        parse_get("listen_port=1\n")


def test_update_lines_new_update_and_remove() -> None:
    update = DeviceUpdate(
        private_key=PRIV,
        listen_port=51820,
        peers=(
            PeerUpdate("B" * 43 + "=", remove=True),
            PeerUpdate(
                A,
                new=True,
                endpoint="198.51.100.2:51820",
                preshared_key=PSK,
                persistent_keepalive=25,
                allowed_ips=("10.99.0.2/32", "203.0.113.0/28"),
            ),
            PeerUpdate(A, preshared_key=ZERO_KEY, allowed_ips=()),
        ),
    )
    assert update_lines(update) == [
        ("private_key", RAW_PRIV.hex()),
        ("listen_port", 51820),
        ("public_key", key_from_b64("B" * 43 + "=").hex()),
        ("remove", "true"),
        ("public_key", RAW_A.hex()),
        ("preshared_key", RAW_PSK.hex()),
        ("endpoint", "198.51.100.2:51820"),
        ("persistent_keepalive_interval", 25),
        ("replace_allowed_ips", "true"),
        ("allowed_ip", "10.99.0.2/32"),
        ("allowed_ip", "203.0.113.0/28"),
        ("public_key", RAW_A.hex()),
        ("update_only", "true"),
        ("preshared_key", "00" * 32),
        ("replace_allowed_ips", "true"),
    ]
    assert format_set([("listen_port", 1)]) == b"set=1\nlisten_port=1\n\n"


def test_update_lines_reject_a_bad_key_without_echoing_it() -> None:
    with pytest.raises(KeyError_, match="private key: must decode to 32 bytes") as exc:
        update_lines(DeviceUpdate(private_key=base64.b64encode(b"secret-ish").decode()))
    assert "c2VjcmV0" not in str(exc.value)


def test_parse_set_reply() -> None:
    parse_set_reply("errno=0\n\n")
    with pytest.raises(UapiRejected, match="set failed: errno=22"):
        parse_set_reply("errno=22\n\n")


def test_netlink_peer_dicts_match_pyroute2s_set() -> None:
    assert netlink_peer(PeerUpdate(A, remove=True)) == {"public_key": A, "remove": True}
    assert netlink_peer(
        PeerUpdate(
            A,
            new=True,
            endpoint="[fd00::1]:51820",
            preshared_key=PSK,
            persistent_keepalive=0,
            allowed_ips=("10.99.0.2/32",),
        )
    ) == {
        "public_key": A,
        "preshared_key": PSK,
        "endpoint_addr": "fd00::1",
        "endpoint_port": 51820,
        "persistent_keepalive": 0,
        "replace_allowed_ips": True,
        "allowed_ips": ["10.99.0.2/32"],
    }
    assert netlink_peer(PeerUpdate(A, endpoint="198.51.100.2:1")) == {
        "public_key": A,
        "update_only": True,
        "endpoint_addr": "198.51.100.2",
        "endpoint_port": 1,
    }


@pytest.mark.parametrize("bad", ["vpn.example.net:51820", "198.51.100.2", "198.51.100.2:x"])
def test_split_endpoint_needs_a_literal_address(bad: str) -> None:
    with pytest.raises(ValueError):
        split_endpoint(bad)


@pytest.mark.parametrize(
    ("address", "allowed", "routes"),
    [
        ("10.99.0.1/24", ["10.99.0.2/32"], ()),
        (
            "10.99.0.1/24",
            ["10.99.0.2/32", "203.0.113.0/28", "198.19.1.16/28"],
            ("198.19.1.16/28", "203.0.113.0/28"),
        ),
        ("10.99.0.1/24", ["203.0.113.5/28", "203.0.113.0/28"], ("203.0.113.0/28",)),
        ("10.99.0.1/24", ["10.99.0.0/16"], ("10.99.0.0/16",)),
        ("10.99.0.1/24", ["0.0.0.0/0", "::/0"], ()),
        (
            "10.99.0.1/24",
            ["fd00:5::/64", "10.99.0.2/32", "2001:db8::1/128", "fd00:5::7/64", "203.0.113.0/28"],
            ("203.0.113.0/28", "2001:db8::1/128", "fd00:5::/64"),
        ),
        ("fd00:99::1/64", ["fd00:99::2/128", "fd00:5::/64", "10.99.0.2/32"], ("10.99.0.2/32", "fd00:5::/64")),
    ],
    ids=[
        "inside-subnet",
        "site-lans",
        "dedup-normalised",
        "wider-than-subnet",
        "no-defaults",
        "ipv6-routed-v4-first",
        "ipv6-address-own-subnet",
    ],
)
def test_peer_routes(address: str, allowed: list[str], routes: tuple[str, ...]) -> None:
    assert peer_routes(address, allowed) == routes


def test_route_changes_one_family_at_a_time() -> None:
    current = {"10.1.0.0/24", "10.2.0.0/24", "fd00:1::/64", "fd00:77::/64"}
    wanted = ("10.1.0.0/24", "10.3.0.0/24", "fd00:5::/64")
    ipv4 = route_changes(AF_INET, wanted, current)
    assert ipv4 == RouteChanges(AF_INET, ("10.3.0.0/24",), ("10.2.0.0/24",))
    assert route_changes(AF_INET6, wanted, current) == RouteChanges(
        AF_INET6, ("fd00:5::/64",), ("fd00:1::/64", "fd00:77::/64")
    )
    # Deletions limited to the routes we claim: the others are not ours to remove.
    assert route_changes(AF_INET6, (), current, claimed={"fd00:1::/64"}) == RouteChanges(
        AF_INET6, (), ("fd00:1::/64",)
    )
    assert route_changes(AF_INET6, (), current, claimed=set()) == RouteChanges(AF_INET6, (), ())


def test_ipv6_routes_are_touched_only_for_an_ipv6_plan_or_routes_we_added() -> None:
    assert not manages_ipv6(("10.1.0.0/24",), set()), "the controller's IPv4-only plans"
    assert manages_ipv6(("10.1.0.0/24", "fd00:5::/64"), set())
    assert manages_ipv6(("10.1.0.0/24",), {"fd00:5::/64"}), "a dropped IPv6 route we added goes"
