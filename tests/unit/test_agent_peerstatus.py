"""A VPNPeer's own status from its gateway's status entry (agent.peerstatus, pure), and the writer that
patches each planned peer's status only when it changed (agent.sink.WithPeerStatus, with a fake API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agent.fakes import ListSink
from agent.peerstatus import peer_status, peer_statuses
from agent.sink import StatusWriteError, WithPeerStatus
from gwplan import GatewayRef

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"
GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "acme")


def tunnel(state: str, error: str | None = None, **more: Any) -> dict[str, Any]:
    return {"name": "s1", "state": state, "establishedAt": None, "bytesIn": 0, "bytesOut": 0,
            "lastError": error, "children": [], **more}  # fmt: skip


def wg(state: str, **more: Any) -> dict[str, Any]:
    return {"name": "rw1", "publicKey": "k=", "allowedIPs": [], "bytesIn": 0, "bytesOut": 0, "state": state,
            **more}  # fmt: skip


def cond(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_an_established_tunnel_is_an_established_ready_admitted_peer() -> None:
    s = peer_status(tunnel("Established", establishedAt=T0, bytesIn=5, bytesOut=7), previous=None, now=T1)
    assert {k: s[k] for k in ("state", "reason", "establishedAt", "bytesIn", "bytesOut")} == {
        "state": "Established",
        "reason": None,
        "establishedAt": T0,
        "bytesIn": 5,
        "bytesOut": 7,
    }
    assert cond(s, "Ready")["status"] == "True" and cond(s, "Admitted")["status"] == "True"
    assert "observedGeneration" not in s, "the plan does not carry the peer's generation"


@pytest.mark.parametrize(
    ("state", "error", "want"),
    [
        ("Connecting", None, "Connecting"),
        ("Down", "peer not responding", "Down"),
        ("Failed", "AUTHENTICATION_FAILED: the peer rejected our authentication (...)", "AuthFailed"),
        ("Failed", "NO_PROPOSAL_CHOSEN: no common IKE/ESP proposal", "Down"),
    ],
)
def test_ipsec_states_map_to_peer_states_with_charons_reason(
    state: str, error: str | None, want: str
) -> None:
    s = peer_status(tunnel(state, error), previous=None, now=T1)
    assert s["state"] == want and s["reason"] == error
    ready = cond(s, "Ready")
    assert ready["status"] == "False" and ready["reason"] == want
    assert ready["message"] == (error or "the tunnel is Connecting")


@pytest.mark.parametrize(
    ("state", "want", "reason"),
    [
        ("Connected", "Established", None),
        ("Stale", "Down", "no handshake for 180 s (the session has expired)"),
        ("NeverConnected", "Down", "no handshake yet"),
    ],
)
def test_wireguard_states_map_to_peer_states(state: str, want: str, reason: str | None) -> None:
    s = peer_status(wg(state, latestHandshake=T0, bytesIn=3), previous=None, now=T1)
    assert (s["state"], s["reason"], s["latestHandshake"], s["bytesIn"]) == (want, reason, T0, 3)
    assert "establishedAt" not in s


def test_a_wireguard_peer_left_off_the_device_is_down_with_the_agents_reason() -> None:
    s = peer_status(wg("Failed", lastError="left out: Secret psk missing"), previous=None, now=T1)
    assert (s["state"], s["reason"]) == ("Down", "left out: Secret psk missing")


def test_last_transition_time_moves_only_when_the_condition_does() -> None:
    first = peer_status(tunnel("Down"), previous=None, now=T0)
    same = peer_status(tunnel("Down", bytesIn=1), previous=first, now=T1)
    assert cond(same, "Ready")["lastTransitionTime"] == T0
    assert cond(same, "Admitted")["lastTransitionTime"] == T0
    up = peer_status(tunnel("Established"), previous=same, now=T1)
    assert cond(up, "Ready")["lastTransitionTime"] == T1
    assert cond(up, "Admitted")["lastTransitionTime"] == T0


def test_peer_statuses_names_every_planned_peer_of_either_kind() -> None:
    out = peer_statuses({"tunnels": [tunnel("Down")], "peers": [wg("Connected")]}, previous={}, now=T0)
    assert set(out) == {"s1", "rw1"}
    assert peer_statuses({"agent": {}}, previous={}, now=T0) == {}


# --- the writer -------------------------------------------------------------------------------------


class PeerApi:
    """Records each patch by the object it targets; ``failures`` are raised first."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict[str, Any]]] = []
        self.failures: list[StatusWriteError] = []

    async def patch_status(self, ref: GatewayRef, status: Mapping[str, Any]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.writes.append((ref.kind, ref.name, dict(status)))


async def settle() -> None:
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def no_sleep(_: float) -> None:
    await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_the_writer_patches_each_peer_once_per_change_and_forgets_peers_that_leave_the_plan() -> None:
    api, inner = PeerApi(), ListSink()
    async with anyio.create_task_group() as tg:
        sink = WithPeerStatus(inner, GW, api, tg, clock=lambda: 0.0, sleep=no_sleep)
        status = {"tunnels": [tunnel("Down"), {**tunnel("Established"), "name": "s2"}]}
        await sink.publish(status)
        await settle()
        assert sorted((k, n, s["state"]) for k, n, s in api.writes) == [
            ("VPNPeer", "s1", "Down"),
            ("VPNPeer", "s2", "Established"),
        ]
        assert inner.published == [status], "the gateway's own status goes on unchanged"
        await sink.publish(status)
        await settle()
        assert len(api.writes) == 2, "nothing changed: no write"
        await sink.publish({"tunnels": [tunnel("Established")]})
        await settle()
        assert [(n, s["state"]) for _, n, s in api.writes[2:]] == [("s1", "Established")]
        assert set(sink.writers) == {"s1"}, "s2 left the plan: its writer is gone"
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_writer_retries_a_failed_peer_write() -> None:
    api = PeerApi()
    api.failures = [StatusWriteError("HTTP 503", retry=True), StatusWriteError("HTTP 409", retry=True)]
    async with anyio.create_task_group() as tg:
        sink = WithPeerStatus(ListSink(), GW, api, tg, clock=lambda: 0.0, sleep=no_sleep)
        await sink.publish({"tunnels": [tunnel("Down")]})
        await settle()
        assert [(n, s["state"]) for _, n, s in api.writes] == [("s1", "Down")]
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_legacy_gateways_tunnels_are_no_vpnpeers() -> None:
    api = PeerApi()
    legacy = GatewayRef("IPsecGateway", "ipsec.bnerd.net/v1alpha1", "t", "old")
    async with anyio.create_task_group() as tg:
        sink = WithPeerStatus(ListSink(), legacy, api, tg, clock=lambda: 0.0, sleep=no_sleep)
        await sink.publish({"tunnels": [tunnel("Down")]})
        await settle()
        assert api.writes == [] and sink.writers == {}
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_counters_alone_are_written_at_most_every_interval_and_a_state_change_at_once() -> None:
    """Found by review: every busy peer's counters were patched each resync (thousands of writes a
    minute for a big gateway); now at most every ``counters_every`` s per peer, bounded over the
    gateway by ``counters_rate``."""
    api, now = PeerApi(), [0.0]
    async with anyio.create_task_group() as tg:
        sink = WithPeerStatus(
            ListSink(), GW, api, tg, clock=lambda: now[0], sleep=no_sleep, counters_every=300
        )
        await sink.publish({"tunnels": [tunnel("Established", bytesIn=1)]})
        await settle()
        now[0] = 30.0
        await sink.publish({"tunnels": [tunnel("Established", bytesIn=2)]})
        await settle()
        assert [s["bytesIn"] for _, _, s in api.writes] == [1], "counters alone, not yet due"
        now[0] = 301.0
        await sink.publish({"tunnels": [tunnel("Established", bytesIn=3)]})
        await settle()
        assert [s["bytesIn"] for _, _, s in api.writes] == [1, 3], "due: written"
        now[0] = 302.0
        await sink.publish({"tunnels": [tunnel("Down", bytesIn=4)]})
        await settle()
        assert [(s["state"], s["bytesIn"]) for _, _, s in api.writes][-1] == ("Down", 4), (
            "a state change at once"
        )
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_with_many_peers_the_counters_interval_stretches_to_the_gateways_rate() -> None:
    api, now = PeerApi(), [0.0]
    many = [{**tunnel("Established", bytesIn=1), "name": f"s{i}"} for i in range(2000)]
    async with anyio.create_task_group() as tg:
        sink = WithPeerStatus(
            ListSink(), GW, api, tg, clock=lambda: now[0], sleep=no_sleep, counters_rate=2.0
        )
        await sink.publish({"tunnels": many})
        await settle()
        first = len(api.writes)
        now[0] = 400.0  # past 300 s, short of 2000 peers / 2 per s = 1000 s
        await sink.publish({"tunnels": [{**t, "bytesIn": 2} for t in many]})
        await settle()
        assert len(api.writes) == first, "not due at this gateway's size"
        now[0] = 1001.0
        await sink.publish({"tunnels": [{**t, "bytesIn": 3} for t in many]})
        for _ in range(50):
            await settle()
        assert len(api.writes) == 2 * first
        tg.cancel_scope.cancel()
