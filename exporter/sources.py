"""The I/O shells: query charon and WireGuard for one scrape, within a deadline, and never hang.

* ``StrongswanSource`` keeps one VICI session across scrapes. A dead or missing socket is a refused
  connect (fast) and the scrape reports ``strongswan_up 0``; after a failure the next connect waits for
  ``backoff`` (scrapes meanwhile answer ``up 0`` at once). A call that times out discards the session (the
  stream is desynchronised: ``gwkit.vici.session``).
* ``EventFollower`` listens on a second, dedicated session for ``child-rekey`` and down events, whose
  final CHILD_SA counts keep the byte counters exact across rekeys (``exporter.ipsec``); it reconnects with
  backoff, and learns the daemon's epoch (start time) on every connect.
* ``WireGuardSource`` reads each interface through the backend ``gwkit.wireguard.backend.detect`` picks
  (UAPI socket of wireguard-go/boringtun, else kernel netlink), re-detecting after a failure.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import anyio
import anyio.abc

from exporter import ipsec
from exporter.collector import StrongswanSnapshot, WireGuardSnapshot
from exporter.uapifast import KeyCache, ReplyError, fast_view
from exporter.wireguard import InterfaceView, interface_view
from gwkit.backoff import backoff as _backoff
from gwkit.vici import ViciError, ViciSession, wire
from gwkit.vici.queries import (
    DaemonInfo,
    StartSighting,
    counters,
    daemon_info,
    daemon_info_from,
    missing_sas,
    restarted_between,
    sighting,
)
from gwkit.wireguard import uapi
from gwkit.wireguard.backend import UapiBackend, WireGuardBackend, WireGuardError, detect

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
Connect = Callable[..., Awaitable[ViciSession]]
Detect = Callable[[str, Path | None], Awaitable[WireGuardBackend]]

EVENTS = ("child-rekey", "child-updown", "ike-updown")


class ReplyBuffer:
    """A receive buffer kept across scrapes (one per interface). At 10,000 peers the reply is ~3.4 MB:
    reading it in fresh 1 MiB chunks and appending cost ~5 ms of allocation and page faults a scrape
    here; ``recv_into`` a buffer that stays mapped costs nothing extra."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.data = bytearray(size)

    def grow(self) -> None:
        self.data.extend(bytes(len(self.data)))


async def read_get(path: Path, timeout: float, buffer: ReplyBuffer | None = None) -> str:
    """One ``get=1`` exchange: the raw reply text. Raises UapiUnavailable (never a key in the message).
    (``gwkit.wireguard.uapi.get`` parses into ``DeviceState``; the exporter wants the text for its fast
    parser, ``exporter.uapifast``.)"""
    buf = buffer or ReplyBuffer()
    try:
        with anyio.fail_after(timeout):
            async with await anyio.connect_unix(str(path)) as stream:
                await stream.send(b"get=1\n\n")
                sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 (anyio, not Django)
                n = 0
                while n < 2 or buf.data[n - 2 : n] != b"\n\n":  # the reply ends with a blank line
                    if n == len(buf.data):
                        buf.grow()
                    with memoryview(buf.data) as view:
                        try:
                            got = sock.recv_into(view[n:])
                        except BlockingIOError:
                            got = -1
                    if got < 0:
                        await anyio.wait_readable(sock)
                    elif got == 0:
                        break
                    else:
                        n += got
    except TimeoutError as exc:
        raise uapi.UapiUnavailable(f"{path}: no answer in {timeout:.1f}s") from exc
    except OSError as exc:
        raise uapi.UapiUnavailable(f"{path}: {exc.strerror or exc}") from exc
    return buf.data[:n].decode(errors="replace")


def backoff(failures: int, base: float = 0.25, cap: float = 5.0) -> float:
    """Seconds to wait before reconnect attempt ``failures`` (1, 2, ...): 0.25, 0.5, 1, 2, 4, 5, 5 ...
    (0 after a session that ended without a failure)."""
    return _backoff(failures, base=base, cap=cap)


def epoch_of(started: float | None) -> str:
    """charon's unique ids restart at 1 with the daemon, so SA keys carry its (settled) start time."""
    return f"{started:.0f}" if started is not None else "unknown"


