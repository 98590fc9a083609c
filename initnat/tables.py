"""``iptables-save`` text in, ``iptables-restore --noflush`` payloads out (pure).

* :func:`payload` declares our chains (``:CHAIN - [0:0]``: under ``--noflush`` that flushes ONLY that
  chain), fixes our jumps, and appends our rules: one ``*table ... COMMIT`` section per table.
* ``iptables-restore`` commits table by table (measured here, legacy and nft alike: a failing ``*filter``
  section after a good ``*nat`` section leaves the new nat rules in place). So the applier tests the
  payload first and, if the real commit still fails half way, restores :func:`snapshot_payload`, the
  previous content of our chains taken from the save output just before.
* :func:`choose_variant` picks legacy or nft the way kube-proxy's iptables wrapper does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from initnat.rules import FILTER_CHAIN, JUMPS, OWN_PREFIX, Flush, Ruleset, Table

Variant = Literal["legacy", "nft"]

_SET_XMARK = re.compile(r"--set-xmark (0x[0-9a-f]+)/(0x[0-9a-f]+)")
_HINT_CHAINS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")


@dataclass
class SavedTable:
    chains: list[str] = field(default_factory=list)
    """Every chain declared in the table, built-in and user-defined, in save order."""
    rules: dict[str, list[str]] = field(default_factory=dict)
    """Chain -> its ``-A`` lines, in order."""


def parse_save(text: str) -> dict[str, SavedTable]:
    tables: dict[str, SavedTable] = {}
    current: SavedTable | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:].strip(), SavedTable())
        elif current is None or not line or line.startswith("#") or line == "COMMIT":
            continue
        elif line.startswith(":"):
            chain = line[1:].split(" ", 1)[0]
            current.chains.append(chain)
            current.rules.setdefault(chain, [])
        elif line.startswith("-A "):
            chain = line.split(" ", 2)[1]
            current.rules.setdefault(chain, []).append(line)
    return tables


def own_state(saved: dict[str, SavedTable]) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per table: (our chains, their rules), as the kernel has them."""
    out: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for name, t in saved.items():
        chains = tuple(sorted(c for c in t.chains if c.startswith(OWN_PREFIX)))
        if chains:
            out[name] = (chains, tuple(r for c in chains for r in t.rules.get(c, [])))
    return out


def _jump(builtin: str, ours: str) -> str:
    return f"-A {builtin} -j {ours}"


def jump_fixes(saved: dict[str, SavedTable], table: Table, chains: Iterable[str] | None = None) -> list[str]:
    """Restore lines that leave each of our jumps in ``table`` exactly once, as the chain's first rule.

    Nothing when that is already so; otherwise delete every copy of OUR jump (``-D`` deletes the first
    exact match, so one line per copy) and insert it at position 1. Foreign rules are never named.
    ``chains``: only the jumps to these of our chains (those a ruleset has); None: every jump of JUMPS.
    """
    lines: list[str] = []
    t = saved.get(table, SavedTable())
    wanted = None if chains is None else frozenset(chains)
    for tbl, builtin, ours in JUMPS:
        if tbl != table or (wanted is not None and ours not in wanted):
            continue
        existing = t.rules.get(builtin, [])
        want = _jump(builtin, ours)
        copies = existing.count(want)
        if copies == 1 and existing[0] == want:
            continue
        lines.extend([f"-D {builtin} -j {ours}"] * copies)
        lines.append(f"-I {builtin} 1 -j {ours}")
    return lines


OwnRules = tuple[tuple[str, str, tuple[str, ...]], ...]
"""(table, chain, its ``-A`` lines) for each chain of a ruleset: tables in the ruleset's order, chains
sorted."""


def _chain(rule: str) -> str:
    return rule.split(" ", 2)[1]


def rendered_rules(ruleset: Ruleset) -> OwnRules:
    return tuple(
        (t.table, c, tuple(r for r in t.rules if _chain(r) == c))
        for t in ruleset.tables
        for c in sorted(t.chains)
    )


