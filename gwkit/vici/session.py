"""An async VICI session on anyio: one UNIX stream, one request at a time, a deadline on every call.

Only this module touches the socket. Errors are translated here, once (see ``errors.py``). A call that
times out leaves the stream desynchronised (charon may still answer later), so the session closes itself
and every later call raises ``ViciUnavailable``: the owner reconnects.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from gwkit.vici import wire
from gwkit.vici.errors import ViciCommandFailed, ViciTimeout, ViciUnavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
_READ = 65536


class ViciSession:
    def __init__(self, stream: anyio.abc.ByteStream, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._stream = stream
        self._buffer = wire.FrameBuffer()
        self._pending: list[wire.Frame] = []
        self._early: list[wire.Frame] = []  # events that arrived while registering (listen yields them)
        self._lock = anyio.Lock()
        self._broken: str | None = None
        self.timeout = timeout
        self.max_call_timeout: float | None = None
        """If set, caps every call's deadline, even an explicit one (a long query made of many calls
        still notices a hung charon after this long)."""

    @classmethod
    async def connect(cls, path: str | Path, *, timeout: float = DEFAULT_TIMEOUT) -> ViciSession:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_unix(str(path))
        except TimeoutError as exc:
            raise ViciTimeout(f"connect {path}: no answer in {timeout:.1f}s") from exc
        except OSError as exc:
            raise ViciUnavailable(f"connect {path}: {exc.strerror or exc}") from exc
        return cls(stream, timeout=timeout)

    @property
    def closed(self) -> bool:
        return self._broken is not None

    async def aclose(self) -> None:
        if self._broken is None:
            self._broken = "closed"
        await self._stream.aclose()

    async def __aenter__(self) -> ViciSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- low level ----------------------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        try:
            await self._stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            await self._break(f"send: {exc or type(exc).__name__}")
            raise ViciUnavailable(f"charon closed the VICI socket: {exc or type(exc).__name__}") from exc

    async def _frame(self) -> wire.Frame:
        while not self._pending:
            try:
                data = await self._stream.receive(_READ)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                await self._break("receive: connection closed")
                raise ViciUnavailable("charon closed the VICI socket") from exc
            try:
                self._pending.extend(self._buffer.feed(data))
            except wire.DecodeError as exc:  # the stream cannot be trusted any more: discard the session
                await self._break(f"malformed message: {exc}")
                raise ViciUnavailable(f"malformed VICI message from charon: {exc}") from exc
        return self._pending.pop(0)

    async def _break(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()

    def _check_open(self) -> None:
        if self._broken is not None:
            raise ViciUnavailable(f"session unusable ({self._broken}); reconnect")

    async def _guarded(self, what: str, timeout: float | None, coro: Any) -> Any:
        self._check_open()
        limit = self.timeout if timeout is None else timeout
        if self.max_call_timeout is not None:
            limit = min(limit, self.max_call_timeout)
        async with self._lock:
            self._check_open()
            try:
                with anyio.fail_after(limit):
                    return await coro()
            except TimeoutError as exc:
                await self._break(f"{what} timed out")
                raise ViciTimeout(f"{what}: no answer from charon in {limit:.1f}s") from exc

    # --- requests -----------------------------------------------------------------------------------

    async def call(
        self,
        command: str,
        message: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        check: bool = True,
    ) -> wire.Section:
        """One request, one response. ``check``: raise ViciCommandFailed on ``success: no``."""

        async def go() -> wire.Section:
            await self._send(wire.request(command, message))
            while True:
                frame = await self._frame()
                if frame.type == wire.CMD_RESPONSE:
                    return frame.body
                if frame.type == wire.CMD_UNKNOWN:
                    raise ViciCommandFailed(command, "unknown command")

        body: wire.Section = await self._guarded(command, timeout, go)
        if check and body.get("success") == "no":
            raise ViciCommandFailed(command, str(body.get("errmsg", "failed")))
        return body

    async def stream(
        self,
        command: str,
        message: Mapping[str, Any] | None,
        event: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        on_event: Callable[[wire.Section], None] | None = None,
    ) -> tuple[list[wire.Section], wire.Section]:
        """A streamed command (list-sas, list-conns, initiate, terminate): the events it emits, then the
        response. With ``check``, a failure carries the streamed ``control-log`` lines. ``on_event``
        takes each event as it arrives instead (the list is then empty): a caller can work on a long
        listing while charon is still writing it."""

        async def go() -> tuple[list[wire.Section], wire.Section]:
            events: list[wire.Section] = []
            take = events.append if on_event is None else on_event
            await self._send(wire.register(event))
            await self._confirm(event)
            await self._send(wire.request(command, message))
            while True:
                frame = await self._frame()
                if frame.type == wire.EVENT and frame.name == event:
                    take(frame.body)
                elif frame.type == wire.CMD_RESPONSE:
                    break
                elif frame.type == wire.CMD_UNKNOWN:
                    raise ViciCommandFailed(command, "unknown command")
            await self._send(wire.unregister(event))
            await self._confirm(event)
            for early in self._early:  # late ones, that arrived before the confirm
                if early.name == event:
                    take(early.body)
            self._early.clear()
            return events, frame.body

        events, body = await self._guarded(command, timeout, go)
        if check and body.get("success") == "no":
            lines = tuple(str(e.get("msg", "")) for e in events if event == "control-log")
            raise ViciCommandFailed(command, str(body.get("errmsg", "failed")), lines)
        return events, body

    async def _confirm(self, event: str) -> None:
        frame = await self._frame()
        while frame.type == wire.EVENT:
            # An event registered a moment ago can arrive before the next registration's confirmation
            # (seen live: ike-updown between the ike-updown and child-updown confirmations). Keep it.
            self._early.append(frame)
            frame = await self._frame()
        if frame.type == wire.EVENT_UNKNOWN:
            raise ViciCommandFailed(f"register {event}", "unknown event")
        if frame.type != wire.EVENT_CONFIRM:
            raise ViciUnavailable(f"register {event}: unexpected packet type {frame.type}")

    async def listen(
        self, events: Sequence[str], *, on_registered: Callable[[], None] | None = None
    ) -> AsyncGenerator[wire.Frame, None]:
        """Register for ``events`` and yield them until the socket closes (use a dedicated session).
        ``on_registered`` is called once charon confirmed every registration (nothing is missed after)."""

        async def register() -> None:
            for name in events:
                await self._send(wire.register(name))
                await self._confirm(name)

        await self._guarded("register", None, register)
        if on_registered is not None:
            on_registered()
        while self._early:
            yield self._early.pop(0)
        async with self._lock:
            while True:
                frame = await self._frame()
                if frame.type == wire.EVENT:
                    yield frame
