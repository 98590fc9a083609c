"""IPsec tunnels from charon's listing, with byte/packet counters that survive CHILD_SA rekeys (pure).

The problem: a CHILD_SA's counters start at 0 on every rekey (a new SA replaces the old one), so
exporters that publish the live SA's counters show a sawtooth that ``rate()`` reads as counter resets
and torn traffic. Ours are true counters per tunnel and per child config:

    total(tunnel, child) = retired(tunnel, child) + sum(last counts of its live SAs)

``Carry`` is the state that makes this work, threaded through pure functions:

* ``last``: the latest counts of every live CHILD_SA, keyed ``<epoch>/<uniqueid>``; ``epoch`` is charon's
  start time, because unique ids restart at 1 when charon restarts;
* an SA's counts move to ``retired`` when it is *final*: a ``child-rekey`` event (its ``old`` SA), a down
  event (``child-updown``/``ike-updown`` without ``up``), or when a listing no longer shows it (only
  provisionally: a listing can miss an SA whose IKE_SA was rekeyed while charon enumerated, and if a
  later one shows it again, its counts leave ``retired`` and it is live again);
* ``final`` remembers what was already retired per SA for ``FINAL_HORIZON`` seconds, so a late event with
  higher counts adds only the difference and a rekeyed SA still listed during charon's 5 s
  ``delete_rekeyed_delay`` (frozen counters, state REKEYED/DELETED: LAB-FACTS) is not counted twice.

Timestamps are computed once per SA (``established`` and ``install-time`` are seconds since,
``rekey-time`` seconds remaining: LAB-FACTS) and then kept, so they do not jitter by a second per scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

FINAL_HORIZON = 600.0
"""Seconds to remember a retired SA (late events, REKEYED SAs still listed)."""

Section = Mapping[str, Any]
CARRYING = frozenset({"INSTALLED", "REKEYING"})
"""CHILD_SA states that carry traffic: a REKEYING SA is still the live one until its successor is in."""


class Counts(NamedTuple):
    """Immutable like the frozen dataclasses elsewhere, but a NamedTuple: thousands are made per scrape
    and a frozen dataclass's ``__init__`` measured ~4x slower. ``+``/``-`` are element-wise here."""

    bytes_in: int = 0
    bytes_out: int = 0
    packets_in: int = 0
    packets_out: int = 0

    def __add__(self, other: Counts) -> Counts:  # type: ignore[override]
        return Counts(
            self.bytes_in + other.bytes_in,
            self.bytes_out + other.bytes_out,
            self.packets_in + other.packets_in,
            self.packets_out + other.packets_out,
        )

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.bytes_in - other.bytes_in,
            self.bytes_out - other.bytes_out,
            self.packets_in - other.packets_in,
            self.packets_out - other.packets_out,
        )

    def at_least(self, other: Counts) -> Counts:
        if (
            self.bytes_in >= other.bytes_in
            and self.bytes_out >= other.bytes_out
            and self.packets_in >= other.packets_in
            and self.packets_out >= other.packets_out
        ):
            return self  # the usual case: an SA's counters only grow
        return Counts(
            max(self.bytes_in, other.bytes_in),
            max(self.bytes_out, other.bytes_out),
            max(self.packets_in, other.packets_in),
            max(self.packets_out, other.packets_out),
        )

    def clamp(self) -> Counts:
        return Counts(
            max(0, self.bytes_in), max(0, self.bytes_out), max(0, self.packets_in), max(0, self.packets_out)
        )


ZERO = Counts()
ChildKey = tuple[str, str]
"""(tunnel, child config name)."""


@dataclass(frozen=True)
class Final:
    key: ChildKey
    counts: Counts
    at: float
    omitted: bool = False
    """Retired because a listing did not show it, not by an event: if a later listing shows it again it
    was only missed (an IKE_SA rekey moving children while charon enumerated), and it comes back."""