def kernel_rules(saved: dict[str, SavedTable], ruleset: Ruleset) -> OwnRules | None:
    """What the kernel holds in the chains of ``ruleset`` (None when one of them does not exist)."""
    out = []
    for t in ruleset.tables:
        have = saved.get(t.table, SavedTable())
        for c in sorted(t.chains):
            if c not in have.chains:
                return None
            out.append((t.table, c, tuple(have.rules.get(c, []))))
    return tuple(out)


def in_sync(saved: dict[str, SavedTable], ruleset: Ruleset) -> bool:
    """The kernel already has exactly ``ruleset`` in our chains, and our jumps in place."""
    return kernel_rules(saved, ruleset) == rendered_rules(ruleset) and not any(
        jump_fixes(saved, t.table, t.chains) for t in ruleset.tables
    )


@dataclass(frozen=True)
class Printed:
    """How the kernel prints rules of ours where that is not how we rendered them, learned from a copy of
    the ruleset written to the probe chains (:func:`probe_payload`, :func:`probed`): nobody else writes
    those, so what they print is the kernel's print, never another writer's edit. Every decision here
    assumes iptables-save prints our rules byte for byte as rendered; a newer iptables that orders
    options differently or omits a default would otherwise make every resync a full restore and, worse,
    make every affected grant look revoked (flushed and tombstoned at every resync). See
    :func:`as_rendered`."""

    lines: frozenset[tuple[str, str, str]]
    """(table, the kernel's line, our line) for each rule of ours the kernel prints otherwise."""


def printed(saved: dict[str, SavedTable], ruleset: Ruleset) -> Printed | None:
    """The probe chains read back (:func:`probed`): how the kernel prints each rule of ``ruleset``,
    paired with ours by position (iptables keeps the order), in each chain that holds as many rules as
    rendered (a print that split or merged rules could not be paired: those chains are not learned). A
    kernel line that stands for two different lines of ours (counting a line printed as itself) is not
    learned either. None when nothing is learned (in particular when the kernel prints everything as
    rendered)."""
    have = kernel_rules(saved, ruleset)
    if have is None:
        return None
    pairs: dict[tuple[str, str], set[str]] = {}
    for (table, _, kernel), (_, _, ours) in zip(have, rendered_rules(ruleset), strict=True):
        if len(kernel) == len(ours):
            for k, r in zip(kernel, ours, strict=True):
                pairs.setdefault((table, k), set()).add(r)
    lines = frozenset(
        (table, k, r) for (table, k), rs in pairs.items() if len(rs) == 1 and (r := next(iter(rs))) != k
    )
    return Printed(lines) if lines else None


def as_rendered(saved: dict[str, SavedTable], memo: Printed | None) -> dict[str, SavedTable]:
    """``saved`` with each line of our chains that is the kernel's print of a line of ours (``memo``) read
    as that line of ours: the kernel printing a rule is not the rule being gone, so it is in sync and
    revokes nothing. The kernel's rule IS that rule: iptables-save prints a rule so that restoring the
    print re-creates it. Lines not learned (drift, a new rule, a restart with no memo) stay as they are
    and are compared byte for byte, as before."""
    if memo is None:
        return saved
    ours: dict[str, dict[str, str]] = {}
    for table, kernel, rendered in memo.lines:
        ours.setdefault(table, {})[kernel] = rendered
    out = dict(saved)
    for name, known in ours.items():
        t = saved.get(name)
        if t is None:
            continue
        rules = {
            c: [known.get(r, r) for r in lines] if c.startswith(OWN_PREFIX) else lines
            for c, lines in t.rules.items()
        }
        out[name] = SavedTable(list(t.chains), rules)
    return out


PROBE_PREFIX = "VPNGWPROBE-"
"""Chains init-nat writes a copy of its ruleset to, to see how the kernel prints it: never jumped to, so
they match no packet; deleted right after. Not ours by OWN_PREFIX (never compared)."""
_OUR_CHAIN = re.compile(rf"^-A {OWN_PREFIX}| -[jg] {OWN_PREFIX}")
_PROBE_CHAIN = re.compile(rf"^-A {PROBE_PREFIX}| -[jg] {PROBE_PREFIX}")


