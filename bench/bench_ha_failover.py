"""Benchmark: an HA gateway's cloud failover against the REAL Neutron (lab/openstack: neutron 29 on
MariaDB) and the Nova os-interface emulator, through ``OpenStackCloud.ensure``.

    .venv/bin/python bench/bench_ha_failover.py [--moves 10]

One gateway with a reverse exposure on a ClusterLink router, HA with slot a on node-0 and slot b on
node-1; then ``--moves`` ensures alternating the active slot (b, a, b, ...). Per move:

* ``fip``: the floating IP's move as Neutron sees it: from the disassociating PUT's start to the
  associating PUT's end (the disassociation, the GET that sees the floating IP on no port, the
  association);
* ``disassociate`` / ``associate``: the two PUTs alone;
* ``to_fip``: from the ensure's start to the association's end (the reads before the move included);
* ``ensure``: the whole ensure (every read, the two ports' address pairs, the floating IP, the routes).

Also the ensure that enables HA on a running gateway (slot b's port created and attached) and a no-op
ensure. Numbers go to the report / docs (2 cores, shared: upper values).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from controller.cloud import CloudWant, HaWant
from controller.cloudplan import Slot
from controller.openstack import OpenStackCloud, OpenStackSettings
from lab.openstack.cloud import Cloud, cloud_seed, declare_nodes
from lab.openstack.neutron import start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.sdk import connect
from tests.integration.test_controller_openstack import KEY, docs, plan_of_docs


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]
    return f"median {statistics.median(xs):.3f} p90 {p90:.3f} min {xs[0]:.3f} max {xs[-1]:.3f} (n={len(xs)})"


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moves", type=int, default=10)
    args = ap.parse_args()
    if args.moves < 1:
        ap.error("--moves must be at least 1")
    neutron = start_neutron(seed=cloud_seed())
    try:
        assert neutron.seed_data is not None
        cloud = Cloud.from_dict(neutron.seed_data["cloud"])
        with NovaEmulator(neutron.endpoint) as nova:
            declare_nodes(nova, cloud)
            calls: list[tuple[str, float, float]] = []  # (operation, start, end)

            def observe(operation: str, seconds: float, error: BaseException | None) -> None:
                end = time.monotonic()
                calls.append((operation, end - seconds, end))

            backend = OpenStackCloud(
                connect(neutron.endpoint, compute=nova.url),
                OpenStackSettings(
                    cloud.gateway.network_id, cloud.external.network_id, cloud.gateway.subnet_id, "bench"
                ),
                observe=observe,
            )
            a, b = cloud.nodes[0], cloud.nodes[1]
            single = CloudWant(
                KEY, a.name, a.provider_id, plan_of_docs(docs(False, False)), (cloud.clusters[0].router_id,)
            )

            started: list[float] = []

            def ensure(active: Slot | None) -> float:
                w = (
                    single
                    if active is None
                    else dataclasses.replace(single, ha=HaWant(b.name, b.provider_id, active))
                )
                t0 = time.monotonic()
                started.append(t0)
                anyio.run(backend.ensure, w)
                return time.monotonic() - t0

            ensure(None)
            print(f"bench.ha enable_ha_seconds={ensure('a'):.3f} (slot b's port created, tagged, attached)")
            print(f"bench.ha noop_ensure_seconds={ensure('a'):.3f}")
            fip, dis, ass, whole, to_fip = [], [], [], [], []
            for i in range(args.moves):
                calls.clear()
                whole.append(ensure("b" if i % 2 == 0 else "a"))
                puts = [(s, e) for op, s, e in calls if op == "network.update_ip"]
                assert len(puts) == 2, calls
                dis.append(puts[0][1] - puts[0][0])
                ass.append(puts[1][1] - puts[1][0])
                fip.append(puts[1][1] - puts[0][0])
                to_fip.append(puts[1][1] - started[-1])
                print(
                    f"bench.ha move={i} fip={fip[-1]:.3f} disassociate={dis[-1]:.3f} "
                    f"associate={ass[-1]:.3f} to_fip={to_fip[-1]:.3f} ensure={whole[-1]:.3f}"
                )
            print(f"bench.ha fip_move_seconds {summary(fip)}")
            print(f"bench.ha disassociate_seconds {summary(dis)}")
            print(f"bench.ha associate_seconds {summary(ass)}")
            print(f"bench.ha ensure_start_to_fip_seconds {summary(to_fip)}")
            print(f"bench.ha failover_ensure_seconds {summary(whole)}")
            anyio.run(backend.release, KEY)
    finally:
        neutron.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
