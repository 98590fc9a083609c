"""The read-only VICI relay (agent.ipsec.relay) against a fake charon on socketpairs.

Each relayed client gets its own connection to the fake (a socketpair whose far end a thread serves,
scripted like strongSwan's own vici tests); clients reach the relay through a real UNIX listener. The
same refusals against a live charon, whose state is checked, are in tests/integration/
test_exporter_readonly.py.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import pytest
from vici.protocol import Message

from agent.ipsec.relay import Limits, Relay
from agent.ipsec.relay import serve as relay_serve
from gwkit.vici import ViciCommandFailed, ViciSession, ViciUnavailable, readonly, wire
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio


def frame(kind: int, body: dict[str, object] | None = None, name: str | None = None) -> bytes:
    head = struct.pack("!B", kind)
    if name is not None:
        head += struct.pack("!B", len(name)) + name.encode()
    packet = head + (bytes(Message.serialize(body)) if body else b"")
    return struct.pack("!I", len(packet)) + packet


def read_frame(sock: socket.socket) -> bytes | None:
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    (length,) = struct.unpack("!I", head)
    return head + sock.recv(length, socket.MSG_WAITALL)


@dataclass
class FakeCharon:
    """Answers like charon: version/stats/get-counters/list-conns, list-sas with ``sas`` list-sa events
    of ``sa_bytes`` each, registrations confirmed; ``silent`` commands are never answered; ``delay``
    before every answer. Records every packet it received (all connections)."""

    sas: int = 2
    sa_bytes: int = 100
    delay: float = 0.0
    silent: frozenset[str] = frozenset()
    received: list[tuple[int, str]] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    down: bool = False

    def serve(self, sock: socket.socket) -> None:
        registered: set[str] = set()
        try:
            while (data := read_frame(sock)) is not None:
                kind, name = data[4], data[6 : 6 + data[5]].decode()
                self.received.append((kind, name))
                time.sleep(self.delay)
                if kind in (wire.EVENT_REGISTER, wire.EVENT_UNREGISTER):
                    (registered.add if kind == wire.EVENT_REGISTER else registered.discard)(name)
                    self._send(sock, frame(wire.EVENT_CONFIRM))
                    continue
                if name in self.silent:
                    continue
                if name == "list-sas":
                    for i in range(self.sas):
                        if "list-sa" in registered:
                            sa = {"uniqueid": str(i + 1), "pad": b"x" * self.sa_bytes, "child-sas": {}}
                            self._send(sock, frame(wire.EVENT, {f"s{i}": sa}, "list-sa"))
                    self._send(sock, frame(wire.CMD_RESPONSE))
                elif name == "stats":
                    self._send(sock, frame(wire.CMD_RESPONSE, {"ikesas": {"total": str(self.sas)}}))
                    if "ike-updown" in registered:
                        self._send(sock, frame(wire.EVENT, {"s0": {"state": b"ESTABLISHED"}}, "ike-updown"))
                else:
                    self._send(sock, frame(wire.CMD_RESPONSE, {"daemon": b"charon", "version": b"5.9.8"}))
        except OSError:
            pass
        finally:
            self.closed.append(time.monotonic())
            sock.close()

    def _send(self, sock: socket.socket, data: bytes) -> None:
        self.sent.append(data)
        sock.sendall(data)


@dataclass
class Harness:
    path: Path
    charon: FakeCharon
    relay: Relay

    async def session(self) -> ViciSession:
        return await ViciSession.connect(self.path, timeout=5.0)

    async def raw(self) -> anyio.abc.SocketStream:
        return await anyio.connect_unix(str(self.path))


@pytest.fixture
def charon() -> FakeCharon:
    return FakeCharon()


@pytest.fixture
def limits() -> Limits:
    return Limits()


@pytest.fixture
async def harness(tmp_path: Path, charon: FakeCharon, limits: Limits) -> AsyncIterator[Harness]:
    threads: list[threading.Thread] = []

    async def connect() -> anyio.abc.SocketStream:
        if charon.down:
            raise ConnectionRefusedError(111, "Connection refused")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        t = threading.Thread(target=charon.serve, args=(theirs,), daemon=True)
        t.start()
        threads.append(t)
        return await anyio.abc.UNIXSocketStream.from_socket(ours)

    path = tmp_path / "ro.vici"
    relay = Relay(connect, limits)
    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.serve, listener)
        yield Harness(path, charon, relay)
        tg.cancel_scope.cancel()
    for t in threads:
        t.join(5)


async def receive_frames(stream: anyio.abc.ByteStream, count: int, timeout: float = 5.0) -> list[bytes]:
    splitter, frames = wire.PacketSplitter(), list[bytes]()
    with anyio.fail_after(timeout):
        while len(frames) < count:
            frames += splitter.feed(await stream.receive())
    return frames


async def closed_within(stream: anyio.abc.ByteStream, seconds: float) -> float:
    """Seconds until the relay closed ``stream`` (reading away whatever still comes)."""
    t0 = time.monotonic()
    with anyio.fail_after(seconds):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    return time.monotonic() - t0


# --- what passes and what does not -------------------------------------------------------------------


async def test_queries_pass_and_nothing_else_reaches_charon(harness: Harness) -> None:
    async with await harness.session() as s:
        assert (await s.call("version"))["daemon"] == "charon"
        assert (await s.call("stats"))["ikesas"] == {"total": "2"}
        events, _ = await s.stream("list-sas", {"noblock": "yes"}, "list-sa")
        assert [next(iter(e)) for e in events] == ["s0", "s1"]
        await s.call("get-counters")
        await s.stream("list-conns", {"ike": "s1"}, "list-conn")
        for command in ("initiate", "terminate", "load-conn", "unload-conn", "load-shared", "clear-creds",
                        "reload-settings", "reset-counters", "get-shared"):  # fmt: skip
            with pytest.raises(ViciCommandFailed, match="unknown command"):
                await s.call(command, {"ike": "s1"})
        with pytest.raises(ViciCommandFailed, match="unknown event"):
            await s.stream("initiate", {"child": "s1-0"}, "control-log")
        with pytest.raises(ViciCommandFailed, match="unknown event"):
            async for _ in s.listen(["log"]):
                pass
    names = [name for _, name in harness.charon.received]
    assert names == [
        "version", "stats", "list-sa", "list-sas", "list-sa", "get-counters", "list-conn", "list-conns",
        "list-conn",
    ]  # fmt: skip
    assert harness.relay.refusals.count == 11


async def test_charons_packets_reach_the_client_byte_for_byte(harness: Harness) -> None:
    stream = await harness.raw()
    async with stream:
        await stream.send(wire.register("list-sa") + wire.request("list-sas"))
        got = await receive_frames(stream, 2 + harness.charon.sas)
    assert got == harness.charon.sent


async def test_events_a_client_registered_for_reach_it(harness: Harness) -> None:
    """The fake emits an ike-updown after a stats answer on a connection registered for it."""
    stream = await harness.raw()
    async with stream:
        await stream.send(wire.register("ike-updown") + wire.request("stats"))
        frames = await receive_frames(stream, 3)
    assert [f[4] for f in frames] == [wire.EVENT_CONFIRM, wire.CMD_RESPONSE, wire.EVENT]
    assert frames[2] == harness.charon.sent[-1]


@pytest.mark.parametrize("charon", [FakeCharon(delay=0.2)], ids=["charon-answers-late"])
async def test_a_refusal_never_overtakes_the_answers_owed_before_it(harness: Harness) -> None:
    """Pipelined: the relay answers initiate at once itself, charon answers list-sas 0.2 s later; the
    client must still see list-sas' events and response first."""
    stream = await harness.raw()
    async with stream:
        await stream.send(
            wire.register("list-sa") + wire.request("list-sas") + wire.request("initiate")
            + wire.register("log") + wire.request("version")
        )  # fmt: skip
        got = await receive_frames(stream, 1 + harness.charon.sas + 1 + 1 + 1 + 1)
    kinds = [f[4] for f in got]
    assert kinds == [
        wire.EVENT_CONFIRM, wire.EVENT, wire.EVENT, wire.CMD_RESPONSE, wire.CMD_UNKNOWN, wire.EVENT_UNKNOWN,
        wire.CMD_RESPONSE,
    ]  # fmt: skip


