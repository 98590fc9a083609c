"""initnat.iptables' control flow against a fake command runner (FakeRunner, next to the Protocol).

The real iptables-restore is exercised in tests/integration/test_initnat_iptables.py; here we pin the
order of steps and what happens on each kind of failure, which the kernel makes hard to provoke.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address

import pytest

from gwplan import Exposure, Grant, Nat, Port
from initnat import rules, tables
from initnat.iptables import Completed, FakeRunner, Iptables, IptablesError, detect_variant
from initnat.rules import Flush

RULESET = rules.render(
    rules.validate(
        Nat(
            exposures=(Exposure("web", "198.18.0.10", (Port(80),), target_address="192.0.2.66"),),
            grants=(Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x10000),),
        ),
        nic2_address=IPv4Address("192.0.2.2"),
    )
)
OLD = (
    "*filter\n:FORWARD ACCEPT [0:0]\n:VPNGW-FORWARD - [0:0]\n"
    "-A VPNGW-FORWARD -j CONNMARK --set-xmark 0x50000/0xfff0000\nCOMMIT\n"
)


def in_sync_save() -> str:
    lines = []
    for t in RULESET.tables:
        lines.append(f"*{t.table}")
        lines += [f":{c} - [0:0]" for c in t.chains]
        lines += [f"-A {b} -j {o}" for tbl, b, o in rules.JUMPS if tbl == t.table]
        lines += list(t.rules)
        lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def test_in_sync_kernel_means_no_restore_at_all() -> None:
    r = FakeRunner({"iptables-nft-save": [Completed(0, in_sync_save(), "")]})
    applied = Iptables("nft", r).apply(RULESET)
    assert not applied.changed and [a[0][0] for a in r.calls] == ["iptables-nft-save"]


def test_apply_tests_first_then_commits_with_noflush_and_wait() -> None:
    r = FakeRunner({"iptables-legacy-save": [Completed(0, OLD, ""), Completed(0, in_sync_save(), "")]})
    ipt = Iptables("legacy", r)
    applied = ipt.apply(RULESET)
    assert applied.changed and set(applied.admissions_before) == {Flush(0x50000, 0xFFF0000)}
    assert ipt.print_known and ipt.printed is None, "read back as rendered: no probe"
    assert [a[0] for a in r.calls] == [
        ("iptables-legacy-save",),
        ("iptables-legacy-restore", "--noflush", "--wait", "--test"),
        ("iptables-legacy-restore", "--noflush", "--wait"),
        ("iptables-legacy-save",),  # read back: does the kernel print it as rendered?
    ]
    assert r.calls[1][1] == r.calls[2][1] == tables.payload(RULESET, tables.parse_save(OLD))


def test_refused_by_test_changes_nothing() -> None:
    r = FakeRunner(
        {
            "iptables-nft-save": [Completed(0, OLD, "")],
            "iptables-nft-restore": [Completed(2, "", "Chain 'X' does not exist\nError occurred at line: 3")],
        }
    )
    with pytest.raises(
        IptablesError, match="refused by --test, nothing changed: Chain 'X' does not exist"
    ) as e:
        Iptables("nft", r).apply(RULESET)
    assert e.value.rolled_back and len(r.calls) == 2


def test_failed_commit_restores_the_snapshot_of_our_chains() -> None:
    r = FakeRunner(
        {
            "iptables-nft-save": [Completed(0, OLD, "")],
            "iptables-nft-restore": [
                Completed(0, "", ""),
                Completed(1, "", "nat: boom"),
                Completed(0, "", ""),
            ],
        }
    )
    with pytest.raises(IptablesError, match="apply failed, previous rules restored: nat: boom") as e:
        Iptables("nft", r).apply(RULESET)
    assert e.value.rolled_back
    assert r.calls[-1][1] == tables.snapshot_payload(tables.parse_save(OLD), RULESET)
    assert "--set-xmark 0x50000/0xfff0000" in (r.calls[-1][1] or "")


def test_failed_rollback_is_reported_as_such() -> None:
    r = FakeRunner(
        {
            "iptables-nft-save": [Completed(0, OLD, "")],
            "iptables-nft-restore": [
                Completed(0, "", ""),
                Completed(1, "", "boom"),
                Completed(1, "", "again"),
            ],
        }
    )
    with pytest.raises(IptablesError, match="restoring the previous rules failed too: again") as e:
        Iptables("nft", r).apply(RULESET)
    assert not e.value.rolled_back


def test_save_failure_is_reported_before_anything_is_written() -> None:
    r = FakeRunner({"iptables-nft-save": [Completed(4, "", "Permission denied (you must be root)")]})
    with pytest.raises(IptablesError, match="Permission denied"):
        Iptables("nft", r).apply(RULESET)
    assert len(r.calls) == 1


def test_detect_variant_follows_the_rules() -> None:
    many = "*filter\n" + "-A FORWARD -j ACCEPT\n" * 12
    r = FakeRunner(
        {"iptables-legacy-save": [Completed(0, many, "")], "iptables-nft-save": [Completed(0, "", "")]}
    )
    assert detect_variant(r) == "legacy"

    def missing(argv: object, input: str | None = None) -> Completed:
        raise FileNotFoundError("iptables-legacy-save")

    assert detect_variant(missing) == "nft"


def test_delete_sends_only_minus_d_lines_of_the_given_rules_and_reports_a_refusal() -> None:
    """Lifting tombstones: no save, no --test, no chain declaration (that would flush the chain under
    --noflush); one transaction of ``-D`` lines."""
    stones = rules.tombstone_rules([Flush(0x10000, 0xFFF0000), Flush(0x20000, 0xFFF0000)])
    r = FakeRunner()
    Iptables("nft", r).delete("filter", stones)
    assert r.calls == [
        (
            ("iptables-nft-restore", "--noflush", "--wait"),
            "*filter\n" + "".join(f"-D {s.removeprefix('-A ')}\n" for s in stones) + "COMMIT\n",
        )
    ]
    refused = FakeRunner({"iptables-nft-restore": [Completed(1, "", "iptables-nft-restore: line 2 failed")]})
    with pytest.raises(IptablesError, match="nothing changed: iptables-nft-restore: line 2 failed"):
        Iptables("nft", refused).delete("filter", stones)


def _reprinted(line: str) -> str:
    return line.replace("-s 203.0.113.0/28 -p tcp", "-p tcp -s 203.0.113.0/28")


OTHER = "\n".join(_reprinted(line) for line in in_sync_save().splitlines()) + "\n"
"""The kernel holding RULESET, printed as another iptables version might."""


def probe_save(reprint: Callable[[str], str] = _reprinted) -> str:
    """The save while the probe chains hold their copy of RULESET, printed by ``reprint``."""
    return "\n".join(reprint(line) for line in tables.probe_payload(RULESET).splitlines()) + "\n"


def _mismatches(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in caplog.messages if "initnat.roundtrip_mismatch" in m]


def test_a_print_mismatch_is_learned_from_the_probe_and_then_counts_as_in_sync(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The save read back after the restore prints the admission rule otherwise (as a newer iptables
    might): the probe chains show it is the kernel's print, one error line; the next applies find the
    kernel in sync (no --test, no restore, no probe) and see the grant as admitted, not as revoked."""
    assert in_sync_save() != OTHER
    saves = [
        Completed(0, OLD, ""),
        Completed(0, OTHER, ""),
        Completed(0, probe_save(), ""),
        Completed(0, OTHER, ""),
    ]
    r = FakeRunner({"iptables-nft-save": saves})
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert ipt.apply(RULESET).changed
        again = ipt.apply(RULESET)
        assert not ipt.apply(RULESET).changed
    assert not again.changed and set(again.admissions_before) == {Flush(0x10000, 0xFFF0000)}
    assert tables.revoked_in_kernel(again.admissions_before, RULESET) == frozenset()
    assert [c[1] for c in r.calls if c[0][0] == "iptables-nft-restore"][2:] == [
        tables.probe_payload(RULESET),
        tables.probe_cleanup_payload(RULESET),
    ], "--test and the commit once, then the probe once"
    (line,) = _mismatches(caplog)
    assert "variant=nft" in line and "rendered_only=1 kernel_only=1 learned=yes" in line
    assert "-p tcp -s 203.0.113.0/28" in line and "-s 203.0.113.0/28 -p tcp" in line
    assert "initnat.readback_drift" not in caplog.text and ipt.print_known


