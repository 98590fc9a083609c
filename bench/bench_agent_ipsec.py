"""Benchmark: how fast the IPsec status-agent brings every tunnel back after charon is killed, how fast
a plan change is applied, and how fast a rotated key's site tunnel is back. Live daemons in the lab (needs
root); prints numbers, asserts nothing.

    .venv/bin/python bench/bench_agent_ipsec.py [--sites 20] [--restarts 10] [--reloads 5]
                                                [--rotations 0] [--poll-interval 0.2]

Restart: ``kill -9`` the gateway's charon, start it again (the lab returns once the new charon answers on
VICI), then poll the agent's status file every 10 ms until every tunnel is Established again. Reload: add
one tunnel to the plan file (atomic rename) and time until it is Established in the status file.
Rotation: the first site loads a new PSK, then its Secret file is replaced (atomic rename); time until
the gateway's charon lists a new IKE_SA of that site ESTABLISHED (the old one cut: agent.ipsec.plan.cuts),
polled over VICI every 10 ms, and until the status file says Established again after that.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab helpers live in tests/

from gwplan import SecretRef
from lab.wait import WaitTimeout, wait_for, wait_for_async
from lab.world import Host, Lab
from tests.integration.test_agent_ipsec import (
    PSK,
    Agent,
    all_established,
    make_plan,
    sa_ids,
    setup_site,
    start_sites,
)

DOWN_TIMEOUT = 30.0
"""How long a kill -9 of charon may take to show as every tunnel Down in the agent's status."""


def summary(name: str, values: list[float]) -> str:
    v = sorted(values)
    p90 = v[min(len(v) - 1, round(0.9 * (len(v) - 1)))]
    return (
        f"{name}: n={len(v)} min={v[0] * 1000:.0f}ms median={statistics.median(v) * 1000:.0f}ms "
        f"p90={p90 * 1000:.0f}ms max={v[-1] * 1000:.0f}ms"
    )


def wait(agent: Agent, names: list[str], timeout: float = 30.0) -> float:
    start = time.monotonic()
    check = all_established(names)
    try:
        wait_for(lambda: check(agent.tunnels()), timeout, f"{names} all Established", interval=0.01)
    except WaitTimeout as e:
        raise RuntimeError(f"not all Established after {timeout}s") from e
    return time.monotonic() - start


def restarts_once(lab: Lab, agent: Agent, names: list[str]) -> tuple[float, float, float]:
    """kill -9 + start: (reported Down after the kill, charon answering after the kill, all Established
    after charon answered)."""
    assert lab.gw.charon is not None
    killed = time.monotonic()
    lab.gw.charon.kill()
    # Once had no deadline at all: a tunnel never reported Down hung the bench.
    try:
        wait_for(
            lambda: not any(t["state"] == "Established" for t in agent.tunnels().values()),
            DOWN_TIMEOUT,
            "every tunnel reported Down after charon's kill -9",
            interval=0.005,
        )
    except WaitTimeout as e:
        raise RuntimeError(f"tunnels still Established {DOWN_TIMEOUT:g}s after charon's kill -9") from e
    down = time.monotonic() - killed
    lab.gw.charon.start()
    answered = time.monotonic()
    return down, answered - killed, wait(agent, names)


def measure(lab: Lab, agent: Agent, sites: list[Host], n_sites: int, restarts: int, poll: str) -> None:
    active = sites[:n_sites]
    agent.write_plan(make_plan(lab, active))
    agent.start("--poll-interval", poll)
    first = wait(agent, [s.role for s in active], 60)
    print(f"cold start: {n_sites} tunnels Established {first * 1000:.0f}ms after the agent process started")
    runs = []
    for _ in range(restarts):
        runs.append(restarts_once(lab, agent, [s.role for s in active]))
        time.sleep(0.5)
    if not runs:
        return
    print(summary("kill -9: every tunnel reported Down after the kill", [r[0] for r in runs]))
    print(summary("restart: the new charon answering VICI after the kill", [r[1] for r in runs]))
    print(summary(f"restart, {n_sites} tunnels: all Established after charon answered", [r[2] for r in runs]))


def reloads(lab: Lab, agent: Agent, sites: list[Host], n_sites: int) -> None:
    active = sites[:n_sites]
    reload_times = []
    for extra in sites[n_sites:]:
        active = [*active, extra]
        agent.write_plan(make_plan(lab, active))
        reload_times.append(wait(agent, [s.role for s in active]))
    if reload_times:
        print(summary("plan reload adding one tunnel: Established after the rename", reload_times))


async def rotations(lab: Lab, agent: Agent, sites: list[Host], n: int) -> None:
    """Rotate the first site's key ``n`` times (the site first, then the gateway's Secret file); it has a
    Secret of its own, the others keep theirs."""
    site = sites[0]
    own = SecretRef("bench-own-psk", "psk")
    agent.write_psk(PSK, own)
    agent.write_plan(make_plan(lab, sites, refs={site.role: own}))  # a moved reference: cut, back at once
    await anyio.sleep(2)
    await anyio.to_thread.run_sync(wait, agent, [s.role for s in sites])
    to_sa, to_status = [], []
    for i in range(n):
        before = {uid for uid, (name, _) in (await sa_ids(lab)).items() if name == site.role}
        key = f"bench-rotated-{i}-{time.monotonic_ns()}"  # test-only values
        await setup_site(lab, site, psk=key)
        changed = time.monotonic()
        agent.write_psk(key, own)

        async def new_sa(before: set[str] = before) -> bool:
            return any(
                nm == site.role and st == "ESTABLISHED" and uid not in before
                for uid, (nm, st) in (await sa_ids(lab)).items()
            )

        try:
            await wait_for_async(new_sa, 30, f"rotation {i}: a new IKE_SA", interval=0.01)
        except WaitTimeout as e:
            raise RuntimeError(f"rotation {i}: no new IKE_SA after 30 s") from e
        to_sa.append(time.monotonic() - changed)
        await anyio.to_thread.run_sync(wait, agent, [site.role])  # polls the status file every 10 ms
        to_status.append(time.monotonic() - changed)
        await anyio.sleep(random.uniform(0.5, 1.5))  # noqa: S311 (no phase lock with the agent's poll)
    print(
        summary("PSK rotated (site first): the new IKE_SA ESTABLISHED after the Secret file changed", to_sa)
    )
    print(summary("PSK rotated: the status file Established again after the Secret file changed", to_status))


async def main_async(n_sites: int, restarts: int, n_reloads: int, n_rotations: int, poll: str) -> None:
    with Lab() as lab:
        agent = Agent(lab, Path(tempfile.mkdtemp(prefix="bench-agent-")))
        try:
            sites = start_sites(lab, n_sites + n_reloads)
            for s in sites:
                await setup_site(lab, s)
            agent.write_psk(PSK)
            await anyio.to_thread.run_sync(measure, lab, agent, sites, n_sites, restarts, poll)
            await anyio.to_thread.run_sync(reloads, lab, agent, sites, n_sites)
            if n_rotations:
                await rotations(lab, agent, sites, n_rotations)
        finally:
            agent.stop()
            print(f"agent log: {agent.log_file}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sites", type=int, default=20)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--reloads", type=int, default=5)
    p.add_argument("--rotations", type=int, default=0)
    p.add_argument("--poll-interval", default="0.2", help="the agent's (the pod's default is 0.5)")
    a = p.parse_args()
    anyio.run(main_async, a.sites, a.restarts, a.reloads, a.rotations, a.poll_interval)


if __name__ == "__main__":
    main()
