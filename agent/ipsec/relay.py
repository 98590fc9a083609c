"""A read-only VICI socket for the exporter: a relay to charon that passes queries only.

charon has no read-only socket (``gwkit.vici.readonly``), so the agent, which holds the control socket
anyway, serves one (``--readonly-dir``, ``<dir>/charon.vici``). Each client connection gets its own
connection to charon. Client -> charon, every packet is judged by the pure ``readonly.decide``: a query
is passed on unchanged, anything else answered ``CMD_UNKNOWN`` / ``EVENT_UNKNOWN`` here (charon never
sees it) and logged once per name; charon -> client, packets pass unchanged (``readonly.Flow`` keeps
refusals behind the answers owed before them).

A client must not be able to hold up the agent or charon:

* at most ``Limits.max_clients`` connections at once (each holds one of charon's connections, and a
  query one of its worker threads while it runs); one more is accepted and closed at once;
* frames are at most 512 KiB either way, as charon's own limit (``wire.MAX_MESSAGE``);
* every write has a deadline (a client that stops reading is dropped, and charon's connection with it);
  a message once begun must be complete within ``frame_timeout``; while charon owes an answer it must
  send something within ``answer_timeout`` (a hung charon ends the connection, not the relay). Waiting
  for a client's next request, or for an event nobody owes, has no deadline: an idle event subscriber
  is the normal case, and the client cap bounds what idle connections can hold;
* the relay's tasks only ever wait on their own sockets: the agent's own VICI sessions go straight to
  charon and never queue behind a relayed one.

When charon is down the upstream connect fails and the client's connection is closed at once (the
exporter reports ``strongswan_up 0``); when the agent is down the socket refuses connections (the same).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from gwkit import sockio
from gwkit.vici import readonly, wire

log = logging.getLogger(__name__)

SOCKET_NAME = "charon.vici"
SOCKET_MODE = 0o666
"""Inside an emptyDir only the agent and the exporter mount (the pod spec): the exporter runs as
another user than a root agent, which has no CAP_CHOWN to hand it the socket."""
_READ = 65536
_IDLE_SLICE = 1.0
"""How often a reader with nothing owed looks whether a deadline has begun meanwhile."""
_LOGGED_NAMES = 64

Connect = Callable[[], Awaitable[anyio.abc.SocketStream]]


@dataclass(frozen=True)
class Limits:
    max_clients: int = 4
    """Connections at once; the exporter uses two (scrapes, rekey events)."""
    connect_timeout: float = 2.0
    """For the connection to charon."""
    frame_timeout: float = 10.0
    """A message, once its first byte came, must be complete within this (either side)."""
    send_timeout: float = 10.0
    """Every write, to either side."""
    answer_timeout: float = 30.0
    """While charon owes an answer, it must send something within this (a streamed listing counts)."""


class Hangup(Exception):
    """End this client's connection (and its connection to charon)."""

    def __init__(self, reason: str, *, quiet: bool = False) -> None:
        super().__init__(reason)
        self.quiet = quiet
        """An ordinary end (a side closed), not a fault worth a warning."""


class Refusals:
    """Logs each refused name once (per kind), so a client that retries cannot flood the log; at most
    ``_LOGGED_NAMES`` names, then one line saying so."""

    def __init__(self) -> None:
        self.logged: set[tuple[str, str]] = set()
        self.count = 0
        self._capped = False

    def note(self, refused: readonly.Refuse) -> None:
        self.count += 1
        key = (refused.kind, refused.name)
        if key in self.logged:
            return
        if len(self.logged) >= _LOGGED_NAMES:
            if not self._capped:
                self._capped = True
                log.warning("vici_relay.refused more=yes note='further names are not logged'")
            return
        self.logged.add(key)
        log.warning("vici_relay.refused kind=%s name=%r answer=unknown", refused.kind, refused.name)


