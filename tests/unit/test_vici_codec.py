"""gwkit.vici.wire (pure): the decoder agrees with the vici package's codec (property test),
frames split anywhere reassemble, and malformed input is an error, not garbage."""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vici.protocol import FiniteStream, Message

from gwkit.vici import wire
from gwkit.vici.wire import DecodeError, FrameBuffer, decode

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(lambda s: len(s.encode()) < 256)
values = st.binary(max_size=40)
sections: Any = st.recursive(
    st.dictionaries(names, st.one_of(values, st.lists(values, max_size=4)), max_size=5),
    lambda children: st.dictionaries(
        names, st.one_of(values, st.lists(values, max_size=3), children), max_size=4
    ),
    max_leaves=30,
)


def to_str(value: Any) -> Any:
    """The vici package's bytes values -> str, recursively, as our decoder yields them."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [to_str(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_str(v) for k, v in value.items()}
    return value


def reference(body: bytes) -> dict[str, Any]:
    return to_str(Message.deserialize(FiniteStream(body)))  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(sections)
def test_decode_matches_the_vici_package(section: dict[str, Any]) -> None:
    body = Message.serialize(OrderedDict(section))
    assert decode(body) == reference(body)


ascii_names = st.text(st.characters(codec="ascii"), min_size=1, max_size=12)
ascii_values = st.binary(max_size=127).map(lambda b: bytes(c & 0x7F for c in b))
ascii_sections: Any = st.recursive(
    st.dictionaries(ascii_names, st.one_of(ascii_values, st.lists(ascii_values, max_size=4)), max_size=5),
    lambda children: st.dictionaries(ascii_names, st.one_of(ascii_values, children), max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(ascii_sections)
def test_decode_of_an_ascii_message_matches_the_vici_package(section: dict[str, Any]) -> None:
    """charon's listings are ASCII (length bytes included: values under 128 bytes): the path that
    slices one decoding of the whole message."""
    body = Message.serialize(OrderedDict(section))
    assert body.isascii()
    assert decode(body) == reference(body)


@given(sections, st.integers(min_value=1, max_value=50))
def test_frames_split_anywhere_reassemble(section: dict[str, Any], chunk: int) -> None:
    body = Message.serialize(OrderedDict(section))
    packet = struct.pack("!BB", wire.EVENT, 7) + b"list-sa" + body
    framed = (struct.pack("!I", len(packet)) + packet) * 2
    buf = FrameBuffer()
    frames = [f for i in range(0, len(framed), chunk) for f in buf.feed(framed[i : i + chunk])]
    assert [(f.type, f.name, f.body) for f in frames] == [(wire.EVENT, "list-sa", reference(body))] * 2


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x03\x05ab", id="truncated-key"),
        pytest.param(b"\x03\x01a\x00\x09abc", id="value-past-end"),
        pytest.param(b"\x02", id="section-end-without-start"),
        pytest.param(b"\x09", id="unknown-type"),
        pytest.param(b"\x05\x00\x01a", id="list-item-outside-list"),
    ],
)
def test_malformed_messages_raise(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(body)


def test_a_malformed_frame_is_a_decode_error_for_the_session_to_translate() -> None:
    bad = struct.pack("!BB", wire.EVENT, 7) + b"list-sa" + b"\x09"
    with pytest.raises(DecodeError):
        FrameBuffer().feed(struct.pack("!I", len(bad)) + bad)


def test_a_frame_longer_than_charon_ever_sends_is_refused_before_buffering_it() -> None:
    with pytest.raises(DecodeError, match="exceeds"):
        FrameBuffer().feed(struct.pack("!I", 0xFFFFFFF0) + b"\x01")
