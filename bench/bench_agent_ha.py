"""Benchmark: how long the agent's HA elector (agent.ha) takes to hand a gateway over, against the API
emulator; prints numbers, asserts nothing.

    .venv/bin/python bench/bench_agent_ha.py [--rounds 5] [--duration 3] [--renew 1.0]

Two electors contend for one Lease (tests/component/test_agent_ha.py's ``Pod``, each with its own user
and only the pod's Role's rights). Per round, with the holder:

* release: stopped gracefully (it releases): from the stop to the standby's promotion;
* kill: cancelled without release (a SIGKILL): from the kill to the promotion, and from the holder's last
  successful renewal sent to the promotion (at least the duration, by design);
* partition: its requests hang: from the cut to the holder's fence, and the gap from its fence to the
  other's promotion (positive: never two active).

All instants are this process's monotonic clock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwplan import Ha
from lab.kubeapi import KubeAPIThread
from lab.wait import wait_for_async
from tests.component.test_agent_ha import LEASE, EmulatorWorld, pods


def summary(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name:<38} -"
    return f"{name:<38} n={len(xs)} median={statistics.median(xs):.3f}s min={min(xs):.3f}s max={max(xs):.3f}s"


async def one_round(world: EmulatorWorld, tmp: Path, ha: Ha, how: str, out: dict[str, list[float]]) -> None:
    async with pods(world, tmp, "pod-a", "pod-b", ha=ha) as (a, b):
        await wait_for_async(
            lambda: {a.elector.current, b.elector.current} == {"active", "standby"}, 30, "one"
        )
        first, second = (a, b) if a.elector.current == "active" else (b, a)
        await wait_for_async(lambda: second.elector.memory.seen is not None, 10, "the standby reading")
        await anyio.sleep(ha.renew_seconds * 1.5)
        t0 = time.monotonic()
        if how == "release":
            first.stop()
        elif how == "kill":
            first.kill()
        else:
            world.partition(first.name)
        await wait_for_async(lambda: second.elector.current == "active", 60, "the takeover", interval=0.01)
        promoted = second.instant("active", t0)
        assert promoted is not None
        out[f"{how}: to promotion"].append(promoted - t0)
        if how == "kill":
            renewed = first.elector.memory.renewed_at
            if renewed is not None:
                out["kill: last renewal sent to promotion"].append(promoted - renewed)
        if how == "partition":
            fenced = first.instant("standby", t0)
            if fenced is not None:
                out["partition: cut to fence"].append(fenced - t0)
                out["partition: fence to promotion"].append(promoted - fenced)
            world.heal(first.name)


async def bench(rounds: int, ha: Ha) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "release: to promotion",
            "kill: to promotion",
            "kill: last renewal sent to promotion",
            "partition: to promotion",
            "partition: cut to fence",
            "partition: fence to promotion",
        )
    }
    for i in range(rounds):
        for how in ("release", "kill", "partition"):
            with tempfile.TemporaryDirectory() as d, KubeAPIThread(kubeconfig=Path(d) / "kubeconfig") as api:
                world = EmulatorWorld(api, Path(d))
                world.create_lease({"leaseDurationSeconds": ha.lease_duration_seconds})
                await one_round(world, Path(d) / f"r{i}", ha, how, out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=3)
    p.add_argument("--renew", type=float, default=1.0)
    ns = p.parse_args()
    ha = Ha(LEASE, ns.duration, ns.renew)
    print(f"lease {ns.duration}s, renew {ns.renew}s, {ns.rounds} rounds of release, kill and partition")
    for name, xs in anyio.run(bench, ns.rounds, ha).items():
        print(summary(name, xs))


if __name__ == "__main__":
    main()
