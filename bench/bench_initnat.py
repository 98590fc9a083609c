"""Benchmarks of init-nat's two hot paths, on the real kernel in a throwaway network namespace (root).

1. Applying 1,000 exposures x 2 grants (5,001 filter + 2,000 nat rules): the ``iptables-restore
   --noflush`` transaction itself, the whole apply (save + --test + restore), and a no-op re-apply, for
   the legacy and the nft variant.
2. Deleting one grant's 5,000 of 10,000 conntrack entries: init-nat's ctnetlink flush by mark side by
   side with ``conntrack -D -m MARK/MASK`` in the same run (fresh entries before each measurement).

Usage: ``.venv/bin/python bench/bench_initnat.py [--rounds N]`` (prints a table; docs/initnat.md).
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gwplan import Exposure, Grant, Nat, Port  # noqa: E402
from initnat import rules  # noqa: E402
from initnat.conntrack import NetlinkFlusher  # noqa: E402
from initnat.iptables import Iptables  # noqa: E402

MASK = 0x0FFF0000


def big_nat(exposures: int = 1000, grants_each: int = 2) -> Nat:
    exps, grants = [], []
    for i in range(exposures):
        vip = str(IPv4Address("198.18.0.10") + i)
        exps.append(Exposure(f"svc-{i}", vip, (Port(443),), target_address=str(IPv4Address("10.20.0.1") + i)))
        for j in range(grants_each):
            mark = (i * grants_each + j + 1) << 16
            grants.append(Grant(f"peer-{j}", f"svc-{i}", "exposure", (f"172.{16 + j}.0.0/16",), mark))
    return Nat(service_cidr="198.18.0.0/20", exposures=tuple(exps), grants=tuple(grants), mark_mask=MASK)


def _stats(xs: list[float]) -> str:
    return (
        f"median {statistics.median(xs) * 1000:8.1f} ms  min {min(xs) * 1000:8.1f}  max {max(xs) * 1000:8.1f}"
    )


def bench_restore(rounds: int) -> None:
    t0 = time.perf_counter()
    policy = rules.validate(big_nat(), nic2_address=IPv4Address("192.0.2.2"))
    ruleset = rules.render(policy)
    render_s = time.perf_counter() - t0
    print(f"1,000 exposures x 2 grants: {ruleset.rule_count} rules; validate+render {render_s * 1000:.1f} ms")
    for variant in ("legacy", "nft"):
        ipt = Iptables(variant)
        restore, whole, noop = [], [], []
        for _ in range(rounds):
            _reset(variant)
            t = time.perf_counter()
            applied = ipt.apply(ruleset)
            whole.append(time.perf_counter() - t)
            restore.append(applied.seconds)
            t = time.perf_counter()
            assert not ipt.apply(ruleset).changed
            noop.append(time.perf_counter() - t)
        print(f"  {variant:6s} restore transaction  {_stats(restore)}")
        print(f"  {variant:6s} whole apply         {_stats(whole)}   (save + --test + restore)")
        print(f"  {variant:6s} no-op re-apply      {_stats(noop)}   (save + compare)")
        _reset(variant)


def _reset(variant: str) -> None:
    for table in ("filter", "nat"):
        subprocess.run([f"iptables-{variant}", "-t", table, "-F"], check=True)
        subprocess.run([f"iptables-{variant}", "-t", table, "-X"], check=True)


def populate(n: int = 10_000, marks: tuple[int, int] = (0x10000, 0x20000)) -> None:
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    with Conntrack() as ct:
        for i in range(n):
            src = str(IPv4Address("172.16.0.1") + i)
            orig = NFCTAttrTuple(
                saddr=src, daddr="198.18.0.10", proto=socket.IPPROTO_UDP, sport=40000, dport=53
            )
            reply = NFCTAttrTuple(
                saddr="198.18.0.10", daddr=src, proto=socket.IPPROTO_UDP, sport=53, dport=40000
            )
            ct.entry("add", timeout=600, tuple_orig=orig, tuple_reply=reply, mark=marks[i % 2])


def count(mark: int | None = None) -> int:
    argv = ["conntrack", "-L"] + (["-m", f"{mark:#x}/{MASK:#x}"] if mark is not None else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def bench_conntrack(rounds: int) -> None:
    flusher = NetlinkFlusher()

    def ours() -> None:
        flusher.flush_mark(0x10000, MASK)

    def tool() -> None:
        subprocess.run(["conntrack", "-D", "-m", f"{0x10000:#x}/{MASK:#x}"], capture_output=True, check=True)

    results: dict[str, list[float]] = {
        "init-nat flush by mark (ctnetlink)": [],
        "conntrack -D -m MARK/MASK": [],
    }
    runs: list[tuple[str, Callable[[], None]]] = [
        ("init-nat flush by mark (ctnetlink)", ours),
        ("conntrack -D -m MARK/MASK", tool),
    ]
    for r in range(rounds):
        for name, fn in runs if r % 2 == 0 else runs[::-1]:  # alternate the order between rounds
            subprocess.run(["conntrack", "-F"], capture_output=True, check=True)
            populate()
            assert count() == 10_000, count()
            t = time.perf_counter()
            fn()
            results[name].append(time.perf_counter() - t)
            left, other = count(0x10000), count(0x20000)
            assert (left, other) == (0, 5000), (name, left, other)
    flusher.close()
    print("deleting one grant's 5,000 of 10,000 conntrack entries:")
    for name, xs in results.items():
        print(f"  {name:36s} {_stats(xs)}")


def inner(rounds: int) -> None:
    print(f"kernel {os.uname().release}, {os.cpu_count()} cpus, rounds={rounds}")
    bench_restore(rounds)
    bench_conntrack(rounds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        inner(args.rounds)
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    ns = f"vg{os.getpid()}x{secrets.token_hex(3)}-bench"  # the lab's prefix: a stale one gets cleaned up
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = ["ip", "netns", "exec", ns, sys.executable, __file__, "--inside", "--rounds", str(args.rounds)]
        return subprocess.run(argv, env=env, check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    sys.exit(main())
