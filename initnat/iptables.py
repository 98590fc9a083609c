"""Applies a :class:`~initnat.rules.Ruleset` with ``iptables-restore --noflush --wait`` (thin I/O shell).

One apply = save (to compare and to snapshot) -> nothing to do if the kernel already matches ->
``--test`` of the whole payload -> the real transaction -> on failure, put back the snapshot of our
chains and report; on success, read it back (does the kernel print it as rendered? else the probe,
:meth:`Iptables.learn_print`). ``iptables-restore`` commits table by table (tables.py), so the
snapshot is what makes "nothing is half-applied" true. Only our chains (``:VPNGW-... - [0:0]`` flushes
just those under ``--noflush``), our jumps and the probe chains are ever written; foreign rules and chains
are never named.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from initnat import tables
from initnat.rules import Flush, Ruleset, Table
from initnat.tables import Variant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        """Run ``argv`` to completion (raises OSError when it cannot be started)."""
        ...


def run_process(argv: Sequence[str], input: str | None = None) -> Completed:
    res = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=60, check=False)
    return Completed(res.returncode, res.stdout, res.stderr)


@dataclass
class FakeRunner:
    """In-memory stand-in for tests of the shell's control flow: answers by argv[0]; records calls."""

    replies: dict[str, list[Completed]] = field(default_factory=dict)
    calls: list[tuple[tuple[str, ...], str | None]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], input: str | None = None) -> Completed:
        self.calls.append((tuple(argv), input))
        queue = self.replies.get(argv[0], [])
        if not queue:
            return Completed(0, "", "")
        return queue.pop(0) if len(queue) > 1 else queue[0]


_conforms: Runner = FakeRunner()


class IptablesError(Exception):
    """The ruleset could not be applied. ``rolled_back`` says the previous content was put back."""

    def __init__(self, message: str, *, rolled_back: bool = True) -> None:
        super().__init__(message)
        self.rolled_back = rolled_back


@dataclass(frozen=True)
class Applied:
    changed: bool
    rules: int
    seconds: float
    """Time of the restore transaction itself (0 when nothing changed)."""
    admissions_before: Mapping[Flush, frozenset[str]]
    """What our filter chain admitted per (conntrack mark, mask) before this apply (from the kernel)."""


def _err(res: Completed) -> str:
    return " ".join((res.stderr or res.stdout).split())[:500]


def detect_variant(run: Runner = run_process) -> Variant:
    """Legacy or nft, the way kube-proxy's iptables wrapper decides (tables.choose_variant)."""
    saves = {}
    for variant in ("legacy", "nft"):
        try:
            res = run([f"iptables-{variant}-save"])
        except OSError:  # not installed: that variant holds nothing we could see
            saves[variant] = ""
            continue
        if res.returncode != 0:
            # Counted as empty, which may pick the wrong variant: e.g. iptables-legacy-save without NET_RAW
            # ("Permission denied") on a node whose kube-proxy writes legacy rules.
            log.warning(
                "iptables.save_failed variant=%s error=%r hint=%r",
                variant,
                _err(res),
                "init-nat needs NET_ADMIN and NET_RAW; or pass --iptables legacy|nft",
            )
        saves[variant] = res.stdout if res.returncode == 0 else ""
    chosen = tables.choose_variant(saves["legacy"], saves["nft"])
    log.info(
        "iptables.variant chosen=%s legacy_rules=%d nft_rules=%d",
        chosen,
        tables.count_rules(saves["legacy"]),
        tables.count_rules(saves["nft"]),
    )
    return chosen


_REPORTED_MAX = 64
_NOT_READ = (IptablesError, OSError, subprocess.SubprocessError)
"""What a failed read of the kernel's print raises (a refused save, a missing binary, a timeout): the
print is then not known, nothing else."""


Family = Literal["ipv4", "ipv6"]


