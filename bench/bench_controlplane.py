"""Benchmark of the real control plane (lab.controlplane): start to ready from a cold data directory,
per phase, and the processes' memory once ready.

Each round starts a fresh ``ControlPlane`` (new CA and keys, empty etcd data dir on the tmpfs), waits
until it is ready (etcd /health, kube-apiserver /readyz, kube-controller-manager /healthz, the default
ServiceAccount made by the controllers) and stops it. Numbers go to docs/controlplane.md.

Usage: .venv/bin/python bench/bench_controlplane.py [--rounds N]
Exit codes: 0 ok, 1 the control plane failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.controlplane import ControlPlane, ControlPlaneError, cleanup_stale

log = logging.getLogger("bench.controlplane")
PHASES = ("pki", "etcd", "apiserver", "controller_manager", "default_sa", "total", "stop")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    logging.basicConfig(level=logging.WARNING)
    cleanup_stale()
    load_before = os.getloadavg()[0]
    samples: dict[str, list[float]] = {k: [] for k in PHASES}
    memory: dict[str, float] = {}
    for i in range(args.rounds):
        cp = ControlPlane()
        try:
            cp.start()
            if i == 0:
                memory = {name: rss_mb(pid) for name, pid in cp.pids().items()}
        except ControlPlaneError as e:
            print(f"round {i + 1}: {e}", file=sys.stderr)
            cp.stop()
            return 1
        t0 = time.monotonic()
        cp.stop()
        cp.timings["stop"] = time.monotonic() - t0
        for k in PHASES:
            samples[k].append(cp.timings.get(k, 0.0))
        print(
            f"round {i + 1}: ready in {cp.timings['total']:.2f} s ("
            + ", ".join(f"{k} {cp.timings.get(k, 0.0):.2f}" for k in PHASES if k not in ("total",))
            + ")",
            flush=True,
        )
    print(f"\nload average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"{'phase':<20} {'min s':>7} {'median s':>9} {'max s':>7}")
    for k in PHASES:
        v = samples[k]
        print(f"{k:<20} {min(v):7.2f} {statistics.median(v):9.2f} {max(v):7.2f}")
    print("\nRSS once ready (first round): " + ", ".join(f"{k} {v:.0f} MB" for k, v in memory.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
