"""The WireGuard agent loop (``WireGuardAgent.step``) against fakes: an in-memory device (``FakeDevice``,
WireGuard's set semantics), a recording NetDev, the real ``FileSecrets`` over a tmp dir, an injected
resolver and clocks. The same behaviours against a live wireguard-go are in tests/integration."""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.fakes import ListSink, StaticPlans
from agent.runtime import Settings
from agent.sources import FileSecrets
from agent.wireguard.run import WireGuardAgent
from gwkit.wireguard.backend import BackendUnavailable, WireGuardBackend
from gwkit.wireguard.fakes import FakeDevice, FakeNetDev
from gwplan import GatewayRef, Plan, SecretRef, WgPeer, WireGuard, plan_hash
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


A, B = key(), key()
NOW = 1_800_000_000.0


@dataclass
class Health:
    beats: int = 0
    ready: tuple[bool, str] = (False, "")

    def beat(self) -> None:
        self.beats += 1

    def set_ready(self, ready: bool, reason: str) -> None:
        self.ready = (ready, reason)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


def plan(*peers: WgPeer, port: int = 51820) -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="wireguard",
        wireguard=WireGuard("wg0", port, "10.99.0.1/24", SecretRef("gw", "privateKey"), peers),
    )


SITE = WgPeer("site-a", A, ("10.99.0.2/32", "203.0.113.0/28"), "198.51.100.2:51820", SecretRef("a", "psk"))
LAPTOP = WgPeer("laptop-b", B, ("10.99.0.3/32",))


@dataclass
class Rig:
    agent: WireGuardAgent
    device: FakeDevice
    netdev: FakeNetDev
    sink: ListSink
    health: Health
    secrets: Path
    wall: Clock
    mono: Clock
    dns: dict[str, str]
    private: str
    psk: str

    def write(self, name: str, k: str, value: str) -> None:
        (self.secrets / name).mkdir(parents=True, exist_ok=True)
        (self.secrets / name / k).write_text(value)

    async def step(self, p: Plan | None = None) -> None:
        if p is not None:
            self.agent.plan = p
        await self.agent.step()

    def peers(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.sink.published[-1]["peers"]}


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    device, netdev, sink, health = FakeDevice(), FakeNetDev(), ListSink(), Health()
    wall, mono = Clock(NOW), Clock(100.0)
    dns: dict[str, str] = {}

    async def opener(interface: str, uapi_dir: Path | None) -> WireGuardBackend:
        return device

    async def resolver(host: str) -> str:
        if host not in dns:
            raise OSError(f"{host}: Name or service not known")
        return dns[host]

    settings = Settings(plan=tmp_path / "plan.json", secrets_dir=tmp_path / "s", resync_seconds=30.0)
    agent = WireGuardAgent(
        settings,
        FileSecrets(settings.secrets_dir),
        sink,
        health,
        open_backend=opener,
        netdev=netdev,
        resolver=resolver,
        clock=wall,
        monotonic=mono,
    )
    r = Rig(agent, device, netdev, sink, health, settings.secrets_dir, wall, mono, dns, key(), key())
    r.write("gw", "privateKey", r.private + "\n")
    r.write("a", "psk", r.psk + "\n")
    return r


async def test_first_step_configures_everything_then_idle_steps_do_nothing(rig: Rig) -> None:
    await rig.step(plan(SITE, LAPTOP))
    assert rig.device.private_key == rig.private and rig.device.listen_port == 51820
    assert set(rig.device.peers) == {A, B} and rig.device.peers[A].preshared_key == rig.psk
    assert rig.netdev.calls == [("wg0", "10.99.0.1/24", ("203.0.113.0/28",))]
    assert rig.health.ready == (True, "wg0 configured with 2 peers (fake)")
    assert [p["state"] for p in rig.sink.published[0]["peers"]] == ["NeverConnected"] * 2
    for _ in range(3):
        await rig.step()
    assert len(rig.device.applied) == 1 and len(rig.netdev.calls) == 1 and len(rig.sink.published) == 1
    assert rig.health.beats == 4


