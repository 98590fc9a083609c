"""A node that dies, end to end on the REAL control plane (root; tests/integration/test_real_node_loss_e2e.py
is the scenario): two lab kubelets as nodes of a real kube-apiserver and kube-controller-manager v1.35
(lab.controlplane, node-monitor timings ``NodeTimings``: grace 4 s, period 1 s), the chart's controller
with the static cloud, a gateway with two IPsec site peers and traffic on node-a; node-a is partitioned
(heartbeat stops, its processes keep running), the operator's out-of-service taint as soon as it is
NotReady (with the lab's fence: NIC2 leaves node-a for node-b), the gateway back on node-b.

Each round is a fresh world on one control plane for the whole run; prints per round and the median of:
detection (silence -> NotReady), re-pin (-> the controller re-pinned the gateway), rollout (-> the Recreate
rollout deleted the old pod; the operator's fence and taint follow at once), fence (taint -> old pod
force-deleted), pod start (-> the new pod Running on node-b), IKE (-> both tunnels Established on the CR),
traffic (-> both sites reach the exposure), total (silence -> traffic). Each round also says who
force-deleted the old pod (``deleter=``): the controller (its ``PodForceDeleted`` Event) or
kube-controller-manager's pod GC, which force-deletes terminating pods on a NotReady out-of-service node
on its own 20 s period (whichever is first; the fence phase is then pod GC's, not the controller's).

Usage: ``.venv/bin/python bench/bench_node_loss.py [--rounds N] [--grace SECONDS]``; prints
``bench.node_loss ...`` lines and a table (docs/e2e.md). Exit 0, 1 when a round fails, 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gwkit.logs import setup_logging  # noqa: E402
from lab.controlplane import ControlPlane, NodeTimings, cleanup_stale  # noqa: E402
from tests.integration.test_real_kubelet import RealWorld  # noqa: E402
from tests.integration.test_real_node_loss_e2e import node_loss  # noqa: E402

PHASES = {
    "detection": "silence -> NotReady (detection)",
    "repin": "NotReady -> gateway re-pinned",
    "rollout": "-> old pod deleted, NIC2 fenced, tainted",
    "fence": "taint -> old pod force-deleted",
    "pod_start": "-> new pod Running on node-b",
    "ike": "-> both tunnels Established",
    "traffic": "-> both sites reach web",
    "total": "silence -> traffic (total)",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--grace", type=float, default=NodeTimings().monitor_grace, help="--node-monitor-grace-period"
    )
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    if os.geteuid() != 0:
        print("bench.node_loss.failed error='needs root (network namespaces, charon)'", file=sys.stderr)
        return 1
    setup_logging("WARNING")
    cleanup_stale()
    results: dict[str, list[float]] = {k: [] for k in PHASES}
    deleters: dict[str, int] = {"controller": 0, "podgc": 0}
    with ControlPlane(nodes=NodeTimings(monitor_grace=args.grace)) as cp:
        for i in range(args.rounds):
            try:
                with (
                    tempfile.TemporaryDirectory(prefix="vg-bench-") as d,
                    RealWorld(cp, Path(d), nodes=("node-a", "node-b")) as w,
                ):
                    tl = node_loss(w)
            except AssertionError as exc:
                print(f"bench.node_loss.failed round={i} error={str(exc).splitlines()[0]!r}", file=sys.stderr)
                return 1
            b = tl.breakdown()
            print(
                f"bench.node_loss round={i} "
                + " ".join(f"{k}={v:.2f}" for k, v in b.items())
                + f" deleter={tl.deleter}",
                flush=True,
            )
            for k, v in b.items():
                results[k].append(v)
            deleters[tl.deleter] += 1
    print(
        f"\nkernel {os.uname().release}, {os.cpu_count()} cpus, rounds={args.rounds}, grace={args.grace:g} s"
    )
    for key, label in PHASES.items():
        xs = results[key]
        print(f"  {label:40s} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  max {max(xs):6.2f}")
    print(
        f"  old pod force-deleted by: controller {deleters['controller']}, "
        f"kube-controller-manager's pod GC {deleters['podgc']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
