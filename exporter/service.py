"""One scrape: ask every source at once under one deadline; concurrent scrapes share one daemon query.

Coalescing: while a query is in flight, further scrapes wait for its result instead of starting another
(Prometheus HA pairs, a dashboard and a curl all hitting /metrics must not multiply the load on charon).
The flight runs shielded from the first caller's cancellation (a client hanging up must not cancel the
others' answer); it is bounded by the scrape deadline anyway.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from exporter.collector import Snapshot, StrongswanSnapshot, WireGuardSnapshot
from exporter.ipsec import PlanTunnel
from exporter.sources import StrongswanSource, WireGuardSource
from exporter.wireguard import InterfaceView
from gwplan.model import Plan, PlanError, loads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanNames:
    """What the exporter takes from the plan: tunnel/child names and subnets, WireGuard peer names."""

    tunnels: tuple[PlanTunnel, ...] = ()
    wireguard_interface: str | None = None
    peers: tuple[tuple[str, str], ...] = ()
    """(public key, VPNPeer name)."""

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
        return cls(tunnels, wg.interface if wg else None, peers)


class PlanFile:
    """The plan file, re-read when it changes (stat per scrape); a bad plan keeps the last good one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.names = PlanNames()

    def load_initial(self) -> None:
        """At startup a bad plan is bad input (raises PlanError / OSError)."""
        if self.path is not None:
            self._stamp = self._stat()
            self.names = PlanNames.of(loads(self.path.read_bytes()))

    def _stat(self) -> tuple[int, int, int]:
        assert self.path is not None
        st = os.stat(self.path)  # follows the kubelet's ..data symlink swap
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> PlanNames:
        if self.path is None:
            return self.names
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return self.names
            names = PlanNames.of(loads(self.path.read_bytes()))
        except (OSError, PlanError) as exc:
            log.error("exporter.plan.rejected path=%s error=%r keeping=last-good", self.path, str(exc))
            return self.names
        self._stamp, self.names = stamp, names
        log.info(
            "exporter.plan.loaded path=%s tunnels=%d peers=%d",
            self.path,
            len(names.tunnels),
            len(names.peers),
        )
        return names


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
    ) -> None:
        self.strongswan = strongswan
        self.wireguard = wireguard
        self.interfaces = interfaces
        self.plan = plan or PlanFile(None)
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

    def _interfaces(self, names: PlanNames) -> set[str]:
        """The WireGuard interfaces to read: the command line's and the plan's."""
        interfaces = set(self.interfaces)
        if names.wireguard_interface:
            interfaces.add(names.wireguard_interface)
        return interfaces

    def _down(self) -> Snapshot:
        """Every watched daemon reported down (``*_up 0``, which alerts), for a query that crashed."""
        ss = StrongswanSnapshot(up=False, duration=0.0) if self.strongswan is not None else None
        interfaces = self._interfaces(self.plan.names)
        wg = None
        if self.wireguard is not None and interfaces:
            wg = WireGuardSnapshot(0.0, tuple(InterfaceView(i, False) for i in sorted(interfaces)))
        return Snapshot(strongswan=ss, wireguard=wg)

    async def _query(self) -> Snapshot:
        self.queries += 1
        names = self.plan.current()
        ss: StrongswanSnapshot | None = None
        wg: WireGuardSnapshot | None = None
        interfaces = self._interfaces(names)
        peer_names = {names.wireguard_interface: dict(names.peers)} if names.wireguard_interface else {}

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
                if self.strongswan is not None:
                    tg.start_soon(run_ss)
                if self.wireguard is not None and interfaces:
                    tg.start_soon(run_wg)
        if self.strongswan is not None and ss is None:
            ss = StrongswanSnapshot(up=False, duration=self.scrape_timeout)
        if self.wireguard is not None and interfaces and wg is None:
            wg = WireGuardSnapshot(duration=self.scrape_timeout)
        return Snapshot(strongswan=ss, wireguard=wg)