async def test_reload_touches_only_what_changed_and_routes_follow_peers(rig: Rig) -> None:
    await rig.step(plan(SITE, LAPTOP))
    rig.device.handshake(A, NOW - 5, rx=100, tx=200)
    await rig.step(plan(SITE))
    last = rig.device.applied[-1]
    assert [(p.public_key, p.remove) for p in last.peers] == [(B, True)]
    assert rig.device.peers[A].last_handshake == NOW - 5 and rig.device.peers[A].rx_bytes == 100
    assert set(rig.peers()) == {"site-a"} and rig.peers()["site-a"]["state"] == "Connected"
    await rig.step(plan(LAPTOP))
    assert rig.netdev.routes == ()  # the site's LAN route went with the site


async def test_listen_port_follows_the_plan(rig: Rig) -> None:
    await rig.step(plan(SITE))
    await rig.step(plan(SITE, port=51821))
    assert rig.device.listen_port == 51821 and rig.device.applied[-1].peers == ()


async def test_invalid_key_in_a_secret_keeps_the_last_good_config(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await rig.step(plan(SITE, LAPTOP))
    bad = base64.b64encode(b"k" * 31).decode()
    rig.write("gw", "privateKey", bad)
    await rig.step()
    await rig.step()
    assert rig.device.private_key == rig.private and len(rig.device.applied) == 1
    rejected = [r.getMessage() for r in caplog.records if "wireguard.config.rejected" in r.getMessage()]
    assert rejected == [
        "wireguard.config.rejected error='secret gw key privateKey: must decode to 32 bytes, got 31' "
        "running=last-good"
    ]
    new = key()
    rig.write("gw", "privateKey", new)
    await rig.step()
    assert rig.device.private_key == new and rig.device.applied[-1].peers == ()  # rotation only
    assert len(rig.netdev.calls) == 2  # a new key: address/routes are re-checked too
    text = caplog.text + repr(rig.sink.published) + rig.health.ready[1]
    for secret in (rig.private, rig.psk, bad, new):
        assert secret not in text


async def test_a_missing_preshared_key_leaves_its_peer_out_and_an_invalid_plan_is_named(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    (rig.secrets / "a" / "psk").unlink()
    await rig.step(plan(SITE, LAPTOP))
    assert set(rig.device.peers) == {B}, "the rest of the plan is applied"
    assert rig.health.ready == (
        True,
        "wg0 configured with 1 peers (fake); left out (key material missing): site-a",
    )
    assert rig.peers()["site-a"]["state"] == "Failed"
    assert rig.peers()["site-a"]["lastError"] == "left out: preshared key: secret a key psk: not mounted"
    assert list(rig.netdev.routes) == [], "no route into the tunnel for a peer that is not on the device"
    rig.write("a", "psk", rig.psk)
    await rig.step()
    assert set(rig.device.peers) == {A, B} and rig.device.peers[A].preshared_key == rig.psk
    assert list(rig.netdev.routes) == ["203.0.113.0/28"]
    assert rig.peers()["site-a"]["state"] == "NeverConnected" and "lastError" not in rig.peers()["site-a"]
    lines = [r.getMessage() for r in caplog.records if "wireguard.peer." in r.getMessage()]
    assert lines == [
        "wireguard.peer.left_out name=site-a reason='preshared key: secret a key psk: not mounted' "
        "action=not-on-device",
        "wireguard.peer.restored name=site-a",
    ]
    await rig.step(plan(SITE, replace(LAPTOP, public_key="not-a-key")))
    assert rig.agent.config_error == "wireguard.peers[1].publicKey: not valid base64"
    assert set(rig.device.peers) == {A, B} and rig.health.ready[0]
    assert rig.sink.published[-1]["agent"]["lastError"] == (
        "newer input rejected, last good configuration running: "
        "wireguard.peers[1].publicKey: not valid base64"
    )


async def test_a_preshared_key_that_goes_missing_removes_its_peer_and_a_removal_in_the_same_plan_applies(
    rig: Rig,
) -> None:
    """Before: the missing Secret rejected the whole configuration, so LAPTOP's removal in the same plan
    change never reached the device. Now both happen: LAPTOP removed, SITE taken off too (it must not
    keep its old key), reported; a third peer untouched."""
    third = WgPeer("laptop-c", key(), ("10.99.0.4/32",))
    await rig.step(plan(SITE, LAPTOP, third))
    rig.device.handshake(third.public_key, NOW - 5, rx=10, tx=20)
    moved = replace(SITE, preshared_key_ref=SecretRef("a-rotated", "psk"))
    await rig.step(plan(moved, third))
    assert set(rig.device.peers) == {third.public_key}
    assert sorted((p.public_key, p.remove) for p in rig.device.applied[-1].peers) == sorted(
        [(A, True), (B, True)]
    ), "both removed in one request, laptop-c not touched"
    assert rig.device.peers[third.public_key].last_handshake == NOW - 5
    assert set(rig.peers()) == {"site-a", "laptop-c"} and rig.peers()["site-a"]["state"] == "Failed"
    assert rig.sink.published[-1]["agent"] == {"planHash": plan_hash(plan(moved, third)), "lastError": None}


async def test_the_gateways_missing_private_key_keeps_the_device_as_it_is_and_is_reported(rig: Rig) -> None:
    await rig.step(plan(SITE, LAPTOP))
    (rig.secrets / "gw" / "privateKey").unlink()
    await rig.step(plan(SITE))  # a removal in the same change: gateway-level, so not applied either
    assert set(rig.device.peers) == {A, B} and len(rig.device.applied) == 1
    assert rig.sink.published[-1]["agent"] == {
        "planHash": plan_hash(plan(SITE, LAPTOP)),
        "lastError": "newer input rejected, last good configuration running: secret gw key privateKey: "
        "not mounted",
    }


async def test_daemon_death_and_restart_reapplies_everything(rig: Rig) -> None:
    await rig.step(plan(SITE, LAPTOP))
    rig.device.handshake(A, NOW - 1)
    await rig.step()
    assert rig.peers()["site-a"]["state"] == "Connected"
    rig.device.up = False
    await rig.step()
    assert rig.health.ready[0] is False and "unavailable" in rig.health.ready[1]
    assert rig.peers()["site-a"]["state"] == "Stale"  # last handshake kept, but not claimed Connected
    rig.device.restart()
    await rig.step()
    assert rig.device.private_key == rig.private and set(rig.device.peers) == {A, B}
    assert rig.health.ready[0] is True and len(rig.netdev.calls) == 2
    assert rig.peers()["site-a"]["state"] == "NeverConnected"


async def test_fast_restart_between_polls_is_noticed_by_the_diff(rig: Rig) -> None:
    await rig.step(plan(SITE))
    rig.device.restart()
    await rig.step()
    assert (
        rig.device.private_key == rig.private and set(rig.device.peers) == {A} and len(rig.netdev.calls) == 2
    )


async def test_backend_unavailable_is_retried(rig: Rig) -> None:
    attempts = []

    async def flaky(interface: str, uapi_dir: Path | None) -> WireGuardBackend:
        attempts.append(interface)
        if len(attempts) < 3:
            raise BackendUnavailable("no UAPI socket and no wireguard module")
        return rig.device

    rig.agent.open_backend = flaky
    await rig.step(plan(SITE))
    await rig.step()
    assert rig.health.ready == (False, "WireGuard device unavailable: no UAPI socket and no wireguard module")
    await rig.step()
    assert rig.health.ready[0] and set(rig.device.peers) == {A}


async def test_device_rejection_is_reported_not_ready(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.device.reject = "wg0 (fake): set failed: errno=22"
    await rig.step(plan(SITE))
    await rig.step()
    assert rig.health.ready == (False, "device rejected the configuration: wg0 (fake): set failed: errno=22")
    assert sum("wireguard.apply.rejected" in r.getMessage() for r in caplog.records) == 1
    rig.device.reject = None
    await rig.step()
    assert rig.health.ready[0]


async def test_netdev_failure_is_retried(rig: Rig) -> None:
    rig.netdev.fail = "wg0: Operation not permitted"
    await rig.step(plan(SITE))
    assert rig.health.ready == (False, "address/routes not configured: wg0: Operation not permitted")
    rig.netdev.fail = None
    await rig.step()
    assert rig.health.ready[0] and rig.netdev.calls


async def test_hostname_endpoints_are_resolved_and_re_resolved(rig: Rig) -> None:
    """``resolve()`` is one round of the background resolver (``Endpoints.run``), driven by hand here."""

    async def resolve() -> None:
        await rig.agent.endpoints.refresh()

    roaming_site = replace(SITE, endpoint="site-a.example.net:51820")
    await rig.step(plan(roaming_site))
    assert rig.agent.endpoints.hosts == {"site-a.example.net"}, "the step names the host it wants"
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint is None  # not resolvable yet: nothing invented
    rig.dns["site-a.example.net"] = "198.51.100.2"
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint is None  # a failure is retried after 5 s, not every round
    rig.mono.t += 5
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint == "198.51.100.2:51820"
    rig.dns["site-a.example.net"] = "198.51.100.9"
    rig.mono.t += 30
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint == "198.51.100.2:51820"  # not due yet
    rig.mono.t += 31
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint == "198.51.100.9:51820"
    del rig.dns["site-a.example.net"]
    rig.mono.t += 61
    await resolve()
    await rig.step()
    assert rig.device.peers[A].endpoint == "198.51.100.9:51820"  # DNS failure: last good address stays
    await rig.step(plan(SITE))
    assert rig.agent.endpoints.hosts == frozenset() and rig.agent.endpoints.addresses == {}


async def test_a_step_never_waits_on_dns_and_a_late_answer_wakes_the_loop(rig: Rig) -> None:
    """A resolver that hangs (a DNS outage; no DNS server can be assumed here, so the resolver is a fake
    gated by the test) never holds up a step: the plan applies at once, a peer removal too. When the name
    finally resolves, the background task wakes the loop (poll interval 60 s here) and the endpoint is
    applied without anything else changing."""
    answer = anyio.Event()
    asked: list[str] = []

    async def slow_dns(host: str) -> str:
        asked.append(host)
        await answer.wait()
        return "198.51.100.7"

    rig.agent.endpoints.resolver = slow_dns
    rig.agent.endpoints.timeout = 3600.0  # the outage outlasts the test unless answered
    rig.agent.settings = replace(rig.agent.settings, poll_interval=60.0)
    roaming_site = replace(SITE, endpoint="site-a.example.net:51820")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.agent.run, StaticPlans(plan(roaming_site, LAPTOP)))
            await wait_for_async(
                lambda: set(rig.device.peers) == {A, B} and asked, 10, "both peers on the fake device", 0.01
            )
            assert rig.device.peers[A].endpoint is None, "configured without waiting for DNS"
            with anyio.fail_after(1):
                await rig.step(plan(roaming_site))  # a plan change while the lookup hangs
            assert set(rig.device.peers) == {A}, "the removal applied at once"
            answer.set()
            await wait_for_async(
                lambda: rig.device.peers[A].endpoint is not None, 10, "A's endpoint resolved", 0.01
            )
            tg.cancel_scope.cancel()
    assert rig.device.peers[A].endpoint == "198.51.100.7:51820"
    assert asked == ["site-a.example.net"]


async def test_the_background_resolver_waits_for_the_next_due_host_or_a_new_one() -> None:
    """``Endpoints.run`` resolves at once what a plan names, then sleeps until the next host is due (or
    a new host is wanted), and wakes its caller only for a changed address."""
    from agent.wireguard.run import Endpoints

    clock = Clock(0.0)
    calls: list[str] = []
    changes: list[dict[str, str]] = []

    async def resolver(host: str) -> str:
        calls.append(host)
        return {"a.example": "192.0.2.1", "b.example": "192.0.2.2"}[host]

    endpoints = Endpoints(resolver, clock, interval=0.2, timeout=1.0)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(endpoints.run, lambda: changes.append(dict(endpoints.addresses)))
            endpoints.want(frozenset({"a.example"}))
            await wait_for_async(lambda: changes, 5, "the first address", 0.005)
            assert changes == [{"a.example": "192.0.2.1"}]
            endpoints.want(frozenset({"a.example", "b.example"}))
            await wait_for_async(lambda: len(changes) == 2, 5, "the second address", 0.005)
            assert calls == ["a.example", "b.example"], "only the new host: a is not due"
            assert endpoints.next_due() == pytest.approx(0.2)
            clock.t = 0.2
            await anyio.sleep(0.4)  # the task's real wait for a's due time (0.2 s on the fake clock)
            await wait_for_async(lambda: len(calls) == 4, 5, "both hosts re-resolved", 0.005)
            assert len(changes) == 2, "re-resolved to the same addresses: no wake-up"
            tg.cancel_scope.cancel()


async def test_status_is_published_on_change_and_counters_at_resync(rig: Rig) -> None:
    await rig.step(plan(SITE))
    rig.device.handshake(A, NOW - 1, rx=10, tx=20)
    await rig.step()
    assert len(rig.sink.published) == 2 and rig.peers()["site-a"]["bytesIn"] == 10
    rig.device.handshake(A, NOW - 1, rx=10, tx=20)  # counters only
    await rig.step()
    assert len(rig.sink.published) == 2
    rig.mono.t += 31
    await rig.step()
    assert len(rig.sink.published) == 3 and rig.peers()["site-a"]["bytesIn"] == 20
    rig.wall.t += 200  # the clock alone makes the handshake stale
    await rig.step()
    assert rig.peers()["site-a"]["state"] == "Stale"


async def test_run_consumes_plans_and_wakes_at_once(rig: Rig) -> None:
    rig.agent.settings = replace(rig.agent.settings, poll_interval=60.0)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.agent.run, StaticPlans(plan(SITE, LAPTOP)))
            await wait_for_async(lambda: rig.health.ready[0], 10, "the agent ready", 0.01)
            tg.cancel_scope.cancel()
    assert set(rig.device.peers) == {A, B} and rig.device.closed


async def test_readiness_says_when_newer_input_is_rejected(rig: Rig) -> None:
    await rig.step(plan(SITE))
    await rig.step(plan(SITE, port=0))
    ready, reason = rig.health.ready
    assert ready and reason.endswith(
        "newer input rejected, last good config running: wireguard.listenPort: 0 must be 1-65535"
    )


async def test_an_unexpected_error_in_a_step_does_not_end_the_loop(rig: Rig) -> None:
    rig.agent.settings = replace(rig.agent.settings, poll_interval=0.01)
    calls = []
    original = rig.agent.step

    async def flaky_step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("bug")
        await original()

    rig.agent.step = flaky_step  # type: ignore[method-assign]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.agent.run, StaticPlans(plan(SITE)))
            await wait_for_async(lambda: rig.health.ready[0], 10, "the agent ready", 0.01)
            tg.cancel_scope.cancel()
    assert len(calls) >= 2 and set(rig.device.peers) == {A}


async def test_due_hostnames_are_resolved_concurrently() -> None:
    """A DNS outage with many hostname peers costs one resolver timeout per step, not one per host: every
    resolution here only finishes once all of them have started, which a sequential loop never reaches."""
    from agent.wireguard.run import Endpoints

    hosts = frozenset(f"site{i}.example" for i in range(5))
    started: set[str] = set()
    all_started = anyio.Event()

    async def resolver(host: str) -> str:
        started.add(host)
        if len(started) == len(hosts):
            all_started.set()
        await all_started.wait()
        return f"192.0.2.{10 + sorted(hosts).index(host)}"

    endpoints = Endpoints(resolver, lambda: 0.0, interval=60.0, timeout=1.0)
    with anyio.fail_after(5):
        assert await endpoints.refresh(hosts)
    assert sorted(endpoints.addresses.values()) == [f"192.0.2.{10 + i}" for i in range(5)]


async def test_a_resolver_error_of_any_kind_is_a_failed_lookup_not_a_dead_task() -> None:
    """The real resolver raises ``idna.IDNAError`` (a UnicodeError, not an OSError) for a label IDNA cannot
    encode, before any lookup is made: it must count as a failed lookup (retried, logged once), or the
    background task would take the agent down with it. The good name is answered by a fake (no DNS
    server can be assumed here)."""
    from agent.wireguard.run import Endpoints, resolve_ipv4

    bad = "ä" * 70 + ".example"

    async def resolver(host: str) -> str:
        return await resolve_ipv4(host) if host == bad else "192.0.2.1"

    endpoints = Endpoints(resolver, lambda: 0.0)
    assert await endpoints.refresh(frozenset({bad, "good.example"}))
    assert endpoints.addresses == {"good.example": "192.0.2.1"}
    assert endpoints.next_due() == 5.0, "the bad one is retried after 5 s"
