"""The VICI framing and message codec, sans I/O."""

from __future__ import annotations

import struct

import pytest
from vici.protocol import Message

from gwkit.vici import wire


def response(body: dict[str, object]) -> bytes:
    packet = struct.pack("!B", wire.CMD_RESPONSE) + bytes(Message.serialize(body))
    return struct.pack("!I", len(packet)) + packet


def event(name: str, body: dict[str, object]) -> bytes:
    raw = name.encode()
    packet = struct.pack("!BB", wire.EVENT, len(raw)) + raw + bytes(Message.serialize(body))
    return struct.pack("!I", len(packet)) + packet


def test_request_frames_name_and_body() -> None:
    data = wire.request("load-shared", {"id": "x", "owners": ["a", "b"]})
    (length,) = struct.unpack("!I", data[:4])
    assert length == len(data) - 4
    assert data[4] == wire.CMD_REQUEST and data[5] == len("load-shared") and data[6:17] == b"load-shared"


@pytest.mark.parametrize("split", [1, 3, 4, 5, 17, 1000], ids=lambda n: f"chunks-of-{n}")
def test_frame_buffer_reassembles_any_split(split: int) -> None:
    stream = event(
        "list-sa", {"gw": {"state": b"ESTABLISHED", "child-sas": {"c-1": {"local-ts": [b"10.0.0.0/24"]}}}}
    )
    stream += response({"success": b"yes"})
    buf = wire.FrameBuffer()
    frames = []
    for i in range(0, len(stream), split):
        frames += buf.feed(stream[i : i + split])
    assert [f.type for f in frames] == [wire.EVENT, wire.CMD_RESPONSE]
    assert frames[0].name == "list-sa"
    assert frames[0].body == {
        "gw": {"state": "ESTABLISHED", "child-sas": {"c-1": {"local-ts": ["10.0.0.0/24"]}}}
    }
    assert frames[1].body == {"success": "yes"}


def test_partial_frame_yields_nothing_until_complete() -> None:
    data = response({"version": b"5.9.8"})
    buf = wire.FrameBuffer()
    assert buf.feed(data[:-1]) == []
    assert buf.feed(data[-1:])[0].body == {"version": "5.9.8"}


def test_bytes_become_text_with_replacement_not_errors() -> None:
    body = bytes(Message.serialize({"k": [b"\xff\xfe", b"ok"]}))
    assert wire.decode(body) == {"k": ["\ufffd\ufffd", "ok"]}
