"""The plan codec: canonical bytes, a hash that catches edits, field paths in errors, gzip transport."""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gwplan as g

PLAN = g.Plan(
    gateway=g.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-acme", "acme"),
    type="ipsec",
    ipsec=g.Ipsec(
        secrets=(g.IkeSecret("psk-hq", ("hq.example",), g.SecretRef("hq-psk", "psk")),),
        tunnels=(
            g.Tunnel(
                "hq",
                True,
                (g.Child("net-10-1-0-0-24", "10.1.0.0/24"),),
                {"hq": {"version": "2", "local": {"id": "gw.example"}, "remote": {"id": "hq.example"}}},
            ),
        ),
    ),
)


def test_round_trip_is_lossless_and_bytes_are_canonical() -> None:
    data = g.dumps(PLAN)
    assert g.loads(data) == PLAN
    assert g.dumps(g.loads(data)) == data


def test_gzip_compressed_plan_reads_the_same() -> None:
    assert g.loads(gzip.compress(g.dumps(PLAN))) == PLAN


def test_corrupt_gzip_is_a_plan_error() -> None:
    with pytest.raises(g.PlanError, match="corrupt gzip"):
        g.loads(gzip.compress(g.dumps(PLAN))[:-9])


def test_concatenated_gzip_members_read_like_gzip_decompress() -> None:
    data = g.dumps(PLAN)
    assert g.loads(gzip.compress(data[:100]) + gzip.compress(data[100:])) == PLAN


@pytest.mark.parametrize(
    ("padding", "error"),
    [
        pytest.param(0, None, id="exactly-the-limit"),
        pytest.param(1, "more than 8388608 bytes once decompressed", id="one-byte-over"),
    ],
)
def test_decompressed_size_is_bounded_like_the_stored_size(padding: int, error: str | None) -> None:
    """A plan padded with JSON whitespace to the limit is read; one byte more is refused by name (the
    compressed form is a few KB, far under the stored-size limit, so only the decompressed check can)."""
    data = g.dumps(PLAN)
    blob = gzip.compress(data + b" " * (g.MAX_PLAN_BYTES - len(data) + padding))
    assert len(blob) < 64 * 1024
    if error is None:
        assert g.loads(blob) == PLAN
    else:
        with pytest.raises(g.PlanError, match=error):
            g.loads(blob)


