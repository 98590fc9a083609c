"""Read-only VICI queries shared by the agent and the exporter: SAs, daemon identity, counters.

The 512 KiB trap (LAB-FACTS, re-measured on charon 5.9.8): charon silently DROPS any VICI message over
512 KiB. ``list-sas`` streams one ``list-sa`` event per IKE_SA, so an IKE_SA with ~1,450+ CHILD_SAs simply
vanishes from the listing, with no error. A monitor that trusts the listing would report a live tunnel
down. ``list_sas`` therefore checks what came back against ``stats`` (``ikesas.total``) and, when IKE_SAs
are missing, recovers them:

1. a *skeleton* listing (``list-sas`` filtered to a child name that does not exist) yields every IKE_SA
   with an empty ``child-sas`` section: small messages, so nothing is dropped; it names the missing ones;
2. each missing IKE_SA is listed alone (``ike-id``);
3. if that single IKE_SA is still too big, its CHILD_SAs are listed per child config name
   (``ike-id`` + ``child``; charon 5.9.8 supports the ``child``/``child-id`` filters although the 5.9
   README does not document them: verified live), the names coming from ``list-conns`` for that conn.
   All CHILD_SAs of one name (e.g. both sides of a rekey) come back in one message.

If even that fails (``list-conns`` itself dropped), the IKE_SA from the skeleton is returned with
``"children-incomplete": "yes"``, so the tunnel still shows as established.

Shape of the result: ``{ike_uniqueid: ike_sa_section}``, where the section is charon's ``list-sa`` IKE_SA
section (str values, ``child-sas`` keyed ``<child>-<uniqueid>`` as charon does) plus a ``"name"`` key with
the conn name. Keyed by unique id because two IKE_SAs may share a conn name (e.g. during a reauth).

Deadlines: ``timeout`` bounds the whole query; every call gets the time that is left, so a call that runs
out of time raises ``ViciTimeout`` and the session discards itself (never a cancelled half-read stream).
"""

from __future__ import annotations

import calendar
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gwkit.vici.errors import ViciCommandFailed, ViciTimeout
from gwkit.vici.session import ViciSession
from gwkit.vici.wire import Section

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# A child name no config uses: the listing then carries every IKE_SA with an empty child-sas section.
_NO_CHILD = "vpngw.skeleton.no-such-child"

IkeSas = dict[str, Section]


class _Deadline:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout

    def left(self, what: str) -> float:
        rest = self.end - time.monotonic()
        if rest <= 0:
            raise ViciTimeout(f"{what}: query deadline of {self.timeout:.1f}s passed")
        return rest


async def _list(session: ViciSession, flt: Mapping[str, str], dl: _Deadline) -> list[tuple[str, Section]]:
    events, _ = await session.stream("list-sas", dict(flt), "list-sa", timeout=dl.left("list-sas"))
    return [(name, sa) for event in events for name, sa in event.items() if isinstance(sa, dict)]


def merge(listing: list[tuple[str, Section]]) -> IkeSas:
    """Key ``list-sa`` events by IKE_SA unique id and put the conn name in (pure)."""
    out: IkeSas = {}
    for name, sa in listing:
        uid = str(sa.get("uniqueid", ""))
        if uid in out:  # the same IKE_SA from several per-child queries: join the children
            out[uid].setdefault("child-sas", {}).update(sa.get("child-sas") or {})
        else:
            out[uid] = {**sa, "name": name, "child-sas": dict(sa.get("child-sas") or {})}
    return out


async def _conn_children(session: ViciSession, conn: str, dl: _Deadline) -> list[str]:
    events, _ = await session.stream("list-conns", {"ike": conn}, "list-conn", timeout=dl.left("list-conns"))
    names: list[str] = []
    for event in events:
        for cfg in event.values():
            if isinstance(cfg, dict):
                names.extend(str(n) for n in (cfg.get("children") or {}))
    return names


