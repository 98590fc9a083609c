"""The read-only subset of VICI, decided packet by packet (pure): what a monitor may ask charon.

charon has one VICI socket and no read-only mode: strongSwan's vici plugin (5.9.8) reads one URI
(``charon.plugins.vici.socket``), and every client connected to it may call every registered command,
``initiate``, ``terminate``, ``load-conn``, ``load-shared``, ``clear-creds`` and ``reload-settings``
included; the socket's file mode is the only access control. A process that only monitors (the exporter)
therefore reaches charon through a relay (``agent.ipsec.relay``) that passes what this module allows:

* ``CMD_REQUEST`` for the query commands the exporter sends (``QUERY_COMMANDS``: ``version``, ``stats``,
  ``list-sas``, ``list-conns``, ``get-counters``), its body a well-formed VICI message;
* ``EVENT_REGISTER`` / ``EVENT_UNREGISTER`` for the events those queries stream and the exporter follows
  (``QUERY_EVENTS``). Not ``log`` or ``control-log``: they carry charon's log lines (identities,
  addresses, every tenant's negotiation), and nothing read-only needs them.

Anything else is refused with the answer charon itself gives a command or event it does not know
(``CMD_UNKNOWN`` / ``EVENT_UNKNOWN``): the client sees an unknown command, charon sees nothing. A packet
no client may send (a response, an event, a malformed name or body) ends the connection (``Hangup``).
Not allowed, although they change nothing either: ``get-conns``, ``get-shared``, ``list-certs``,
``get-keys``, ``list-policies``, ... (least privilege: nothing the exporter does not use).

Order: charon answers one client's requests strictly in order (vici_socket.c ``process_queue``). A refusal
must not overtake the answers to requests sent before it, or a pipelining client would take it for one of
them, so ``Flow`` holds it back until charon has answered everything forwarded earlier (``ask`` when the
client sends, ``answer`` when charon does). It is also where a client that never reads is noticed: more
than ``MAX_OWED`` answers outstanding ends the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from gwkit.vici import wire

QUERY_COMMANDS = frozenset({"version", "stats", "list-sas", "list-conns", "get-counters"})
"""Commands a read-only client may send: what ``gwkit.vici.queries`` and the exporter call."""
QUERY_EVENTS = frozenset({"list-sa", "list-conn", "ike-updown", "child-updown", "ike-rekey", "child-rekey"})
"""Events it may register for: the ones ``list-sas`` / ``list-conns`` stream, and the state changes
the exporter follows to keep its byte counters monotonic across rekeys."""
MAX_OWED = 32
"""Answers one client may have outstanding (forwarded requests plus held-back refusals). Our own
sessions have at most two (a registration and a request)."""

_COMMANDS = frozenset(c.encode() for c in QUERY_COMMANDS)
_EVENTS = frozenset(e.encode() for e in QUERY_EVENTS)
ANSWERS = frozenset({wire.CMD_RESPONSE, wire.CMD_UNKNOWN, wire.EVENT_CONFIRM, wire.EVENT_UNKNOWN})
"""Packet types that answer one client packet (an ``EVENT`` answers nothing: it just comes)."""


def _frame(kind: int) -> bytes:
    return struct.pack("!IB", 1, kind)


CMD_UNKNOWN_REPLY = _frame(wire.CMD_UNKNOWN)
EVENT_UNKNOWN_REPLY = _frame(wire.EVENT_UNKNOWN)


@dataclass(frozen=True)
class Forward:
    """Pass the packet to charon unchanged; charon owes exactly one answer to it."""


@dataclass(frozen=True)
class Refuse:
    """Do not pass it on; answer the client ``reply`` instead (what charon says to an unknown name)."""

    kind: Literal["command", "event"]
    name: str
    """The name as the client sent it (UTF-8, errors replaced): for the log, quoted."""
    reply: bytes


@dataclass(frozen=True)
class Hangup:
    """Not something a client sends: close the connection (the stream cannot be trusted)."""

    reason: str


Verdict = Forward | Refuse | Hangup


def decide(packet: bytes) -> Verdict:
    """The verdict on one packet a client sent (the frame without its 4-byte length)."""
    if not packet:
        return Hangup("empty packet")
    kind = packet[0]
    if kind not in (wire.CMD_REQUEST, wire.EVENT_REGISTER, wire.EVENT_UNREGISTER):
        return Hangup(f"packet type {kind} is not a client request")
    if len(packet) < 2 or len(packet) < 2 + packet[1]:
        return Hangup("name runs past the end of the packet")
    end = 2 + packet[1]
    raw = packet[2:end]
    name = raw.decode("utf-8", "replace")
    if kind == wire.CMD_REQUEST:
        if raw not in _COMMANDS:
            return Refuse("command", name, CMD_UNKNOWN_REPLY)
        try:
            wire.decode(packet, end)
        except wire.DecodeError as exc:
            return Hangup(f"{name}: malformed message body: {exc}")
        return Forward()
    if end != len(packet):
        return Hangup(f"{name}: an event registration carries no body")
    if raw not in _EVENTS:
        return Refuse("event", name, EVENT_UNKNOWN_REPLY)
    return Forward()


@dataclass(frozen=True)
class Flow:
    """What one client is still owed, in order: ``None`` for an answer charon owes (a forwarded packet),
    bytes for a refusal held back until the answers before it have gone out. Invariant: the head is
    never a refusal (those are sent as soon as nothing is owed before them)."""

    owed: tuple[bytes | None, ...] = ()


Step = tuple[Flow, tuple[bytes, ...]]
"""The new flow, and what to send the client now, in this order."""


def ask(flow: Flow, verdict: Forward | Refuse) -> Step | Hangup:
    """The client sent a packet with this verdict (a forwarded one must be recorded before it is sent to
    charon, whose answer could otherwise come first)."""
    if len(flow.owed) >= MAX_OWED:
        return Hangup(f"more than {MAX_OWED} answers outstanding: the client does not read them")
    if isinstance(verdict, Forward):
        return Flow((*flow.owed, None)), ()
    if not flow.owed:
        return flow, (verdict.reply,)
    return Flow((*flow.owed, verdict.reply)), ()


def answer(flow: Flow, kind: int) -> Step | Hangup:
    """charon sent a packet of type ``kind``; the relay passes it on, then sends what this returns."""
    if kind == wire.EVENT:
        return flow, ()
    if kind not in ANSWERS:
        return Hangup(f"charon sent packet type {kind}, which is no answer")
    if not flow.owed:
        return Hangup("charon answered a packet nobody sent")
    rest = flow.owed[1:]
    released: list[bytes] = []
    while rest and rest[0] is not None:
        released.append(rest[0])
        rest = rest[1:]
    return Flow(rest), tuple(released)