class _Conn:
    """One client and its own connection to charon."""

    def __init__(
        self,
        client: anyio.abc.SocketStream,
        charon: anyio.abc.SocketStream,
        limits: Limits,
        refusals: Refusals,
    ) -> None:
        self.client = client
        self.charon = charon
        self.client_sock = sockio.raw(client)
        self.charon_sock = sockio.raw(charon)
        self.limits = limits
        self.refusals = refusals
        self.flow = readonly.Flow()
        self.progress = time.monotonic()
        """When charon last sent something, or a request was forwarded while nothing was owed: while
        an answer is owed, charon must send something within ``answer_timeout`` of it."""
        self.to_client = anyio.Lock()
        """Held from a flow step to the end of the send it decided, so sends to the client keep the
        flow's order (a refusal decided now must not overtake an answer decided a moment before)."""

    async def _send(self, sock: socket.socket, data: bytes, what: str) -> None:
        try:
            with anyio.fail_after(self.limits.send_timeout):
                await sockio.send_all(sock, data)
        except TimeoutError as exc:
            raise Hangup(f"{what} read nothing for {self.limits.send_timeout:.0f}s") from exc

    async def _receive(self, sock: socket.socket, wait: float, what: str) -> bytes | None:
        """The next bytes within ``wait`` seconds (None: nothing yet); Hangup at the end of the stream."""
        data = None
        with anyio.move_on_after(wait):
            data = await sockio.receive(sock, _READ)
            if not data:
                raise Hangup(f"{what} closed the connection", quiet=True)
        return data

    async def client_to_charon(self) -> None:
        frames = wire.PacketSplitter()
        begun = 0.0
        while True:
            # Idle between requests: no deadline (the cap bounds idle clients); inside one: frame_timeout.
            wait = begun + self.limits.frame_timeout - time.monotonic() if frames.partial else math.inf
            data = await self._receive(self.client_sock, max(0.0, wait), "the client")
            if data is None:
                raise Hangup(f"the client did not finish a message in {self.limits.frame_timeout:.0f}s")
            was_partial = frames.partial
            packets = self._feed(frames, data, "client")
            if frames.partial and (packets or not was_partial):
                begun = time.monotonic()  # a new message begins in this data
            for frame in packets:
                verdict = readonly.decide(frame[4:])
                if isinstance(verdict, readonly.Hangup):
                    raise Hangup(f"client: {verdict.reason}")
                if isinstance(verdict, readonly.Refuse):
                    self.refusals.note(verdict)
                async with self.to_client:
                    step = readonly.ask(self.flow, verdict)
                    if isinstance(step, readonly.Hangup):
                        raise Hangup(f"client: {step.reason}")
                    if not self.flow.owed:
                        self.progress = time.monotonic()  # charon's answer deadline starts now
                    self.flow, replies = step
                    if replies:
                        await self._send(self.client_sock, b"".join(replies), "the client")
                if isinstance(verdict, readonly.Forward):  # recorded as owed first: the answer may be quick
                    await self._send(self.charon_sock, frame, "charon")

    async def charon_to_client(self) -> None:
        frames = wire.PacketSplitter()
        begun = 0.0
        while True:
            if frames.partial:
                deadline = begun + self.limits.frame_timeout
            elif self.flow.owed:
                deadline = self.progress + self.limits.answer_timeout
            else:
                deadline = math.inf
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise Hangup("charon did not finish a message or owes an answer past the deadline")
            # Nothing owed: wake up now and then, a request may have started the answer deadline meanwhile.
            data = await self._receive(self.charon_sock, min(wait, _IDLE_SLICE), "charon")
            if data is None:
                continue
            self.progress = time.monotonic()
            was_partial = frames.partial
            packets = self._feed(frames, data, "charon")
            if frames.partial and (packets or not was_partial):
                begun = time.monotonic()
            if not packets:
                continue
            async with self.to_client:
                out: list[bytes] = []
                for frame in packets:
                    step = readonly.answer(self.flow, frame[4])
                    if isinstance(step, readonly.Hangup):
                        raise Hangup(step.reason)
                    self.flow, released = step
                    out.append(frame)
                    out.extend(released)
                await self._send(self.client_sock, b"".join(out), "the client")

    @staticmethod
    def _feed(frames: wire.PacketSplitter, data: bytes, side: str) -> list[bytes]:
        try:
            return frames.feed(data)
        except wire.DecodeError as exc:
            raise Hangup(f"{side}: {exc}") from exc

    async def run(self) -> Hangup:
        """Relay until either side ends; why it ended."""
        ended = Hangup("cancelled", quiet=True)
        try:
            async with anyio.create_task_group() as tg:

                async def side(fn: Callable[[], Awaitable[None]]) -> None:
                    nonlocal ended
                    try:
                        await fn()
                    except Hangup as exc:
                        ended = exc
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                        ended = Hangup(f"connection lost: {exc or type(exc).__name__}", quiet=True)
                    tg.cancel_scope.cancel()

                tg.start_soon(side, self.client_to_charon)
                tg.start_soon(side, self.charon_to_client)
        finally:
            with anyio.CancelScope(shield=True):
                await self.charon.aclose()
                await self.client.aclose()
        return ended


