"""exporter.collector / exporter.family / exporter.wireguard (pure): names, labels, no secrets, and the
fast renderer agreeing with prometheus_client's own exposition."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.collector import Snapshot, SnapshotCollector, StrongswanSnapshot, WireGuardSnapshot, families
from exporter.family import Family, Renderer
from exporter.ipsec import Carry, PlanTunnel, observe_listing, view
from exporter.wireguard import interface_view
from gwkit.vici.queries import DaemonInfo
from gwkit.wireguard.model import DeviceState, PeerState

PRIVATE = base64.b64encode(bytes(range(32))).decode()
PRESHARED = base64.b64encode(bytes(range(100, 132))).decode()
ALICE = base64.b64encode(b"A" * 32).decode()
CAROL = base64.b64encode(b"C" * 32).decode()
BOB = base64.b64encode(b"B" * 32).decode()


def wg_snapshot(up: bool = True) -> Snapshot:
    state = DeviceState(
        listen_port=51820,
        has_private_key=True,
        private_key=PRIVATE,
        peers=(
            PeerState(ALICE, "192.0.2.9:51820", ("10.9.0.2/32",), 1790000000.5, 10, 20, 0, True, PRESHARED),
            PeerState(CAROL, None, ("10.9.0.4/32",), None, 0, 0),
        ),
    )
    iv = interface_view("wg0", state if up else None, {ALICE: "alice", BOB: "bob"}, backend="uapi")
    return Snapshot(wireguard=WireGuardSnapshot(0.01, (iv,)))


def ipsec_snapshot() -> Snapshot:
    sas = {
        "1": {
            "name": "t1",
            "uniqueid": "1",
            "state": "ESTABLISHED",
            "established": "10",
            "local-id": 'we"ird\\id',
            "child-sas": {
                "c0-1": {
                    "name": "c0",
                    "uniqueid": "1",
                    "state": "INSTALLED",
                    "bytes-in": "100",
                    "bytes-out": "200",
                    "packets-in": "1",
                    "packets-out": "2",
                    "rekey-time": "30",
                    "remote-ts": ["10.1.0.0/24"],
                }
            },
        }
    }
    plan = [PlanTunnel("t1", {"c0": "10.1.0.0/24"}), PlanTunnel("t9", {"x": "10.9.0.0/24"})]
    carry, listed = observe_listing(Carry(), sas, epoch="e", now=1000.0, plan=plan)
    v = view(carry, listed, plan, epoch="e")
    info = DaemonInfo("charon", "5.9.8", "Linux", "6.1", "x86_64", 900.0, 1, 0, ("counters",), 16, 7, 0, 3)
    return Snapshot(
        strongswan=StrongswanSnapshot(
            True,
            0.01,
            v,
            info,
            {"child-rekey": 3, "ike-init-out-req": 2, "invalid": 1, "ike-rekey-init": 1, "ike-rekey-resp": 0},
        ),
        wireguard=wg_snapshot().wireguard,
    )


def registry(snap: Snapshot) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap))
    return reg


def test_wireguard_peers_named_by_plan_else_public_key() -> None:
    reg = registry(wg_snapshot())
    assert (
        reg.get_sample_value("wireguard_peer_receive_bytes_total", {"interface": "wg0", "peer": "alice"})
        == 10
    )
    assert (
        reg.get_sample_value("wireguard_peer_transmit_bytes_total", {"interface": "wg0", "peer": CAROL}) == 0
    )
    assert reg.get_sample_value("wireguard_peers", {"interface": "wg0"}) == 2
    assert reg.get_sample_value("wireguard_peer_present", {"interface": "wg0", "peer": "bob"}) == 0
    assert reg.get_sample_value("wireguard_peer_present", {"interface": "wg0", "peer": "alice"}) == 1
    info = {"interface": "wg0", "peer": "alice", "public_key": ALICE, "endpoint": "192.0.2.9:51820"}
    assert reg.get_sample_value("wireguard_peer_info", info) == 1


def test_handshake_is_absent_for_a_peer_that_never_had_one_never_zero() -> None:
    reg = registry(wg_snapshot())
    name = "wireguard_peer_last_handshake_timestamp_seconds"
    assert reg.get_sample_value(name, {"interface": "wg0", "peer": "alice"}) == 1790000000.5
    assert reg.get_sample_value(name, {"interface": "wg0", "peer": CAROL}) is None
    samples = [s for m in reg.collect() for s in m.samples if s.name == name]
    assert samples and all(s.value > 0 for s in samples)


def test_a_down_interface_keeps_configured_peers_as_rows() -> None:
    reg = registry(wg_snapshot(up=False))
    assert reg.get_sample_value("wireguard_up", {"interface": "wg0"}) == 0
    assert reg.get_sample_value("wireguard_peer_present", {"interface": "wg0", "peer": "alice"}) == 0
    assert (
        reg.get_sample_value("wireguard_peer_receive_bytes_total", {"interface": "wg0", "peer": "alice"})
        is None
    )


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_no_secret_anywhere_in_the_output(openmetrics: bool) -> None:
    text = Renderer().render(families(ipsec_snapshot()), openmetrics=openmetrics).decode()
    for secret in (PRIVATE, PRESHARED):
        assert secret not in text and base64.b64decode(secret).hex() not in text
    assert ALICE in text, "the public key is there (peer_info), so the check above is meaningful"


def test_ipsec_metric_names_and_labels() -> None:
    reg = registry(ipsec_snapshot())
    assert reg.get_sample_value("strongswan_up") == 1
    assert reg.get_sample_value("strongswan_tunnel_up", {"tunnel": "t1"}) == 1
    assert reg.get_sample_value("strongswan_tunnel_up", {"tunnel": "t9"}) == 0
    assert reg.get_sample_value("strongswan_tunnel_bytes_total", {"tunnel": "t1", "direction": "out"}) == 200
    assert reg.get_sample_value("strongswan_tunnel_packets_total", {"tunnel": "t9", "direction": "in"}) == 0
    assert reg.get_sample_value("strongswan_tunnel_established_timestamp_seconds", {"tunnel": "t1"}) == 990
    assert reg.get_sample_value("strongswan_tunnel_rekey_timestamp_seconds", {"tunnel": "t1"}) == 1030
    assert reg.get_sample_value("strongswan_tunnel_established_timestamp_seconds", {"tunnel": "t9"}) is None
    assert reg.get_sample_value("strongswan_start_time_seconds") == 900
    assert reg.get_sample_value("strongswan_child_rekeys_total") == 3
    assert reg.get_sample_value("strongswan_invalid_messages_total", {"reason": "invalid"}) == 1
    labels = {"exchange": "ike_sa_init", "direction": "out", "kind": "request"}
    assert reg.get_sample_value("strongswan_messages_total", labels) == 2
    assert (
        reg.get_sample_value(
            "strongswan_info", {"daemon": "charon", "version": "5.9.8", "sysname": "Linux", "release": "6.1"}
        )
        == 1
    )
    volatile = {"uniqueid", "reqid", "local_ts", "remote_ts", "encr_alg", "spi_in", "spi_out"}
    for metric in reg.collect():
        for s in metric.samples:
            if not s.name.endswith("_info"):
                assert not volatile & set(s.labels), s


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_fast_renderer_exposes_what_prometheus_client_does(openmetrics: bool) -> None:
    snap = ipsec_snapshot()
    ours = Renderer().render(families(snap), openmetrics=openmetrics).decode()
    parse: Any
    if openmetrics:
        theirs = om_latest(registry(snap)).decode()  # type: ignore[no-untyped-call]
        parse = parse_openmetrics
    else:
        theirs = generate_latest(registry(snap)).decode()
        parse = parse_text

    def samples(text: str) -> dict[tuple[str, str, tuple[tuple[str, str], ...], str], float]:
        return {
            (m.name, m.type, tuple(sorted(s.labels.items())), s.name): s.value
            for m in parse(text)
            for s in m.samples
        }

    assert samples(ours) == samples(theirs)
    assert ('local_id="we\\"ird\\\\id"') in ours, "label values are escaped"


def test_family_rejects_a_counter_without_total() -> None:
    with pytest.raises(ValueError, match="_total"):
        Family.counter("strongswan_bytes", "x")


def test_renderer_skips_empty_families_and_ends_openmetrics_with_eof() -> None:
    fams = [Family.gauge("a", "doc", ["x"]), Family.gauge("b", "doc", value=1.5)]
    assert Renderer().render(fams) == b"# HELP b doc\n# TYPE b gauge\nb 1.5\n"
    assert Renderer().render(fams, openmetrics=True).endswith(b"# EOF\n")
