"""The read-only VICI filter (gwkit.vici.readonly), pure: the verdict per packet and the answer order."""

from __future__ import annotations

import struct

import pytest
from vici.protocol import Message

from exporter.sources import EVENTS as EXPORTER_EVENTS
from gwkit.vici import readonly, wire
from gwkit.vici.readonly import Forward, Hangup, Refuse


def packet(frame: bytes) -> bytes:
    """The packet of a framed message (without its 4-byte length)."""
    (length,) = struct.unpack("!I", frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


def raw(kind: int, name: bytes, body: bytes = b"") -> bytes:
    return bytes([kind, len(name)]) + name + body


CONTROL = [
    "initiate", "terminate", "rekey", "redirect", "install", "uninstall", "reload-settings",
    "load-conn", "unload-conn", "get-conns", "load-shared", "unload-shared", "get-shared", "clear-creds",
    "flush-certs", "load-cert", "load-key", "unload-key", "get-keys", "load-token", "load-authority",
    "unload-authority", "get-authorities", "list-authorities", "load-pool", "unload-pool", "get-pools",
    "reset-counters", "list-certs", "list-policies", "get-algorithms",
]  # fmt: skip
"""Every other command charon 5.9.8's vici plugin registers (vici_{control,config,cred,authority,
attribute,query}.c): the ones that change state, and the read-only ones the exporter does not use."""


@pytest.mark.parametrize(
    "command, body",
    [
        ("version", None),
        ("stats", None),
        ("list-sas", {}),
        ("list-sas", {"ike-id": "7", "child": "c-1", "noblock": "yes"}),
        ("list-conns", {"ike": "s1"}),
        ("get-counters", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_exporters_queries_are_forwarded(command: str, body: dict[str, str] | None) -> None:
    assert readonly.decide(packet(wire.request(command, body))) == Forward()


@pytest.mark.parametrize("command", CONTROL)
def test_every_other_command_is_answered_unknown_and_never_forwarded(command: str) -> None:
    verdict = readonly.decide(packet(wire.request(command, {"ike": "s1", "child": "s1-0"})))
    assert verdict == Refuse("command", command, readonly.CMD_UNKNOWN_REPLY)
    assert verdict.reply == struct.pack("!IB", 1, wire.CMD_UNKNOWN), "what charon answers an unknown command"


@pytest.mark.parametrize("event", sorted(readonly.QUERY_EVENTS))
@pytest.mark.parametrize("op", [wire.register, wire.unregister], ids=["register", "unregister"])
def test_query_events_are_forwarded(op: object, event: str) -> None:
    assert readonly.decide(packet(op(event))) == Forward()  # type: ignore[operator]


@pytest.mark.parametrize(
    "event", ["log", "control-log", "list-cert", "list-policy", "list-authority", "ike-update"]
)
@pytest.mark.parametrize("op", [wire.register, wire.unregister], ids=["register", "unregister"])
def test_other_events_are_answered_unknown(op: object, event: str) -> None:
    assert readonly.decide(packet(op(event))) == Refuse("event", event, readonly.EVENT_UNKNOWN_REPLY)  # type: ignore[operator]


@pytest.mark.parametrize(
    "kind, name, shown",
    [
        pytest.param(wire.CMD_REQUEST, b"list-sas\x00initiate", "list-sas\x00initiate", id="name-with-nul"),
        pytest.param(wire.CMD_REQUEST, b"LIST-SAS", "LIST-SAS", id="case-matters"),
        pytest.param(wire.CMD_REQUEST, b"list-sas ", "list-sas ", id="trailing-space"),
        pytest.param(wire.CMD_REQUEST, b"", "", id="empty-name"),
        pytest.param(wire.CMD_REQUEST, b"\xffinit", "\ufffdinit", id="not-utf8"),
        pytest.param(wire.EVENT_REGISTER, b"log\x00list-sa", "log\x00list-sa", id="event-with-nul"),
    ],
)
def test_names_match_exactly(kind: int, name: bytes, shown: str) -> None:
    if kind == wire.CMD_REQUEST:
        assert readonly.decide(raw(kind, name)) == Refuse("command", shown, readonly.CMD_UNKNOWN_REPLY)
    else:
        assert readonly.decide(raw(kind, name)) == Refuse("event", shown, readonly.EVENT_UNKNOWN_REPLY)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(bytes([wire.CMD_REQUEST]), id="no-name-length"),
        pytest.param(bytes([wire.CMD_REQUEST, 9]) + b"list-sas", id="name-runs-past-the-end"),
        pytest.param(raw(wire.CMD_REQUEST, b"list-sas", b"\x09"), id="body-unknown-element"),
        pytest.param(raw(wire.CMD_REQUEST, b"stats", bytes([wire.KEY_VALUE, 3]) + b"ik"), id="truncated"),
        pytest.param(raw(wire.CMD_REQUEST, b"stats", bytes([wire.SECTION_END])), id="body-unbalanced"),
        pytest.param(raw(wire.EVENT_REGISTER, b"list-sa", b"x"), id="registration-with-a-body"),
        pytest.param(raw(wire.CMD_RESPONSE, b""), id="a-response"),
        pytest.param(raw(wire.EVENT, b"ike-updown"), id="an-event"),
        pytest.param(raw(wire.EVENT_CONFIRM, b""), id="a-confirmation"),
        pytest.param(raw(wire.CMD_UNKNOWN, b""), id="an-unknown"),
        pytest.param(raw(8, b"list-sas"), id="type-8"),
        pytest.param(raw(255, b"list-sas"), id="type-255"),
    ],
)  # fmt: skip
def test_what_no_client_sends_ends_the_connection(data: bytes) -> None:
    assert isinstance(readonly.decide(data), Hangup)


def test_a_well_formed_body_of_an_allowed_command_passes_whatever_it_holds() -> None:
    body = bytes(Message.serialize({"ike": "s1", "list": [b"a", b"b"], "sub": {"k": b"v"}}))
    assert readonly.decide(raw(wire.CMD_REQUEST, b"list-conns", body)) == Forward()


def test_the_allowlists_cover_what_the_exporter_sends_and_no_more() -> None:
    """exporter.sources and gwkit.vici.queries call these (grep "call(\\"" / "stream(\\""); a new query
    there must be added here on purpose, a control command never."""
    assert {"version", "stats", "list-sas", "list-conns", "get-counters"} == readonly.QUERY_COMMANDS
    assert set(EXPORTER_EVENTS) <= readonly.QUERY_EVENTS
    assert {"list-sa", "list-conn"} <= readonly.QUERY_EVENTS
    assert not readonly.QUERY_EVENTS & {"log", "control-log"}
    assert not readonly.QUERY_COMMANDS & set(CONTROL)


# --- order: a refusal never overtakes the answers owed before it --------------------------------------

REFUSE = Refuse("command", "initiate", readonly.CMD_UNKNOWN_REPLY)
REFUSE_EVENT = Refuse("event", "log", readonly.EVENT_UNKNOWN_REPLY)
CONFIRM, RESPONSE, EVENT, UNKNOWN = wire.EVENT_CONFIRM, wire.CMD_RESPONSE, wire.EVENT, wire.CMD_UNKNOWN


def run(steps: list[tuple[str, object]]) -> list[bytes | str]:
    """Feed client verdicts ("ask") and charon packet types ("answer"); what the client receives, in
    order: charon's packets as "charon:<type>", the relay's own replies as bytes."""
    flow = readonly.Flow()
    out: list[bytes | str] = []
    for what, value in steps:
        if what == "ask":
            step = readonly.ask(flow, value)  # type: ignore[arg-type]
        else:
            out.append(f"charon:{value}")
            step = readonly.answer(flow, value)  # type: ignore[arg-type]
        assert not isinstance(step, Hangup), step
        flow, sent = step
        out.extend(sent)
    return out


@pytest.mark.parametrize(
    "steps, received",
    [
        pytest.param([("ask", REFUSE)], [readonly.CMD_UNKNOWN_REPLY], id="nothing-owed-refused-at-once"),
        pytest.param(
            [("ask", Forward()), ("ask", REFUSE), ("answer", RESPONSE)],
            ["charon:1", readonly.CMD_UNKNOWN_REPLY],
            id="refusal-waits-for-the-answer-before-it",
        ),
        pytest.param(
            [("ask", Forward()), ("ask", Forward()), ("ask", REFUSE), ("answer", CONFIRM), ("answer", EVENT),
             ("answer", EVENT), ("answer", RESPONSE)],
            ["charon:5", "charon:7", "charon:7", "charon:1", readonly.CMD_UNKNOWN_REPLY],
            id="streamed-listing-then-the-refusal",
        ),
        pytest.param(
            [("ask", Forward()), ("ask", REFUSE), ("ask", REFUSE_EVENT), ("ask", Forward()), ("ask", REFUSE),
             ("answer", RESPONSE), ("answer", UNKNOWN)],
            ["charon:1", readonly.CMD_UNKNOWN_REPLY, readonly.EVENT_UNKNOWN_REPLY, "charon:2",
             readonly.CMD_UNKNOWN_REPLY],
            id="interleaved",
        ),
        pytest.param(
            [("ask", REFUSE), ("ask", Forward()), ("answer", EVENT), ("answer", RESPONSE), ("ask", REFUSE)],
            [readonly.CMD_UNKNOWN_REPLY, "charon:7", "charon:1", readonly.CMD_UNKNOWN_REPLY],
            id="events-answer-nothing",
        ),
        pytest.param([("answer", EVENT)], ["charon:7"], id="an-event-with-nothing-owed"),
    ],
)  # fmt: skip
def test_the_client_receives_answers_in_the_order_it_asked(
    steps: list[tuple[str, object]], received: list[bytes | str]
) -> None:
    assert run(steps) == received


@pytest.mark.parametrize("kind", [RESPONSE, CONFIRM, UNKNOWN, wire.EVENT_UNKNOWN])
def test_an_answer_nobody_asked_for_ends_the_connection(kind: int) -> None:
    assert isinstance(readonly.answer(readonly.Flow(), kind), Hangup)


@pytest.mark.parametrize("kind", [wire.CMD_REQUEST, wire.EVENT_REGISTER, wire.EVENT_UNREGISTER, 9])
def test_charon_sending_a_request_ends_the_connection(kind: int) -> None:
    assert isinstance(readonly.answer(readonly.Flow((None,)), kind), Hangup)


def test_a_client_that_never_reads_its_answers_is_cut_off() -> None:
    flow = readonly.Flow()
    for i in range(readonly.MAX_OWED):
        step = readonly.ask(flow, REFUSE if i % 2 else Forward())  # a refusal first would go out at once
        assert not isinstance(step, Hangup), i
        flow = step[0]
    assert isinstance(readonly.ask(flow, REFUSE), Hangup)
    assert isinstance(readonly.ask(flow, Forward()), Hangup)


# --- the splitter the relay frames with ---------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 3, 4, 5, 7, 1000], ids=lambda n: f"chunks-of-{n}")
def test_packet_splitter_returns_frames_as_they_came(split: int) -> None:
    frames = [wire.request("list-sas", {"ike": "s1"}), wire.register("list-sa"), wire.request("stats")]
    stream = b"".join(frames)
    splitter = wire.PacketSplitter()
    out: list[bytes] = []
    for i in range(0, len(stream), split):
        out += splitter.feed(stream[i : i + split])
        assert splitter.partial == (sum(map(len, out)) < min(i + split, len(stream)))
    assert out == frames and not splitter.partial


@pytest.mark.parametrize(
    "length, ok",
    [(wire.MAX_MESSAGE, True), (wire.MAX_MESSAGE + 1, False), (0, False), (2**32 - 1, False)],
    ids=["512KiB", "512KiB+1", "empty", "4GiB"],
)
def test_packet_splitter_holds_charons_512_kib_limit(length: int, ok: bool) -> None:
    splitter = wire.PacketSplitter()
    if ok:
        assert splitter.feed(struct.pack("!I", length) + b"\x00" * 10) == []
        assert splitter.partial
    else:
        with pytest.raises(wire.DecodeError):
            splitter.feed(struct.pack("!I", length))