class StrongswanSource:
    def __init__(
        self,
        socket: Path,
        *,
        connect: Connect = ViciSession.connect,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.socket = socket
        self._connect = connect
        self._clock = clock
        self._wall = wall
        self._session: ViciSession | None = None
        self.failures = 0
        self._retry_at = 0.0
        self.carry = ipsec.Carry()
        self.epoch = ""
        self.started: float | None = None
        self._sighting: StartSighting | None = None
        self._version: wire.Section = {}

    def observe_event(self, name: str, body: Mapping[str, object], epoch: str) -> None:
        self.carry = ipsec.observe_event(self.carry, name, body, epoch=epoch, now=self._wall())

    def epoch_for(self, info: DaemonInfo) -> str:
        """The epoch for a newly connected session's ``info``, shared by scrapes and the event follower.

        charon's unique ids restart with the daemon, so SA keys carry its start time; a new epoch re-keys
        every live CHILD_SA. So it changes only on a real restart: not for charon's one-second wobble of
        ``since``, nor for a wall-clock step (``since`` is wall time minus uptime, so an NTP step moves it;
        ``restarted_between`` takes the step out with our own wall and monotonic clocks). Called only when
        a session is new: while one stays connected charon cannot have restarted."""
        seen = sighting(info.started, wall=self._wall(), mono=self._clock())
        if self.started is None or restarted_between(self._sighting, seen):
            self.started = info.started
        if seen is not None:
            self._sighting = seen
        return epoch_of(self.started)

    async def _fail(self, why: str) -> None:
        self.failures += 1
        self._retry_at = self._clock() + backoff(self.failures)
        if self._session is not None:
            session, self._session = self._session, None
            with anyio.CancelScope(shield=True):
                await session.aclose()
        if self.failures == 1 or self.failures % 60 == 0:  # a state change, then a reminder every ~5 min
            log.warning(
                "exporter.strongswan.down socket=%s failures=%d error=%r",
                self.socket,
                self.failures,
                str(why),
            )

    async def scrape(self, timeout: float, plan: Iterable[ipsec.PlanTunnel]) -> StrongswanSnapshot:
        start = self._clock()
        plan = list(plan)

        def down() -> StrongswanSnapshot:
            view = ipsec.view(self.carry, None, plan, epoch=self.epoch)
            return StrongswanSnapshot(up=False, duration=self._clock() - start, view=view)

        def left() -> float:
            return max(0.001, start + timeout - self._clock())

        fresh = self._session is None or self._session.closed
        if fresh:
            if self._clock() < self._retry_at:
                return down()
            try:
                self._session = await self._connect(self.socket, timeout=left())
            except ViciError as exc:
                await self._fail(str(exc))
                return down()
            if self.failures:
                log.info(
                    "exporter.strongswan.reconnected socket=%s after_failures=%d", self.socket, self.failures
                )
        session = self._session
        assert session is not None
        try:
            if fresh:  # the daemon's version changes only with a restart, which closes the session
                self._version = await session.call("version", timeout=left())
            info = daemon_info_from(self._version, await session.call("stats", timeout=left()))
            if fresh:
                self.epoch = self.epoch_for(info)
            ctrs = await counters(session, timeout=left()) if "counters" in info.plugins else None
            listing = await self._list(session, info, plan, left())
        except ViciError as exc:
            await self._fail(str(exc))
            return down()
        except BaseException:
            # Cancelled mid-call (outer deadline): the stream may hold half an answer; never reuse it.
            dropped, self._session = self._session, None
            if dropped is not None:
                with anyio.CancelScope(shield=True):
                    await dropped.aclose()
            raise
        self.failures = 0
        info = dataclasses.replace(info, started=self.started)
        self.carry, listed = listing.finish(self.carry)
        view = ipsec.view(self.carry, listed, plan, epoch=self.epoch)
        return StrongswanSnapshot(
            up=True, duration=self._clock() - start, view=view, info=info, counters=ctrs
        )

    async def _list(
        self, session: ViciSession, info: DaemonInfo, plan: list[ipsec.PlanTunnel], timeout: float
    ) -> ipsec.Listing:
        """Every IKE_SA, folded into a ``Listing`` as charon streams them (the work per SA overlaps
        charon's). Those that do not arrive (charon silently drops an IKE_SA whose event exceeds
        512 KiB) are fetched piece by piece by ``missing_sas`` and folded in after."""
        start = self._clock()
        listing = ipsec.Listing(epoch=self.epoch, now=self._wall(), plan=plan, subnets=self.carry.subnets)
        got: set[str] = set()

        def take(event: wire.Section) -> None:
            for name, sa in event.items():
                if isinstance(sa, dict):
                    got.add(str(sa.get("uniqueid", "")))
                    listing.add(name, sa)

        await session.stream("list-sas", {}, "list-sa", timeout=timeout, on_event=take)
        left = max(0.001, start + timeout - self._clock())
        for sa in (await missing_sas(session, got, info.ikesas_total, timeout=left)).values():
            listing.add(str(sa.get("name", "")), sa)
        return listing

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.aclose()
            self._session = None


class EventSink(Protocol):
    def observe_event(self, name: str, body: Mapping[str, object], epoch: str) -> None: ...

    def epoch_for(self, info: DaemonInfo) -> str: ...


async def follow_events(
    socket: Path,
    sink: EventSink,
    *,
    connect: Connect = ViciSession.connect,
    sleep: Sleep = anyio.sleep,
) -> None:
    """Forever: connect, learn the epoch, feed rekey/down events to ``sink``; reconnect with backoff."""
    failures = 0
    while True:
        try:
            async with await connect(socket, timeout=5.0) as session:
                epoch = sink.epoch_for(await daemon_info(session))
                log.info("exporter.events.listening socket=%s epoch=%s", socket, epoch)
                failures = 0
                async for frame in session.listen(EVENTS):
                    if frame.name:
                        sink.observe_event(frame.name, frame.body, epoch)
        except ViciError as exc:
            failures += 1
            if failures == 1 or failures % 20 == 0:
                log.warning("exporter.events.lost socket=%s failures=%d error=%r", socket, failures, str(exc))
        await sleep(backoff(failures))


async def _detect(interface: str, uapi_dir: Path | None) -> WireGuardBackend:
    return await detect(interface, uapi_dir)


class WireGuardSource:
    def __init__(
        self,
        uapi_dir: Path | None = None,
        *,
        detect_backend: Detect = _detect,
        clock: Clock = time.monotonic,
    ) -> None:
        self.uapi_dir = uapi_dir
        self._detect = detect_backend
        self._clock = clock
        self._backends: dict[str, WireGuardBackend] = {}
        self._down: set[str] = set()
        self._keys = KeyCache()
        self._buffers: dict[str, ReplyBuffer] = {}

    async def _read(
        self, backend: WireGuardBackend, interface: str, names: Mapping[str, str], timeout: float
    ) -> InterfaceView:
        if isinstance(backend, UapiBackend):
            # Fast path (exporter.uapifast); the generic parser when the reply has another shape.
            try:
                buffer = self._buffers.setdefault(interface, ReplyBuffer())
                text = await read_get(backend.socket(interface), timeout, buffer)
                view = fast_view(interface, text, names, self._keys, backend=backend.name)
                if view is None:
                    view = interface_view(interface, uapi.parse_get(text), names, backend=backend.name)
                return view
            except (uapi.UapiError, ReplyError) as exc:
                raise WireGuardError(f"{interface} (uapi): {exc}") from exc
        return interface_view(interface, await backend.get(interface), names, backend=backend.name)

    async def _one(self, interface: str, names: Mapping[str, str], timeout: float) -> InterfaceView:
        backend = self._backends.get(interface)
        view: InterfaceView | None = None
        why = ""
        with anyio.move_on_after(timeout) as scope:
            try:
                if backend is None:
                    backend = self._backends[interface] = await self._detect(interface, self.uapi_dir)
                view = await self._read(backend, interface, names, timeout)
            except WireGuardError as exc:
                why = str(exc)
        if scope.cancelled_caught:
            why = f"no answer in {timeout:.1f}s"
        if view is None:
            self._backends.pop(interface, None)  # re-detect next time (daemon restarted, module loaded)
            if interface not in self._down:
                log.warning("exporter.wireguard.down interface=%s error=%r", interface, str(why))
                self._down.add(interface)
            return interface_view(interface, None, names, backend=backend.name if backend else "")
        if interface in self._down:
            self._down.discard(interface)
            log.info("exporter.wireguard.up interface=%s backend=%s", interface, view.backend)
        return view

    async def scrape(
        self, timeout: float, interfaces: Iterable[str], names: Mapping[str, Mapping[str, str]]
    ) -> WireGuardSnapshot:
        start = self._clock()
        wanted = sorted(set(interfaces))
        views: dict[str, InterfaceView] = {}

        async def run(interface: str) -> None:
            views[interface] = await self._one(interface, names.get(interface, {}), timeout)

        async with anyio.create_task_group() as tg:
            for interface in wanted:
                tg.start_soon(run, interface)
        return WireGuardSnapshot(duration=self._clock() - start, interfaces=tuple(views[i] for i in wanted))

    async def aclose(self) -> None:
        for backend in self._backends.values():
            await backend.aclose()
        self._backends.clear()