# --- limits --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [wire.MAX_MESSAGE + 1, 2**32 - 1], ids=["512KiB+1", "4GiB"])
async def test_a_frame_over_charons_limit_ends_the_connection(harness: Harness, length: int) -> None:
    stream = await harness.raw()
    async with stream:
        await stream.send(struct.pack("!I", length) + bytes([wire.CMD_REQUEST, 5]) + b"stats")
        assert await closed_within(stream, 2) < 2
    assert harness.charon.received == []


@pytest.mark.parametrize("limits", [Limits(frame_timeout=0.3)], ids=["frame-timeout-0.3s"])
async def test_half_a_message_then_silence_is_cut_off(harness: Harness) -> None:
    stream = await harness.raw()
    async with stream:
        await stream.send(wire.request("version")[:7])
        assert 0.2 < await closed_within(stream, 3) < 2


@pytest.mark.parametrize("limits", [Limits(frame_timeout=0.3)], ids=["frame-timeout-0.3s"])
async def test_an_idle_client_between_requests_is_not_cut_off(harness: Harness) -> None:
    async with await harness.session() as s:
        await s.call("version")
        await anyio.sleep(1.0)
        await s.call("version")


@pytest.mark.parametrize(
    "charon, limits",
    [(FakeCharon(sas=200, sa_bytes=20_000), Limits(send_timeout=0.3))],
    ids=["4MB-listing-send-timeout-0.3s"],
)
async def test_a_client_that_stops_reading_is_dropped_and_the_others_are_served(harness: Harness) -> None:
    stuck = await harness.raw()
    async with stuck:
        await stuck.send(wire.register("list-sa") + wire.request("list-sas"))  # 4 MB it will never read
        async with await harness.session() as other:
            t0 = time.monotonic()
            for _ in range(5):
                await other.call("version")
            assert time.monotonic() - t0 < 0.5, "the stuck client held nothing of anyone else's"
        with anyio.fail_after(5):
            await wait_for_async(
                lambda: len(harness.charon.closed) >= 2,
                10,
                "the other session closed, then the stuck one",
                0.05,
            )
        assert harness.relay.hangups == 1


