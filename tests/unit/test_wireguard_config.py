"""config: plan + secret values + resolved hosts -> desired device; bad input names the field (pure)."""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from agent.wireguard.config import (
    ConfigError,
    Endpoint,
    desired,
    hostnames,
    parse_endpoint,
    secret_key,
    validate,
)
from gwplan import SecretRef, WgPeer, WireGuard


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


PRIV, A, B, PSK = key(1), key(2), key(3), key(4)
KEYREF, PSKREF = SecretRef("gw", "privateKey"), SecretRef("a", "psk")
WG = WireGuard(
    interface="wg0",
    listen_port=51820,
    address="10.99.0.1/24",
    private_key_ref=KEYREF,
    peers=(
        WgPeer("site-a", A, ("10.99.0.2/32", "203.0.113.0/28"), "198.51.100.2:51820", PSKREF, 25),
        WgPeer("laptop-b", B, ("10.99.0.3/32",), "vpn.example.net:4500"),
    ),
)
VALUES = {KEYREF: PRIV, PSKREF: PSK}


def read(ref: SecretRef) -> str:
    return VALUES[ref]


def test_desired_device_from_plan_secrets_and_dns() -> None:
    got = desired(WG, read, {"vpn.example.net": "198.51.100.6"})
    d = got.device
    assert got.left_out == {}
    assert d.private_key == PRIV and d.listen_port == 51820
    a, b = d.peers
    assert (a.public_key, a.endpoint, a.preshared_key, a.persistent_keepalive) == (
        A,
        "198.51.100.2:51820",
        PSK,
        25,
    )
    assert a.allowed_ips == ("10.99.0.2/32", "203.0.113.0/28")
    assert (b.endpoint, b.preshared_key, b.persistent_keepalive) == ("198.51.100.6:4500", None, 0)


def test_unresolved_hostname_leaves_the_endpoint_to_the_device() -> None:
    assert desired(WG, read, {}).device.peers[1].endpoint is None


def test_hostnames_are_only_the_non_literal_hosts() -> None:
    assert hostnames(WG) == frozenset({"vpn.example.net"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("198.51.100.2:51820", Endpoint("198.51.100.2", 51820)),
        ("[fd00::1]:51820", Endpoint("fd00::1", 51820)),
        ("vpn-1.example.net:443", Endpoint("vpn-1.example.net", 443)),
    ],
)
def test_parse_endpoint(text: str, expected: Endpoint) -> None:
    assert parse_endpoint(text, "x") == expected


@pytest.mark.parametrize(
    "text", ["198.51.100.2", "host:0", "host:70000", ":51820", "[nope]:1", "a b:1", "x..y:1"]
)
def test_parse_endpoint_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^peers\[0\]\.endpoint: "):
        parse_endpoint(text, "peers[0].endpoint")


def test_ipv6_endpoint_with_address() -> None:
    assert Endpoint("h", 1).with_address("fd00::2") == "[fd00::2]:1"


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (replace(WG, listen_port=0), r"wireguard\.listenPort: 0 must be 1-65535"),
        (replace(WG, interface="a-very-long-interface"), r"wireguard\.interface: .* interface name"),
        (replace(WG, address="10.99.0.1"), r"wireguard\.address: .* with prefix"),
        (replace(WG, address="nonsense/24"), r"wireguard\.address: "),
        (
            replace(WG, peers=(replace(WG.peers[0], public_key="short"),)),
            r"wireguard\.peers\[0\]\.publicKey: ",
        ),
        (
            replace(WG, peers=(WG.peers[0], replace(WG.peers[1], name="site-a"))),
            r"peers\[1\]\.name: .* unique",
        ),
        (
            replace(WG, peers=(WG.peers[0], replace(WG.peers[1], public_key=A))),
            r"peers\[1\]\.publicKey: .*another",
        ),
        (
            replace(WG, peers=(replace(WG.peers[0], allowed_ips=("10.0.0.0/33",)),)),
            r"peers\[0\]\.allowedIps\[0\]",
        ),
        (replace(WG, peers=(replace(WG.peers[0], endpoint="nohost"),)), r"peers\[0\]\.endpoint: "),
        (replace(WG, peers=(replace(WG.peers[0], persistent_keepalive=-1),)), r"persistentKeepalive"),
    ],
)
def test_invalid_plans_name_the_field(plan: WireGuard, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(plan)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not base64!!", "not valid base64"),
        (base64.b64encode(b"x" * 31) + b"\n", "must decode to 32 bytes, got 31"),
        (b"\xff\xfe", "must be base64 text"),
    ],
)
def test_bad_key_files_name_the_secret_not_the_value(raw: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        secret_key(raw, KEYREF)
    assert str(exc.value).startswith("secret gw key privateKey: ") and message in str(exc.value)
    assert raw.decode(errors="replace").strip() not in str(exc.value)


def test_key_file_with_trailing_newline_as_wg_genkey_writes_it() -> None:
    assert secret_key((PRIV + "\n").encode(), KEYREF) == PRIV


def test_the_gateways_private_key_is_gateway_level() -> None:
    def broken(ref: SecretRef) -> str:
        raise ConfigError(f"secret {ref.name} key {ref.key}: not mounted")

    with pytest.raises(ConfigError, match="secret gw key privateKey: not mounted"):
        desired(WG, broken, {})


@pytest.mark.parametrize(
    "error",
    ["secret a key psk: not mounted", "secret a key psk: must decode to 32 bytes, got 9"],
)
def test_a_peer_whose_preshared_key_cannot_be_read_is_left_out_and_the_rest_configured(error: str) -> None:
    """Missing or unusable, the peer cannot be configured as the plan says: it is not on the desired
    device at all (not without a key, not with an old one), and the reason is returned for status."""
    c = WgPeer("laptop-c", key(5), ("10.99.0.4/32",), preshared_key_ref=SecretRef("c", "psk"))

    def reader(ref: SecretRef) -> str:
        if ref == PSKREF:
            raise ConfigError(error)
        return {KEYREF: PRIV, SecretRef("c", "psk"): key(6)}[ref]

    got = desired(replace(WG, peers=(*WG.peers, c)), reader, {})
    assert [p.public_key for p in got.device.peers] == [B, key(5)], "site-a out, the others in"
    assert got.left_out == {"site-a": f"preshared key: {error}"}
    assert got.device.peers[1].preshared_key == key(6)
