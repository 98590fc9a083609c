"""The IPsec backend obeying its HA role, against live charon daemons and init-nat (docs/ha.md).

The gateway's charon is driven by the keeper (in this process, so its role can be switched by hand), a
remote site's charon is configured independently over VICI (lab/peers.py) and answers (and, once, tries
to initiate toward the gateway); ``python -m initnat --watch`` runs in the gateway namespace as in the pod,
following the role file the switch writes (as the agent's elector does). Nothing else is faked.

A standby has the site's connection loaded and never initiates it (no IKE_SA at either end for seconds);
the site initiating toward it is not answered (init-nat drops IKE on NIC2); promotion brings the tunnel
up; demotion takes the SAs down at both ends; promotion again brings it back.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.fakes import ListSink, ManualRole, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.runtime import SecretError
from gwkit.vici import ViciSession
from gwplan import Ha, IkeSecret, Ipsec, Plan, SecretRef, dumps
from lab.wait import wait_for, wait_for_async
from lab.world import Host, Lab
from tests.integration.test_agent_ipsec import PSK, TENANT_PSK, gw_tunnel, setup_site, site_id
from tests.integration.test_initnat_traffic import Procs, our_rules_with_counters
from tests.integration.test_initnat_traffic import plan as nat_plan

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

PY = sys.executable
STANDBY_COMMENT = "vpngw HA standby: not serving"


class PskSecrets:
    def __init__(self, value: bytes) -> None:
        self.value = value

    def read(self, ref: SecretRef) -> bytes:
        if ref != TENANT_PSK:
            raise SecretError(f"secret {ref.name} key {ref.key}: not mounted")
        return self.value

    def version(self, ref: SecretRef) -> str:
        self.read(ref)
        return "v1"


def ha_plan(lab: Lab, sites: list[Host]) -> Plan:
    """init-nat's plan (NIC2, serviceCIDR, exposures) with the sites' tunnels: one plan, as in a pod."""
    return dataclasses.replace(
        nat_plan(lab, ()),
        ipsec=Ipsec(
            secrets=tuple(IkeSecret(f"psk-{s.role}", (site_id(s),), TENANT_PSK) for s in sites),
            tunnels=tuple(gw_tunnel(lab, s) for s in sites),
        ),
    )


async def ike_sas(host: Host) -> dict[str, dict[str, Any]]:
    assert host.charon is not None
    async with await ViciSession.connect(host.charon.vici_socket) as v:
        events, _ = await v.stream("list-sas", {}, "list-sa")
    return {f"{name}#{sa.get('uniqueid')}": sa for e in events for name, sa in e.items()}


async def conns(host: Host) -> list[str]:
    assert host.charon is not None
    async with await ViciSession.connect(host.charon.vici_socket) as v:
        return [str(n) for n in (await v.call("get-conns")).get("conns") or []]


def tunnel_states(sink: ListSink) -> dict[str, str]:
    return {t["name"]: t["state"] for t in (sink.published[-1]["tunnels"] if sink.published else [])}


def standby_drops(lab: Lab) -> int:
    return sum(n for n, r in our_rules_with_counters(lab) if STANDBY_COMMENT in r)


async def start_initnat(procs: Procs, lab: Lab, plan_file: Path, status: Path) -> None:
    procs.start(
        lab.gw, PY, "-m", "initnat", "--plan", str(plan_file), "--watch", "--status-file", str(status),
        name="initnat",
    )  # fmt: skip
    await wait_for_async(procs.says("initnat", "initnat.applied"), 20, "init-nat's first apply")


async def test_a_standby_never_initiates_nor_answers_and_serves_only_once_promoted(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    lab = pod_lab
    site = lab.add_site()
    plan = ha_plan(lab, [site])
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(dumps(plan))
    role = ManualRole(
        "standby", role_file=tmp_path / "ha-role"
    )  # next to the status file: init-nat's default
    await start_initnat(procs, lab, plan_file, tmp_path / "initnat-status.json")
    assert "role=standby" in procs.output("initnat")
    lab.start_charon(lab.gw)
    lab.start_charon(site)
    await setup_site(lab, site)
    sink = ListSink()
    keeper = Keeper(
        lab.gw.charon.vici_socket,  # type: ignore[union-attr]
        StaticPlans(plan),
        PskSecrets(PSK.encode()),
        sink,
        HealthState(stale_after=60),
        timing=Timing(poll_interval=0.2, resync_seconds=2),
        role=role,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)

        # Standby: loaded, reported Standby, and for seconds no IKE_SA at either end.
        await wait_for_async(lambda: tunnel_states(sink) == {site.role: "Standby"}, 15, "the tunnel Standby")
        assert await conns(lab.gw) == [site.role], "the connection is loaded (promotion is instant)"
        for _ in range(15):
            assert await ike_sas(lab.gw) == {} and await ike_sas(site) == {}, "the standby initiated"
            await anyio.sleep(0.2)

        # The site initiating toward the standby is not answered: init-nat drops IKE on NIC2.
        before = standby_drops(lab)
        assert site.charon is not None
        async with await ViciSession.connect(site.charon.vici_socket) as v:
            _, reply = await v.stream(
                "initiate", {"child": "gw-0", "timeout": "3000"}, "control-log", check=False, timeout=10
            )
            assert reply.get("success") != "yes", reply
            assert await ike_sas(lab.gw) == {}, "the standby answered the site"
            await v.stream(
                "terminate", {"ike": "gw", "force": "yes", "timeout": "-1"}, "control-log", check=False
            )
        assert standby_drops(lab) > before, "dropped by init-nat's standby rules"
        assert tunnel_states(sink) == {site.role: "Standby"}

        for round_ in ("first", "again"):
            # Promotion: init-nat lifts the drop, the keeper initiates at once.
            role.set("active")
            await wait_for_async(
                lambda: tunnel_states(sink) == {site.role: "Established"}, 20, f"promotion ({round_})"
            )
            gw_up = [sa for sa in (await ike_sas(lab.gw)).values() if sa["state"] == "ESTABLISHED"]
            site_up = [sa for sa in (await ike_sas(site)).values() if sa["state"] == "ESTABLISHED"]
            assert len(gw_up) == 1 and len(site_up) == 1 and gw_up[0]["initiator"] == "yes"
            wait_for(lambda: STANDBY_COMMENT not in lab.gw.run("iptables-save").stdout.decode(), 5, "lifted")

            # Demotion (fenced): every SA gone at both ends, the configuration kept.
            role.set("standby")

            async def gone() -> bool:
                return await ike_sas(lab.gw) == {} and await ike_sas(site) == {}

            await wait_for_async(gone, 10, f"the SAs gone at both ends ({round_})")
            await wait_for_async(lambda: tunnel_states(sink) == {site.role: "Standby"}, 10, "Standby again")
            assert await conns(lab.gw) == [site.role]
            wait_for(
                lambda: STANDBY_COMMENT in lab.gw.run("iptables-save").stdout.decode(), 5, "the drop back"
            )
        assert keeper.fenced >= 2
        tg.cancel_scope.cancel()
    assert PSK not in procs.output("initnat")


async def test_without_init_nats_drop_a_standby_cuts_what_a_peer_set_up_with_it(lab: Lab) -> None:
    """Defense in depth: with no init-nat (no drop), charon answers the site's initiation; the keeper's
    standby sweep (link.standby_sweep) terminates that IKE_SA at once, at both ends."""
    site = lab.add_site()
    lab.start_charon(lab.gw)
    lab.start_charon(site)
    await setup_site(lab, site)
    sink = ListSink()
    keeper = Keeper(
        lab.gw.charon.vici_socket,  # type: ignore[union-attr]
        StaticPlans(ha_plan(lab, [site])),
        PskSecrets(PSK.encode()),
        sink,
        HealthState(stale_after=60),
        timing=Timing(poll_interval=0.2, resync_seconds=2),
        role=ManualRole("standby"),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        await wait_for_async(lambda: tunnel_states(sink) == {site.role: "Standby"}, 15, "the tunnel Standby")
        assert site.charon is not None
        async with await ViciSession.connect(site.charon.vici_socket) as v:
            _, reply = await v.stream(
                "initiate", {"child": "gw-0", "timeout": "5000"}, "control-log", check=False, timeout=10
            )
        assert reply.get("success") == "yes", "without the drop, charon answers (the IKE_SA came up)"

        async def gone() -> bool:
            return await ike_sas(lab.gw) == {} and await ike_sas(site) == {}

        await wait_for_async(gone, 10, "the answered SA cut at both ends")
        assert keeper.fenced >= 1, "by the standby's sweep"
        await wait_for_async(lambda: tunnel_states(sink) == {site.role: "Standby"}, 10, "Standby again")
        tg.cancel_scope.cancel()


class PushedPlans:
    """A ``PlanSource`` the test pushes plans into, as the agent's plan follower would hand them on."""

    def __init__(self, first: Plan) -> None:
        self.last_error: str | None = None
        self._send, self._receive = anyio.create_memory_object_stream[Plan](max_buffer_size=8)
        self._send.send_nowait(first)

    def push(self, plan: Plan) -> None:
        self._send.send_nowait(plan)

    async def _it(self) -> AsyncIterator[Plan]:
        async for plan in self._receive:
            yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._it()