@pytest.mark.parametrize(
    "charon, limits",
    [(FakeCharon(silent=frozenset({"stats"})), Limits(answer_timeout=0.3))],
    ids=["stats-never-answered"],
)
async def test_a_hung_charon_ends_the_connection_not_the_relay(harness: Harness) -> None:
    async with await harness.session() as s:
        t0 = time.monotonic()
        with pytest.raises(ViciUnavailable):
            await s.call("stats", timeout=5)
        assert time.monotonic() - t0 < 2.0, "answer_timeout plus at most one idle slice (1 s)"
    async with await harness.session() as s:
        assert (await s.call("version"))["version"] == "5.9.8"


@pytest.mark.parametrize("limits", [Limits(max_clients=2)], ids=["max-2"])
async def test_one_client_over_the_cap_is_closed_at_once(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "agent.ipsec.relay")
    a, b = await harness.session(), await harness.session()
    await a.call("version")
    await b.call("version")
    third = await harness.raw()
    async with third:
        assert await closed_within(third, 2) < 0.5
    assert "vici_relay.full clients=2" in caplog.text
    await a.aclose()
    with anyio.fail_after(5):
        await wait_for_async(lambda: harness.relay.clients <= 1, 10, "the relay to see the client go", 0.01)
    async with await harness.session() as c:
        await c.call("version")
    await b.aclose()


async def test_charon_down_closes_the_client_at_once(harness: Harness) -> None:
    harness.charon.down = True
    t0 = time.monotonic()
    with pytest.raises(ViciUnavailable):
        async with await harness.session() as s:
            await s.call("version")
    assert time.monotonic() - t0 < 0.5
    harness.charon.down = False
    async with await harness.session() as s:
        await s.call("version")


async def test_a_refused_name_is_logged_once(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agent.ipsec.relay")
    async with await harness.session() as s:
        for _ in range(5):
            with pytest.raises(ViciCommandFailed):
                await s.call("initiate")
    lines = [r.getMessage() for r in caplog.records if "vici_relay.refused" in r.getMessage()]
    assert lines == ["vici_relay.refused kind=command name='initiate' answer=unknown"]


def test_the_reply_to_a_refusal_is_what_charon_itself_sends() -> None:
    """Measured against charon 5.9.8 (tests/integration/test_exporter_readonly.py): an unknown command is
    answered with a bare CMD_UNKNOWN packet, an unknown event with a bare EVENT_UNKNOWN."""
    assert frame(wire.CMD_UNKNOWN) == readonly.CMD_UNKNOWN_REPLY
    assert frame(wire.EVENT_UNKNOWN) == readonly.EVENT_UNKNOWN_REPLY


async def test_a_bug_in_the_relay_restarts_it_and_never_reaches_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """relay.serve runs beside the keeper in one task group: an exception out of it would stop the
    keeper too. It is logged and the relay serves again."""
    calls: list[int] = []
    serve_once = Relay.serve

    async def buggy(self: Relay, listener: anyio.abc.SocketListener) -> None:
        calls.append(1)
        if len(calls) == 1:
            await listener.aclose()
            raise RuntimeError("a bug")
        await serve_once(self, listener)

    monkeypatch.setattr(Relay, "serve", buggy)
    path = tmp_path / "ro.vici"
    async with anyio.create_task_group() as tg:
        await tg.start(relay_serve, path, tmp_path / "no-charon.vici")
        with anyio.fail_after(5):
            await wait_for_async(lambda: len(calls) >= 2, 10, "the restart", 0.05)
        stream = await anyio.connect_unix(str(path))
        async with stream:
            assert await closed_within(stream, 2) < 1, "served again (charon absent: closed at once)"
        tg.cancel_scope.cancel()
    assert "vici_relay.failed error='RuntimeError: a bug' action=restart" in caplog.text
