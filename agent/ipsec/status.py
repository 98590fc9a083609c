"""``status.tunnels`` from a ``list-sas`` snapshot (pure: snapshot + plan + errors + clock in, data out).

Facts this relies on (LAB-FACTS, measured on charon 5.9.8):

* ``rekey-time`` / ``reauth-time`` are SECONDS REMAINING, ``established`` / ``install-time`` seconds
  since: so ``rekeyAt = now + rekey-time`` and ``establishedAt = now - established``.
* A CHILD_SA rekey keeps two SAs for one child config for ~5 s: the old one DELETED/REKEYED with frozen
  counters, the new one INSTALLED with counters from 0. The initiator's sequence is INSTALLED ->
  REKEYING -> DELETING+INSTALLED -> DELETED+INSTALLED.
* An IKE rekey gives a new IKE unique id and resets ``established``; the children move over.

So a child counts as up while one of its SAs is INSTALLED or REKEYING (the SA being rekeyed still carries
the traffic), and a tunnel is Established when an IKE_SA is ESTABLISHED and every child of the plan is up.
Counters are summed over the active (INSTALLED/REKEYING) SAs only, never over the old SA as well; the final
counters of SAs that a rekey retired are carried (``Carry``) so that a tunnel's counters never drop to
zero or go backwards at a rekey while the tunnel stays up. They restart from zero when the tunnel goes
down. The carry is state passed in and returned, so the function stays pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from gwplan import Tunnel

TunnelState = Literal["Established", "Connecting", "Down", "Failed", "Standby"]
STANDBY_REASON = (
    "standby: this pod is its gateway's HA standby; the active pod serves the tunnel (here it is loaded, "
    "never initiated, never answered)"
)
"""``lastError`` of a standby's tunnel (state ``Standby``): not a fault, so no Connecting, Down or Failed."""
ACTIVE_CHILD = frozenset({"INSTALLED", "REKEYING"})
STARTING_CHILD = frozenset({"CREATED", "INSTALLING", "ROUTED", "RETRYING"})
RETIRED_CHILD = frozenset({"REKEYED", "DELETING", "DELETED", "DESTROYING"})
UP_IKE = ("ESTABLISHED", "REKEYING", "REKEYED")  # preference order
CONNECTING_IKE = frozenset({"CREATED", "CONNECTING", "PASSIVE"})


@dataclass(frozen=True)
class Counters:
    bytes_in: int = 0
    bytes_out: int = 0
    packets_in: int = 0
    packets_out: int = 0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.bytes_in + other.bytes_in,
            self.bytes_out + other.bytes_out,
            self.packets_in + other.packets_in,
            self.packets_out + other.packets_out,
        )

    @classmethod
    def of(cls, child: Mapping[str, Any]) -> Counters:
        return cls(
            _int(child.get("bytes-in")),
            _int(child.get("bytes-out")),
            _int(child.get("packets-in")),
            _int(child.get("packets-out")),
        )


@dataclass(frozen=True)
class Carry:
    """Per tunnel, between snapshots: last counters of each active CHILD_SA, and what retired SAs
    contributed (counted once: ``retired_ids``)."""

    seen: Mapping[str, Counters] = field(default_factory=dict)
    retired: Counters = Counters()
    retired_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ChildStatus:
    name: str
    remote_subnet: str
    state: TunnelState
    rekey_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "remoteSubnet": self.remote_subnet, "state": self.state}
        if self.rekey_at:
            out["rekeyAt"] = self.rekey_at
        return out