async def list_sas(session: ViciSession, *, timeout: float = DEFAULT_TIMEOUT) -> IkeSas:
    """All IKE_SAs with their CHILD_SAs, even those charon's 512 KiB limit drops (module docstring)."""
    dl = _Deadline(timeout)
    stats = await session.call("stats", timeout=dl.left("stats"))
    expected = int(stats.get("ikesas", {}).get("total", 0))
    sas = merge(await _list(session, {}, dl))
    sas.update(await _missing(session, sas.keys(), expected, dl))
    return sas


async def missing_sas(
    session: ViciSession, have: Collection[str], expected: int, *, timeout: float = DEFAULT_TIMEOUT
) -> IkeSas:
    """The IKE_SAs a full ``list-sas`` did not deliver: ``have`` are the unique ids it did, ``expected``
    the total ``stats`` counted before it. Empty when nothing is missing (no query is sent)."""
    return await _missing(session, have, expected, _Deadline(timeout))


async def _missing(session: ViciSession, have: Collection[str], expected: int, dl: _Deadline) -> IkeSas:
    if len(have) >= expected:
        return {}
    # Some IKE_SAs did not arrive (too big) or went away meanwhile: the skeleton says which exist.
    skeleton = merge(await _list(session, {"child": _NO_CHILD}, dl))
    found: IkeSas = {}
    for uid in (uid for uid in skeleton if uid not in have):
        alone = merge(await _list(session, {"ike-id": uid}, dl))
        if uid in alone:
            found[uid] = alone[uid]
            continue
        sa = skeleton[uid]
        children = await _conn_children(session, sa["name"], dl)
        parts: list[tuple[str, Section]] = [(sa["name"], sa)]
        for child in children:
            parts += await _list(session, {"ike-id": uid, "child": child}, dl)
        joined = merge(parts)[uid]
        if not children:
            joined["children-incomplete"] = "yes"
        found[uid] = joined
        log.info(
            "vici.list_sas.split ike=%s uniqueid=%s children=%d queries=%d",
            sa["name"],
            uid,
            len(joined["child-sas"]),
            len(children),
        )
    return found


@dataclass(frozen=True)
class DaemonInfo:
    """Who answers on the socket, and since when (``started`` changes when charon restarts)."""

    daemon: str
    version: str
    sysname: str
    release: str
    machine: str
    started: float | None
    """Unix time charon started (``stats.uptime.since``; second precision); None if unparsable."""
    ikesas_total: int
    ikesas_half_open: int
    plugins: tuple[str, ...]
    workers_total: int = 0
    workers_idle: int = 0
    queued_jobs: int = 0
    scheduled_jobs: int = 0


def parse_since(text: str, *, utc: bool = False) -> float | None:
    """charon prints ``since`` as local time, ``%b %d %H:%M:%S %Y`` (pure but for the local time zone)."""
    try:
        parsed = time.strptime(text, "%b %d %H:%M:%S %Y")
    except (ValueError, TypeError):
        return None
    return float(calendar.timegm(parsed) if utc else time.mktime(parsed))


START_WOBBLE = 2.0
"""charon prints ``since`` as now minus its uptime in whole seconds, so two calls a moment apart can
differ by a second (measured: 252 calls said :40, 113 said :41). Only a larger jump is a restart."""


def settle_start(previous: float | None, observed: float | None) -> float | None:
    """The daemon's start time, stable across charon's one-second wobble: keep ``previous`` unless
    ``observed`` moved by more than START_WOBBLE (a restart; one within 2 s of the last start shows up as
    a closed socket instead)."""
    if previous is not None and observed is not None and abs(observed - previous) <= START_WOBBLE:
        return previous
    return observed


def start_time(stats: Mapping[str, Any]) -> float | None:
    """charon's start time from a ``stats`` reply (``uptime.since``); None if absent or unparsable."""
    uptime = stats.get("uptime")
    return parse_since(str(uptime.get("since", "")) if isinstance(uptime, Mapping) else "")


