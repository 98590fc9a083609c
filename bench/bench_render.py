"""Benchmark: validate + render a gateway with N peers x 4 subnets and 500 exposures.

    python -m bench.bench_render [--peers 100,1000,5000] [--repeat 3]

Prints, per size, the median wall time of: the whole offline path from documents (per-object validation,
parsing, cross-object validation, allocation, rendering), the plan's canonical serialisation, and a
re-render with the previous plan (the running controller's path). Target (issue 3): under 1 s at 1,000
peers, growing linearly. Each peer is granted one exposure (at 5,000 peers only the first 4,000: the
default conntrack mark mask 0x0FFF0000 holds 4,095 grants). Results are in docs/api.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gwplan
from controller.plan.render import RenderOptions, render_documents

EXPOSURES = 500
SUBNETS = 4
MAX_GRANTS = 4000


def documents(peers: int) -> list[dict[str, Any]]:
    gateway = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "type": "ipsec",
            "serviceCIDR": "100.64.0.0/22",
            "exposures": [
                {
                    "name": f"svc{i}",
                    "target": {"address": f"172.16.{i // 250}.{i % 250 + 1}"},
                    "ports": [{"port": 443, "protocol": "TCP"}],
                }
                for i in range(EXPOSURES)
            ],
            "ipsec": {
                "localID": "vpn.bench.example",
                "ike": {"version": 2, "proposals": ["aes256-sha256-modp2048"]},
                "esp": {"proposals": ["aes256gcm16-modp2048"]},
                "pskSecretRef": {"name": "bench-psk", "key": "psk"},
            },
        },
    }
    base = int(ipaddress.IPv4Address("10.0.0.0"))
    out: list[dict[str, Any]] = [gateway]
    for p in range(peers):
        subnets = [str(ipaddress.IPv4Network((base + (p * SUBNETS + j) * 64, 26))) for j in range(SUBNETS)]
        out.append(
            {
                "apiVersion": "vpn.bnerd.net/v1alpha1",
                "kind": "VPNPeer",
                "metadata": {"name": f"peer{p}", "namespace": "bench"},
                "spec": {
                    "gatewayRef": {"name": "bench"},
                    "type": "site",
                    "endpoint": str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("198.51.0.0")) + p + 1)),
                    "ipsec": {"id": f"peer{p}.bench.example", "remoteSubnets": subnets},
                    "authorization": {"exposures": [f"svc{p % EXPOSURES}"] if p < MAX_GRANTS else []},
                },
            }
        )
    return out


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m bench.bench_render")
    ap.add_argument(
        "--peers", default="100,1000,5000", help="comma-separated peer counts (default: %(default)s)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the median is printed (default: 3)")
    args = ap.parse_args(argv)
    print(
        f"{'peers':>6} {'children':>8} {'grants':>6} {'render_s':>9} {'per_peer_ms':>11} {'dumps_s':>8} "
        f"{'rerender_prev_s':>15} {'plan_MB':>8}"
    )
    for n in (int(x) for x in args.peers.split(",")):
        docs = documents(n)
        opts = RenderOptions()
        t_render, plan = timed(lambda d=docs, o=opts: render_documents(d, o), args.repeat)
        t_dumps, data = timed(lambda p=plan: gwplan.dumps(p), args.repeat)
        prev = RenderOptions(previous=plan)
        t_prev, _ = timed(lambda d=docs, o=prev: render_documents(d, o), args.repeat)
        children = sum(len(t.children) for t in plan.ipsec.tunnels)
        print(
            f"{n:>6} {children:>8} {len(plan.nat.grants):>6} {t_render:>9.3f} {1000 * t_render / n:>11.3f} "
            f"{t_dumps:>8.3f} {t_prev:>15.3f} {len(data) / 1e6:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
