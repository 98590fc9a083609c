"""Benchmarks of init-nat's hot paths, on the real kernel in throwaway network namespaces (root).

1. Applying 1,000 exposures x 2 grants: the ``iptables-restore --noflush`` transaction itself, the whole
   apply (save + --test + restore + read-back save) and a no-op re-apply, for the legacy and the nft
   variant; for the current ruleset (exposures DNATed only from the tunnels, VPNGW-EXPOSURES; NEW
   connections from NIC2 and into serviceCIDR forwarded only when DNATed; the pod guard VPNGW-INPUT /
   VPNGW-OUTPUT and the metadata rule; the reply chain VPNGW-MANGLE), the one before the hostile-
   neighbour rules, the one before the pod guard, the one before the reply chain, the one before
   VPNGW-TARGETS (no drop of connections to a target's real address), and the rejected alternative of
   admitting established flows per grant and source; and the IPv6 ruleset (rules.ipv6_rules) on its own.
2. Revoking one grant of that ruleset: withdrawing its admission alone (before) against withdrawing it
   with a tombstone, flushing its conntrack mark and lifting the tombstone (now).
3. Deleting one grant's 5,000 of 10,000 conntrack entries: init-nat's ctnetlink flush by mark side by
   side with ``conntrack -D -m MARK/MASK`` in the same run (fresh entries before each measurement).
4. The per-packet price of per-grant established rules: UDP forwarding rate through a namespace whose
   chain holds the current design (one shared established rule) or 2,000 per-grant rules, with the
   flow's mark matched by the last (worst case) or the middle one; of the reply chain: the same flow
   with VPNGW-MANGLE in front, once in its own direction (two rules that do not match) and once as the
   replies of a connection that came in on NIC2 (the bit restored, routed by the two fwmark rules); and
   of the NIC2 ingress rule, the flow coming in on NIC2 (the interface matches, the state test does not).

Usage: ``.venv/bin/python bench/bench_initnat.py [--rounds N] [--only PART]`` (prints tables;
docs/initnat.md).
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
from initnat import rules, tables  # noqa: E402
from initnat.conntrack import NetlinkFlusher  # noqa: E402
from initnat.iptables import Iptables  # noqa: E402

MASK = 0x0FFF0000
REPLY = rules.Reply("ens7", rules.DEFAULT_REPLY_MARK)
GUARD = rules.Guard("ens7", ipsec=True)


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


def _table(ruleset: rules.Ruleset, name: str) -> rules.TableRules:
    return next(t for t in ruleset.tables if t.table == name)


def _replaced(ruleset: rules.Ruleset, table: rules.TableRules) -> rules.Ruleset:
    tabs = tuple(table if t.table == table.table else t for t in ruleset.tables)
    return rules.Ruleset(tabs, ruleset.marks, ruleset.mask)


def without_reply(ruleset: rules.Ruleset) -> rules.Ruleset:
    """The ruleset before the reply chain (no mangle table)."""
    tabs = tuple(t for t in ruleset.tables if t.table != "mangle")
    return rules.Ruleset(tabs, ruleset.marks, ruleset.mask)


def per_grant_established(ruleset: rules.Ruleset) -> rules.Ruleset:
    """The rejected alternative: the shared established rule replaced by one rule per (grant, source)
    that accepts only that mark's flows from that source (what an iptables-only revocation needs)."""
    flt = _table(ruleset, "filter")
    m = f"{ruleset.mask:#x}"
    per: list[str] = []
    seen = set()
    for r in flt.rules:
        if "--set-xmark" in r:
            src = r.split(" -s ", 1)[1].split(" ", 1)[0]
            mark = r.rsplit("--set-xmark ", 1)[1].split("/", 1)[0]
            if (src, mark) not in seen:
                seen.add((src, mark))
                per.append(
                    f"-A {rules.FILTER_CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED --ctorigsrc {src} "
                    f"-m connmark --mark {mark}/{m} -j ACCEPT"
                )
    out: list[str] = []
    for r in flt.rules:
        out.extend(per if "vpngw established granted flows" in r else [r])
    return _replaced(ruleset, rules.TableRules("filter", flt.chains, tuple(out)))


def without_targets(ruleset: rules.Ruleset) -> rules.Ruleset:
    """The ruleset before VPNGW-TARGETS (an empty chain stays declared, as the restore needs it)."""
    flt = _table(ruleset, "filter")
    kept = tuple(r for r in flt.rules if rules.TARGET_CHAIN not in r)
    return _replaced(ruleset, rules.TableRules("filter", flt.chains, kept))


