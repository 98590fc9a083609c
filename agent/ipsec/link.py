"""The keeper's decisions (pure): the session state machine, backoffs, and the initiate-if-down watchdog.

Session: DOWN --connected--> PUSHING --pushed--> READY; ``lost`` from any state goes back to DOWN and
counts a failure. Anything else is a bug and raises. Reconnects use a short, bounded backoff: connecting
to a unix socket costs nothing, and a restarted charon must get its configuration back within ~2 s.

Watchdog: a site tunnel (``initiate``) that is not up is initiated, one child after the other, never twice
at once (``in_flight``), never while charon already has an IKE_SA for it that is still being set up (that
would make a duplicate IKE_SA), and after a failure only once its backoff has passed.

HA standby (docs/ha.md): the keeper runs no watchdog, and every IKE_SA charon has is one to terminate
(``standby_sweep``): an initiation that was in flight when the pod was fenced, or a peer charon answered.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent.ipsec.status import ACTIVE_CHILD, STARTING_CHILD, UP_IKE
from gwkit.backoff import backoff
from gwplan import Tunnel


class Link(enum.Enum):
    DOWN = "down"
    PUSHING = "pushing"
    READY = "ready"


@dataclass(frozen=True)
class Conn:
    link: Link = Link.DOWN
    failures: int = 0


LinkEvent = Literal["connected", "pushed", "lost"]


def step(c: Conn, event: LinkEvent) -> Conn:
    match c.link, event:
        case Link.DOWN, "connected":
            return Conn(Link.PUSHING, c.failures)
        case Link.PUSHING, "pushed":
            return Conn(Link.READY, 0)
        case _, "lost":
            return Conn(Link.DOWN, c.failures + 1)
    raise ValueError(f"session event {event!r} while {c.link.value}")


def reconnect_backoff(failures: int, base: float = 0.02, cap: float = 0.25) -> float:
    """Seconds before reconnect number ``failures`` (1, 2, ...): 0.02 s doubling to 0.25 s."""
    return backoff(failures, base=base, cap=cap)


def initiate_backoff(failures: int, base: float = 1.0, cap: float = 30.0) -> float:
    """Seconds before initiating a tunnel again after ``failures`` failed attempts: 1 s doubling to 30 s."""
    return backoff(failures, base=base, cap=cap)


@dataclass(frozen=True)
class Attempt:
    failures: int = 0
    not_before: float = 0.0


def after_attempt(a: Attempt, ok: bool, now: float, *, queued: int = 0) -> Attempt:
    """``queued``: children initiated without waiting; give charon time to set them up before any of
    them is considered missing again (or it would get a duplicate CHILD_SA)."""
    if ok:
        return Attempt(0, now + 5.0 + 0.02 * queued) if queued else Attempt()
    failures = a.failures + 1
    return Attempt(failures, now + initiate_backoff(failures))


@dataclass(frozen=True)
class Initiate:
    tunnel: str
    children: tuple[str, ...]
    """Child configs to initiate, in order (the first one creates the IKE_SA if there is none)."""


def missing_children(tunnel: Tunnel, ikes: list[Mapping[str, Any]]) -> tuple[str, ...] | None:
    """Children of the plan to initiate, () when the tunnel is up, None when charon is busy with it."""
    states = [sa.get("state") for sa in ikes]
    up = any(s in UP_IKE for s in states)
    if not up and ikes:
        return None  # CONNECTING, DELETING, ...: charon is on it; initiating now could duplicate the IKE_SA
    if any(sa.get("children-incomplete") == "yes" for sa in ikes):
        return None  # too big to list its children (queries.list_sas): unknown is not missing
    sas = [child for sa in ikes for child in (sa.get("child-sas") or {}).values()]
    busy = ACTIVE_CHILD | STARTING_CHILD
    return tuple(
        c.name
        for c in tunnel.children
        if not any(s.get("name") == c.name and s.get("state") in busy for s in sas)
    )


def watchdog(
    tunnels: tuple[Tunnel, ...],
    sas: Mapping[str, Mapping[str, Any]],
    *,
    in_flight: frozenset[str],
    attempts: Mapping[str, Attempt],
    now: float,
) -> list[Initiate]:
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for sa in sas.values():
        by_name.setdefault(str(sa.get("name")), []).append(sa)
    out = []
    for t in tunnels:
        if not t.initiate or t.name in in_flight or now < attempts.get(t.name, Attempt()).not_before:
            continue
        missing = missing_children(t, by_name.get(t.name, []))
        if missing:
            out.append(Initiate(t.name, missing))
    return out


GONE_IKE = frozenset({"DESTROYING"})


def standby_sweep(sas: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The unique ids of the IKE_SAs a standby terminates (pure): every one in ``sas``
    (``queries.list_sas``: unique id -> IKE_SA) that is not already being destroyed. A standby serves
    nobody: it initiates nothing, and one that comes up anyway (an initiation charon had queued when the
    pod was fenced, a peer answered while init-nat's drop was not in place yet) is cut at once."""
    return sorted((uid for uid, sa in sas.items() if sa.get("state") not in GONE_IKE), key=str)