def test_a_repaired_drift_reads_back_through_what_the_probe_taught(caplog: pytest.LogCaptureFixture) -> None:
    """After a drift repair the read-back is compared through the learned print: no second probe, no
    second error line."""
    drifted = OTHER.replace("-j VPNGW-TARGETS", "-j ACCEPT")
    saves = [OLD, OTHER, probe_save(), drifted, OTHER]
    r = FakeRunner({"iptables-nft-save": [Completed(0, text, "") for text in saves]})
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert ipt.apply(RULESET).changed and ipt.apply(RULESET).changed
    assert len(_mismatches(caplog)) == 1 and ipt.print_known
    assert [c[1] for c in r.calls].count(tables.probe_payload(RULESET)) == 1


def test_a_read_back_that_the_probe_does_not_explain_is_drift_not_a_print(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another writer edits our chain between our restore and the read-back: the probe chains print the
    ruleset as rendered, so nothing is learned (the foreign line is not taken for our rule's print), a
    warning instead of the mismatch error, and the next apply repairs it."""
    edited = in_sync_save().replace("--set-xmark 0x10000/", "--set-xmark 0x30000/")
    saves = [OLD, edited, probe_save(str), edited]
    r = FakeRunner({"iptables-nft-save": [Completed(0, text, "") for text in saves]})
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert ipt.apply(RULESET).changed
    assert ipt.printed is None and ipt.print_known and _mismatches(caplog) == []
    (drift,) = [m for m in caplog.messages if "initnat.readback_drift" in m]
    assert "rendered_only=1 kernel_only=1" in drift and "0x30000" in drift
    repaired = ipt.apply(RULESET)
    assert repaired.changed and Flush(0x30000, 0xFFF0000) in repaired.admissions_before


def test_a_jump_moved_by_someone_else_before_the_read_back_is_no_print_mismatch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kube-proxy or Calico inserting at FORWARD 1 between our restore and the read-back moves our jump:
    not a print (no error line, no probe); the next apply puts the jump back first."""
    moved = in_sync_save().replace(
        "-A FORWARD -j VPNGW-FORWARD\n", "-A FORWARD -j KUBE-FORWARD\n-A FORWARD -j VPNGW-FORWARD\n"
    )
    r = FakeRunner({"iptables-nft-save": [Completed(0, OLD, ""), Completed(0, moved, "")]})
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert ipt.apply(RULESET).changed
    assert "roundtrip_mismatch" not in caplog.text and "readback_drift" not in caplog.text and ipt.print_known
    assert len(r.calls) == 4, "save, --test, restore, read-back: no probe"
    assert ipt.apply(RULESET).changed
    assert "-I FORWARD 1 -j VPNGW-FORWARD" in (r.calls[-2][1] or ""), "the jump put back first"


@dataclass
class FailingSave(FakeRunner):
    """FakeRunner whose save number ``at`` raises ``exc`` (a timeout, a vanished binary)."""

    at: int = 2
    exc: BaseException = field(default_factory=lambda: OSError("gone"))
    saves: int = 0

    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        if argv[0].endswith("-save"):
            self.saves += 1
            if self.saves == self.at:
                self.calls.append((tuple(argv), input))
                raise self.exc
        return super().__call__(argv, input)


_FAILURES = [
    Completed(4, "", "boom"),
    subprocess.TimeoutExpired(["iptables-nft-save"], 60),
    FileNotFoundError(2, "No such file or directory"),
]


@pytest.mark.parametrize("failure", _FAILURES, ids=["refused", "timeout", "oserror"])
def test_a_failed_read_back_is_not_a_failed_apply(
    failure: Completed | BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """The restore went through: failing the apply now would skip the flush and leave init-nat's memory
    behind the kernel. A refused, timed-out or unstartable read-back only means the print is not known
    (the next apply probes before taking a differing admission line for a revoked one)."""
    if isinstance(failure, Completed):
        r: FakeRunner = FakeRunner({"iptables-nft-save": [Completed(0, OLD, ""), failure]})
    else:
        r = FailingSave({"iptables-nft-save": [Completed(0, OLD, "")]}, exc=failure)
    ipt = Iptables("nft", r)
    ipt.print_known = True
    with caplog.at_level("INFO", logger="initnat"):
        assert ipt.apply(RULESET).changed
    assert not ipt.print_known and "initnat.readback_failed" in caplog.text
    assert len(r.calls) == 4, "no probe either"


@pytest.mark.parametrize("rollback", [0, 1], ids=["rolled-back", "unknown"])
def test_a_failed_restore_leaves_the_print_unknown(rollback: int) -> None:
    r = FakeRunner(
        {
            "iptables-nft-save": [Completed(0, OLD, "")],
            "iptables-nft-restore": [
                Completed(0, "", ""),
                Completed(1, "", "boom"),
                Completed(rollback, "", ""),
            ],
        }
    )
    ipt = Iptables("nft", r)
    ipt.print_known = True
    with pytest.raises(IptablesError):
        ipt.apply(RULESET)
    assert not ipt.print_known


def test_a_refused_probe_is_cleaned_up_and_only_means_not_knowing(caplog: pytest.LogCaptureFixture) -> None:
    """learn_print: the probe's write refused (a table may have committed already) -> its chains are
    deleted anyway, nothing is learned, a warning, no exception."""
    r = FakeRunner({"iptables-nft-restore": [Completed(1, "", "nat: boom"), Completed(0, "", "")]})
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert not ipt.learn_print(RULESET)
    assert ipt.printed is None and not ipt.print_known
    assert "initnat.probe_failed" in caplog.text and "nat: boom" in caplog.text
    assert [c[1] for c in r.calls] == [tables.probe_payload(RULESET), tables.probe_cleanup_payload(RULESET)]


@pytest.mark.parametrize("failure", _FAILURES[1:], ids=["timeout", "oserror"])
def test_a_probe_whose_save_raises_is_cleaned_up_and_only_means_not_knowing(
    failure: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    r = FailingSave(at=1, exc=failure)
    ipt = Iptables("nft", r)
    with caplog.at_level("INFO", logger="initnat"):
        assert not ipt.learn_print(RULESET)
    assert ipt.printed is None and not ipt.print_known and "initnat.probe_failed" in caplog.text
    assert r.calls[-1][1] == tables.probe_cleanup_payload(RULESET), "the probe chains deleted anyway"