def before_hostile(ruleset: rules.Ruleset) -> rules.Ruleset:
    """The ruleset as init-nat rendered it before the hostile-neighbour rules: exposures DNATed in
    VPNGW-PREROUTING from any interface, no NIC2 ingress drop, no serviceCIDR drop."""
    new = (rules.NIC2_INGRESS, rules.SERVICE_CIDR_DNAT_ONLY, rules.TUNNEL_TO_EXPOSURES)
    tabs = []
    for t in ruleset.tables:
        kept = tuple(
            r.replace(f"-A {rules.EXPOSURE_CHAIN} ", f"-A {rules.DNAT_CHAIN} ")
            for r in t.rules
            if not any(c in r for c in new)
        )
        tabs.append(rules.TableRules(t.table, tuple(c for c in t.chains if c != rules.EXPOSURE_CHAIN), kept))
    return rules.Ruleset(tuple(tabs), ruleset.marks, ruleset.mask)


def bench_ipv6(rounds: int) -> None:
    """The IPv6 ruleset (ip6tables-restore; 7 rules for IPsec): whole apply from empty tables and the
    no-op re-apply that every apply and resync adds."""
    ruleset = rules.ipv6_rules(GUARD)
    for variant in ("legacy", "nft"):
        whole, noop = [], []
        for _ in range(rounds):
            _reset(variant, family="ip6")
            ipt = Iptables(variant, family="ipv6")
            t = time.perf_counter()
            assert ipt.apply(ruleset).changed
            whole.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert not ipt.apply(ruleset).changed
            noop.append(time.perf_counter() - t)
        _reset(variant, family="ip6")
        print(f"  {variant:6s} IPv6 ruleset ({ruleset.rule_count} rules) whole apply {_stats(whole)}")
        print(f"  {variant:6s} IPv6 ruleset no-op re-apply          {_stats(noop)}")


def bench_restore(rounds: int) -> None:
    t0 = time.perf_counter()
    policy = rules.validate(big_nat(), nic2_address=IPv4Address("192.0.2.2"), reply=REPLY, guard=GUARD)
    ruleset = rules.render(policy)
    render_s = time.perf_counter() - t0
    print(f"1,000 exposures x 2 grants: validate+render {render_s * 1000:.1f} ms")
    # What every apply also computes to find revocations: the previous policy against the new one, and
    # the kernel's admission rules (parsed from a save) against the new rendering.
    saved = tables.parse_save("*filter\n" + "\n".join(_table(ruleset, "filter").rules) + "\nCOMMIT\n")
    memory, kernel = [], []
    for _ in range(max(rounds, 5)):
        t = time.perf_counter()
        rules.flushes(policy, policy)
        memory.append(time.perf_counter() - t)
        t = time.perf_counter()
        tables.revoked_in_kernel(tables.admissions_in(saved), ruleset)
        tables.tombstones_in(saved)
        kernel.append(time.perf_counter() - t)
    print(f"  revocation check, previous policy   {_stats(memory)}")
    print(f"  revocation check, kernel's rules    {_stats(kernel)}")
    unguarded = rules.render(rules.validate(big_nat(), nic2_address=IPv4Address("192.0.2.2"), reply=REPLY))
    variants = [
        ("current (hostile-neighbour rules, pod guard, reply chain)", ruleset),
        ("before the hostile-neighbour rules", before_hostile(ruleset)),
        ("before the pod guard (with the reply chain)", before_hostile(unguarded)),
        ("before the reply chain", without_reply(before_hostile(unguarded))),
        ("before VPNGW-TARGETS", without_targets(without_reply(before_hostile(unguarded)))),
        ("per-grant established", per_grant_established(without_reply(before_hostile(unguarded)))),
    ]
    times: dict[tuple[str, str], tuple[list[float], list[float], list[float]]] = {
        (label, v): ([], [], []) for label, _ in variants for v in ("legacy", "nft")
    }
    for r in range(rounds):  # the rulesets interleaved (order alternating), so machine noise hits all alike
        for label, rs in variants if r % 2 == 0 else variants[::-1]:
            for variant in ("legacy", "nft"):
                ipt = Iptables(variant)
                restore, whole, noop = times[(label, variant)]
                _reset(variant)
                t = time.perf_counter()
                applied = ipt.apply(rs)
                whole.append(time.perf_counter() - t)
                restore.append(applied.seconds)
                t = time.perf_counter()
                assert not ipt.apply(rs).changed
                noop.append(time.perf_counter() - t)
                _reset(variant)
    for label, rs in variants:
        counts = ", ".join(f"{t.table} {len(t.rules)}" for t in rs.tables)
        print(f" {label}: {rs.rule_count} rules ({counts})")
        for variant in ("legacy", "nft"):
            restore, whole, noop = times[(label, variant)]
            print(f"  {variant:6s} restore transaction  {_stats(restore)}")
            print(f"  {variant:6s} whole apply         {_stats(whole)}   (save, --test, restore, read back)")
            print(f"  {variant:6s} no-op re-apply      {_stats(noop)}   (save + compare)")
    bench_ipv6(rounds)