@dataclass(frozen=True)
class TunnelStatus:
    name: str
    state: TunnelState
    established_at: str | None
    rekey_at: str | None
    counters: Counters
    children: tuple[ChildStatus, ...]
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "establishedAt": self.established_at,
            "rekeyAt": self.rekey_at,
            "bytesIn": self.counters.bytes_in,
            "bytesOut": self.counters.bytes_out,
            "packetsIn": self.counters.packets_in,
            "packetsOut": self.counters.packets_out,
            "children": [c.to_dict() for c in self.children],
            "lastError": self.last_error,
        }


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _seconds(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _pick_ike(ikes: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The IKE_SA that represents the tunnel: ESTABLISHED first, and the newest of those."""
    for state in UP_IKE:
        up = [sa for sa in ikes if sa.get("state") == state]
        if up:
            return min(up, key=lambda sa: _seconds(sa, "established") or 0)
    return None


def tunnel_status(
    tunnel: Tunnel,
    ikes: list[Mapping[str, Any]],
    *,
    now: datetime,
    error: str | None,
    in_flight: bool,
    carry: Carry,
    standby: bool = False,
) -> tuple[TunnelStatus, Carry]:
    """``standby``: the pod is its HA pair's standby: with no IKE_SA the tunnel is ``Standby`` (with
    ``STANDBY_REASON``), its children Down; an SA that is there (one the keeper is terminating) is
    reported as it is."""
    if standby and not ikes:
        down = tuple(ChildStatus(c.name, c.remote_subnet, "Down") for c in tunnel.children)
        return TunnelStatus(tunnel.name, "Standby", None, None, Counters(), down, STANDBY_REASON), Carry()
    ike = _pick_ike(ikes)
    sas = [child for sa in ikes for child in (sa.get("child-sas") or {}).values()]
    # Counters: active SAs, plus what retired SAs carried before they were replaced.
    seen: dict[str, Counters] = {}
    retired, retired_ids = carry.retired, set(carry.retired_ids)
    present = set()
    for child in sas:
        uid, sa_state = str(child.get("uniqueid")), child.get("state")
        present.add(uid)
        if sa_state in ACTIVE_CHILD:
            seen[uid] = Counters.of(child)
        elif sa_state in RETIRED_CHILD and uid not in retired_ids:
            retired += Counters.of(child)
            retired_ids.add(uid)
    for uid, last in carry.seen.items():
        if uid not in present and uid not in retired_ids:  # vanished between two snapshots
            retired += last
    retired_ids &= present  # unique ids never come back; keep the set small
    active = Counters()
    for counters in seen.values():
        active += counters

    # An IKE_SA whose children could not be listed at all (charon's 512 KiB limit, even per child name:
    # queries.list_sas marks it) is up; its children are unknown, and unknown is not down.
    incomplete = ike is not None and ike.get("children-incomplete") == "yes"
    children: list[ChildStatus] = []
    for c in tunnel.children:
        mine = [sa for sa in sas if sa.get("name") == c.name]
        up = [sa for sa in mine if sa.get("state") in ACTIVE_CHILD]
        if incomplete and not mine:
            children.append(ChildStatus(c.name, c.remote_subnet, "Established"))
        elif up and ike is not None:
            newest = min(up, key=lambda sa: _seconds(sa, "install-time") or 0)
            left = _seconds(newest, "rekey-time")
            at = rfc3339(now + timedelta(seconds=left)) if left is not None else None
            children.append(ChildStatus(c.name, c.remote_subnet, "Established", at))
        elif any(sa.get("state") in STARTING_CHILD for sa in mine) or in_flight:
            children.append(ChildStatus(c.name, c.remote_subnet, "Connecting"))
        else:
            children.append(ChildStatus(c.name, c.remote_subnet, "Down"))

    state: TunnelState
    all_up = ike is not None and all(ch.state == "Established" for ch in children)
    if all_up:
        state = "Established"
    elif in_flight or any(sa.get("state") in CONNECTING_IKE for sa in ikes):
        state = "Connecting"
    elif error:
        state = "Failed"
    elif ike is not None:
        state = "Connecting"  # up, but waiting for some CHILD_SAs
    else:
        state = "Down"

    established_at = rekey_at = None
    if ike is not None:
        since = _seconds(ike, "established")
        if since is not None:
            established_at = rfc3339(now - timedelta(seconds=since))
        left = _seconds(ike, "rekey-time")
        if left is None:
            left = _seconds(ike, "reauth-time")
        if left is not None:
            rekey_at = rfc3339(now + timedelta(seconds=left))

    if not ikes:  # down: counters restart when it comes back
        new_carry = Carry()
        total = Counters()
    else:
        new_carry = Carry(seen, retired, frozenset(retired_ids))
        total = retired + active
    status = TunnelStatus(
        name=tunnel.name,
        state=state,
        established_at=established_at,
        rekey_at=rekey_at,
        counters=total,
        children=tuple(children),
        last_error=None if state == "Established" else error,
    )
    return status, new_carry


def tunnels_status(
    tunnels: tuple[Tunnel, ...],
    sas: Mapping[str, Mapping[str, Any]] | None,
    *,
    now: datetime,
    errors: Mapping[str, str],
    in_flight: frozenset[str] = frozenset(),
    carry: Mapping[str, Carry] | None = None,
    daemon_error: str | None = None,
    standby: bool = False,
) -> tuple[list[TunnelStatus], dict[str, Carry]]:
    """One status per tunnel of the plan, in plan order. ``sas`` is ``queries.list_sas``'s result
    (``{uniqueid: ike_sa}`` with ``name``), or None when charon could not be asked (``daemon_error``):
    then every tunnel is Down with that reason. ``standby``: see ``tunnel_status``."""
    carry = carry or {}
    out: list[TunnelStatus] = []
    new_carry: dict[str, Carry] = {}
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for sa in (sas or {}).values():
        by_name.setdefault(str(sa.get("name")), []).append(sa)
    for t in tunnels:
        if sas is None:
            down = tuple(ChildStatus(c.name, c.remote_subnet, "Down") for c in t.children)
            out.append(
                TunnelStatus(t.name, "Down", None, None, Counters(), down, daemon_error or errors.get(t.name))
            )
            # Unknown is not gone: a hung charon that answers again still has these SAs (the keeper
            # clears the carry itself when a new daemon answers).
            new_carry[t.name] = carry.get(t.name, Carry())
            continue
        st, new_carry[t.name] = tunnel_status(
            t,
            by_name.get(t.name, []),
            now=now,
            error=errors.get(t.name),
            in_flight=t.name in in_flight,
            carry=carry.get(t.name, Carry()),
            standby=standby,
        )
        out.append(st)
    return out, new_carry


def tunnels_summary(statuses: list[TunnelStatus] | tuple[TunnelStatus, ...]) -> str:
    """``status.tunnelsSummary``: how many of the plan's tunnels are Established, e.g. ``3/4 up`` (the
    VPNGateway's Tunnels column: a printer column cannot count, so the agent that knows says it)."""
    up = sum(1 for s in statuses if s.state == "Established")
    return f"{up}/{len(statuses)} up"


# --- charon's reasons, from control-log / log lines ----------------------------------------------------

_REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (
            r"received (AUTHENTICATION_FAILED) notify",
            "AUTHENTICATION_FAILED: the peer rejected our authentication",
        ),
        (
            r"MAC mismatched|verification of .* failed|authentication of '.*' with pre-shared key failed",
            "AUTHENTICATION_FAILED: an IKE_AUTH claiming this peer's identity did not verify "
            "(a PSK mismatch, or not this peer: anyone may claim an identity)",
        ),
        (r"no shared key found for", "AUTHENTICATION_FAILED: no shared key for these identities"),
        (r"received (NO_PROPOSAL_CHOSEN) notify", "NO_PROPOSAL_CHOSEN: no common IKE/ESP proposal"),
        (r"no (?:acceptable|matching) proposal", "NO_PROPOSAL_CHOSEN: no common IKE/ESP proposal"),
        (r"received (TS_UNACCEPTABLE) notify", "TS_UNACCEPTABLE: the peer rejected the traffic selectors"),
        (r"received (INVALID_ID_INFORMATION)", "INVALID_ID_INFORMATION: the peer rejected our identity"),
        (r"giving up after \d+ retransmits", "peer not responding: gave up after retransmits"),
        (r"(peer not responding)", "peer not responding"),
        (r"error installing route|unable to install", "charon could not install the SA or its route"),
        (
            r"no IKE config found|no matching peer config found",
            "the peer's identity matches no configuration",
        ),
    )
)


