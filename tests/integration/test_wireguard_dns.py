"""Hostname endpoints during a DNS outage, against a live wireguard-go: the WireGuard agent's step never
waits on DNS (the background resolver does), and a late answer is applied when it comes.

The agent runs in-process (``WireGuardAgent.run``) on the gateway's real wireguard-go (UAPI socket) and
configures address/routes in the gateway namespace through rtnetlink (``IpRouteNetDev(netns=...)``). The
resolver is a fake gated by the test: a DNS server cannot be assumed on this machine (no network, and
the lab has none), and an outage must last exactly as long as the test wants. The real resolver
(``getaddrinfo`` through ``/etc/netns/<ns>/hosts``) is exercised by tests/integration/test_wireguard_agent.py.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.fakes import ListSink
from agent.health import HealthState
from agent.runtime import Settings
from agent.sources import FileSecrets
from agent.wireguard.run import WireGuardAgent
from gwkit.wireguard.backend import UapiBackend
from gwkit.wireguard.netdev import IpRouteNetDev
from gwplan import GatewayRef, Plan, SecretRef, WgPeer, WireGuard
from lab import netns
from lab.peers import keypair
from lab.wait import wait_for_async
from lab.world import Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

NAME = "site-a.dns-outage.example"


def plan(*peers: WgPeer) -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, "10.99.0.1/24", SecretRef("gw-key", "privateKey"), peers),
    )


async def test_a_dns_outage_never_holds_up_a_step_and_the_late_answer_is_applied(
    lab: Lab, tmp_path: Path
) -> None:
    site = lab.add_site()
    gw_wg, site_wg = lab.start_wireguard(lab.gw), lab.start_wireguard(site)
    gw_priv, gw_pub = keypair()
    site_priv, site_pub = keypair()
    # The site only answers (no endpoint for the gateway): traffic flows only once the gateway's device
    # has the site's endpoint, i.e. once the name resolved.
    (tmp_path / "site.key").write_text(site_priv)
    site_wg.wg("set", "wg0", "private-key", str(tmp_path / "site.key"), "listen-port", "51820",
               "peer", gw_pub, "allowed-ips", "10.99.0.0/24")  # fmt: skip
    netns.addr(site.ns, "wg0", "10.99.0.2/24")
    netns.run(["ip", "-n", site.ns, "link", "set", "wg0", "up"])
    (tmp_path / "secrets" / "gw-key").mkdir(parents=True)
    (tmp_path / "secrets" / "gw-key" / "privateKey").write_text(gw_priv + "\n")

    answer = anyio.Event()
    asked: list[str] = []

    async def dns(host: str) -> str:  # an outage until the test answers
        asked.append(host)
        await answer.wait()
        return site.addresses[0]

    settings = Settings(
        plan=tmp_path / "unused-plan.json",
        secrets_dir=tmp_path / "secrets",
        wireguard_uapi_dir=gw_wg.uapi_dir,
        poll_interval=0.2,
        resync_seconds=5.0,
    )
    agent = WireGuardAgent(
        settings,
        FileSecrets(settings.secrets_dir),
        ListSink(),
        HealthState(),
        netdev=IpRouteNetDev(netns=lab.gw.ns),
        resolver=dns,
    )
    agent.endpoints.timeout = 3600.0  # the lookup hangs for as long as the outage lasts
    device = UapiBackend(gw_wg.uapi_dir)

    async def peers() -> dict[str, str | None]:
        return {p.public_key: p.endpoint for p in (await device.get("wg0")).peers}

    other = base64.b64encode(os.urandom(32)).decode()
    named = WgPeer("site-a", site_pub, ("10.99.0.2/32", site.lans[0]), f"{NAME}:51820")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, _Plans(agent))
            agent.plan = plan(named, WgPeer("other", other, ("10.99.0.9/32",)))
            agent.wake_up()
            await wait_for_async(
                lambda: _has(peers, 2), 10.0, "both peers configured while the name does not resolve"
            )
            assert asked == [NAME]
            assert (await peers())[site_pub] is None, "no endpoint invented"
            assert not await anyio.to_thread.run_sync(lambda: lab.gw.ping("10.99.0.2", count=1, wait=1))
            t0 = time.monotonic()
            agent.plan = plan(named)  # a plan change during the outage
            await wait_for_async(lambda: _has(peers, 1), 5, "the removal applied")
            removal = time.monotonic() - t0
            answer.set()
            await wait_for_async(
                lambda: _endpoint_is(peers, site_pub, f"{site.addresses[0]}:51820"),
                5,
                "the late answer applied",
            )
            # wireguard-go retries a handshake that had no endpoint after REKEY_TIMEOUT (5 s)
            await wait_for_async(
                lambda: anyio.to_thread.run_sync(lambda: lab.gw.ping(site.lan_host, count=1, wait=1)),
                15,
                "ping the site's LAN through the resolved endpoint",
            )
            tg.cancel_scope.cancel()
    finally:
        await device.aclose()
    assert removal < 2, f"a removal waited {removal:.2f}s behind DNS"  # acceptance: within 2 s


class _Plans:
    """The plan is set on the agent directly (``agent.plan``): this source only keeps ``run`` going."""

    def __init__(self, agent: WireGuardAgent) -> None:
        self.last_error: str | None = None

    def __aiter__(self) -> _Plans:
        return self

    async def __anext__(self) -> Plan:
        await anyio.sleep_forever()
        raise StopAsyncIteration


async def _has(peers: Callable[[], Any], n: int) -> bool:
    return len(await peers()) == n


async def _endpoint_is(peers: Callable[[], Any], key: str, endpoint: str) -> bool:
    return bool((await peers()).get(key) == endpoint)
