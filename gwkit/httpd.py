"""A tiny HTTP/1.0 server for probes and metrics (``GET``/``HEAD`` only, one request per connection).

Programs answer a path with ``(status, content type, body)``; this module reads the request head, calls
them, writes the answer and closes. Enough for the kubelet's probes and Prometheus' scrapes; not a web
framework (the exporter has its own, streaming server).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

log = logging.getLogger(__name__)

MAX_REQUEST = 8192
Answer = tuple[int, str, bytes]
Handler = Callable[[str], Awaitable[Answer]]
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def parse_request_line(head: bytes) -> tuple[str, str] | None:
    """(method, path without query) of a GET/HEAD request head, or None (pure)."""
    line = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    parts = line.split()
    if len(parts) < 2 or parts[0] not in (b"GET", b"HEAD"):
        return None
    return parts[0].decode(), parts[1].split(b"?", 1)[0].decode("ascii", errors="replace")


def split_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); raises ValueError naming the flag and the rule."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{flag} {listen!r}: expected HOST:PORT with a port 0-65535")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _handle(stream: anyio.abc.SocketStream, handler: Handler) -> None:
    async with stream:
        head = b""
        with anyio.move_on_after(5):
            while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_REQUEST:
                try:
                    head += await stream.receive(1024)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        req = parse_request_line(head)
        if req is None:
            code, ctype, body = 400, "text/plain", b"bad request\n"
        else:
            try:
                code, ctype, body = await handler(req[1])
            except Exception as exc:
                log.warning("httpd.handler_failed path=%s error=%r", req[1], str(exc))
                code, ctype, body = 500, "text/plain", b"internal error\n"
        reply = (
            f"HTTP/1.0 {code} {REASONS.get(code, '')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + (body if req is None or req[0] != "HEAD" else b"")
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await stream.send(reply)


async def serve(
    listen: str, handler: Handler, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound port."""
    host, port = split_listen(listen)
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = int(listener.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610 - anyio, not Django
    task_status.started(bound)

    async def one(stream: anyio.abc.SocketStream) -> None:
        try:
            await _handle(stream, handler)
        except Exception as exc:  # one bad client must not stop the server
            log.debug("httpd.request_failed error=%r", exc)

    async with listener:
        await listener.serve(one)