def bench_revocation(rounds: int) -> None:
    """Revoke grant 0x10000 (of 2,000) from a full ruleset: the old sequence (withdraw, flush) against
    the current one (withdraw + tombstone, flush, delete the tombstone). Each round starts from the full
    ruleset."""
    nat = big_nat()
    full = rules.validate(nat, nic2_address=IPv4Address("192.0.2.2"), reply=REPLY, guard=GUARD)
    revoked_nat = Nat(
        service_cidr=nat.service_cidr,
        exposures=nat.exposures,
        grants=tuple(g for g in nat.grants if g.mark != 0x10000),
        mark_mask=nat.mark_mask,
    )
    after = rules.validate(revoked_nat, nic2_address=IPv4Address("192.0.2.2"), reply=REPLY, guard=GUARD)
    gone = rules.flushes(full, after)
    assert gone == {rules.Flush(0x10000, MASK)}, gone
    flusher = NetlinkFlusher()
    print("revoking one grant of 1,000 exposures x 2 grants (apply + flush of its mark + lift):")
    for variant in ("legacy", "nft"):
        ipt = Iptables(variant)
        old, new, lift = [], [], []
        for r in range(rounds):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                _reset(variant)
                ipt.apply(rules.render(full))
                t = time.perf_counter()
                if which == "old":
                    ipt.apply(rules.render(after))
                    flusher.flush_mark(0x10000, MASK)
                    old.append(time.perf_counter() - t)
                else:
                    ipt.apply(rules.render(after, tombstones=gone))
                    flusher.flush_mark(0x10000, MASK)
                    lifting = time.perf_counter()
                    ipt.delete("filter", rules.tombstone_rules(gone))
                    done = time.perf_counter()
                    new.append(done - t)
                    lift.append(done - lifting)
                    assert not ipt.apply(rules.render(after)).changed
        print(f"  {variant:6s} withdraw, flush (before)          {_stats(old)}")
        print(f"  {variant:6s} withdraw+tombstone, flush, lift  {_stats(new)}")
        print(f"  {variant:6s}   of which the lift alone        {_stats(lift)}   (a -D payload)")
        _reset(variant)
    flusher.close()


def _reset(variant: str, family: str = "ip") -> None:
    for table in ("filter", "nat", "mangle") if family == "ip" else ("filter",):
        subprocess.run([f"{family}tables-{variant}", "-t", table, "-F"], check=True)
        subprocess.run([f"{family}tables-{variant}", "-t", table, "-X"], check=True)


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


SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.1.0.2", 40000)); s.connect((sys.argv[2], 9))
payload, n, end = b"x" * 64, 0, time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    for _ in range(100):
        try:
            s.send(payload); n += 1
        except OSError:
            pass
