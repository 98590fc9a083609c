"""One scrape: ask every source at once under one deadline; concurrent scrapes share one daemon query.

What is watched: every WireGuard interface of the command line and of the plan; charon whenever
``--vici-socket`` names it, or the plan is an IPsec plan, or nothing else is named (both then use the
gateway image's socket, ``DEFAULT_VICI_SOCKET``). A watched source is in every scrape: its ``*_up`` is 0
when it does not answer, never absent (``monitoring/alerts.yml`` alerts on the 0).

The plan file (``PlanFile``) is re-read when it changes. A missing or invalid plan is never fatal: the
last good one keeps naming tunnels and peers; while there has been none yet, the exporter watches only
what the command line names, ``/readyz`` answers 503 with the path and the reason, the log repeats them
every few seconds (``exporter.plan.waiting``) and ``vpngw_exporter_plan_valid`` is 0.

Coalescing: while a query is in flight, further scrapes wait for its result instead of starting another
(Prometheus HA pairs, a dashboard and a curl all hitting /metrics must not multiply the load on charon).
The flight runs shielded from the first caller's cancellation (a client hanging up must not cancel the
others' answer); it is bounded by the scrape deadline anyway.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from exporter.collector import Snapshot, StrongswanSnapshot, WireGuardSnapshot
from exporter.ipsec import PlanTunnel
from exporter.sources import StrongswanSource, WireGuardSource, follow_events
from exporter.wireguard import interface_view
from gwkit.logs import Reminder
from gwplan.model import Plan, PlanError, loads

log = logging.getLogger(__name__)

DEFAULT_VICI_SOCKET = Path("/var/run/charon/charon.vici")
"""Where the gateway image's charon puts its VICI socket (images/gateway/strongswan.conf), as the agent."""
REMIND_EVERY = 5.0
"""Seconds between the log lines that repeat why there is no valid plan yet."""
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class PlanNames:
    """What the exporter takes from the plan: tunnel/child names and subnets, WireGuard peer names."""

    tunnels: tuple[PlanTunnel, ...] = ()
    wireguard_interface: str | None = None
    peers: tuple[tuple[str, str], ...] = ()
    """(public key, VPNPeer name)."""
    gateway_type: str | None = None
    """The plan's ``type`` (``ipsec`` or ``wireguard``); None without a plan."""

    @classmethod
    def of(cls, plan: Plan | None) -> PlanNames:
        if plan is None:
            return cls()
        tunnels = tuple(
            PlanTunnel(t.name, {c.name: c.remote_subnet for c in t.children})
            for t in (plan.ipsec.tunnels if plan.ipsec else ())
        )
        wg = plan.wireguard
        peers = tuple((p.public_key, p.name) for p in wg.peers) if wg else ()
        return cls(tunnels, wg.interface if wg else None, peers, plan.type)