def reason_from_log(lines: list[str] | tuple[str, ...]) -> str | None:
    """The most specific cause in charon's log lines (pure). The generic "establishing CHILD_SA failed"
    is what charon returns; the cause is only in the streamed lines (LAB-FACTS)."""
    for pattern, reason in _REASONS:
        for line in lines:
            m = pattern.search(line)
            if m:
                return f"{reason} ({line.strip()[:160]})"
    return None


# --- when to publish (pure) --------------------------------------------------------------------------------

COUNTER_FIELDS = frozenset({"bytesIn", "bytesOut", "packetsIn", "packetsOut"})
TIME_FIELDS = frozenset({"establishedAt", "rekeyAt"})
TIME_WOBBLE = 1.0
"""``establishedAt``/``rekeyAt`` are now -/+ charon's whole seconds, so two listings a moment apart can
differ by a second with nothing changed; a rekey or a new SA moves them by far more."""


def _parse_rfc3339(text: Any) -> datetime | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None


def _same_time(a: Any, b: Any) -> bool:
    if a == b:
        return True
    ta, tb = _parse_rfc3339(a), _parse_rfc3339(b)
    return ta is not None and tb is not None and abs((ta - tb).total_seconds()) <= TIME_WOBBLE


def significant_change(previous: Any, current: Any) -> bool:
    """Does ``current`` differ from ``previous`` in more than byte/packet counters and timestamp wobble?
    (a state, a child, an error, the agent section, a tunnel added or removed, a rekey's new rekeyAt)."""
    if isinstance(previous, Mapping) and isinstance(current, Mapping):
        if previous.keys() != current.keys():
            return True
        for key, value in current.items():
            if key in COUNTER_FIELDS:
                continue
            if key in TIME_FIELDS:
                if not _same_time(previous[key], value):
                    return True
            elif significant_change(previous[key], value):
                return True
        return False
    if isinstance(previous, list) and isinstance(current, list):
        return len(previous) != len(current) or any(
            significant_change(p, c) for p, c in zip(previous, current, strict=True)
        )
    return bool(previous != current)


def publish_due(
    previous: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    *,
    now: float,
    last: float,
    interval: float,
) -> bool:
    """Publish ``current`` now? A first status or a significant change (``significant_change``): at once.
    Counters (and timestamp wobble) alone: only once ``interval`` has passed since the ``last`` publish, so
    a keeper listing SAs every poll (a site is offline and being retried) does not write the CR status
    every poll because the other tunnels' counters moved. Unchanged: never."""
    if previous is None:
        return True
    if current == previous:
        return False
    if significant_change(previous, current):
        return True
    return now - last >= interval