print(n)
"""


DEST = "10.9.0.9"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _packets_chain(grants: int, position: int | None, nic2: bool = False) -> str:
    """FORWARD -> VPNGW-FORWARD: what an established packet of a granted flow walks. ``position`` None
    is the current design (one shared rule); else ``grants`` per-grant rules, the flow's mark in the
    ``position``-th. ``nic2``: with the NIC2 ingress rule first, NIC2 being r0 (the flow's way in)."""
    lines = [
        "*filter",
        ":VPNGW-FORWARD - [0:0]",
        ":VPNGW-TARGETS - [0:0]",
        "-A FORWARD -j VPNGW-FORWARD",
    ]
    if nic2:
        lines.append(
            "-A VPNGW-FORWARD -i r0 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j DROP"
        )
    lines += [
        "-A VPNGW-FORWARD -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j VPNGW-TARGETS",
    ]
    if position is None:
        lines.append(
            f"-A VPNGW-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -m connmark ! --mark 0x0/{MASK:#x} "
            "-j ACCEPT"
        )
    else:
        for i in range(1, grants + 1):
            src = "10.1.0.2" if i == position else str(IPv4Address("172.16.0.1") + i)
            lines.append(
                f"-A VPNGW-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED --ctorigsrc {src} "
                f"-m connmark --mark {i << 16:#x}/{MASK:#x} -j ACCEPT"
            )
    lines += ["-A VPNGW-FORWARD -j DROP", "COMMIT", ""]  # only the established, marked flow passes
    return "\n".join(lines)


def _established_flow(ns: str, mark: int, *, replies: bool = False) -> None:
    """The sender's flow as an established (replied, assured) conntrack entry carrying ``mark``; with
    ``replies`` the entry is the other way round, so the sender's packets are its REPLY direction."""
    _in(ns, "conntrack", "-F", check=False)
    ends = [("10.1.0.2", "40000"), (DEST, "9")]
    (src, sport), (dst, dport) = ends[::-1] if replies else ends
    _in(ns, "conntrack", "-I", "-p", "udp", "-s", src, "-d", dst, "--sport", sport,
        "--dport", dport, "-t", "600", "-u", "SEEN_REPLY,ASSURED", "-m", str(mark))  # fmt: skip


def _reply_chain() -> str:
    """The mangle chain as init-nat renders it, NIC2 being the router's r1 (the destination side)."""
    lines = ["*mangle", f":{rules.MANGLE_CHAIN} - [0:0]", f"-A PREROUTING -j {rules.MANGLE_CHAIN}"]
    lines += list(rules.reply_rules(rules.Reply("r1", rules.DEFAULT_REPLY_MARK)))
    return "\n".join([*lines, "COMMIT", ""])


def _reply_routing(ns: str, on: bool) -> None:
    """init-nat's two fwmark rules and a table 100 whose default route leads to the destination too."""
    bit = f"{rules.DEFAULT_REPLY_MARK:#x}/{rules.DEFAULT_REPLY_MARK:#x}"
    for prio, table, extra in (("1002", "main", ["suppress_prefixlength", "0"]), ("1003", "100", [])):
        if on:
            _ip("-n", ns, "rule", "add", "fwmark", bit, "lookup", table, *extra, "priority", prio)
        else:
            subprocess.run(
                ["ip", "-n", ns, "rule", "del", "priority", prio], check=False, capture_output=True
            )
    if on:
        _ip("-n", ns, "route", "replace", "default", "via", "10.2.0.2", "dev", "r1", "table", "100")


def _in(ns: str, *argv: str, check: bool = True, input: str | None = None) -> str:
    res = subprocess.run(["ip", "netns", "exec", ns, *argv], input=input, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {ns}: {res.stderr.strip()}")
    return res.stdout


def _packet_rate(
    variant: str, hosts: tuple[str, str, str], position: int | None, reply: str, grants: int, seconds: float
) -> float:
    """One measurement: the router's chains for the case, a fresh conntrack entry, the sender for
    ``seconds``; kpps delivered."""
    s, r, d = hosts
    _reply_routing(r, reply in ("own", "replies"))  # the fwmark rules exist for every packet's route lookup
    try:
        for table in ("filter", "mangle"):
            for op in ("-F", "-X"):
                _in(r, f"iptables-{variant}", "-t", table, op, check=False)
        _in(r, f"iptables-{variant}-restore", input=_packets_chain(grants, position, reply == "nic2"))
        if reply in ("own", "replies"):
            _in(r, f"iptables-{variant}-restore", input=_reply_chain())
        bit = rules.DEFAULT_REPLY_MARK if reply == "replies" else 0
        _established_flow(r, ((position or 1) << 16) | bit, replies=reply == "replies")
        _in(d, "iptables-legacy", "-Z", "INPUT")
        _in(s, sys.executable, "-c", SENDER, str(seconds), DEST)
        if reply == "replies":  # the bit was restored, and it is what routed them
            save = _in(r, f"iptables-{variant}-save", "-c", "-t", "mangle")
            restored = next(x for x in save.splitlines() if "--restore-mark" in x)
            assert not restored.startswith("[0:"), restored
            mark = f"{rules.DEFAULT_REPLY_MARK:#x}"
            got = _in(r, "ip", "route", "get", DEST, "from", "10.1.0.2", "iif", "r0", "mark", mark)
            assert "table 100" in got, got
        out = _in(d, "iptables-legacy", "-L", "INPUT", "-vnx")
        return int(next(x for x in out.splitlines() if "dpt:9" in x).split()[0]) / seconds / 1000
    finally:
        _reply_routing(r, False)


def bench_packets(rounds: int, seconds: float = 1.5, grants: int = 2000) -> None:
    """UDP forwarding rate (64-byte payloads, one flow, veth) through a router namespace whose chain is
    the current design or ``grants`` per-grant established rules. The sender's CPU does the forwarding
    (veth hands packets to the same CPU's softirq), so the rate is bounded by the per-packet cost."""
    base = f"vg{os.getpid()}x{secrets.token_hex(3)}-pk"
    s, r, d = (f"{base}{x}" for x in "srd")
    addrs = (
        (s, "s0", "10.1.0.2/24"),
        (r, "r0", "10.1.0.1/24"),
        (r, "r1", "10.2.0.1/24"),
        (d, "d0", "10.2.0.2/24"),
    )
    cases: list[tuple[str, int | None, str]] = [
        ("one shared established rule", None, ""),
        ("+ NIC2 ingress rule, the flow coming in on NIC2", None, "nic2"),
        ("+ reply chain and rules, the flow's own direction", None, "own"),
        ("+ reply chain and rules, replies of a NIC2 flow", None, "replies"),
        (f"per-grant: {grants} rules, flow's mark in the middle", grants // 2, ""),
        (f"per-grant: {grants} rules, flow's mark last", grants, ""),
    ]
    try:
        for ns in (s, r, d):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", s, "link", "add", "s0", "type", "veth", "peer", "name", "r0", "netns", r)
        _ip("-n", r, "link", "add", "r1", "type", "veth", "peer", "name", "d0", "netns", d)
        for ns, dev, cidr in addrs:
            _ip("-n", ns, "addr", "add", cidr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", s, "route", "add", "default", "via", "10.1.0.1")
        _ip("-n", d, "route", "add", "default", "via", "10.2.0.1")
        # The destination is behind the router's DEFAULT route (main), as a fabric client is behind a pod's:
        # the reply rules' main lookup (suppress_prefixlength 0) then falls through to table 100.
        _ip("-n", d, "addr", "add", f"{DEST}/32", "dev", "lo")
        _ip("-n", r, "route", "add", "default", "via", "10.2.0.2")
        _in(r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _in(d, "iptables-legacy", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
        print(f"forwarding one established UDP flow (64 B payload), {seconds} s per measurement:")
        for variant in ("legacy", "nft"):
            rates: dict[str, list[float]] = {label: [] for label, _, _ in cases}
            for _ in range(rounds):  # the cases interleaved, so a slower minute of the machine hits all
                for label, position, reply in cases:
                    rates[label].append(_packet_rate(variant, (s, r, d), position, reply, grants, seconds))
            for label, _, _ in cases:
                xs = rates[label]
                print(
                    f"  {variant:6s} {label:58s} median {statistics.median(xs):7.1f} kpps  "
                    f"min {min(xs):7.1f}  max {max(xs):7.1f}"
                )
            for table in ("filter", "mangle"):
                for op in ("-F", "-X"):
                    _in(r, f"iptables-{variant}", "-t", table, op, check=False)
    finally:
        for ns in (s, r, d):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def inner(rounds: int, only: str | None = None) -> None:
    print(f"kernel {os.uname().release}, {os.cpu_count()} cpus, rounds={rounds}")
    for name, fn in (
        ("restore", bench_restore),
        ("revocation", bench_revocation),
        ("conntrack", bench_conntrack),
    ):
        if only is None or only == name:
            fn(rounds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", choices=("restore", "revocation", "conntrack", "packets"), help="one part only")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        inner(args.rounds, args.only)
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rc = 0
    if args.only != "packets":
        ns = f"vg{os.getpid()}x{secrets.token_hex(3)}-bench"  # the lab's prefix: stale ones get cleaned up
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            argv = [sys.executable, __file__, "--inside", "--rounds", str(args.rounds)]
            argv += ["--only", args.only] if args.only else []
            rc = subprocess.run(["ip", "netns", "exec", ns, *argv], env=env, check=False).returncode
        finally:
            subprocess.run(["ip", "netns", "del", ns], check=False)
    if args.only in (None, "packets") and rc == 0:
        bench_packets(args.rounds)
    return rc


if __name__ == "__main__":
    sys.exit(main())