@dataclass
class Iptables:
    variant: Variant
    run: Runner = run_process
    family: Family = "ipv4"
    """``ipv6``: the same machinery on ``ip6tables-<variant>-save/-restore`` (rules.ipv6_rules)."""
    printed: tables.Printed | None = None
    """How the kernel prints rules of ours otherwise than we render them, learned by :meth:`learn_print`
    (tables.Printed): those lines of the kernel's are read as ours (in sync, nothing revoked)."""
    print_known: bool = False
    """Our chains in the kernel are known to print as rendered, read through :attr:`printed`: true after
    a read-back that showed it or a probe; false at start and after a failed or unknown restore or a
    failed read-back. While false, a kernel line that differs from our rendering may be the kernel's
    print of one of our rules, so it is not taken for a revoked one before :meth:`learn_print`."""
    reported: set[str] = field(default_factory=set)
    """Digests of the print mismatches already logged (one error line per distinct mismatch)."""

    @property
    def command(self) -> str:
        """``iptables-legacy``, ``ip6tables-nft``, ...: the binaries are ``<command>-save``, ``-restore``."""
        return f"{'ip6tables' if self.family == 'ipv6' else 'iptables'}-{self.variant}"

    def _save(self) -> str:
        res = self.run([f"{self.command}-save"])
        if res.returncode != 0:
            raise IptablesError(f"{self.command}-save failed: {_err(res)}", rolled_back=False)
        return res.stdout

    def saved(self) -> dict[str, tables.SavedTable]:
        return tables.parse_save(self._save())

    def _restore(self, payload: str, *, test: bool = False) -> Completed:
        argv = [f"{self.command}-restore", "--noflush", "--wait"]
        if test:
            argv.append("--test")
        return self.run(argv, payload)

    def apply(self, ruleset: Ruleset, saved: dict[str, tables.SavedTable] | None = None) -> Applied:
        """``saved``: an ``iptables-save`` the caller just read (:meth:`saved`), to not read it twice."""
        saved = self.saved() if saved is None else saved
        view = tables.as_rendered(saved, self.printed)
        before = tables.admissions_in(view)
        if tables.in_sync(view, ruleset):
            return Applied(False, ruleset.rule_count, 0.0, before)
        text = tables.payload(ruleset, saved)
        res = self._restore(text, test=True)
        if res.returncode != 0:
            raise IptablesError(f"the new ruleset was refused by --test, nothing changed: {_err(res)}")
        self.print_known = False  # until read back: the kernel holds something new (or, on failure, unknown)
        started = time.monotonic()
        res = self._restore(text)
        seconds = time.monotonic() - started
        if res.returncode != 0:
            cause = _err(res)
            back = self._restore(tables.snapshot_payload(saved, ruleset))
            if back.returncode != 0:
                raise IptablesError(
                    f"apply failed ({cause}) and restoring the previous rules failed too: {_err(back)}",
                    rolled_back=False,
                )
            raise IptablesError(f"apply failed, previous rules restored: {cause}")
        self._read_back(ruleset)
        return Applied(True, ruleset.rule_count, seconds, before)

    def _read_back(self, ruleset: Ruleset) -> None:
        """Right after our restore of ``ruleset``: do our chains read as rendered (through :attr:`printed`)?
        Then the print is known. If not, the difference is the kernel's print of rules not learned yet OR
        another writer's edit racing us: only the probe (:meth:`learn_print`) tells them apart, and what
        it does not explain is drift (a warning; the next resync repairs it). Our jumps are not compared:
        kube-proxy inserting in front of them is not a print. A failed read only leaves the print unknown."""
        try:
            after = self.saved()
        except _NOT_READ as exc:
            log.warning("initnat.readback_failed error=%r", " ".join(str(exc).split()))
            return
        want = tables.rendered_rules(ruleset)
        if tables.kernel_rules(tables.as_rendered(after, self.printed), ruleset) == want:
            self.print_known = True
            return
        if not self.learn_print(ruleset):
            return
        view = tables.as_rendered(after, self.printed)
        if tables.kernel_rules(view, ruleset) != want:
            ours, theirs = tables.mismatch(view, ruleset)
            msg = "initnat.readback_drift variant=%s rendered_only=%d kernel_only=%d kernel=%s"
            log.warning(msg, self.variant, len(ours), len(theirs), json.dumps(list(theirs[:2])))

    def learn_print(self, ruleset: Ruleset) -> bool:
        """How does the kernel print ``ruleset``? Write a copy of it to chains nothing jumps to
        (tables.PROBE_PREFIX: they match no packet and nobody else writes them), read it back, delete
        them; what differs from the rendering is kept in :attr:`printed` (one error line per distinct
        mismatch). Run when our own chains cannot tell: after a restart or a failed read-back, before
        taking differing admission lines for revoked ones, and when a read-back differs. A failure only
        means not knowing (logged). True when the probe's print is fully explained by what was learned."""
        try:
            try:
                res = self._restore(tables.probe_payload(ruleset))
                if res.returncode != 0:
                    raise IptablesError(f"writing the probe chains failed: {_err(res)}")
                seen = tables.probed(self.saved(), ruleset)
            finally:  # also after a failed write: a table may have committed before another failed
                gone = self._restore(tables.probe_cleanup_payload(ruleset))
                if gone.returncode != 0:
                    log.warning("initnat.probe_cleanup_failed error=%r", _err(gone))
        except _NOT_READ as exc:
            log.warning("initnat.probe_failed error=%r", " ".join(str(exc).split()))
            return False
        self.print_known = True
        self.printed = tables.printed(seen, ruleset)
        want = tables.rendered_rules(ruleset)
        if tables.kernel_rules(seen, ruleset) != want:
            self._report(*tables.mismatch(seen, ruleset))
        return tables.kernel_rules(tables.as_rendered(seen, self.printed), ruleset) == want

    def _report(self, only_rendered: Sequence[str], only_kernel: Sequence[str]) -> None:
        """One error line per distinct mismatch (a few of its lines; iptables rules hold no secrets)."""
        digest = hashlib.sha256(repr((tuple(only_rendered), tuple(only_kernel))).encode()).hexdigest()[:16]
        if digest in self.reported:
            return
        if len(self.reported) >= _REPORTED_MAX:
            self.reported.clear()
        self.reported.add(digest)
        log.error(
            "initnat.roundtrip_mismatch variant=%s digest=%s rendered_only=%d kernel_only=%d "
            "learned=%s rendered=%s kernel=%s",
            self.variant,
            digest,
            len(only_rendered),
            len(only_kernel),
            "yes" if self.printed else "no",
            json.dumps(list(only_rendered[:2])),
            json.dumps(list(only_kernel[:2])),
        )

    def delete(self, table: Table, lines: Sequence[str]) -> float:
        """Delete exactly these ``-A`` rules of ours (a small ``--noflush`` payload of ``-D`` lines: the
        rest of the table is neither sent nor compared). Returns the transaction's seconds; raises
        IptablesError (nothing changed) when one of them is not there."""
        text = (
            f"*{table}\n"
            + "".join(f"-D {line[3:]}\n" for line in lines if line.startswith("-A "))
            + "COMMIT\n"
        )
        started = time.monotonic()
        res = self._restore(text)
        if res.returncode != 0:
            raise IptablesError(f"deleting {len(lines)} rule(s) failed, nothing changed: {_err(res)}")
        return time.monotonic() - started
