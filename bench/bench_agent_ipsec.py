"""Benchmark: how fast the IPsec status-agent brings every tunnel back after charon is killed, and how fast
a plan change is applied. Live daemons in the lab (needs root); prints numbers, asserts nothing.

    .venv/bin/python bench/bench_agent_ipsec.py [--sites 20] [--restarts 10] [--reloads 5]

Restart: ``kill -9`` the gateway's charon, start it again (the lab returns once the new charon answers on
VICI), then poll the agent's status file every 10 ms until every tunnel is Established again. Reload: add
one tunnel to the plan file (atomic rename) and time until it is Established in the status file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab helpers live in tests/

from lab.world import Host, Lab
from tests.integration.test_agent_ipsec import (
    PSK,
    Agent,
    all_established,
    make_plan,
    setup_site,
    start_sites,
)


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
    while time.monotonic() - start < timeout:
        if check(agent.tunnels()):
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"not all Established after {timeout}s")


def restarts_once(lab: Lab, agent: Agent, names: list[str]) -> tuple[float, float, float]:
    """kill -9 + start: (reported Down after the kill, charon answering after the kill, all Established
    after charon answered)."""
    assert lab.gw.charon is not None
    killed = time.monotonic()
    lab.gw.charon.kill()
    while any(t["state"] == "Established" for t in agent.tunnels().values()):
        time.sleep(0.005)
    down = time.monotonic() - killed
    lab.gw.charon.start()
    answered = time.monotonic()
    return down, answered - killed, wait(agent, names)


def measure(lab: Lab, agent: Agent, sites: list[Host], n_sites: int, restarts: int) -> None:
    active = sites[:n_sites]
    agent.write_plan(make_plan(lab, active))
    agent.start()
    first = wait(agent, [s.role for s in active], 60)
    print(f"cold start: {n_sites} tunnels Established {first * 1000:.0f}ms after the agent process started")
    runs = []
    for _ in range(restarts):
        runs.append(restarts_once(lab, agent, [s.role for s in active]))
        time.sleep(0.5)
    print(summary("kill -9: every tunnel reported Down after the kill", [r[0] for r in runs]))
    print(summary("restart: the new charon answering VICI after the kill", [r[1] for r in runs]))
    print(summary(f"restart, {n_sites} tunnels: all Established after charon answered", [r[2] for r in runs]))
    reload_times = []
    for extra in sites[n_sites:]:
        active = [*active, extra]
        agent.write_plan(make_plan(lab, active))
        reload_times.append(wait(agent, [s.role for s in active]))
    if reload_times:
        print(summary("plan reload adding one tunnel: Established after the rename", reload_times))


async def main_async(n_sites: int, restarts: int, reloads: int) -> None:
    with Lab() as lab:
        agent = Agent(lab, Path(tempfile.mkdtemp(prefix="bench-agent-")))
        try:
            sites = start_sites(lab, n_sites + reloads)
            for s in sites:
                await setup_site(lab, s)
            agent.write_psk(PSK)
            await anyio.to_thread.run_sync(measure, lab, agent, sites, n_sites, restarts)
        finally:
            agent.stop()
            print(f"agent log: {agent.log_file}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sites", type=int, default=20)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--reloads", type=int, default=5)
    a = p.parse_args()
    anyio.run(main_async, a.sites, a.restarts, a.reloads)


if __name__ == "__main__":
    main()