def _to_probe(line: str) -> str:
    # " -j VPNGW-" and " -g VPNGW-" are only ever a jump or a goto: names inside comments have no spaces.
    return _OUR_CHAIN.sub(lambda m: m.group(0).replace(OWN_PREFIX, PROBE_PREFIX), line)


def _from_probe(line: str) -> str:
    return _PROBE_CHAIN.sub(lambda m: m.group(0).replace(PROBE_PREFIX, OWN_PREFIX), line)


def _probe_chain(chain: str) -> str:
    return PROBE_PREFIX + chain.removeprefix(OWN_PREFIX)


def probe_payload(ruleset: Ruleset) -> str:
    """``ruleset`` in the probe chains (each declared, so emptied first), no jumps to them."""
    out: list[str] = []
    for t in ruleset.tables:
        out.append(f"*{t.table}")
        out.extend(f":{_probe_chain(c)} - [0:0]" for c in t.chains)
        out.extend(_to_probe(r) for r in t.rules)
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def probe_cleanup_payload(ruleset: Ruleset) -> str:
    """Empty the probe chains (they jump to each other), then delete them."""
    out: list[str] = []
    for t in ruleset.tables:
        out.append(f"*{t.table}")
        out.extend(f":{_probe_chain(c)} - [0:0]" for c in t.chains)
        out.extend(f"-X {_probe_chain(c)}" for c in t.chains)
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def probed(saved: dict[str, SavedTable], ruleset: Ruleset) -> dict[str, SavedTable]:
    """The probe chains of ``saved`` as if they were our chains (names put back), and only them: read
    with :func:`printed` and :func:`mismatch` as what the kernel holds of ``ruleset``."""
    out: dict[str, SavedTable] = {}
    for t in ruleset.tables:
        have = saved.get(t.table, SavedTable())
        chains = [c for c in t.chains if _probe_chain(c) in have.chains]
        rules = {c: [_from_probe(r) for r in have.rules.get(_probe_chain(c), [])] for c in chains}
        out[t.table] = SavedTable(chains, rules)
    return out


def mismatch(saved: dict[str, SavedTable], ruleset: Ruleset) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Our rules only in the rendering and only in the kernel, in order (our jumps are not compared)."""
    want = [r for _, _, rs in rendered_rules(ruleset) for r in rs]
    have = [r for _, _, rs in kernel_rules(saved, ruleset) or () for r in rs]
    in_kernel, in_rendering = set(have), set(want)
    return tuple(r for r in want if r not in in_kernel), tuple(r for r in have if r not in in_rendering)


def payload(ruleset: Ruleset, saved: dict[str, SavedTable]) -> str:
    out: list[str] = []
    for t in ruleset.tables:
        out.append(f"*{t.table}")
        out.extend(f":{c} - [0:0]" for c in t.chains)
        out.extend(jump_fixes(saved, t.table, t.chains))
        out.extend(t.rules)
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def snapshot_payload(saved: dict[str, SavedTable], ruleset: Ruleset) -> str:
    """A payload that puts back what our chains held in ``saved`` (chains that did not exist yet are
    left empty: a jump to an empty chain changes nothing)."""
    have = own_state(saved)
    out: list[str] = []
    for t in ruleset.tables:
        chains, rules = have.get(t.table, ((), ()))
        out.append(f"*{t.table}")
        out.extend(f":{c} - [0:0]" for c in sorted(set(chains) | set(t.chains)))
        out.extend(rules)
        out.append("COMMIT")
    return "\n".join(out) + "\n"


_COMMENT = re.compile(r' -m comment --comment ("[^"]*"|\S+)')
_GRANT_TO = re.compile(r'^"?vpngw grant (to=[0-9.]+)[ "]')


def _what_it_admits(comment: re.Match[str]) -> str:
    """Of an admission rule's comment only the target counts (``to=`` leads it, see rules.render)."""
    to = _GRANT_TO.match(comment.group(1))
    return f" {to.group(1)}" if to else ""