def test_the_limit_counts_every_gzip_member() -> None:
    half = gzip.compress(b" " * (g.MAX_PLAN_BYTES // 2 + 1))
    with pytest.raises(g.PlanError, match="once decompressed"):
        g.loads(half + half)


def test_a_gzip_bomb_never_expands_past_the_limit_in_memory() -> None:
    """64 MiB of zeros is 64 KB of gzip; ``gzip.decompress`` would hold all of it before any check."""
    z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(z.compress(zeros) for _ in range(64)) + z.flush()
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(g.PlanError, match="once decompressed"):
            g.loads(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * g.MAX_PLAN_BYTES


def test_a_stored_plan_over_the_limit_is_refused_before_it_is_read() -> None:
    with pytest.raises(g.PlanError, match=f"is larger than {g.MAX_PLAN_BYTES}"):
        g.loads(b" " * (g.MAX_PLAN_BYTES + 1))


def test_hand_edited_plan_is_rejected_by_its_hash() -> None:
    doc = json.loads(g.dumps(PLAN))
    doc["ipsec"]["tunnels"][0]["initiate"] = False
    with pytest.raises(g.PlanError, match="hash"):
        g.loads(json.dumps(doc))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(lambda d: d.update(version="plan.vpn.bnerd.net/v9"), "version", id="unknown-version"),
        pytest.param(lambda d: d.update(type="openvpn"), "type: 'openvpn' is not one of", id="bad-type"),
        pytest.param(
            lambda d: d["ipsec"]["tunnels"][0].update(initiate="yes"),
            "ipsec.tunnels[0].initiate",
            id="wrong-kind",
        ),
        pytest.param(
            lambda d: d["ipsec"]["secrets"][0].pop("ref"), "ipsec.secrets[0].ref: required", id="missing"
        ),
    ],
)
def test_errors_name_the_field(mutate: Callable[[dict[str, Any]], object], message: str) -> None:
    doc = json.loads(g.dumps(PLAN))
    del doc["hash"]
    mutate(doc)
    with pytest.raises(g.PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        g.from_dict(doc)


WG_PLAN = g.Plan(
    gateway=g.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-acme", "acme"),
    type="wireguard",
    wireguard=g.WireGuard("wg0", 51820, "10.99.0.1/24", g.SecretRef("acme-wg", "privateKey")),
)


@pytest.mark.parametrize(
    "name", ["", "a" * 16, "../etc", "wg0/x", "wg 0", "-i", ".", "..", ".hidden", "wg0;reboot"]
)
def test_a_plan_whose_device_name_breaks_the_one_rule_is_refused(name: str) -> None:
    """One rule for every component that takes the name (init-nat's iptables -i, the agent's ip link,
    the exporter's <name>.sock), applied where the plan is read."""
    doc = json.loads(g.dumps(WG_PLAN))
    del doc["hash"]
    doc["wireguard"]["interface"] = name
    with pytest.raises(g.PlanError, match=r"wireguard\.interface: .* is not a network device name"):
        g.from_dict(doc)


@pytest.mark.parametrize("name", ["wg0", "a" * 15, "wg-acme.1", "_x", "0"])
def test_device_names_the_rule_admits_round_trip(name: str) -> None:
    plan = g.Plan(
        WG_PLAN.gateway,
        "wireguard",
        wireguard=g.WireGuard(name, 51820, "10.99.0.1/24", g.SecretRef("k", "k")),
    )
    assert g.loads(g.dumps(plan)).wireguard == plan.wireguard


def test_nic_reply_mark_is_optional_and_round_trips() -> None:
    """``nic.replyMark`` (init-nat's reply bit) is new: a plan without it reads as None (init-nat's default)
    and its bytes are what they were before the field existed; one that sets it keeps it."""
    doc = json.loads(g.dumps(PLAN))
    assert "replyMark" not in doc["nic"], "absent when unset: older plans keep their bytes and hash"
    assert g.loads(g.dumps(PLAN)).nic.reply_mark is None
    marked = g.Plan(gateway=PLAN.gateway, type="ipsec", ipsec=PLAN.ipsec, nic=g.Nic(reply_mark=0x1))
    data = g.dumps(marked)
    assert json.loads(data)["nic"]["replyMark"] == 1 and g.loads(data) == marked
    doc = json.loads(data)
    del doc["hash"]
    doc["nic"]["replyMark"] = "0x1"
    with pytest.raises(g.PlanError, match=r"nic\.replyMark: expected int"):
        g.from_dict(doc)


@pytest.mark.parametrize(
    ("owners", "message"),
    [
        pytest.param([], "empty", id="no-owners"),
        pytest.param(["gw.example", "hq.example"], "'gw.example' is a local id", id="our-own-id"),
        pytest.param(["GW.Example"], "is a local id", id="our-own-id-other-case"),
        pytest.param(["0.0.0.0"], "wildcard identity", id="any"),
        pytest.param(["%any"], "wildcard identity", id="percent-any"),
        pytest.param(["0.0.0.1-255.255.255.254"], "address range", id="range"),
        pytest.param(["10.0.0.0/8"], "subnet, wildcard", id="subnet"),
        pytest.param(["*.example"], "subnet, wildcard", id="star"),
        pytest.param(["fqdn:#2a"], "subnet, wildcard", id="hex-encoded"),
    ],
)
def test_a_shared_key_is_for_its_peer_alone(owners: list[str], message: str) -> None:
    """charon offers a key for an exchange when any owner matches either side's identity and tries every
    key it offers: an owner that is our own id, a pattern or nothing at all lets one peer's key
    authenticate another peer (tests/integration/test_hostile_peer.py plays it live)."""
    doc = json.loads(g.dumps(PLAN))
    del doc["hash"]
    doc["ipsec"]["secrets"][0]["owners"] = owners
    with pytest.raises(g.PlanError, match=r"ipsec\.secrets\[0\]\.owners: .*" + message):
        g.from_dict(doc)


@pytest.mark.parametrize(
    ("ike_id", "wildcard"),
    [
        ("hq.example", False),
        ("198.51.100.2", False),
        ("ops@acme.example", False),
        ("hq-1.example", False),
        ("1.2.3-4.5", False),  # not an address before the "-": charon reads an FQDN
        ("1.2.3.4-x", True),
        ("0.0.0.0", True),
        ("", True),
    ],
)
def test_ike_id_wildcard_follows_charons_parser(ike_id: str, wildcard: bool) -> None:
    assert (g.ike_id_wildcard(ike_id) is not None) is wildcard


# Golden plans: the bytes and hash a released controller writes, checked in. A pod's agent may be older or
# newer than the controller that rendered its plan; a change to the encoding (key names, order, escaping,
# what is left out when unset, what the hash covers) must fail here, not when a running pod refuses a plan.
GOLDEN = Path(__file__).parent / "golden"
IPSEC_GOLDEN = g.Plan(
    gateway=g.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-acme", "acme"),
    type="ipsec",
    nic=g.Nic(
        "fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1", table=101, rule_priority=1100, reply_mark=0x1
    ),
    ipsec=g.Ipsec(
        secrets=(g.IkeSecret("psk-hq", ("büro.example",), g.SecretRef("hq-psk", "psk")),),
        tunnels=(
            g.Tunnel(
                "hq",
                True,
                (g.Child("hq-0", "10.1.0.0/24"), g.Child("hq-1", "10.2.0.0/24")),
                {
                    "hq": {
                        "version": "2",
                        "remote_addrs": ["198.51.100.2"],
                        "local": {"auth": "psk", "id": "gw.example"},
                        "remote": {"auth": "psk", "id": "büro.example"},
                        "children": {
                            "hq-0": {"local_ts": ["198.18.0.0/24"], "remote_ts": ["10.1.0.0/24"]},
                            "hq-1": {"local_ts": ["198.18.0.0/24"], "remote_ts": ["10.2.0.0/24"]},
                        },
                    }
                },
            ),
            g.Tunnel(
                "rw",
                False,
                (g.Child("rw-0", "10.3.0.0/24"),),
                {"rw": {"version": "2", "local": {"auth": "pubkey"}, "remote": {"auth": "pubkey"}}},
                peer_cas=("ca-rw",),
            ),
        ),
        certificates=(
            g.IkeCertificate("gw-cert", g.SecretRef("gw-tls", "tls.crt")),
            g.IkeCertificate("ca-rw", g.SecretRef("rw-ca", "ca.crt"), ca=True),
        ),
        private_keys=(g.IkePrivateKey("gw-key", g.SecretRef("gw-tls", "tls.key")),),
    ),
    nat=g.Nat(
        service_cidr="198.18.0.0/24",
        source_address="198.18.0.1",
        internal_source_cidrs=("192.0.2.64/26",),
        exposures=(
            g.Exposure("web", "198.18.0.10", (g.Port(443), g.Port(53, "UDP")), target_address="192.0.2.70"),
            g.Exposure("db", "198.18.0.11", (g.Port(5432),), target_host="db.fabric.example"),
        ),
        reverse_exposures=(g.ReverseExposure("hq-ldap", "198.18.0.20", "10.1.0.5", (g.Port(636),)),),
        grants=(
            g.Grant("hq", "web", "exposure", ("10.1.0.0/24", "10.2.0.0/24"), 0x10000),
            g.Grant("hq", "hq-ldap", "reverse", ("192.0.2.64/26",), 0x20000),
        ),
        allowed_targets=("192.0.2.64/26",),
    ),
)
IPSEC_GOLDEN_HASH = "sha256:57dcf13ea4decaeaca92db1497bc63785890cadb36e9d52d2e18c2d1ad21c34b"
WIREGUARD_GOLDEN = g.Plan(
    gateway=g.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-wg", "acme-wg"),
    type="wireguard",
    nic=g.Nic("fa:16:3e:00:00:02", "192.0.2.3/26", "192.0.2.1"),
    wireguard=g.WireGuard(
        "wg0",
        51820,
        "10.99.0.1/24",
        g.SecretRef("acme-wg", "privateKey"),
        peers=(
            g.WgPeer(
                "s1",
                "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
                ("10.99.0.2/32", "10.1.0.0/24"),
                endpoint="site1.example:51820",
                preshared_key_ref=g.SecretRef("s1-psk", "presharedKey"),
                persistent_keepalive=25,
            ),
            g.WgPeer("laptop", "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0=", ("10.99.0.3/32",)),
        ),
    ),
    nat=g.Nat(
        service_cidr="198.18.1.0/24",
        source_address="198.18.1.1",
        exposures=(g.Exposure("web", "198.18.1.10", (g.Port(443),), target_address="192.0.2.70"),),
        grants=(g.Grant("s1", "web", "exposure", ("10.99.0.2/32", "10.1.0.0/24"), 0x10000),),
    ),
)
WIREGUARD_GOLDEN_HASH = "sha256:6c3d18e5583ee270ae7c752ac2e5ad9a450154d7ad393f8e46fcf281a7668167"


@pytest.mark.parametrize(
    ("plan", "path", "digest"),
    [
        pytest.param(IPSEC_GOLDEN, "plan-ipsec.json", IPSEC_GOLDEN_HASH, id="ipsec"),
        pytest.param(WIREGUARD_GOLDEN, "plan-wireguard.json", WIREGUARD_GOLDEN_HASH, id="wireguard"),
    ],
)
def test_the_encoding_is_the_one_checked_in(plan: g.Plan, path: str, digest: str) -> None:
    golden = (GOLDEN / path).read_bytes()
    assert g.dumps(plan) == golden, f"the encoding of {path} changed: an agent of another version refuses it"
    assert g.plan_hash(plan) == digest
    assert g.loads(golden) == plan
    # The hash is the SHA-256 of the canonical document without it (keys sorted, so "hash" sits between
    # "gateway" and the next key: cut its member out of the bytes as they are, no codec involved).
    member = f',"hash":"{digest}"'.encode()
    assert golden.count(member) == 1
    body = golden.replace(member, b"").rstrip(b"\n")
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
