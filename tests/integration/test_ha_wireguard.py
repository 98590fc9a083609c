"""The WireGuard backend obeying its HA role (docs/ha.md), against real wireguard-go in the lab.

The gateway's wireguard-go is driven by ``WireGuardAgent`` (in this process, so its role can be switched by
hand; addresses, routes and the link through rtnetlink in the gateway's namespace). Two sites, each a
wireguard-go configured with ``wg`` as a pure responder (no endpoint for the gateway: only the gateway can
start a handshake): site A's plan entry has the controller's default keepalive (25 s), site B's none (the
plan's 0: nothing but the promotion's kick makes the gateway send to it).

Standby: the device is configured (key, listen port, both peers with their endpoints), its link down, no
keepalive, and no handshake happens for seconds (with keepalive 25 one would, at once, if the standby kept
it: wireguard-go here does not follow its link state). Promotion: link up, routes back, a handshake with
both sites at once (wg's latest-handshake at both ends). Demotion: link down and the gateway's sessions
gone (its latest-handshake back to 0). Promotion again: newer handshakes. That the standby receives
nothing is init-nat's drop (tests/integration/test_initnat_ha_role.py).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from agent.fakes import ListSink, ManualRole, StaticPlans
from agent.health import HealthState
from agent.runtime import SecretError, Settings
from agent.wireguard.run import WireGuardAgent
from gwkit.wireguard.netdev import IpRouteNetDev
from gwplan import GatewayRef, Plan, SecretRef, WgPeer, WireGuard
from lab import netns
from lab.peers import keypair
from lab.wait import wait_for_async
from lab.world import Host, Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

GW_KEY = SecretRef("gw-key", "privateKey")
GW_TUNNEL = "10.99.0.1"


class KeySecrets:
    def __init__(self, private: str) -> None:
        self.private = private

    def read(self, ref: SecretRef) -> bytes:
        if ref != GW_KEY:
            raise SecretError(f"secret {ref.name} key {ref.key}: not mounted")
        return self.private.encode()

    def version(self, ref: SecretRef) -> str:
        self.read(ref)
        return "v1"


def wg_plan(sites: list[tuple[Host, str, int | None]]) -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant", "gw"),
        type="wireguard",
        wireguard=WireGuard(
            interface="wg0",
            listen_port=51820,
            address=f"{GW_TUNNEL}/24",
            private_key_ref=GW_KEY,
            peers=tuple(
                WgPeer(
                    name=site.role,
                    public_key=public,
                    allowed_ips=(f"10.99.0.{i + 2}/32", site.lans[0]),
                    endpoint=f"{site.addresses[0]}:51820",
                    persistent_keepalive=keepalive,
                )
                for i, (site, public, keepalive) in enumerate(sites)
            ),
        ),
    )


def site_handshake(site: Host) -> int:
    out = site.wireguard["wg0"].wg("show", "wg0", "latest-handshakes")
    return max((int(line.split()[1]) for line in out.splitlines() if line.strip()), default=0)


def link_up(lab: Lab) -> bool:
    line = lab.gw.run("ip", "-o", "link", "show", "dev", "wg0").stdout.decode()
    return "UP" in line.split("<", 1)[1].split(">")[0].split(",")


def gw_field(lab: Lab, what: str) -> dict[str, str]:
    """``wg show wg0 <what>`` of the gateway per peer (never ``dump``: it prints the private key)."""
    out = lab.gw.wireguard["wg0"].wg("show", "wg0", what)
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def states(sink: ListSink) -> list[str]:
    return [p["state"] for p in (sink.published[-1]["peers"] if sink.published else [])]


async def test_a_standby_device_is_configured_but_silent_and_handshakes_at_once_when_promoted(
    lab: Lab, tmp_path: Path
) -> None:
    sites = [lab.add_site(), lab.add_site()]
    gw_wg = lab.start_wireguard(lab.gw)
    gw_private, gw_public = keypair()
    publics: list[str] = []
    for i, site in enumerate(sites):
        wgd = lab.start_wireguard(site)
        private, public = keypair()
        publics.append(public)
        (tmp_path / f"{site.role}.key").write_text(private)
        wgd.wg(
            "set", "wg0", "listen-port", "51820", "private-key", str(tmp_path / f"{site.role}.key"),
            "peer", gw_public, "allowed-ips", f"{GW_TUNNEL}/32",
        )  # fmt: skip
        netns.addr(site.ns, "wg0", f"10.99.0.{i + 2}/24")
        netns.run(["ip", "-n", site.ns, "link", "set", "wg0", "up"])
    plan = wg_plan([(sites[0], publics[0], 25), (sites[1], publics[1], None)])

    role = ManualRole("standby")
    sink = ListSink()
    settings = Settings(
        plan=tmp_path / "plan.json",
        secrets_dir=tmp_path,
        wireguard_uapi_dir=gw_wg.uapi_dir,
        poll_interval=0.2,
        resync_seconds=5,
    )
    agent = WireGuardAgent(
        settings, KeySecrets(gw_private), sink, HealthState(stale_after=60),
        netdev=IpRouteNetDev(netns=lab.gw.ns), role=role,
    )  # fmt: skip
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run, StaticPlans(plan))

        # Standby: configured (key, port, peers with their endpoints), link down, no keepalive, silent.
        def configured() -> bool:
            ends = gw_field(lab, "endpoints")
            return (
                gw_wg.wg("show", "wg0", "public-key").strip() == gw_public
                and gw_wg.wg("show", "wg0", "listen-port").strip() == "51820"
                and all(ends.get(p) == f"{s.addresses[0]}:51820" for s, p in zip(sites, publics, strict=True))
            )

        await wait_for_async(configured, 15, "the standby's device configured")
        await wait_for_async(lambda: states(sink) == ["Standby", "Standby"], 10, "the peers reported Standby")
        assert not link_up(lab), "a standby's link is down"
        assert set(gw_field(lab, "persistent-keepalive").values()) == {"off"}
        for _ in range(15):
            assert [site_handshake(s) for s in sites] == [0, 0], "the standby handshook"
            await anyio.sleep(0.2)
        assert sites[0].lans[0] not in lab.gw.run("ip", "route", "show", "dev", "wg0").stdout.decode()

        last = [0, 0]
        for round_ in ("first", "again"):
            role.set("active")

            def newer(before: tuple[int, ...] = tuple(last)) -> bool:
                return all(site_handshake(s) > b for s, b in zip(sites, before, strict=True))

            await wait_for_async(newer, 20, f"a handshake with both sites on promotion ({round_})")
            last = [site_handshake(s) for s in sites]
            assert link_up(lab)
            routes = lab.gw.run("ip", "route", "show", "dev", "wg0").stdout.decode()
            assert all(s.lans[0] in routes for s in sites)
            await wait_for_async(
                lambda: states(sink) == ["Connected", "Connected"], 10, "the peers Connected"
            )
            assert all(int(v) > 0 for v in gw_field(lab, "latest-handshakes").values()), "the gateway's too"
            await wait_for_async(
                lambda: gw_field(lab, "persistent-keepalive") == {publics[0]: "25", publics[1]: "off"},
                5,
                "the planned keepalives (the kick's put back to the plan's 0)",
            )

            role.set("standby")
            await wait_for_async(lambda: not link_up(lab), 10, f"link down ({round_})")
            await wait_for_async(
                lambda: set(gw_field(lab, "latest-handshakes").values()) == {"0"}, 10, "the sessions dropped"
            )
            await wait_for_async(lambda: states(sink) == ["Standby", "Standby"], 10, "Standby again")
            assert set(gw_field(lab, "persistent-keepalive").values()) == {"off"}
            await anyio.sleep(1.1)  # latest-handshake counts whole seconds: the next one must be newer
        tg.cancel_scope.cancel()
