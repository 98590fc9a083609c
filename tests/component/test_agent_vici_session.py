"""ViciSession additions the agent relies on, against a scripted peer on a socketpair: an event that
arrives between two registration confirmations is delivered (seen live with ike-updown), ``on_registered``
fires once every registration is confirmed, and ``max_call_timeout`` caps even an explicit deadline."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import anyio
import anyio.abc
import pytest
from vici.protocol import Message

from agent.vici import ViciSession, ViciTimeout, wire

pytestmark = pytest.mark.anyio

Script = Callable[[socket.socket], None]


def _packet(kind: int, body: dict[str, object] | None = None, name: str | None = None) -> bytes:
    head = struct.pack("!B", kind)
    if name is not None:
        head += struct.pack("!B", len(name)) + name.encode()
    packet = head + (Message.serialize(body) if body else b"")
    return struct.pack("!I", len(packet)) + packet


def _read(sock: socket.socket) -> tuple[int, str]:
    (length,) = struct.unpack("!I", sock.recv(4, socket.MSG_WAITALL))
    data = sock.recv(length, socket.MSG_WAITALL)
    return data[0], data[2 : 2 + data[1]].decode()


@pytest.fixture
def peer() -> Iterator[Callable[[Script], socket.socket]]:
    threads: list[threading.Thread] = []
    socks: list[socket.socket] = []

    def start(script: Script) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.extend([ours, theirs])
        t = threading.Thread(target=script, args=(theirs,), daemon=True)
        t.start()
        threads.append(t)
        return ours

    yield start
    for s in socks:
        s.close()
    for t in threads:
        t.join(timeout=2)


async def test_an_event_between_registrations_is_delivered_not_an_error(
    peer: Callable[[Script], socket.socket],
) -> None:
    def script(s: socket.socket) -> None:
        assert _read(s) == (wire.EVENT_REGISTER, "ike-updown")
        s.sendall(_packet(wire.EVENT_CONFIRM))
        assert _read(s) == (wire.EVENT_REGISTER, "child-updown")
        s.sendall(_packet(wire.EVENT, {"s1": {"state": b"ESTABLISHED"}}, name="ike-updown"))  # early
        s.sendall(_packet(wire.EVENT_CONFIRM))
        s.sendall(_packet(wire.EVENT, {"s1": {"state": b"INSTALLED"}}, name="child-updown"))
        time.sleep(0.5)

    ours = peer(script)
    session = ViciSession(await anyio.abc.UNIXSocketStream.from_socket(ours), timeout=2)
    registered: list[bool] = []
    got = []
    frames = session.listen(["ike-updown", "child-updown"], on_registered=lambda: registered.append(True))
    with anyio.fail_after(3):
        async with contextlib.aclosing(frames):  # close the generator in this task (it holds a lock)
            async for frame in frames:
                got.append(frame.name)
                if len(got) == 2:
                    break
    assert registered == [True]
    assert got == ["ike-updown", "child-updown"]


async def test_max_call_timeout_caps_an_explicit_deadline(peer: Callable[[Script], socket.socket]) -> None:
    def script(s: socket.socket) -> None:
        _read(s)  # never answers
        time.sleep(2)

    session = ViciSession(await anyio.abc.UNIXSocketStream.from_socket(peer(script)), timeout=5)
    session.max_call_timeout = 0.2
    start = time.monotonic()
    with pytest.raises(ViciTimeout):
        await session.call("stats", timeout=30)
    assert time.monotonic() - start < 1.5
    assert session.closed