class Relay:
    """Serves the read-only socket: accepts clients (up to the cap) and relays each to charon."""

    def __init__(self, connect: Connect, limits: Limits | None = None) -> None:
        self.connect = connect
        self.limits = limits or Limits()
        self.refusals = Refusals()
        self.clients = 0
        self.hangups = 0
        self._charon_down: str | None = None
        self._full_logged = False

    async def handle(self, client: anyio.abc.SocketStream) -> None:
        try:
            with anyio.fail_after(self.limits.connect_timeout):
                charon = await self.connect()
        except OSError as exc:  # TimeoutError included
            why = str(exc) or type(exc).__name__
            if self._charon_down is None:
                log.warning("vici_relay.charon_unreachable error=%r action=close-client", why)
            self._charon_down = why
            with anyio.CancelScope(shield=True):
                await client.aclose()
            return
        if self._charon_down is not None:
            log.info("vici_relay.charon_reachable")
            self._charon_down = None
        ended = await _Conn(client, charon, self.limits, self.refusals).run()
        if ended.quiet:
            log.debug("vici_relay.closed reason=%r", str(ended))
            return
        self.hangups += 1
        if self.hangups == 1 or self.hangups % 100 == 0:  # a client that keeps trying cannot flood the log
            log.warning("vici_relay.hangup reason=%r count=%d", str(ended), self.hangups)

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accept until cancelled."""
        async with listener, anyio.create_task_group() as tg:
            while True:
                try:
                    client = await listener.accept()
                except OSError as exc:  # EMFILE and the like: the relay stays, the agent too
                    log.error("vici_relay.accept_failed error=%r", str(exc))
                    await anyio.sleep(1.0)
                    continue
                if self.clients >= self.limits.max_clients:
                    if not self._full_logged:
                        log.warning("vici_relay.full clients=%d action=close-new-connection", self.clients)
                        self._full_logged = True
                    with anyio.CancelScope(shield=True):
                        await client.aclose()
                    continue
                self._full_logged = False
                self.clients += 1
                tg.start_soon(self._one, client)

    async def _one(self, client: anyio.abc.SocketStream) -> None:
        try:
            await self.handle(client)
        except Exception as exc:  # one client must never take the relay (or the agent) down
            log.error("vici_relay.failed error=%r", f"{type(exc).__name__}: {exc}", exc_info=True)
        finally:
            self.clients -= 1


async def serve(
    path: Path,
    vici_socket: Path,
    limits: Limits | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``path`` (mode ``SOCKET_MODE``; a stale socket file is replaced) until cancelled, relaying
    to charon's ``vici_socket``."""

    async def connect() -> anyio.abc.SocketStream:
        return await anyio.connect_unix(str(vici_socket))

    started = False
    while True:  # nothing here may take the agent (the keeper beside it) down: log and serve again
        try:
            listener = await anyio.create_unix_listener(path, mode=SOCKET_MODE)
        except OSError as exc:  # the directory is missing or not ours
            log.error("vici_relay.listen_failed socket=%s error=%r", path, str(exc))
            await anyio.sleep(5.0)
            continue
        log.info("vici_relay.listening socket=%s charon=%s mode=%o", path, vici_socket, SOCKET_MODE)
        if not started:
            task_status.started()
            started = True
        try:
            await Relay(connect, limits).serve(listener)  # until cancelled; the socket file then stays
        except Exception as exc:  # a bug
            log.error(
                "vici_relay.failed error=%r action=restart", f"{type(exc).__name__}: {exc}", exc_info=True
            )
            await anyio.sleep(1.0)
