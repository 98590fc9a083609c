"""The cluster services a node offers its pods in the lab, served inside the node's network namespace by
the lab kubelet's own event loop (no extra process):

* the API server at its in-cluster address (``kubernetes.default.svc``, e.g. 10.96.0.1:443): a TCP relay
  to the emulator on 127.0.0.1 in the root namespace. TLS passes through untouched, so the pod checks the
  emulator's certificate (which carries the in-cluster address as a SAN) against the projected ``ca.crt``
  (or the real kube-apiserver's, lab.controlplane, whose serving certificate carries it too). A
  ``RelayGate`` closed cuts every relayed connection and refuses new ones: a node partitioned from the
  API server takes its pods with it;
* cluster DNS (e.g. 10.96.0.10:53, UDP): A records for names the test registers (``records``), NXDOMAIN
  for every other name, as CoreDNS answers for unknown names. Only what a pod's resolver asks: one
  question per query, A (and an empty answer for other types of a known name).
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Mapping
from ipaddress import IPv4Address

import anyio
import anyio.abc
from anyio.abc import TaskStatus

log = logging.getLogger(__name__)


async def _pump(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
    try:
        async for chunk in src:
            await dst.send(chunk)
        await dst.send_eof()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


class RelayGate:
    """Open until ``close()``: then every relayed connection is cut and new ones are closed at once (a
    partitioned node's pods lose the API server with it). Used on the relay's event loop only."""

    def __init__(self) -> None:
        self.closed = False
        self._scopes: set[anyio.CancelScope] = set()

    def close(self) -> None:
        self.closed = True
        for scope in list(self._scopes):
            scope.cancel()


async def serve_relay(
    sock: socket.socket,
    target: tuple[str, int],
    gate: RelayGate | None = None,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Relay every connection accepted on ``sock`` (a listening socket, any namespace) to ``target``, while
    ``gate`` (if any) is open."""
    listener = await anyio.abc.SocketListener.from_socket(sock)
    task_status.started()

    async def handle(client: anyio.abc.SocketStream) -> None:
        async with client:
            if gate is not None and gate.closed:
                return
            with anyio.CancelScope() as scope:
                if gate is not None:
                    gate._scopes.add(scope)
                try:
                    try:
                        upstream = await anyio.connect_tcp(*target)
                    except OSError as exc:
                        log.warning(
                            "relay.connect_failed target=%s:%d error=%r", target[0], target[1], str(exc)
                        )
                        return
                    async with upstream, anyio.create_task_group() as tg:
                        tg.start_soon(_pump, client, upstream)
                        tg.start_soon(_pump, upstream, client)
                finally:
                    if gate is not None:
                        gate._scopes.discard(scope)

    async with listener:
        await listener.serve(handle)


# --- DNS ------------------------------------------------------------------------------------------------


def _qname(packet: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    while True:
        n = packet[offset]
        if n == 0:
            return ".".join(labels), offset + 1
        if n & 0xC0:
            raise ValueError("compressed names in a question")
        labels.append(packet[offset + 1 : offset + 1 + n].decode("ascii", "replace"))
        offset += 1 + n


def dns_answer(query: bytes, records: Mapping[str, str]) -> bytes | None:
    """The response to one DNS ``query`` (pure); None for what is no standard query."""
    if len(query) < 12:
        return None
    ident, flags, qd, _an, _ns, _ar = struct.unpack("!6H", query[:12])
    if flags & 0x8000 or qd != 1 or (flags >> 11) & 0xF != 0:
        return None
    try:
        name, end = _qname(query, 12)
        qtype, qclass = struct.unpack("!2H", query[end : end + 4])
    except (ValueError, IndexError, struct.error):
        return None
    question = query[12 : end + 4]
    known = name.lower().rstrip(".") in records
    rcode = 0 if known else 3  # NXDOMAIN
    answers = b""
    count = 0
    if known and qtype == 1 and qclass == 1:
        addr = IPv4Address(records[name.lower().rstrip(".")]).packed
        answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + addr
        count = 1
    rd = flags & 0x0100
    header = struct.pack("!6H", ident, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1, count, 0, 0)
    return header + question + answers


async def serve_dns(
    sock: socket.socket,
    records: Mapping[str, str],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer DNS queries arriving on ``sock`` (a bound UDP socket) from ``records`` (name -> IPv4; the
    mapping may change while this runs)."""
    udp = await anyio.abc.UDPSocket.from_socket(sock)
    task_status.started()
    async with udp:
        async for data, addr in udp:
            reply = dns_answer(data, records)
            if reply is not None:
                await udp.sendto(reply, *addr)
