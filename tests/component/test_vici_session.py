"""ViciSession against a scripted peer on a socketpair (the pattern of strongSwan's own vici tests).

These pin the error contract the agent and exporter rely on; the same behaviour against a live charon
(kill -9, SIGSTOP) is in tests/integration/test_lab.py.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest
from vici.protocol import Message

from gwkit.vici import ViciCommandFailed, ViciSession, ViciTimeout, ViciUnavailable, wire

pytestmark = pytest.mark.anyio


def _packet(kind: int, body: dict[str, object] | None = None, name: str | None = None) -> bytes:
    head = struct.pack("!B", kind)
    if name is not None:
        head += struct.pack("!B", len(name)) + name.encode()
    packet = head + (Message.serialize(body) if body else b"")
    return struct.pack("!I", len(packet)) + packet


def _read_packet(sock: socket.socket) -> tuple[int, str]:
    (length,) = struct.unpack("!I", sock.recv(4, socket.MSG_WAITALL))
    data = sock.recv(length, socket.MSG_WAITALL)
    return data[0], data[2 : 2 + data[1]].decode()


Script = Callable[[socket.socket], None]


@pytest.fixture
def peer() -> Iterator[Callable[[Script], socket.socket]]:
    """Runs ``script`` on the far end of a socketpair in a thread; returns our end. What a script raises
    (its assertions on what we sent) is raised again in the test, at its teardown: a thread's exception
    alone would only be a warning."""
    threads: list[threading.Thread] = []
    socks: list[socket.socket] = []
    errors: list[BaseException] = []

    def run(script: Script, sock: socket.socket) -> None:
        try:
            script(sock)
        except BaseException as exc:
            errors.append(exc)

    def start(script: Script) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.extend([ours, theirs])
        t = threading.Thread(target=run, args=(script, theirs), daemon=True)
        t.start()
        threads.append(t)
        return ours

    yield start
    for s in socks:
        s.close()
    for t in threads:
        t.join(timeout=2)
    if errors:
        raise errors[0]


async def _session(sock: socket.socket, timeout: float = 1.0) -> ViciSession:
    return ViciSession(await anyio.abc.UNIXSocketStream.from_socket(sock), timeout=timeout)


async def test_call_returns_the_response_body(peer: Callable[[Script], socket.socket]) -> None:
    def script(s: socket.socket) -> None:
        assert _read_packet(s) == (wire.CMD_REQUEST, "version")
        s.sendall(_packet(wire.CMD_RESPONSE, {"daemon": b"charon", "version": b"5.9.8"}))

    session = await _session(peer(script))
    assert await session.call("version") == {"daemon": "charon", "version": "5.9.8"}


async def test_success_no_raises_command_failed_with_charons_message(
    peer: Callable[[Script], socket.socket],
) -> None:
    def script(s: socket.socket) -> None:
        _read_packet(s)
        s.sendall(_packet(wire.CMD_RESPONSE, {"success": b"no", "errmsg": b"no such conn"}))

    session = await _session(peer(script))
    with pytest.raises(ViciCommandFailed, match="unload-conn: no such conn"):
        await session.call("unload-conn", {"name": "x"})
    assert not session.closed, "a command failure leaves the stream in sync"


async def test_unknown_command(peer: Callable[[Script], socket.socket]) -> None:
    def script(s: socket.socket) -> None:
        _read_packet(s)
        s.sendall(_packet(wire.CMD_UNKNOWN))

    session = await _session(peer(script))
    with pytest.raises(ViciCommandFailed, match="unknown command"):
        await session.call("no-such-command")


async def test_streamed_command_collects_events_and_carries_control_log_on_failure(
    peer: Callable[[Script], socket.socket],
) -> None:
    def script(s: socket.socket) -> None:
        assert _read_packet(s) == (wire.EVENT_REGISTER, "control-log")
        s.sendall(_packet(wire.EVENT_CONFIRM))
        assert _read_packet(s) == (wire.CMD_REQUEST, "initiate")
        s.sendall(
            _packet(wire.EVENT, {"msg": b"received AUTHENTICATION_FAILED notify error"}, name="control-log")
        )
        s.sendall(
            _packet(wire.CMD_RESPONSE, {"success": b"no", "errmsg": b"establishing CHILD_SA 'x' failed"})
        )
        assert _read_packet(s) == (wire.EVENT_UNREGISTER, "control-log")
        s.sendall(_packet(wire.EVENT_CONFIRM))

    session = await _session(peer(script))
    with pytest.raises(ViciCommandFailed) as info:
        await session.stream("initiate", {"child": "x"}, "control-log")
    assert info.value.log == ("received AUTHENTICATION_FAILED notify error",)


async def test_eof_mid_call_is_unavailable_and_the_session_is_discarded(
    peer: Callable[[Script], socket.socket],
) -> None:
    def script(s: socket.socket) -> None:
        _read_packet(s)
        s.close()

    session = await _session(peer(script))
    with pytest.raises(ViciUnavailable):
        await session.call("stats")
    assert session.closed
    with pytest.raises(ViciUnavailable, match="reconnect"):
        await session.call("stats")


async def test_no_answer_times_out_and_discards_the_desynchronised_session(
    peer: Callable[[Script], socket.socket],
) -> None:
    release = threading.Event()

    def script(s: socket.socket) -> None:
        _read_packet(s)
        release.wait(5)  # never answers in time, like a SIGSTOPped charon

    session = await _session(peer(script), timeout=0.2)
    try:
        with pytest.raises(ViciTimeout):
            await session.call("list-conns")
        assert session.closed
    finally:
        release.set()


async def test_connect_to_a_missing_socket_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ViciUnavailable, match="connect"):
        await ViciSession.connect(f"{tmp_path}/nothing.vici")


async def test_a_malformed_message_discards_the_session(peer: Callable[[Script], socket.socket]) -> None:
    def script(s: socket.socket) -> None:
        _read_packet(s)
        bad = struct.pack("!B", wire.CMD_RESPONSE) + b"\x09garbage"
        s.sendall(struct.pack("!I", len(bad)) + bad)

    session = await _session(peer(script))
    with pytest.raises(ViciUnavailable, match="malformed"):
        await session.call("stats")
    assert session.closed


# --- ViciSession additions the agent relies on, against a scripted peer on a socketpair: an event that
# arrives between two registration confirmations is delivered (seen live with ike-updown), ``on_registered``
# fires once every registration is confirmed, and ``max_call_timeout`` caps even an explicit deadline.


async def test_an_event_between_registrations_is_delivered_not_an_error(
    peer: Callable[[Script], socket.socket],
) -> None:
    def script(s: socket.socket) -> None:
        assert _read_packet(s) == (wire.EVENT_REGISTER, "ike-updown")
        s.sendall(_packet(wire.EVENT_CONFIRM))
        assert _read_packet(s) == (wire.EVENT_REGISTER, "child-updown")
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
        _read_packet(s)  # never answers
        time.sleep(2)

    session = ViciSession(await anyio.abc.UNIXSocketStream.from_socket(peer(script)), timeout=5)
    session.max_call_timeout = 0.2
    start = time.monotonic()
    with pytest.raises(ViciTimeout):
        await session.call("stats", timeout=30)
    assert time.monotonic() - start < 1.5
    assert session.closed


async def test_on_event_takes_each_event_as_it_arrives(peer: Callable[[Script], socket.socket]) -> None:
    """The peer holds the second event back until the first was handed over: a caller can work on a
    long listing while charon is still writing it."""
    handed = threading.Event()
    held_back: list[bool] = []

    def script(s: socket.socket) -> None:
        assert _read_packet(s) == (wire.EVENT_REGISTER, "list-sa")
        s.sendall(_packet(wire.EVENT_CONFIRM))
        assert _read_packet(s) == (wire.CMD_REQUEST, "list-sas")
        s.sendall(_packet(wire.EVENT, {"t1": {"uniqueid": b"1"}}, name="list-sa"))
        held_back.append(handed.wait(timeout=2))
        s.sendall(_packet(wire.EVENT, {"t2": {"uniqueid": b"2"}}, name="list-sa"))
        s.sendall(_packet(wire.CMD_RESPONSE))
        assert _read_packet(s) == (wire.EVENT_UNREGISTER, "list-sa")
        s.sendall(_packet(wire.EVENT_CONFIRM))

    got: list[wire.Section] = []

    def take(event: wire.Section) -> None:
        got.append(event)
        handed.set()

    session = await _session(peer(script), timeout=5.0)
    events, _ = await session.stream("list-sas", {}, "list-sa", on_event=take)
    assert events == [] and got == [{"t1": {"uniqueid": "1"}}, {"t2": {"uniqueid": "2"}}]
    assert held_back == [True], "the first event was handed over before the second was sent"