@dataclass(frozen=True)
class StartSighting:
    """charon's start time as one ``stats`` reply gave it, with our own clocks read right after.

    charon computes ``since`` as wall time minus its monotonic uptime, so a wall-clock step (NTP, a VM
    resumed, an operator's ``date -s``) moves ``since`` by the step although nothing restarted. Our wall
    and monotonic clocks are the same kernel clocks charon reads (one pod, one kernel), so the step is
    (wall delta - monotonic delta) between two sightings, and can be taken out."""

    since: float
    wall: float
    """Our ``time.time()`` (Unix seconds)."""
    mono: float
    """Our ``time.monotonic()``: only differences are used, like charon's uptime."""


def sighting(since: float | None, *, wall: float, mono: float) -> StartSighting | None:
    return None if since is None else StartSighting(since, wall, mono)


def start_drift(before: StartSighting, after: StartSighting) -> float:
    """Seconds ``since`` moved between two sightings beyond what a wall-clock step explains (pure).
    About 0 (within charon's one-second wobble) for the same daemon, whatever the clocks did."""
    step = (after.wall - before.wall) - (after.mono - before.mono)
    return after.since - (before.since + step)


def restarted_between(
    before: StartSighting | None, after: StartSighting | None, *, tolerance: float = START_WOBBLE
) -> bool:
    """Did charon restart between two sightings? Only a start-time move that a wall-clock step does not
    explain counts; None (unknown) on either side is not a restart. For the moments our session could not
    see (a reconnect after a hung charon): while one VICI session stays connected the answer is no
    whatever ``since`` says, because a restart closes every VICI connection."""
    return before is not None and after is not None and abs(start_drift(before, after)) > tolerance


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def daemon_info_from(version: Section, stats: Section) -> DaemonInfo:
    """Build DaemonInfo from the ``version`` and ``stats`` replies (pure but for ``parse_since``)."""
    ikesas = stats.get("ikesas") or {}
    workers = stats.get("workers") or {}
    queues = stats.get("queues") or {}
    return DaemonInfo(
        daemon=str(version.get("daemon", "")),
        version=str(version.get("version", "")),
        sysname=str(version.get("sysname", "")),
        release=str(version.get("release", "")),
        machine=str(version.get("machine", "")),
        started=parse_since(str((stats.get("uptime") or {}).get("since", ""))),
        ikesas_total=_int(ikesas.get("total")),
        ikesas_half_open=_int(ikesas.get("half-open")),
        plugins=tuple(str(p) for p in stats.get("plugins") or ()),
        workers_total=_int(workers.get("total")),
        workers_idle=_int(workers.get("idle")),
        queued_jobs=sum(_int(v) for v in queues.values()) if isinstance(queues, dict) else 0,
        scheduled_jobs=_int(stats.get("scheduled")),
    )


async def daemon_info(session: ViciSession, *, timeout: float = DEFAULT_TIMEOUT) -> DaemonInfo:
    dl = _Deadline(timeout)
    version = await session.call("version", timeout=dl.left("version"))
    stats = await session.call("stats", timeout=dl.left("stats"))
    return daemon_info_from(version, stats)


async def counters(session: ViciSession, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, int] | None:
    """Global ``get-counters`` (rekeys, invalid messages, ...); None when the counters plugin is absent."""
    try:
        body = await session.call("get-counters", timeout=timeout)
    except ViciCommandFailed as exc:
        if exc.message == "unknown command":
            return None
        raise
    return counters_from(body)


def counters_from(body: Section) -> dict[str, int]:
    """charon 5.9.8 nests the global counters under an empty conn name: ``{"counters": {"": {...}}}``."""
    raw = body.get("counters") or {}
    if not isinstance(raw, dict):
        return {}
    if isinstance(raw.get(""), dict):
        raw = raw[""]
    return {str(k): _int(v) for k, v in raw.items() if not isinstance(v, dict)}


__all__ = [
    "DaemonInfo",
    "IkeSas",
    "StartSighting",
    "counters",
    "counters_from",
    "daemon_info",
    "daemon_info_from",
    "list_sas",
    "merge",
    "restarted_between",
    "settle_start",
    "sighting",
    "start_drift",
    "start_time",
]