@dataclass(frozen=True)
class Carry:
    retired: Mapping[ChildKey, Counts] = field(default_factory=dict)
    last: Mapping[str, tuple[ChildKey, Counts]] = field(default_factory=dict)
    final: Mapping[str, Final] = field(default_factory=dict)
    stamps: Mapping[str, float] = field(default_factory=dict)
    subnets: Mapping[ChildKey, str] = field(default_factory=dict)
    """Remote subnet label per child, from the plan or the first listing that showed it."""


@dataclass(frozen=True)
class PlanTunnel:
    """A tunnel the plan configures: its children by name with their (single) remote subnet."""

    name: str
    children: Mapping[str, str]


class ChildView(NamedTuple):
    tunnel: str
    child: str
    subnet: str
    up: bool
    counts: Counts


@dataclass(frozen=True)
class TunnelView:
    name: str
    up: bool
    configured: bool
    ike_sas: int
    children_installed: int
    children_configured: int
    counts: Counts
    established: float | None = None
    next_rekey: float | None = None


class Info(NamedTuple):
    """One ``_info`` series: the place for unique ids, algorithms and selectors. ``values`` follow
    ``IKE_INFO_LABELS`` / ``CHILD_INFO_LABELS``."""

    values: tuple[str, ...]


@dataclass(frozen=True)
class IpsecView:
    tunnels: tuple[TunnelView, ...] = ()
    children: tuple[ChildView, ...] = ()
    ike_info: tuple[Info, ...] = ()
    child_info: tuple[Info, ...] = ()


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def counts_of(child: Section) -> Counts:
    get = child.get
    try:  # the usual case: all four present (or absent before any traffic) and numeric
        return Counts(
            int(get("bytes-in", 0)),
            int(get("bytes-out", 0)),
            int(get("packets-in", 0)),
            int(get("packets-out", 0)),
        )
    except (TypeError, ValueError):
        pass
    return Counts(
        _int(child.get("bytes-in")),
        _int(child.get("bytes-out")),
        _int(child.get("packets-in")),
        _int(child.get("packets-out")),
    )


def _retire(
    retired: dict[ChildKey, Counts],
    final: dict[str, Final],
    uid: str,
    key: ChildKey,
    counts: Counts,
    now: float,
    *,
    omitted: bool = False,
) -> None:
    before = final.get(uid)
    if before is None:
        retired[key] = retired.get(key, ZERO) + counts
        final[uid] = Final(key, counts, now, omitted)
        return
    grown = counts.at_least(before.counts)
    retired[key] = retired.get(key, ZERO) + (grown - before.counts).clamp()
    final[uid] = Final(key, grown, before.at, before.omitted and omitted)


def _children(ike: Section) -> Iterable[Section]:
    kids = ike.get("child-sas") or {}
    return [c for c in kids.values() if isinstance(c, Mapping)] if isinstance(kids, Mapping) else []


def observe_event(carry: Carry, event: str, body: Section, *, epoch: str, now: float) -> Carry:
    """Fold a ``child-rekey`` / ``child-updown`` / ``ike-updown`` event into the carry (pure).

    Only *final* counts are taken: the ``old`` SA of a child rekey, every SA of a down event. Up events
    and the ``new`` SA are left to the next listing."""
    if event not in ("child-rekey", "child-updown", "ike-updown"):
        return carry
    if event != "child-rekey" and body.get("up") == "yes":
        return carry
    retired, final, last = dict(carry.retired), dict(carry.final), dict(carry.last)
    for tunnel, ike in body.items():
        if not isinstance(ike, Mapping):
            continue
        kids = ike.get("child-sas") or {}
        if event == "child-rekey":
            olds = [kids["old"]] if isinstance(kids, Mapping) and isinstance(kids.get("old"), Mapping) else []
        else:
            olds = list(_children(ike))
        for child in olds:
            uid = f"{epoch}/{child.get('uniqueid', '')}"
            key = (str(tunnel), str(child.get("name", "")))
            counts = counts_of(child)
            seen = last.pop(uid, None)
            if seen is not None:  # the listing's key wins: it is where the live counts were summed
                key, counts = seen[0], counts.at_least(seen[1])
            _retire(retired, final, uid, key, counts, now)
    return replace(carry, retired=retired, final=final, last=last)


