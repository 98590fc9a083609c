"""Benchmark: warm-standby HA end to end, in the lab, process mode (lab/kubelet/haworld.py's world: two
lab-kubelet nodes, the controller with ``--cloud openstack --allow-ha`` against the REAL Neutron and the
Nova emulator, the L3 follower as the router, two IPsec sites).

    PYTHONPATH=. .venv/bin/python bench/bench_ha_e2e.py [--failovers 3]

The HA gateway comes up (without HA first, then HA enabled: slot a serves). Then the serving pod's
containers are killed -9, again and again, until ``--failovers`` failovers happened. The kubelet
restarts a container at once after its first exit and after CrashLoopBackOff (10 s, doubling) after the
next ones, so a pod's first crash recovers in place (its restarted agent renews its own Lease) and a
later one fails over to the other slot. Per crash, seconds from the kill until each milestone was first
seen (``HAWorld.crash``):

* ``lease``: the other slot's pod holds the Lease; ``status_ha``: ``status.ha.activeSlot`` says the other
  slot (the controller); ``fip``: the floating IP is on the other slot's port in Neutron;
* ``established_<site>``: the tunnel Established on the CR with a new ``establishedAt``;
* ``traffic_<site>``: the site's first TCP round trip through its tunnel after the first that failed
  (a prober sends one every ~0.1 s).

KNOWN BUG (tests/integration/test_e2e_ha.py): the promoted slot initiates before the floating IP is on
its port, and the router's conntrack pins its IKE un-NATed; the tunnels never come back on their own.
The failovers here run with the lab's stand-in for a fix (``forget_pinned``: the router's entries of the
new port's fixed IP without the floating IP's NAT are deleted once the floating IP is on that port,
``pinned_forgotten``), so the tunnel and traffic numbers are what a fix that holds the initiation until
the floating IP moved would give, about. The issue's goal: < 10 s for a pod kill. Nothing is asserted.

Measured here (2 shared cores, 2026-12-03, one run, 3 failovers a->b, b->a, a->b, 1 in-place recovery),
medians from the kill: Lease taken by the standby 3.4 s; floating IP on its port in Neutron 8.5 s;
traffic back 11.0 s; every tunnel Established on the CR 13.2 s (10.9-15.5 s); status.ha flipped 16.0 s
(the controller writes it after its cloud step). The in-place recovery (the pod's first crash): traffic
16.0 s, tunnels 18.6 s (8.1-10.2 s in a quieter test run). Both miss the 10 s goal on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.kubelet.haworld import Failover, HAWorld
from lab.openstack.cloud import Cloud, cloud_seed, declare_nodes
from lab.openstack.fixtures import OpenStackLab
from lab.openstack.neutron import start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.proxy import FaultProxy
from tests.examples import example_docs

GOAL = 10.0
"""Seconds: the issue's goal for a pod kill."""


def summary(xs: list[float]) -> str:
    if not xs:
        return "never seen"
    xs = sorted(xs)
    return f"median {statistics.median(xs):.2f} min {xs[0]:.2f} max {xs[-1]:.2f} (n={len(xs)})"


def report(kind: str, crashes: list[Failover]) -> None:
    keys = sorted({k for f in crashes for k in f.seconds})
    for k in keys:
        xs = [f.seconds[k] for f in crashes if k in f.seconds]
        print(f"bench.ha_e2e {kind} {k}_seconds {summary(xs)}")
    done = [
        max(v for k, v in f.seconds.items() if k.startswith(("traffic_", "established_"))) for f in crashes
    ]
    if done:
        med = statistics.median(done)
        verdict = "meets" if med < GOAL else "misses"
        print(
            f"bench.ha_e2e {kind} every_tunnel_and_traffic_back_seconds {summary(done)}: "
            f"{verdict} the goal (< {GOAL:g} s for a pod kill)"
        )


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--max-crashes", type=int, default=12)
    args = ap.parse_args()
    if args.failovers < 1:
        ap.error("--failovers must be at least 1")
    in_place: list[Failover] = []
    failovers: list[Failover] = []
    neutron = start_neutron(seed=cloud_seed())
    try:
        assert neutron.seed_data is not None
        cloud = Cloud.from_dict(neutron.seed_data["cloud"])
        with (
            tempfile.TemporaryDirectory(prefix="bench-ha-e2e-") as tmp,
            NovaEmulator(neutron.endpoint) as nova,
            FaultProxy(neutron.endpoint, error_style="neutron", name="neutron") as nproxy,
            FaultProxy(nova.url, error_style="nova", name="nova") as cproxy,
        ):
            declare_nodes(nova, cloud)
            lab = OpenStackLab(neutron, cloud, nova, nproxy, cproxy)
            with HAWorld(Path(tmp), lab) as h:
                h.up(example_docs("ipsec.yaml"))
                h.w.wait(lambda: h.ha().get("activeSlot") == "a", 60, "slot a serving")
                for i in range(args.max_crashes):
                    if len(failovers) >= args.failovers:
                        break
                    f = h.crash(timeout=90, forget_pinned=True)
                    kind = "failover" if f.serving != f.killed_slot else "in_place"
                    (failovers if kind == "failover" else in_place).append(f)
                    print(
                        f"bench.ha_e2e crash={i} killed=slot-{f.killed_slot} serving=slot-{f.serving} "
                        f"{kind} pinned={len(f.pinned)} {f.line()}"
                    )
                leftovers = h.leftovers
            left = leftovers()
            if left:
                print(f"bench.ha_e2e LEFT BEHIND: {left}")
    finally:
        neutron.close()
    report("in_place", in_place)
    report("failover", failovers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
