"""Benchmark: how fast the backends and init-nat act on an HA role change (docs/ha.md). Live daemons in the
lab (needs root); prints numbers, asserts nothing.

    .venv/bin/python bench/bench_ha_role.py [--sites 10] [--rounds 5] [--skip ipsec,wireguard,initnat]

* IPsec: the keeper (in this process, a hand-flipped role: tests/integration/test_ha_ipsec.ManualRole)
  on the gateway's charon with N responding sites, all Established. Fence (active -> standby): from the
  switch to the gateway's charon listing no IKE_SA (VICI polled every 5 ms from a thread) and to the
  keeper's ``ha.fenced`` line (its own measure of the terminate calls). Promotion (standby -> active):
  from the switch to the keeper's first ``tunnel.initiate`` line, and to every site ESTABLISHED at the
  gateway's charon.
* init-nat: ``python -m initnat --watch`` (its default 0.25 s poll) in the pod-like gateway namespace; the
  role file replaced by atomic rename; the time from the rename to the end of the apply that put the role
  in force (the wall-clock stamp of its ``initnat.applied ... role=`` line).
* WireGuard: the agent on the gateway's wireguard-go and N responder sites (no keepalive in the plan, so
  the kick alone starts the handshakes); from the switch to every peer's last handshake at the gateway
  (UAPI, nanoseconds), and from the switch to the fence's end (the link down and the sessions dropped:
  every peer's last handshake back to none).
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab helpers live in tests/

from agent.fakes import ListSink, ManualRole, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.runtime import Settings
from agent.wireguard.run import WireGuardAgent
from gwkit.vici import ViciSession
from gwkit.wireguard import uapi
from gwkit.wireguard.netdev import IpRouteNetDev
from gwplan import dumps
from lab import netns
from lab.peers import keypair
from lab.wait import wait_for, wait_for_async
from lab.world import Host, Lab
from tests.integration.test_agent_ipsec import PSK, setup_site
from tests.integration.test_ha_ipsec import PskSecrets, ha_plan
from tests.integration.test_ha_wireguard import GW_TUNNEL, KeySecrets, wg_plan
from tests.integration.test_initnat_traffic import Procs


class Marks(logging.Handler):
    """The monotonic time of each log line whose message starts with a watched event name."""

    def __init__(self, *events: str) -> None:
        super().__init__(logging.INFO)
        self.events = events
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(self.events):
            self.seen.append((time.monotonic(), msg))

    def first(self, event: str, after: float) -> float | None:
        return next((t for t, m in self.seen if t >= after and m.startswith(event)), None)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def summary(name: str, values: list[float]) -> None:
    if values:
        print(
            f"  {name}: median {statistics.median(values) * 1000:.0f} ms, min {min(values) * 1000:.0f}, "
            f"max {max(values) * 1000:.0f} (n={len(values)})"
        )


def sas_at(host: Host) -> list[str]:
    """Blocking (from a thread): the IKE_SA states charon lists."""

    async def ask() -> list[str]:
        assert host.charon is not None
        async with await ViciSession.connect(host.charon.vici_socket) as v:
            events, _ = await v.stream("list-sas", {}, "list-sa")
        return [str(sa.get("state")) for e in events for sa in e.values()]

    return anyio.run(ask)


def poll_until(cond: Callable[[], bool], timeout: float = 30.0, interval: float = 0.005) -> float:
    """Monotonic time ``cond`` first held (``lab.wait.wait_for`` in this thread)."""
    return wait_for(lambda: cond() and time.monotonic(), timeout, "the measured condition", interval=interval)


async def bench_ipsec(sites_n: int, rounds: int) -> None:
    with Lab() as lab:  # no init-nat here: the gateway's IKE replies need no policy routing
        sites = [lab.add_site() for _ in range(sites_n)]
        lab.start_charon(lab.gw)
        for s in sites:
            lab.start_charon(s)
            await setup_site(lab, s)
        marks = Marks("tunnel.initiate ", "ha.fenced")
        logging.getLogger("agent.ipsec.keeper").addHandler(marks)
        logging.getLogger("agent.ipsec.keeper").setLevel(logging.INFO)
        role = ManualRole("active")
        assert lab.gw.charon is not None
        keeper = Keeper(
            lab.gw.charon.vici_socket,
            StaticPlans(ha_plan(lab, sites)),
            PskSecrets(PSK.encode()),
            ListSink(),
            HealthState(stale_after=60),
            timing=Timing(poll_interval=0.5, resync_seconds=30),
            role=role,
        )
        gone, fenced, first, all_up = [], [], [], []
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            established = lambda: sas_at(lab.gw).count("ESTABLISHED") == sites_n  # noqa: E731
            await wait_for_async(lambda: anyio.to_thread.run_sync(established), 60, "all up")
            for i in range(rounds):
                t0 = time.monotonic()
                role.set("standby")
                t = await anyio.to_thread.run_sync(lambda: poll_until(lambda: sas_at(lab.gw) == []))
                fence_line = functools.partial(marks.first, "ha.fenced", t0)
                await wait_for_async(fence_line, 10, "the fence's line")
                gone.append(t - t0)
                fenced.append((marks.first("ha.fenced", t0) or t0) - t0)
                await anyio.sleep(1.0)
                t0 = time.monotonic()
                role.set("active")
                t = await anyio.to_thread.run_sync(lambda: poll_until(established, 60))
                all_up.append(t - t0)
                first.append((marks.first("tunnel.initiate ", t0) or t0) - t0)
                print(
                    f"ipsec round {i + 1}: fence->no SA {ms(gone[-1])} ms (fence line {ms(fenced[-1])}); "
                    f"promotion->first initiate {ms(first[-1])} ms, ->all {sites_n} up {ms(all_up[-1])} ms"
                )
                await anyio.sleep(1.0)
            # A fence while the promotion's initiations are in flight (charon busy with them): from the
            # fence to no IKE_SA at the gateway, which then stays so for a second (the sweep).
            role.set("standby")
            await anyio.to_thread.run_sync(lambda: poll_until(lambda: sas_at(lab.gw) == []))
            await anyio.sleep(1.0)
            flap = []
            for _ in range(rounds):
                role.set("active")
                await anyio.to_thread.run_sync(lambda: poll_until(lambda: len(sas_at(lab.gw)) >= 1, 10))
                t0 = time.monotonic()
                role.set("standby")
                t = await anyio.to_thread.run_sync(lambda: poll_until(lambda: sas_at(lab.gw) == []))
                flap.append(t - t0)
                await anyio.sleep(1.0)
                late = await anyio.to_thread.run_sync(lambda: sas_at(lab.gw))
                print(f"ipsec fence mid-initiation: no SA {ms(flap[-1])} ms; 1 s later: {len(late)} IKE_SA")
                await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
        print(f"IPsec, {sites_n} sites, charon 5.9.8 kernel-libipsec:")
        summary("fence while initiations are in flight -> no IKE_SA at the gateway", flap)
        summary("fence -> no IKE_SA at the gateway", gone)
        summary("fence -> keeper's ha.fenced (terminates done)", fenced)
        summary("promotion -> first initiate", first)
        summary(f"promotion -> all {sites_n} ESTABLISHED", all_up)


def applied(procs: Procs, role: str, before: int) -> bool:
    """init-nat logged one more apply with ``role`` in force than ``before``."""
    return procs.output("initnat").count(f"role={role}") > before


def all_since(handshakes: Callable[[], list[float | None]], since: float) -> bool:
    return all(h is not None and h >= since for h in handshakes())


def bench_initnat(rounds: int) -> None:
    with Lab(pod_mode=True, nic2_name="ens7") as lab, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        site = lab.add_site()
        plan_file, role_file = work / "plan.json", work / "ha-role"
        plan_file.write_bytes(dumps(ha_plan(lab, [site])))
        procs = Procs(work)
        try:
            procs.start(
                lab.gw, sys.executable, "-m", "initnat", "--plan", str(plan_file), "--watch",
                "--status-file", str(work / "initnat-status.json"), name="initnat",
            )  # fmt: skip
            poll_until(lambda: "initnat.applied" in procs.output("initnat"), 30, 0.05)
            took: list[float] = []
            for i in range(rounds * 2):
                want = "standby" if i % 2 == 0 else "active"
                count = procs.output("initnat").count(f"role={want}")
                tmp_file = work / ".ha-role.tmp"
                tmp_file.write_text(want + "\n")
                written = time.time()
                tmp_file.replace(role_file)
                poll_until(functools.partial(applied, procs, want, count), 10, 0.01)
                line = [x for x in procs.output("initnat").splitlines() if f"role={want}" in x][-1]
                stamp = datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
                took.append(stamp - written)
                print(f"initnat {want}: {ms(took[-1])} ms from the rename to the applied line")
                time.sleep(0.5)
            print("init-nat --watch (poll 0.25 s, role file read every 50 ms):")
            summary("role file renamed -> rules applied", took)
        finally:
            procs.stop()


async def bench_wireguard(sites_n: int, rounds: int) -> None:
    with Lab() as lab, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gw_wg = lab.start_wireguard(lab.gw)
        gw_private, gw_public = keypair()
        entries: list[tuple[Host, str, int | None]] = []
        for i in range(sites_n):
            site = lab.add_site()
            wgd = lab.start_wireguard(site)
            private, public = keypair()
            (work / f"{site.role}.key").write_text(private)
            wgd.wg("set", "wg0", "listen-port", "51820", "private-key", str(work / f"{site.role}.key"),
                   "peer", gw_public, "allowed-ips", f"{GW_TUNNEL}/32")  # fmt: skip
            netns.addr(site.ns, "wg0", f"10.99.0.{i + 2}/24")
            netns.run(["ip", "-n", site.ns, "link", "set", "wg0", "up"])
            entries.append((site, public, None))
        role = ManualRole("standby")
        settings = Settings(
            plan=work / "plan.json", secrets_dir=work, wireguard_uapi_dir=gw_wg.uapi_dir, poll_interval=0.5
        )
        agent = WireGuardAgent(
            settings, KeySecrets(gw_private), ListSink(), HealthState(stale_after=60),
            netdev=IpRouteNetDev(netns=lab.gw.ns), role=role,
        )  # fmt: skip

        def handshakes() -> list[float | None]:
            return [p.last_handshake for p in anyio.run(uapi.get, gw_wg.uapi_socket).peers]

        up, down = [], []
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, StaticPlans(wg_plan(entries)))
            await wait_for_async(
                lambda: anyio.to_thread.run_sync(lambda: len(handshakes()) == sites_n), 20, "configured"
            )
            await anyio.sleep(1.0)
            for i in range(rounds):
                t0, wall0 = time.monotonic(), time.time()
                role.set("active")
                since = functools.partial(all_since, handshakes, wall0)
                await anyio.to_thread.run_sync(poll_until, since, 20.0)
                last = await anyio.to_thread.run_sync(handshakes)
                up.append(max(h or 0 for h in last) - wall0)
                await anyio.sleep(1.0)
                t0 = time.monotonic()
                role.set("standby")
                t = await anyio.to_thread.run_sync(lambda: poll_until(lambda: not any(handshakes()), 20))
                down.append(t - t0)
                print(f"wireguard round {i + 1}: promotion->all handshaken {ms(up[-1])} ms; "
                      f"fence->sessions dropped {ms(down[-1])} ms")  # fmt: skip
                await anyio.sleep(1.0)
            tg.cancel_scope.cancel()
        print(f"WireGuard, {sites_n} site peers, wireguard-go 0.0.20220316 (UAPI):")
        summary("promotion -> every site peer's handshake (gateway's clock)", up)
        summary("fence -> link down and every session dropped", down)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sites", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip", default="")
    args = p.parse_args()
    skip = set(args.skip.split(","))
    if "ipsec" not in skip:
        anyio.run(bench_ipsec, args.sites, args.rounds)
    if "initnat" not in skip:
        bench_initnat(args.rounds)
    if "wireguard" not in skip:
        anyio.run(bench_wireguard, args.sites, args.rounds)


if __name__ == "__main__":
    main()