def _stamp(old: Mapping[str, float], new: dict[str, float], key: str, value: float | None) -> None:
    if key in old:
        new[key] = old[key]
    elif value is not None:
        new[key] = value


def _ts(raw: Any) -> list[str]:
    if isinstance(raw, list):
        return [str(x) for x in raw]
    return [str(raw)] if raw else []


_Child = tuple[str, ChildKey, Counts, bool, Any]
"""A listed CHILD_SA: uid, key, counts, carries traffic, rekey-time (a plain tuple: 1,000 per scrape)."""


class Listing:
    """One ``list-sas`` answer, folded in IKE_SA by IKE_SA as charon streams them (``add``), then into the
    carry (``finish``). Pure but for its own state.

    Why incremental: charon writes the 1,000-CHILD_SA listing over ~30 ms, one event per IKE_SA. The work
    per SA (counts, keys, info labels) done as each event arrives overlaps charon's own, and only the
    work per tunnel is left once the answer is complete. The facts that depend on the carry (was the SA
    retired by an event meanwhile? its previous counts and timestamps) are settled in ``finish`` against
    the carry as it is then: the event follower may have changed it while the listing streamed."""

    def __init__(
        self,
        *,
        epoch: str,
        now: float,
        plan: Iterable[PlanTunnel] = (),
        subnets: Mapping[ChildKey, str] | None = None,
    ) -> None:
        """``subnets``: the carry's remote subnets as the listing starts (events never change them)."""
        self.epoch = epoch
        self.now = now
        self._prefix = f"{epoch}/"
        self._planned = {(t.name, c): s for t in plan for c, s in t.children.items()}
        self._known = subnets or {}
        self._subnets: dict[ChildKey, str] = {}
        """Remote subnets first seen in this listing (the carry keeps the first one seen per child)."""
        self._children: list[_Child] = []
        self._listed: set[str] = set()
        self._ikes: list[tuple[str, str, int | None, bool]] = []
        self.installed: set[ChildKey] = set()
        self.seen: set[str] = set()
        self.ike_info: list[Info] = []
        self.child_info: list[Info] = []

    def add(self, name: str, ike: Section) -> None:
        """One IKE_SA (``name``: its connection, i.e. the tunnel) with its CHILD_SAs."""
        tunnel = str(name)
        ike_uid = str(ike.get("uniqueid", ""))
        est = _int(ike.get("established")) if "established" in ike else None
        self._ikes.append((tunnel, ike_uid, est, ike.get("state") == "ESTABLISHED"))
        self.seen.add(tunnel)
        self.ike_info.append(_ike_labels(tunnel, ike_uid, ike, self.epoch))
        prefix, subnets, known, planned = self._prefix, self._subnets, self._known, self._planned
        for child in _children(ike):
            uid = prefix + str(child.get("uniqueid", ""))
            key = (tunnel, str(child.get("name", "")))
            self._listed.add(uid)
            seen = known.get(key) or subnets.get(key)  # the first one seen is kept: labels stay stable
            if seen is None and (remote := child.get("remote-ts")):
                seen = subnets[key] = ",".join(_ts(remote))
            subnet = planned.get(key) or seen or ""
            self.child_info.append(_child_labels(tunnel, child, subnet, self.epoch))
            carrying = child.get("state") in CARRYING
            if carrying:
                self.installed.add(key)
            self._children.append((uid, key, counts_of(child), carrying, child.get("rekey-time")))

    def finish(self, carry: Carry) -> tuple[Carry, Listed]:
        """Fold the complete answer into ``carry``: SAs it no longer shows are retired."""
        now, epoch = self.now, self.epoch
        retired, final = dict(carry.retired), dict(carry.final)
        old_last, old_stamps = carry.last, carry.stamps
        last: dict[str, tuple[ChildKey, Counts]] = {}
        stamps: dict[str, float] = {}
        ike_count: dict[str, int] = {}
        established: dict[str, float] = {}
        next_rekey: dict[str, float] = {}
        for tunnel, ike_uid, est, up in self._ikes:
            sk = f"{epoch}/ike/{ike_uid}"
            _stamp(old_stamps, stamps, sk, None if est is None else float(int(now) - est))
            if up:
                ike_count[tunnel] = ike_count.get(tunnel, 0) + 1
                if (at := stamps.get(sk)) is not None:
                    established[tunnel] = max(established.get(tunnel, at), at)
        for uid, key, counts, carrying, rekey in self._children:
            seen = old_last.get(uid)
            gone = final.get(uid)
            if gone is not None:
                if not gone.omitted:  # retired by an event (REKEYED, frozen): never counted twice
                    continue
                # Retired only because a listing missed it: it is live, take its retired counts back.
                retired[gone.key] = (retired.get(gone.key, ZERO) - gone.counts).clamp()
                del final[uid]
                seen = (gone.key, gone.counts)
            last[uid] = (key, counts if seen is None else counts.at_least(seen[1]))
            rk = uid + "/rekey"
            at = old_stamps.get(rk)
            if at is None and rekey is not None:
                at = float(int(now) + _int(rekey))
            if at is not None:
                stamps[rk] = at
                if carrying:
                    next_rekey[key[0]] = min(next_rekey.get(key[0], at), at)
        for uid, (key, counts) in old_last.items():
            if uid not in last and uid not in self._listed:
                _retire(retired, final, uid, key, counts, now, omitted=True)
        final = {uid: f for uid, f in final.items() if now - f.at < FINAL_HORIZON}
        subnets = {**self._subnets, **carry.subnets} if self._subnets else carry.subnets
        new = Carry(retired=retired, last=last, final=final, stamps=stamps, subnets=subnets)
        listed = Listed(
            installed=self.installed,
            seen=self.seen,
            ike_count=ike_count,
            established=established,
            next_rekey=next_rekey,
            ike_info=tuple(self.ike_info),
            child_info=tuple(self.child_info),
        )
        return new, listed