async def test_an_active_pod_initiates_only_once_its_plan_says_the_public_address_is_here(
    lab: Lab, tmp_path: Path
) -> None:
    """The promoted pod's first IKE packets must not leave before the floating IP's NAT is in place (a
    router keeps the first packet's translation for every retransmit: the end-to-end failover's tunnels
    never came back). Active with ``publicHere`` false: nothing initiated for seconds; the plan saying it
    (the controller's, after its cloud step): the tunnel up at once, initiated by the gateway."""
    site = lab.add_site()
    plan = ha_plan(lab, [site])
    lease = Ha("gw-lease", public_here=False)
    plans = PushedPlans(dataclasses.replace(plan, ha=lease))
    lab.start_charon(lab.gw)
    lab.start_charon(site)
    await setup_site(lab, site)
    sink = ListSink()
    keeper = Keeper(
        lab.gw.charon.vici_socket,  # type: ignore[union-attr]
        plans,
        PskSecrets(PSK.encode()),
        sink,
        HealthState(stale_after=60),
        timing=Timing(poll_interval=0.2, resync_seconds=2),
        role=ManualRole("active"),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        await wait_for_async(lambda: tunnel_states(sink), 15, "the first status")
        assert await conns(lab.gw) == [site.role]
        for _ in range(15):  # 3 s of an active pod whose public address is elsewhere
            assert await ike_sas(lab.gw) == {} and await ike_sas(site) == {}, "initiated too early"
            await anyio.sleep(0.2)
        plans.push(dataclasses.replace(plan, ha=dataclasses.replace(lease, public_here=True)))
        await wait_for_async(lambda: tunnel_states(sink) == {site.role: "Established"}, 20, "the tunnel up")
        gw_up = [sa for sa in (await ike_sas(lab.gw)).values() if sa["state"] == "ESTABLISHED"]
        assert len(gw_up) == 1 and gw_up[0]["initiator"] == "yes"
        tg.cancel_scope.cancel()