class PlanFile:
    """The plan file, re-read when it changes (a ``stat`` per call of ``current``). A missing or invalid
    file is reported (``error``, the log) and never raised: the last good plan's names stay."""

    def __init__(
        self, path: Path | None, *, clock: Callable[[], float] = time.monotonic, remind_every: float = 5.0
    ) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.names = PlanNames()
        self.loaded = False
        """A valid plan has been read (``names`` come from it)."""
        self.error: str | None = None
        """Why the file as it is now cannot be used (None once it is valid)."""
        self._logged: str | None = None
        self._remind = Reminder(remind_every, clock)

    def load_initial(self) -> None:
        """Read the plan now and raise PlanError / OSError if it is bad (for callers that want that)."""
        if self.path is not None:
            self._stamp = self._stat()
            self.names = PlanNames.of(loads(self.path.read_bytes()))
            self.loaded, self.error = True, None

    def _stat(self) -> tuple[int, int, int]:
        assert self.path is not None
        st = os.stat(self.path)  # follows the kubelet's ..data symlink swap
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    @property
    def valid(self) -> bool | None:
        """Whether the file is valid now (None: no ``--plan``)."""
        return None if self.path is None else self.error is None and self.loaded

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: ready once a valid plan was read (a later bad version keeps the last good one)."""
        if self.path is None:
            return True, "no --plan: tunnels and peers named by the daemons"
        if not self.loaded:
            return False, f"no valid plan at {self.path}: {self.error or 'not read yet'}"
        if self.error:
            return True, f"plan {self.path} loaded; a newer version is rejected: {self.error}"
        return True, f"plan {self.path} loaded"

    def current(self) -> PlanNames:
        if self.path is None:
            return self.names
        try:
            stamp = self._stat()
        except OSError as exc:
            self._stamp = None
            self._reject(f"cannot read {self.path}: {exc.strerror or exc}")
            return self.names
        if stamp == self._stamp:
            self._still_waiting()
            return self.names
        try:
            data = self.path.read_bytes()
        except OSError as exc:  # stamp not kept: a fixed mode does not change it, so read again next time
            self._reject(f"cannot read {self.path}: {exc.strerror or exc}")
            return self.names
        self._stamp = stamp  # this version is judged now, good or bad: not re-parsed per scrape
        try:
            names = PlanNames.of(loads(data))
        except PlanError as exc:
            self._reject(str(exc))
            return self.names
        waited = self._remind.waited()
        self._remind.clear()
        self.names, self.loaded, self.error, self._logged = names, True, None, None
        log.info(
            "exporter.plan.loaded path=%s type=%s tunnels=%d peers=%d waited=%.0fs",
            self.path,
            names.gateway_type,
            len(names.tunnels),
            len(names.peers),
            waited,
        )
        return names

    def _reject(self, reason: str) -> None:
        self.error = reason
        if reason != self._logged:  # once per distinct reason, not once per scrape
            self._logged = reason
            kept = "last-good" if self.loaded else "none"
            log.error("exporter.plan.rejected path=%s error=%r keeping=%s", self.path, reason, kept)
        self._still_waiting()

    def _still_waiting(self) -> None:
        if not self.loaded and self.error and self._remind.due(self.error):
            log.warning(
                "exporter.plan.waiting path=%s reason=%r for=%.0fs ready=no",
                self.path,
                self.error,
                self._remind.waited(),
            )


ROLE_FILE = "ha-role"
"""The role file's name beside the plan in the agent's read-only directory (``agent.sink.CopiedRole``)."""


def is_standby(data: bytes | None) -> tuple[bool, str | None]:
    """What the role file's bytes say (pure): (standby, why the content is not understood). Absent (None)
    or ``active``: not standby; ``standby``: standby. Anything else counts as active, with the reason: the
    gauge can only silence tunnel alerts, and silence needs a clear ``standby`` (a bad file on the active
    pod must not hide an outage; on a standby it makes alerts that point at it). The agent writes only the
    two words, by atomic rename."""
    if data is None:
        return False, None
    word = data.strip()
    if word == b"standby":
        return True, None
    if word == b"active":
        return False, None
    shown = word[:32].decode("ascii", "replace")
    return False, f"neither active nor standby: {shown!r}" + ("..." if len(word) > 32 else "")


class RoleFile:
    """The agent's copy of the pod's HA role (``<read-only dir>/ha-role``), read at every scrape (a few
    bytes from a memory emptyDir). A file that cannot be read or is not understood is logged once per
    reason and counts as active (``is_standby``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None

    def standby(self) -> bool:
        try:
            data: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            data = None
        except OSError as exc:
            self._complain(f"cannot read: {exc.strerror or exc}")
            return False
        standby, why = is_standby(data)
        self._complain(why)
        return standby

    def _complain(self, why: str | None) -> None:
        if why != self.error and why is not None:
            log.warning("exporter.ha_role.invalid path=%s error=%r counted=active", self.path, why)
        elif why is None and self.error is not None:
            log.info("exporter.ha_role.valid path=%s", self.path)
        self.error = why


async def watch_plan(plan: PlanFile, interval: float = 1.0, *, sleep: Sleep = anyio.sleep) -> None:
    """Check the plan file every ``interval`` even when nobody scrapes: readiness and the waiting
    reminders follow the file, and charon's event follower starts once an IPsec plan appears."""
    while True:
        plan.current()
        await sleep(interval)


class _Flight:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: Snapshot | None = None


class Exporter:
    def __init__(
        self,
        *,
        strongswan: StrongswanSource | None = None,
        wireguard: WireGuardSource | None = None,
        interfaces: tuple[str, ...] = (),
        plan: PlanFile | None = None,
        scrape_timeout: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
        charon: Literal["always", "ipsec-plan"] = "always",
        role: RoleFile | None = None,
    ) -> None:
        """``charon``: watch ``strongswan`` in every scrape, or only while the plan is an IPsec plan
        (a WireGuard gateway has no charon: its ``strongswan_up 0`` would be a false alert)."""
        self.strongswan = strongswan
        self.charon = charon
        self.wireguard = wireguard
        self.interfaces = interfaces
        self.plan = plan or PlanFile(None)
        self.role = role
        """The pod's HA role (``vpngw_ha_standby``); None: not reported."""
        self.scrape_timeout = scrape_timeout
        self._clock = clock
        self._flight: _Flight | None = None
        self.queries = 0
        """Daemon queries made (each serves every scrape that arrived while it ran)."""

    async def snapshot(self) -> Snapshot:
        flight = self._flight
        if flight is not None:
            await flight.done.wait()
            assert flight.result is not None
            return flight.result
        flight = self._flight = _Flight()
        try:
            with anyio.CancelScope(shield=True):
                flight.result = await self._query()
        except Exception:  # a bug: this scrape (and its waiters) says *_up 0 and the log has the traceback
            log.exception("exporter.scrape.error source=query")
        finally:
            self._flight = None
            if flight.result is None:  # the query itself crashed: waiters get an all-down snapshot
                flight.result = self._down()
            flight.done.set()
        return flight.result

    def watches_charon(self, names: PlanNames | None = None) -> bool:
        """Is charon part of a scrape under ``names`` (default: the last good plan's)?"""
        if self.strongswan is None:
            return False
        if self.charon == "always":
            return True
        return (self.plan.names if names is None else names).gateway_type == "ipsec"

    def _interfaces(self, names: PlanNames) -> set[str]:
        """The WireGuard interfaces to read: the command line's and the plan's."""
        interfaces = set(self.interfaces)
        if names.wireguard_interface:
            interfaces.add(names.wireguard_interface)
        return interfaces

    def _down(self) -> Snapshot:
        """Every watched daemon reported down (``*_up 0``, which alerts), for a query that crashed."""
        ss = StrongswanSnapshot(up=False, duration=0.0) if self.watches_charon() else None
        names = self.plan.names
        interfaces = self._interfaces(names)
        wg = None
        if self.wireguard is not None and interfaces:
            wg = _wireguard_down(0.0, interfaces, _peer_names(names))
        return Snapshot(strongswan=ss, wireguard=wg, plan_valid=self.plan.valid, ha_standby=self._standby())

    def _standby(self) -> bool | None:
        return None if self.role is None else self.role.standby()

    async def _query(self) -> Snapshot:
        self.queries += 1
        names = self.plan.current()
        ss: StrongswanSnapshot | None = None
        wg: WireGuardSnapshot | None = None
        interfaces = self._interfaces(names)
        charon = self.watches_charon(names)
        peer_names = _peer_names(names)

        # A bug or an unexpected reply in one source must not take the others (or the scrape) down:
        # that source reports up 0 for this scrape and the traceback goes to the log.
        async def run_ss() -> None:
            nonlocal ss
            assert self.strongswan is not None
            try:
                ss = await self.strongswan.scrape(self.scrape_timeout, names.tunnels)
            except Exception:
                log.exception("exporter.scrape.error source=strongswan")

        async def run_wg() -> None:
            nonlocal wg
            assert self.wireguard is not None
            try:
                wg = await self.wireguard.scrape(self.scrape_timeout, interfaces, peer_names)
            except Exception:
                log.exception("exporter.scrape.error source=wireguard")

        with anyio.move_on_after(self.scrape_timeout + 0.5):  # belt and braces: sources keep their own
            async with anyio.create_task_group() as tg:
                if charon:
                    tg.start_soon(run_ss)
                if self.wireguard is not None and interfaces:
                    tg.start_soon(run_wg)
        if charon and ss is None:
            ss = StrongswanSnapshot(up=False, duration=self.scrape_timeout)
        if self.wireguard is not None and interfaces and wg is None:
            wg = _wireguard_down(self.scrape_timeout, interfaces, peer_names)
        return Snapshot(strongswan=ss, wireguard=wg, plan_valid=self.plan.valid, ha_standby=self._standby())


def _peer_names(names: PlanNames) -> dict[str, dict[str, str]]:
    """Interface -> (public key -> VPNPeer name), for the plan's interface."""
    return {names.wireguard_interface: dict(names.peers)} if names.wireguard_interface else {}


def _wireguard_down(
    duration: float, interfaces: set[str], peer_names: dict[str, dict[str, str]]
) -> WireGuardSnapshot:
    """Every watched interface down (``wireguard_up 0``, its configured peers missing)."""
    views = tuple(interface_view(i, None, peer_names.get(i, {})) for i in sorted(interfaces))
    return WireGuardSnapshot(duration, views)


async def follow_charon_events(
    exporter: Exporter, socket: Path, interval: float = 1.0, *, sleep: Sleep = anyio.sleep
) -> None:
    """Run charon's event follower (``sources.follow_events``) while the exporter watches charon: from
    the start with ``charon="always"``, from the first IPsec plan otherwise; stopped if a new plan is of
    another type."""
    assert exporter.strongswan is not None
    while True:
        if not exporter.watches_charon():
            await sleep(interval)
            continue
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_events, socket, exporter.strongswan)
            while exporter.watches_charon():
                await sleep(interval)
            tg.cancel_scope.cancel()
