"""Reads and writes on a raw (non-blocking) socket that a deadline may cancel at any moment.

Why not the anyio stream's own ``receive``/``send``: on asyncio, anyio 4.16's UNIX socket stream waits
for a readable or writable socket with a future whose ``set_result`` is the selector's callback, removed
only by a done-callback that runs a loop iteration later. Cancelled by a deadline just as the socket
turns ready, the loop then calls ``set_result`` on the cancelled future and logs ``Exception in callback
Future.set_result(None) ... InvalidStateError`` (seen here: a read-only server dropping a client that
stopped reading a 4.9 MB reply, the moment the client closed). ``anyio.wait_readable`` /
``wait_writable`` guard against exactly that, so these wait with them and then read or write the socket
directly. Callers put the deadline around the call (``anyio.fail_after`` / ``move_on_after``); a
cancelled ``send_all`` may have written part of ``data``, so the stream is to be closed after it.
"""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import anyio.lowlevel


def raw(stream: anyio.abc.SocketStream) -> socket.socket:
    sock: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 (anyio, not Django)
    return sock


async def receive(sock: socket.socket, max_bytes: int = 65536) -> bytes:
    """The next bytes; b"" at the end of the stream. Raises OSError (ECONNRESET ...)."""
    await anyio.lowlevel.checkpoint()  # a peer that always has data must not starve the other tasks
    while True:
        try:
            return sock.recv(max_bytes)
        except BlockingIOError:
            await anyio.wait_readable(sock)


async def send_all(sock: socket.socket, data: bytes) -> None:
    """All of ``data``. Raises OSError (EPIPE when the peer is gone ...)."""
    await anyio.lowlevel.checkpoint()
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await anyio.wait_writable(sock)
            continue
        view = view[sent:]
