"""init-nat when iptables-save prints our rules differently than we render them (a newer iptables in a
rebuilt image: another option order, an omitted default). Real iptables (legacy and nft), real netlink,
real conntrack entries flushed by the real ctnetlink flusher, all in a throwaway namespace. The only
stand-in is the print itself: a Runner wrapper rewrites the save output the way another iptables version
might (``-s SRC -p tcp`` printed as ``-p tcp -s SRC``, likewise ``-d``); everything else, including the
restores and the lines we read back, goes through the real tools."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from pyroute2 import Conntrack, IPRoute

from gwplan import Grant
from initnat import rules, tables
from initnat.__main__ import Gateway
from initnat.conntrack import NetlinkFlusher
from initnat.iptables import Completed, Iptables, Runner, run_process
from lab import netns
from lab.netns import NsSysctls
from tests.helpers import conntrack as _ct
from tests.integration.test_initnat_cli import MAC
from tests.integration.test_initnat_cli import make_plan as plan

pytestmark = [pytest.mark.lab]

GA = Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x10000)
GB = Grant("s2", "web", "exposure", ("203.0.113.16/28",), 0x20000)
MASK = 0x0FFF0000
# Our admission rules and the DNAT rule start with an address then the protocol; this "other version"
# prints the protocol first, in every chain. Same rule, same kernel object, other bytes.
_ADDRESS_THEN_PROTOCOL = re.compile(r"^(-A \S+) (-[sd] \S+) (-p \S+) ", re.MULTILINE)
# Likewise our mangle rule (and its probe copy): the state match printed before the interface.
_INTERFACE_THEN_STATE = re.compile(
    r"^(-A VPNGW(?:PROBE)?-MANGLE) (-i \S+) (-m conntrack --ctstate NEW) ", re.M
)


def other_print(save: str) -> str:
    return _INTERFACE_THEN_STATE.sub(r"\1 \3 \2 ", _ADDRESS_THEN_PROTOCOL.sub(r"\1 \3 \2 ", save))


@pytest.fixture
def ns() -> Iterator[str]:
    with netns.nic2_ns("rtp", MAC) as name:
        yield name


@dataclass
class OtherPrint:
    """The real iptables in ``ns``, except that iptables-save prints address-then-protocol rules of ours
    the other way round (unless ``reprint`` is off: this iptables' own print). Counts the real (not
    ``--test``) restores and the saves; the save numbered ``fail_save`` fails once, as one that could not
    get the xtables lock would."""

    ns: str
    reprint: bool = True
    fail_save: int = 0
    restores: int = 0
    saves: int = 0

    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        if argv[0].endswith("-restore") and "--test" not in argv:
            self.restores += 1
        if argv[0].endswith("-save"):
            self.saves += 1
            if self.saves == self.fail_save:
                return Completed(4, "", "Another app is currently holding the xtables lock")
        res = run_process(netns.ns_exec(self.ns, *argv), input)
        if argv[0].endswith("-save") and self.reprint:
            return Completed(res.returncode, other_print(res.stdout), res.stderr)
        return res


_conforms: Runner = OtherPrint("")


@dataclass
class CountingFlusher(NetlinkFlusher):
    """The real ctnetlink flusher with its socket in ``ns`` (never this process's namespace, also after
    an error closed it); records every flush it is asked for."""

    ns: str = ""
    flushed: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def flush_mark(self, mark: int, mask: int) -> None:
        self.flushed.append((mark, mask))
        if self._ct is None:
            self._ct = Conntrack(netns=self.ns)
        super().flush_mark(mark, mask)


def add_flows(ns: str, mark: int, first: int, count: int = 3) -> None:
    for i in range(first, first + count):
        res = _ct(
            ns, "-I", "-s", f"203.0.113.{i}", "-d", "198.18.0.10", "-p", "tcp", "--sport", str(4000 + i),
            "--dport", "80", "--state", "ESTABLISHED", "-t", "300", "-u", "ASSURED", "-m", str(mark),
        )  # fmt: skip
        assert res.returncode == 0, res.stderr


def flows(ns: str, mark: int) -> int:
    return len(_ct(ns, "-L", "-m", f"{mark:#x}/{MASK:#x}").stdout.splitlines())


@pytest.fixture
def gateway(ns: str) -> Iterator[tuple[Gateway, OtherPrint, CountingFlusher]]:
    printer, flusher = OtherPrint(ns), CountingFlusher(ns=ns)
    try:
        with IPRoute(netns=ns, flags=0) as ipr:
            yield Gateway(Iptables("nft", printer), ipr, flusher, sysctls=NsSysctls(ns)), printer, flusher
    finally:
        flusher.close()


def mismatch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "initnat.roundtrip_mismatch" in r.getMessage()]


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_kernel_that_prints_our_rules_differently_is_in_sync_and_revokes_nothing(
    gateway: tuple[Gateway, OtherPrint, CountingFlusher],
    ns: str,
    variant: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, printer, flusher = gateway
    gw.iptables.variant = variant  # type: ignore[assignment]
    with caplog.at_level("INFO", logger="initnat"):
        gw.apply(plan(GA, GB))
    assert printer.restores == 3 and flusher.flushed == [], "ours, then the probe's write and delete"
    (line,) = mismatch_lines(caplog)
    assert f"variant={variant}" in line and "learned=yes" in line, line
    assert "-A VPNGW-FORWARD -p tcp -s 203.0.113.0/28 " in line, "the kernel's print, to compare by eye"
    assert "-A VPNGW-FORWARD -s 203.0.113.0/28 -p tcp " in line, "and ours"
    assert gw.iptables.printed is not None
    (mangle,) = [(k, r) for t, k, r in gw.iptables.printed.lines if t == "mangle"]
    assert mangle[0].startswith("-A VPNGW-MANGLE -m conntrack --ctstate NEW -i n2 "), "the reply chain too"
    add_flows(ns, GA.mark, 1)
    add_flows(ns, GB.mark, 17)

    caplog.clear()
    with caplog.at_level("INFO", logger="initnat"):
        gw.apply(plan(GA, GB))  # a resync of the same plan
        gw.apply(plan(GA, GB))
    assert printer.restores == 3, "the kernel holds what it held right after our restore: in sync"
    assert flusher.flushed == [], "no grant looks revoked because of how its rules are printed"
    assert flows(ns, GA.mark) == 3 and flows(ns, GB.mark) == 3, "tenant flows untouched"
    assert mismatch_lines(caplog) == [] and "changed=False" in caplog.text

    # A grant genuinely revoked is still flushed (with its tombstone lifted afterwards), the other kept.
    with caplog.at_level("INFO", logger="initnat"):
        gw.apply(plan(GB))
    assert flusher.flushed == [(GA.mark, MASK)] and printer.restores == 5, "the swap, then the -D lift"
    assert flows(ns, GA.mark) == 0 and flows(ns, GB.mark) == 3
    save = gw.iptables.run([f"iptables-{variant}-save"]).stdout
    assert "0x10000/" not in save, "GA's admission withdrawn and its tombstone lifted"
    assert "-A VPNGW-FORWARD -p tcp -s 203.0.113.16/28 " in save, "GB's admission, in the kernel's print"
    gw.apply(plan(GB))
    assert printer.restores == 5 and flusher.flushed == [(GA.mark, MASK)], "and stable again"
    assert flows(ns, GB.mark) == 3


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_drift_is_still_repaired_and_a_narrowed_grant_still_flushed(
    gateway: tuple[Gateway, OtherPrint, CountingFlusher], ns: str, variant: str
) -> None:
    """The memory of the kernel's print covers exactly what the kernel held after our restore: a rule
    deleted by hand is drift (restored), and a grant narrowed by the plan is revoked as before."""
    gw, printer, flusher = gateway
    gw.iptables.variant = variant  # type: ignore[assignment]
    wide = Grant("s1", "web", "exposure", ("203.0.113.0/28", "203.0.113.32/28"), 0x10000)
    gw.apply(plan(wide, GB))
    res = run_process(netns.ns_exec(ns, f"iptables-{variant}", "-D", "VPNGW-TARGETS", "1"))
    assert res.returncode == 0, res.stderr
    gw.apply(plan(wide, GB))
    assert printer.restores == 4, "drift repaired (after ours and the probe's two), no second probe"
    assert flusher.flushed == []
    add_flows(ns, GA.mark, 1)
    gw.apply(plan(GA, GB))  # wide narrowed to 203.0.113.0/28: its flows are flushed (some came from .32/28)
    assert flusher.flushed == [(GA.mark, MASK)] and flows(ns, GA.mark) == 0
    assert gw.last is not None and rules.render(gw.last).rule_count > 0


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_restart_learns_the_print_first_and_still_revokes_what_was_really_narrowed(
    gateway: tuple[Gateway, OtherPrint, CountingFlusher],
    ns: str,
    variant: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No memory after a restart: before taking the kernel's admission lines that differ from the
    rendering for revoked ones, init-nat writes a copy of the ruleset to chains nothing jumps to, reads
    back how the kernel prints it, and deletes them. A grant that only prints otherwise keeps its flows
    (and the kernel its rules: no restore); a grant narrowed while init-nat was down is still flushed."""
    gw, printer, _ = gateway
    gw.iptables.variant = variant  # type: ignore[assignment]
    wide = Grant("s1", "web", "exposure", ("203.0.113.0/28", "203.0.113.32/28"), 0x10000)
    gw.apply(plan(wide, GB))
    add_flows(ns, GA.mark, 1)
    add_flows(ns, GB.mark, 17)
    before = printer.restores

    def restart() -> tuple[Gateway, CountingFlusher]:
        flusher = CountingFlusher(ns=ns)
        return Gateway(Iptables(variant, printer), gw.netlink, flusher, sysctls=gw.sysctls), flusher  # type: ignore[arg-type]

    fresh, flusher = restart()
    caplog.clear()
    try:
        with caplog.at_level("INFO", logger="initnat"):
            fresh.apply(plan(wide, GB))
        assert flusher.flushed == [], "nothing revoked: the kernel's lines are its print of ours"
        assert flows(ns, GA.mark) == 3 and flows(ns, GB.mark) == 3
        assert printer.restores == before + 2, "the probe's write and delete, no restore of our chains"
        assert "VPNGWPROBE" not in gw.iptables.run([f"iptables-{variant}-save"]).stdout, "probe chains gone"
        (line,) = mismatch_lines(caplog)
        assert "learned=yes" in line, line
        fresh.apply(plan(wide, GB))
        assert printer.restores == before + 2 and flusher.flushed == [], "in sync from then on"
    finally:
        flusher.close()

    fresh, flusher = restart()  # restarted onto a plan that narrowed wide to 203.0.113.0/28
    try:
        fresh.apply(plan(GA, GB))
        assert flusher.flushed == [(GA.mark, MASK)], "the narrowed grant, and only it"
        assert flows(ns, GA.mark) == 0 and flows(ns, GB.mark) == 3
    finally:
        flusher.close()


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_restart_onto_a_narrowing_of_the_same_length_still_flushes(
    gateway: tuple[Gateway, OtherPrint, CountingFlusher], ns: str, variant: str
) -> None:
    """The print is learned from the probe's copy of the NEW ruleset, never from our live chains: a
    source replaced by another (203.0.113.32/28 -> .48/28, the chain keeps its length) while init-nat
    was down is a revocation, not a print to learn (paired by position, the old line would pass for the
    new one's print and hide it)."""
    gw, printer, _ = gateway
    gw.iptables.variant = variant  # type: ignore[assignment]
    old = Grant("s1", "web", "exposure", ("203.0.113.0/28", "203.0.113.32/28"), 0x10000)
    new = Grant("s1", "web", "exposure", ("203.0.113.0/28", "203.0.113.48/28"), 0x10000)
    gw.apply(plan(old, GB))
    add_flows(ns, GA.mark, 33)  # from 203.0.113.32/28, no longer granted
    add_flows(ns, GB.mark, 17)
    flusher = CountingFlusher(ns=ns)
    try:
        Gateway(Iptables(variant, printer), gw.netlink, flusher, sysctls=gw.sysctls).apply(plan(new, GB))  # type: ignore[arg-type]
        assert flusher.flushed == [(GA.mark, MASK)] and flows(ns, GA.mark) == 0
        assert flows(ns, GB.mark) == 3
    finally:
        flusher.close()


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_a_failed_read_back_does_not_make_the_next_resync_revoke_every_grant(
    ns: str, variant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The read-back after our restore fails once (the xtables lock, a timeout): the print is not known,
    so the next apply of the same plan, whose admissions in the kernel's print look revoked, learns it
    from the probe first instead of flushing and tombstoning every grant."""
    printer, flusher = OtherPrint(ns, fail_save=2), CountingFlusher(ns=ns)
    try:
        with IPRoute(netns=ns, flags=0) as ipr, caplog.at_level("INFO", logger="initnat"):
            gw = Gateway(Iptables(variant, printer), ipr, flusher, sysctls=NsSysctls(ns))  # type: ignore[arg-type]
            gw.apply(plan(GA, GB))  # save, restore, the read-back save fails
            assert printer.saves == 2 and "initnat.readback_failed" in caplog.text
            add_flows(ns, GA.mark, 1)
            add_flows(ns, GB.mark, 17)
            restores = printer.restores
            gw.apply(plan(GA, GB))  # a resync of the same plan (--watch: gw.last is set)
            assert flusher.flushed == [], "nothing revoked: the kernel's lines are its print of ours"
            assert flows(ns, GA.mark) == 3 and flows(ns, GB.mark) == 3
            assert printer.restores == restores + 2, "the probe's write and delete, our chains untouched"
            gw.apply(plan(GA, GB))
            assert printer.restores == restores + 2 and flusher.flushed == [], "known from then on"
    finally:
        flusher.close()


FOREIGN = 0x30000


@dataclass
class RacingEdit(OtherPrint):
    """Between our restore of VPNGW-FORWARD and the save that reads it back, another root writer
    replaces GA's admission rule in place (``iptables -R``, the chain keeps its length) by one that
    marks FOREIGN. Once."""

    armed: bool = False
    done: bool = False

    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        if argv[0].endswith("-save") and self.armed:
            self.armed, self.done = False, True
            variant = argv[0].removeprefix("iptables-").removesuffix("-save")
            chain = tables.parse_save(run_process(netns.ns_exec(self.ns, argv[0])).stdout)["filter"]
            at, line = next(
                (i, r)
                for i, r in enumerate(chain.rules["VPNGW-FORWARD"], 1)
                if f"--set-xmark {GA.mark:#x}/" in r
            )
            edited = shlex.split(line.replace(f"{GA.mark:#x}/", f"{FOREIGN:#x}/"))[2:]
            cmd = netns.ns_exec(self.ns, f"iptables-{variant}", "-R", "VPNGW-FORWARD", str(at), *edited)
            assert run_process(cmd).returncode == 0
        res = super().__call__(argv, input)
        if argv[0].endswith("-restore") and "--test" not in argv and ":VPNGW-FORWARD " in (input or ""):
            self.armed = not self.done
        return res


@pytest.mark.parametrize("reprint", [False, True], ids=["own-print", "other-print"])
@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_an_edit_racing_the_read_back_is_not_learned_as_the_print_and_is_repaired(
    ns: str, variant: str, reprint: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The read-back differs from what we restored because someone else wrote our chain meanwhile: the
    print is learned from the probe chains (nobody else writes them), so the foreign line is not taken
    for our rule's print. Drift, logged as a warning; the next resync replaces it and flushes the mark it
    set (it admits nothing the plan grants); GA and GB keep their flows."""
    printer, flusher = RacingEdit(ns, reprint=reprint), CountingFlusher(ns=ns)
    try:
        with IPRoute(netns=ns, flags=0) as ipr, caplog.at_level("INFO", logger="initnat"):
            gw = Gateway(Iptables(variant, printer), ipr, flusher, sysctls=NsSysctls(ns))  # type: ignore[arg-type]
            gw.apply(plan(GA, GB))
            assert printer.done and "initnat.readback_drift" in caplog.text
            assert len(mismatch_lines(caplog)) == (1 if reprint else 0), "only a real print difference"
            save = run_process(netns.ns_exec(ns, f"iptables-{variant}-save")).stdout
            assert f"--set-xmark {FOREIGN:#x}/" in save and f"--set-xmark {GA.mark:#x}/" not in save
            add_flows(ns, FOREIGN, 40)
            add_flows(ns, GA.mark, 1)
            add_flows(ns, GB.mark, 17)
            gw.apply(plan(GA, GB))  # the resync
            assert flusher.flushed == [(FOREIGN, MASK)] and flows(ns, FOREIGN) == 0
            assert flows(ns, GA.mark) == 3 and flows(ns, GB.mark) == 3
            save = run_process(netns.ns_exec(ns, f"iptables-{variant}-save")).stdout
            assert f"{FOREIGN:#x}/" not in save and f"--set-xmark {GA.mark:#x}/" in save, "repaired"
            restores = printer.restores
            gw.apply(plan(GA, GB))
            assert printer.restores == restores and flusher.flushed == [(FOREIGN, MASK)], "stable"
    finally:
        flusher.close()