@dataclass(frozen=True)
class Listed:
    """What the view takes from one complete listing, besides the carry."""

    installed: set[ChildKey] = field(default_factory=set)
    """Child configs with a CHILD_SA carrying traffic."""
    seen: set[str] = field(default_factory=set)
    """Tunnels with an IKE_SA in the listing."""
    ike_count: Mapping[str, int] = field(default_factory=dict)
    """ESTABLISHED IKE_SAs per tunnel."""
    established: Mapping[str, float] = field(default_factory=dict)
    next_rekey: Mapping[str, float] = field(default_factory=dict)
    ike_info: tuple[Info, ...] = ()
    child_info: tuple[Info, ...] = ()


def observe_listing(
    carry: Carry,
    sas: Mapping[str, Section],
    *,
    epoch: str,
    now: float,
    plan: Iterable[PlanTunnel] = (),
) -> tuple[Carry, Listed]:
    """Fold one complete ``list_sas`` result (IKE_SAs keyed by unique id, each with its ``name``) into
    the carry at once; ``Listing`` does the same as the answer streams in."""
    listing = Listing(epoch=epoch, now=now, plan=plan, subnets=carry.subnets)
    for ike in sas.values():
        listing.add(str(ike.get("name", "")), ike)
    return listing.finish(carry)


def totals(carry: Carry) -> dict[ChildKey, Counts]:
    out = dict(carry.retired)
    for key, counts in carry.last.values():
        got = out.get(key)
        out[key] = counts if got is None else got + counts
    return out


_IKE_KEYS = (
    ("version", "version"),
    ("state", "state"),
    ("local_host", "local-host"),
    ("remote_host", "remote-host"),
    ("local_id", "local-id"),
    ("remote_id", "remote-id"),
    ("encr_alg", "encr-alg"),
    ("encr_keysize", "encr-keysize"),
    ("integ_alg", "integ-alg"),
    ("prf_alg", "prf-alg"),
    ("dh_group", "dh-group"),
)
IKE_INFO_LABELS = ("tunnel", "uniqueid", *(label for label, _ in _IKE_KEYS))
_CHILD_KEYS = (
    ("uniqueid", "uniqueid"),
    ("reqid", "reqid"),
    ("state", "state"),
    ("mode", "mode"),
    ("protocol", "protocol"),
    ("encr_alg", "encr-alg"),
    ("encr_keysize", "encr-keysize"),
    ("integ_alg", "integ-alg"),
    ("dh_group", "dh-group"),
)
CHILD_INFO_LABELS = (
    "tunnel",
    "child",
    "subnet",
    *(label for label, _ in _CHILD_KEYS),
    "local_ts",
    "remote_ts",
)

