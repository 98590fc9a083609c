"""initnat.iptables against the real iptables-restore (legacy and nft) in a throwaway network namespace:
atomic apply, idempotence, foreign rules and chains untouched, rollback after a failed commit, revocation
order with real conntrack entries."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

import pytest

from gwplan import Exposure, Grant, Nat, Port
from initnat import rules, tables
from initnat.iptables import Completed, Iptables, IptablesError, Runner, detect_variant, run_process
from lab import netns
from tests.helpers import conntrack as _ct

pytestmark = [pytest.mark.lab]

FOREIGN = """\
*filter
:FOREIGN-CHAIN - [0:0]
-A FORWARD -s 10.9.9.9/32 -j ACCEPT
-A FOREIGN-CHAIN -j RETURN
COMMIT
*nat
-A POSTROUTING -o eth0 -j MASQUERADE
COMMIT
"""


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-ipt"
    netns.add_ns(name, netns.POD_SYSCTLS)  # as a pod's namespace: no forwarding, strict rp_filter
    try:
        yield name
    finally:
        netns.destroy_ns(name)


def in_ns(ns: str) -> Runner:
    def run(argv: Sequence[str], input: str | None = None) -> Completed:
        return run_process(netns.ns_exec(ns, *argv), input)

    return run


def ruleset(*grants: Grant, ports: tuple[int, ...] = (80,)) -> rules.Ruleset:
    return rules.render(
        rules.validate(
            Nat(
                service_cidr="198.18.0.0/24",
                exposures=(
                    Exposure(
                        "web", "198.18.0.10", tuple(Port(p) for p in ports), target_address="192.0.2.66"
                    ),
                ),
                grants=grants,
            ),
            nic2_address=IPv4Address("192.0.2.2"),
        )
    )


GA = Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x10000)
GB = Grant("s2", "web", "exposure", ("203.0.113.16/28",), 0x20000)


def foreign_lines(ipt: Iptables) -> list[str]:
    text = ipt.run([f"iptables-{ipt.variant}-save"]).stdout
    return [line for line in text.splitlines() if line.startswith(("-A", ":")) and "VPNGW" not in line]


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_apply_is_idempotent_and_leaves_foreign_rules_alone(ns: str, variant: str) -> None:
    ipt = Iptables(variant, in_ns(ns))  # type: ignore[arg-type]
    assert ipt.run([f"iptables-{variant}-restore", "--noflush"], FOREIGN).returncode == 0
    foreign = foreign_lines(ipt)
    first = ipt.apply(ruleset(GA, GB))
    assert first.changed and first.rules > 0
    assert tables.in_sync(ipt.saved(), ruleset(GA, GB)), "the kernel holds exactly what we rendered"
    assert not ipt.apply(ruleset(GA, GB)).changed, "same plan, nothing written"
    saved = ipt.saved()
    assert saved["filter"].rules["FORWARD"][0] == "-A FORWARD -j VPNGW-FORWARD", "our jump comes first"
    assert ipt.apply(ruleset(GB)).changed
    assert foreign_lines(ipt) == foreign, "foreign rules and chains are never touched"
    assert "0x10000" not in tables.own_rules_text(ipt.saved())


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_failed_commit_leaves_the_previous_ruleset_fully_in_place(ns: str, variant: str) -> None:
    """The filter section commits, then the nat section fails in the kernel (fault injected by
    corrupting the real commit's nat section after --test passed): the snapshot is put back."""
    real = in_ns(ns)
    commits = []

    def faulty(argv: Sequence[str], input: str | None = None) -> Completed:
        if input and argv[-1] == "--wait":
            commits.append(input)
            if len(commits) == 1:  # the real commit, not the rollback after it
                input = input.replace("-j DNAT --to-destination", "-j NO-SUCH-TARGET --to-destination", 1)
        return real(argv, input)

    good = Iptables(variant, real)  # type: ignore[arg-type]
    good.apply(ruleset(GA))
    before = tables.own_rules_text(good.saved())
    with pytest.raises(IptablesError, match="previous rules restored") as e:
        Iptables(variant, faulty).apply(ruleset(GB, ports=(80, 443)))  # type: ignore[arg-type]
    assert e.value.rolled_back and len(commits) == 2
    assert commits[0].index("*filter") < commits[0].index("*nat"), "filter commits before nat fails"
    assert tables.own_rules_text(good.saved()) == before, "filter was committed, then rolled back"


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_refused_ruleset_changes_nothing(ns: str, variant: str) -> None:
    ipt = Iptables(variant, in_ns(ns))  # type: ignore[arg-type]
    ipt.apply(ruleset(GA))
    before = tables.own_rules_text(ipt.saved())
    bad = rules.Ruleset(
        tables=(rules.TableRules("filter", ("VPNGW-FORWARD",), ("-A VPNGW-FORWARD -j NO-SUCH-CHAIN",)),),
        marks=frozenset(),
        mask=0x0FFF0000,
    )
    # legacy's --test catches this; nft's --test does not check jump targets, so the commit fails and
    # the snapshot goes back: either way nothing changed.
    with pytest.raises(IptablesError, match=r"refused by --test|previous rules restored"):
        ipt.apply(bad)
    assert tables.own_rules_text(ipt.saved()) == before


def test_variant_detection_follows_the_namespace_that_holds_the_rules(ns: str) -> None:
    run = in_ns(ns)
    assert detect_variant(run) == "nft"
    rules_text = (
        "*filter\n" + "".join(f"-A INPUT -s 10.0.0.{i}/32 -j ACCEPT\n" for i in range(12)) + "COMMIT\n"
    )
    assert run(["iptables-legacy-restore", "--noflush"], rules_text).returncode == 0
    assert detect_variant(run) == "legacy"


def test_flush_by_mark_deletes_exactly_that_grants_entries(ns: str) -> None:
    for i in range(40):
        mark = 0x10000 if i % 4 == 0 else 0x20000
        res = _ct(
            ns, "-I", "-s", f"203.0.113.{i + 1}", "-d", "198.18.0.10", "-p", "tcp", "--sport", str(2000 + i),
            "--dport", "80", "--state", "ESTABLISHED", "-t", "300", "-u", "ASSURED", "-m", str(mark),
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    code = (
        "from initnat.conntrack import NetlinkFlusher, flush_marks; from initnat.rules import Flush;"
        "print(*flush_marks(NetlinkFlusher(), [Flush(0x10000, 0x0fff0000)]))"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        netns.ns_exec(ns, sys.executable, "-c", code), capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "0x10000/0xfff0000"
    assert _ct(ns, "-L", "-m", "0x10000/0xfff0000").stdout.strip() == b""
    assert len(_ct(ns, "-L", "-m", "0x20000/0xfff0000").stdout.splitlines()) == 30


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_lifting_tombstones_deletes_exactly_those_rules(ns: str, variant: str) -> None:
    """After a revoked mark's flush, its DROP is deleted by a small ``-D`` payload: the chain is then
    exactly the steady-state ruleset (a re-apply writes nothing); deleting a rule that is not there is
    refused as a whole."""
    ipt = Iptables(variant, in_ns(ns))  # type: ignore[arg-type]
    assert ipt.run([f"iptables-{variant}-restore", "--noflush"], FOREIGN).returncode == 0
    foreign = foreign_lines(ipt)
    policy = rules.validate(
        Nat(
            service_cidr="198.18.0.0/24",
            exposures=(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
            grants=(GB,),
        ),
        nic2_address=IPv4Address("192.0.2.2"),
    )
    stones = {rules.Flush(0x10000, 0x0FFF0000), rules.Flush(0x30000, 0x7FFF0000)}
    assert ipt.apply(rules.render(policy, stones)).changed
    assert tables.tombstones_in(ipt.saved()) == stones
    ipt.delete("filter", rules.tombstone_rules(stones))
    assert tables.in_sync(ipt.saved(), rules.render(policy)) and not ipt.apply(rules.render(policy)).changed
    one = rules.Flush(0x10000, 0x0FFF0000)
    ipt.apply(rules.render(policy, [one]))
    before = tables.own_rules_text(ipt.saved())
    with pytest.raises(IptablesError, match="nothing changed"):
        ipt.delete("filter", rules.tombstone_rules([one, rules.Flush(0x40000, 0x0FFF0000)]))
    assert tables.own_rules_text(ipt.saved()) == before, "all or nothing: the present one stays too"
    assert tables.tombstones_in(ipt.saved()) == {one} and foreign_lines(ipt) == foreign


def _masked(mask: int, *grants: Grant, reply: rules.Reply | None = None) -> rules.Policy:
    return rules.validate(
        Nat(
            service_cidr="198.18.0.0/24",
            exposures=(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
            grants=grants,
            mark_mask=mask,
        ),
        nic2_address=IPv4Address("192.0.2.2"),
        reply=reply,
    )


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_the_widest_mark_mask_accepted_round_trips_and_a_full_one_would_not(ns: str, variant: str) -> None:
    """Why validation stops at 0xfffffffe: iptables-save prints ``--mark X/0xffffffff`` as ``--mark X``
    (libxt_connmark print_mark), so a full mask would never be in sync, its tombstones would not be found
    after a restart, and the kernel's admissions would differ from every rendering (each grant revoked)."""
    ipt = Iptables(variant, in_ns(ns))  # type: ignore[arg-type]
    stone = rules.Flush(0x10000, 0xFFFFFFFE)
    widest = rules.render(_masked(0xFFFFFFFE, GB), [stone])
    ipt.apply(widest)
    saved = ipt.saved()
    assert tables.in_sync(saved, widest) and not ipt.apply(widest).changed
    assert tables.tombstones_in(saved) == {stone}
    plain = rules.render(_masked(0xFFFFFFFE, GB))
    assert tables.revoked_in_kernel(tables.admissions_in(saved), plain) == set()
    with pytest.raises(rules.NatConfigError, match=r"nat\.markMask: 0xffffffff"):
        _masked(0xFFFFFFFF, GB)
    # The reply bit is then the one bit left (nic.replyMark 0x1): it round-trips as well.
    with_reply = rules.render(_masked(0xFFFFFFFE, GB, reply=rules.Reply("ens7", 0x1)))
    ipt.apply(with_reply)
    assert tables.in_sync(ipt.saved(), with_reply) and not ipt.apply(with_reply).changed
    full = rules.Ruleset(  # what rendering a full mask would give, were it accepted
        tuple(
            rules.TableRules(t.table, t.chains, tuple(r.replace("fffffffe", "ffffffff") for r in t.rules))
            for t in widest.tables
        ),
        widest.marks,
        0xFFFFFFFF,
    )
    ipt.apply(full)
    saved = ipt.saved()
    assert not tables.in_sync(saved, full) and tables.tombstones_in(saved) == frozenset()


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_one_address_service_cidr_reads_back_in_sync(ns: str, variant: str) -> None:
    """iptables-save prints a /32 conntrack address without its prefix (``--ctorigdst 198.18.0.10``):
    rendered with ``/32`` the gate rule never read back equal, so every resync re-applied everything."""
    ipt = Iptables(variant, in_ns(ns))  # type: ignore[arg-type]
    one = rules.render(
        rules.validate(
            Nat(
                service_cidr="198.18.0.10/32",
                exposures=(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
                grants=(GA,),
            ),
            nic2_address=IPv4Address("192.0.2.2"),
        )
    )
    assert ipt.apply(one).changed
    assert tables.in_sync(ipt.saved(), one) and not ipt.apply(one).changed


FOREIGN_MANGLE = """\
*mangle
:CNI-MANGLE - [0:0]
-A PREROUTING -i eth0 -j MARK --set-xmark 0x4000/0x4000
-A CNI-MANGLE -j RETURN
COMMIT
"""


@dataclass
class Counting:
    """The real tools in the namespace, counting the real (not --test) restores."""

    run: Runner
    restores: int = 0

    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        if argv[0].endswith("-restore") and "--test" not in argv:
            self.restores += 1
        return self.run(argv, input)


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_the_reply_chain_reads_back_in_sync_after_a_restart_and_its_drift_is_repaired(
    ns: str, variant: str
) -> None:
    """The mangle table goes through the same transaction, read-back and repair as the others, with
    the real iptables: in sync as rendered (a restarted init-nat, which remembers nothing, writes
    nothing), foreign mangle rules untouched, our jump put back first, a rule of ours deleted or edited
    by hand restored."""
    real = Counting(in_ns(ns))
    ipt = Iptables(variant, real)  # type: ignore[arg-type]
    assert real.run([f"iptables-{variant}-restore", "--noflush"], FOREIGN_MANGLE).returncode == 0
    rs = rules.render(_masked(0x0FFF0000, GA, GB, reply=rules.Reply("ens7", 0x10000000)))
    assert [t.table for t in rs.tables] == ["filter", "nat", "mangle"]
    assert ipt.apply(rs).changed and real.restores == 1
    foreign = foreign_lines(ipt)
    assert "-A PREROUTING -i eth0 -j MARK --set-xmark 0x4000/0x4000" in foreign
    assert ipt.print_known and ipt.printed is None, "read back exactly as rendered: no probe"
    saved = ipt.saved()
    assert saved["mangle"].rules["PREROUTING"][0] == "-A PREROUTING -j VPNGW-MANGLE", "our jump first"
    assert saved["mangle"].rules["VPNGW-MANGLE"] == list(rs.tables[2].rules)

    restarted = Iptables(variant, real)  # type: ignore[arg-type]
    assert not restarted.apply(rs).changed and real.restores == 1, "a restart finds it in sync"
    assert foreign_lines(ipt) == foreign

    chain = "VPNGW-MANGLE"
    drifts = [
        [f"iptables-{variant}", "-t", "mangle", "-D", chain, "2"],
        [f"iptables-{variant}", "-t", "mangle", "-R", chain, "1", "-i", "ens8", "-j", "CONNMARK",
         "--set-xmark", "0x10000000/0x10000000"],
        [f"iptables-{variant}", "-t", "mangle", "-I", "PREROUTING", "1", "-j", "CNI-MANGLE"],
        [f"iptables-{variant}", "-t", "mangle", "-F", chain],
    ]  # fmt: skip
    for drift in drifts:
        assert real.run(drift).returncode == 0, drift
        assert not tables.in_sync(ipt.saved(), rs), drift
        assert restarted.apply(rs).changed, drift
        assert tables.in_sync(ipt.saved(), rs) and not restarted.apply(rs).changed, drift
    assert ipt.saved()["mangle"].rules["PREROUTING"][:2] == [
        "-A PREROUTING -j VPNGW-MANGLE",
        "-A PREROUTING -j CNI-MANGLE",
    ]
    assert [line for line in foreign_lines(ipt) if "CNI-MANGLE" not in line] == [
        line for line in foreign if "CNI-MANGLE" not in line
    ], "foreign mangle rules untouched"


FOREIGN_INPUT = """\
*filter
-A INPUT -i lo -j ACCEPT
-A OUTPUT -o lo -j ACCEPT
COMMIT
"""


def _guarded(guard: rules.Guard) -> rules.Ruleset:
    return rules.render(
        rules.validate(
            Nat(
                service_cidr="198.18.0.0/24",
                exposures=(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
                grants=(GA,),
            ),
            nic2_address=IPv4Address("192.0.2.2"),
            reply=rules.Reply("ens7", 0x10000000),
            tunnel_interfaces=(("wireguard.interface", "wg0"),) if guard.wireguard else (),
            guard=guard,
        )
    )


@pytest.mark.parametrize("variant", ["legacy", "nft"])
@pytest.mark.parametrize(
    "guard",
    [
        pytest.param(rules.Guard("ens7", ipsec=True), id="ipsec"),
        pytest.param(rules.Guard("ens7", wireguard=("wg0", 51820)), id="wireguard"),
    ],
)
def test_the_pod_guard_reads_back_in_sync_after_a_restart_and_its_drift_is_repaired(
    ns: str, variant: str, guard: rules.Guard
) -> None:
    """VPNGW-INPUT and VPNGW-OUTPUT (and the metadata rule in VPNGW-TARGETS) go through the same
    transaction, read-back and repair as the other chains, with the real iptables: printed exactly as
    rendered (``-m policy``, ``-i ipsec+``, ``-p esp`` included: no probe), a restart writes nothing, our
    jumps first in INPUT and OUTPUT, foreign INPUT/OUTPUT rules untouched, drift repaired."""
    real = Counting(in_ns(ns))
    ipt = Iptables(variant, real)  # type: ignore[arg-type]
    assert real.run([f"iptables-{variant}-restore", "--noflush"], FOREIGN_INPUT).returncode == 0
    rs = _guarded(guard)
    (flt,) = [t for t in rs.tables if t.table == "filter"]
    assert ipt.apply(rs).changed and real.restores == 1
    assert ipt.print_known and ipt.printed is None, "read back exactly as rendered: no probe"
    saved = ipt.saved()
    assert saved["filter"].rules["INPUT"] == ["-A INPUT -j VPNGW-INPUT", "-A INPUT -i lo -j ACCEPT"]
    assert saved["filter"].rules["OUTPUT"] == ["-A OUTPUT -j VPNGW-OUTPUT", "-A OUTPUT -o lo -j ACCEPT"]
    for chain in ("VPNGW-INPUT", "VPNGW-OUTPUT", "VPNGW-TARGETS"):
        assert saved["filter"].rules[chain] == [r for r in flt.rules if r.startswith(f"-A {chain} ")], chain

    restarted = Iptables(variant, real)  # type: ignore[arg-type]
    assert not restarted.apply(rs).changed and real.restores == 1, "a restart finds it in sync"
    drifts = [
        [f"iptables-{variant}", "-D", "VPNGW-INPUT", "2"],
        [f"iptables-{variant}", "-F", "VPNGW-OUTPUT"],
        [f"iptables-{variant}", "-I", "INPUT", "1", "-j", "ACCEPT"],  # a foreign ACCEPT in front of ours
    ]
    for drift in drifts:
        assert real.run(drift).returncode == 0, drift
        assert not tables.in_sync(ipt.saved(), rs), drift
        assert restarted.apply(rs).changed, drift
        assert tables.in_sync(ipt.saved(), rs) and not restarted.apply(rs).changed, drift
    assert ipt.saved()["filter"].rules["INPUT"] == [
        "-A INPUT -j VPNGW-INPUT",
        "-A INPUT -j ACCEPT",
        "-A INPUT -i lo -j ACCEPT",
    ], "our jump first again, foreign rules kept"
