"""VICI framing and messages, sans I/O: bytes in, values out.

The message codec is the ``vici`` package's (``vici.protocol.Message``); this module adds the framing
(4-byte big-endian length) as an incremental parser, and turns charon's byte values into str.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vici.protocol import FiniteStream, Message, Packet

(
    CMD_REQUEST,
    CMD_RESPONSE,
    CMD_UNKNOWN,
    EVENT_REGISTER,
    EVENT_UNREGISTER,
    EVENT_CONFIRM,
    EVENT_UNKNOWN,
    EVENT,
) = range(8)
MAX_MESSAGE = 512 * 1024  # charon drops (events) or hangs up on (requests) anything larger: LAB-FACTS

Section = dict[str, Any]


@dataclass(frozen=True)
class Frame:
    """One packet from charon: a response, an event confirmation, or an event with its name."""

    type: int
    name: str | None
    body: Section


def _named(kind: int, name: str, body: bytes = b"") -> bytes:
    raw = name.encode()
    packet = struct.pack("!BB", kind, len(raw)) + raw + body
    return struct.pack("!I", len(packet)) + packet


def request(command: str, message: Mapping[str, Any] | None = None) -> bytes:
    body = Message.serialize(dict(message)) if message else b""
    return _named(CMD_REQUEST, command, body)


def register(event: str) -> bytes:
    return _named(EVENT_REGISTER, event)


def unregister(event: str) -> bytes:
    return _named(EVENT_UNREGISTER, event)


def to_str(value: Any) -> Any:
    """charon's values are bytes; ours are str (lists and sections converted recursively)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [to_str(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_str(v) for k, v in value.items()}
    return value


def parse_packet(packet: bytes) -> Frame:
    parsed = Packet.parse(packet)
    if parsed.response_type == EVENT:
        return Frame(EVENT, parsed.event_type.decode(), to_str(Message.deserialize(parsed.payload)))
    if parsed.response_type == CMD_RESPONSE:
        return Frame(CMD_RESPONSE, None, to_str(Message.deserialize(parsed.payload)))
    return Frame(parsed.response_type, None, {})


class FrameBuffer:
    """Incremental frame parser: ``feed`` bytes, ``frames`` returns every complete packet."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (length,) = struct.unpack_from("!I", self._buf)
            if len(self._buf) < 4 + length:
                break
            packet = bytes(self._buf[4 : 4 + length])
            del self._buf[: 4 + length]
            out.append(parse_packet(packet))
        return out


__all__ = [
    "FiniteStream",
    "Frame",
    "FrameBuffer",
    "parse_packet",
    "register",
    "request",
    "to_str",
    "unregister",
]