# An SA's info labels are fixed for its life but for its state, so they are built once per (SA, state):
# at 1,000 CHILD_SAs building them was a fifth of a scrape. A bounded memo; the values are pure.
_MEMO: dict[tuple[str, ...], tuple[str, ...]] = {}
_MEMO_LIMIT = 100_000


def _memo(key: tuple[str, ...], build: Any) -> tuple[str, ...]:
    got = _MEMO.get(key)
    if got is None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        got = _MEMO[key] = build()
    return got


def _ike_labels(tunnel: str, uid: str, ike: Section, epoch: str) -> Info:
    key = ("ike", epoch, uid, tunnel, str(ike.get("state", "")))
    return Info(_memo(key, lambda: (tunnel, uid, *(str(ike.get(k, "")) for _, k in _IKE_KEYS))))


def _child_labels(tunnel: str, child: Section, subnet: str, epoch: str) -> Info:
    key = ("child", epoch, str(child.get("uniqueid", "")), tunnel, subnet, str(child.get("state", "")))
    return Info(
        _memo(
            key,
            lambda: (
                tunnel,
                str(child.get("name", "")),
                subnet,
                *(str(child.get(k, "")) for _, k in _CHILD_KEYS),
                ",".join(_ts(child.get("local-ts"))),
                ",".join(_ts(child.get("remote-ts"))),
            ),
        )
    )


def view(carry: Carry, listed: Listed | None, plan: Iterable[PlanTunnel], *, epoch: str) -> IpsecView:
    """The tunnels as the metrics show them (pure). ``listed`` None: charon did not answer this scrape, so
    every tunnel is down and the counters hold their carried totals."""
    planned = {t.name: t for t in plan}
    subnets = dict(carry.subnets)
    for t in planned.values():
        for child, subnet in t.children.items():
            subnets[(t.name, child)] = subnet
    sums = totals(carry)
    got = listed or Listed()
    installed, ike_count = got.installed, got.ike_count
    child_keys = set(sums) | installed | set(subnets)
    by_tunnel: dict[str, list[ChildKey]] = {name: [] for name in planned}
    for k in child_keys:
        by_tunnel.setdefault(k[0], []).append(k)
    for name in got.seen:
        by_tunnel.setdefault(name, [])
    # With a plan, a tunnel neither planned nor in charon's listing is a deprovisioned peer: its series go
    # stale instead of reporting a tunnel that is down forever (VpnTunnelDown would never clear). Without
    # a plan nothing says what is configured, so every tunnel seen so far keeps its row.
    shown = (planned.keys() | got.seen) if planned else set(by_tunnel)
    tunnels: list[TunnelView] = []
    for name in sorted(by_tunnel):
        if name not in shown:
            continue
        mine = by_tunnel[name]
        n_up = sum(1 for k in mine if k in installed)
        total = ZERO
        for k in mine:
            if (counts := sums.get(k)) is not None:
                total = total + counts
        up = ike_count.get(name, 0) > 0 and n_up > 0
        tunnels.append(
            TunnelView(
                name=name,
                up=up,
                configured=name in planned,
                ike_sas=ike_count.get(name, 0),
                children_installed=n_up,
                children_configured=len(planned[name].children) if name in planned else 0,
                counts=total,
                established=got.established.get(name) if up else None,
                next_rekey=got.next_rekey.get(name) if up else None,
            )
        )
    children = tuple(
        ChildView(
            tunnel=k[0], child=k[1], subnet=subnets.get(k, ""), up=k in installed, counts=sums.get(k, ZERO)
        )
        for k in sorted(child_keys)
        if k[0] in shown
    )
    return IpsecView(tuple(tunnels), children, got.ike_info, got.child_info)