def admissions(rules: Iterable[str]) -> dict[Flush, frozenset[str]]:
    """(conntrack mark, mask) -> the admission rules that set it (names stripped, the mask written as
    ``/MASK``: only what the rule admits counts, including the DNAT target its comment names, as in
    ``rules.Admission.key``). The mask is the one the rule marked with: a flush of its entries must use
    that one."""
    out: dict[Flush, set[str]] = {}
    for r in rules:
        if m := _SET_XMARK.search(r):
            key = Flush(int(m.group(1), 16), int(m.group(2), 16))
            out.setdefault(key, set()).add(
                _COMMENT.sub(_what_it_admits, r).replace(f"/{m.group(2)}", "/MASK")
            )
    return {key: frozenset(lines) for key, lines in out.items()}


def admissions_in(saved: dict[str, SavedTable]) -> dict[Flush, frozenset[str]]:
    """What our filter chain admits in the kernel now, per (conntrack mark, mask)."""
    return admissions(saved.get("filter", SavedTable()).rules.get(FILTER_CHAIN, []))


_TOMBSTONE_COMMENT = '"vpngw revoked until its conntrack flush"'  # rules.tombstone_rules
_CONNMARK = re.compile(r" -m connmark --mark (0x[0-9a-f]+)/(0x[0-9a-f]+)( |$)")


def tombstones_in(saved: dict[str, SavedTable]) -> frozenset[Flush]:
    """Revoked marks our filter chain still drops (``rules.render(tombstones=...)``): their flush had not
    succeeded when the process that wrote them stopped, so a restarted init-nat owes it."""
    out = set()
    for r in saved.get("filter", SavedTable()).rules.get(FILTER_CHAIN, []):
        # By its comment, wherever the print puts the options (the flush is owed whatever the version).
        if _TOMBSTONE_COMMENT in r and r.endswith(" -j DROP") and (m := _CONNMARK.search(r)):
            out.add(Flush(int(m.group(1), 16), int(m.group(2), 16)))
    return frozenset(out)


def marks_in(saved: dict[str, SavedTable]) -> frozenset[int]:
    """Conntrack marks our filter chain currently sets."""
    return frozenset(f.mark for f in admissions_in(saved))


def revoked_in_kernel(before: Mapping[Flush, frozenset[str]], ruleset: Ruleset) -> frozenset[Flush]:
    """What must be flushed when we do not know the previous plan (init-nat restarted): a mark the new
    rules no longer set, or one that loses any admission rule it had in the kernel (a grant narrowed
    while we were down), each with the mask the kernel's rules marked under. A ``markMask`` change
    alone revokes nothing (as in ``rules.flushes``): a mark keeps admitting what it admitted."""
    after: dict[int, frozenset[str]] = {}
    for f, lines in admissions(r for t in ruleset.tables if t.table == "filter" for r in t.rules).items():
        after[f.mark] = after.get(f.mark, frozenset()) | lines
    return frozenset(f for f, lines in before.items() if not lines <= after.get(f.mark, frozenset()))


def count_rules(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("-"))


def choose_variant(legacy_save: str, nft_save: str) -> Variant:
    """kube-proxy's rule (kubernetes-sigs/iptables-wrappers): a kubelet hint/canary chain in one
    variant decides; otherwise the variant holding more rules wins, nft on a tie (the Debian default).
    Our own chains count as a hint too: a restarted init-nat keeps using the variant it wrote to."""
    for hint in (*_HINT_CHAINS, FILTER_CHAIN):
        in_legacy, in_nft = f":{hint} " in legacy_save, f":{hint} " in nft_save
        if in_legacy != in_nft:
            return "legacy" if in_legacy else "nft"
    return "legacy" if count_rules(legacy_save) > count_rules(nft_save) else "nft"


def own_rules_text(saved: dict[str, SavedTable], tables: Iterable[str] = ("filter", "nat", "mangle")) -> str:
    """Our chains and jumps as text, for logs and tests that compare states."""
    lines: list[str] = []
    for name in tables:
        t = saved.get(name)
        if t is None:
            continue
        for _, builtin, ours in (j for j in JUMPS if j[0] == name):
            lines.extend(f"{name} {r}" for r in t.rules.get(builtin, []) if r == _jump(builtin, ours))
        lines.extend(f"{name} {r}" for c in sorted(t.rules) if c.startswith(OWN_PREFIX) for r in t.rules[c])
    return "\n".join(lines)
