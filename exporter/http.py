"""A minimal HTTP/1.1 server on anyio for /metrics and /healthz (one response per connection).

Why not prometheus_client's ``start_http_server``: it is threaded WSGI, while the daemon queries are
async (anyio); a small server keeps one event loop, one deadline model and no thread hand-off.

A slow or hostile client cannot pin the exporter: the connections are handled by
``gwkit.httpd.serve_connections`` with ``LIMITS``:

* at most 1024 connections at once (as ``gwkit.httpd.LIMITS``: a held connection costs a descriptor
  and ~13 KB), of them at most 4 past their request head: Prometheus, a second replica, the kubelet and
  a human fit, and each may hold a reply of 4 MB at 10,000 WireGuard peers plus as much again that a
  client not reading leaves in the transport's buffer, so 4 bound that to ~32 MB. Over the first
  cap a newcomer displaces the connection reading its request head longest; over the second, a request
  whose head is read displaces the one sending its reply longest, else the one answered longest
  (``gwkit.admission``). A flood of never-sending clients only displaces itself: ``/healthz`` and a
  scrape being answered or sent keep their slots;
* the request head (at most 16 KiB) must arrive within 10 s in total, not per read, or the connection
  is closed without an answer;
* the reply must be taken within 5 s plus its size at 256 KiB/s: a body streams for as long as the
  scraper keeps reading at least that fast (a 4 MB body gets 20 s, beyond Prometheus' default 10 s scrape
  timeout, so a scraper gives up before the exporter does), while a client that never reads is cut off
  at the same deadline. A rate, not a flat total: a flat total small enough to cut a never-reading
  client quickly would also cut a large body to a legitimate scraper on a slow link.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc

from exporter.family import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from gwkit.httpd import Connection, Limits, send_all, serve_connections

log = logging.getLogger(__name__)

MAX_REQUEST = 16 * 1024
LIMITS = Limits(connections=1024, replies=4, head_seconds=10.0, send_seconds=5.0, send_rate=256 * 1024)
"""The module docstring says why these."""


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


Handler = Callable[[str, str, dict[str, str]], Awaitable[Response]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def wants_openmetrics(accept: str) -> bool:
    """True if the Accept header offers OpenMetrics with q > 0 (Prometheus asks for it first)."""
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        if fields[0] != "application/openmetrics-text":
            continue
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def content_type(openmetrics: bool) -> str:
    return OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE


def parse_request(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Request line and headers (lower-cased names). Raises ValueError on garbage."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"unsupported version {version!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError("malformed header")
        headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


def response_head(resp: Response) -> bytes:
    """Status line and headers; the body is sent after it as is (not copied onto the head: at 10,000
    WireGuard peers it is 4 MB)."""
    reason = _REASONS.get(resp.status, "Unknown")
    return (
        f"HTTP/1.1 {resp.status} {reason}\r\nContent-Type: {resp.content_type}\r\n"
        f"Content-Length: {len(resp.body)}\r\nConnection: close\r\n\r\n"
    ).encode()


async def _serve_one(
    stream: anyio.abc.ByteStream, conn: Connection, handler: Handler, limits: Limits
) -> None:
    data = bytearray()
    with anyio.move_on_after(limits.head_seconds):  # total, not per read
        while b"\r\n\r\n" not in data and len(data) <= MAX_REQUEST:
            try:
                data += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
    if b"\r\n\r\n" not in data:
        return
    conn.answering()
    try:
        method, path, headers = parse_request(bytes(data.split(b"\r\n\r\n", 1)[0]))
    except ValueError:
        resp = Response(400, "text/plain; charset=utf-8", b"bad request\n")
        method, path = "GET", "-"
    else:
        if method not in ("GET", "HEAD"):
            resp = Response(405, "text/plain; charset=utf-8", b"only GET and HEAD\n")
        else:
            try:
                resp = await handler(method, path, headers)
            except Exception:
                log.exception("exporter.http.error path=%s", path)
                resp = Response(500, "text/plain; charset=utf-8", b"internal error\n")
    conn.sending()
    body = resp.body if method != "HEAD" else b""
    if not await send_all(stream, limits, response_head(resp), *([body] if body else [])):
        log.debug("exporter.http.cut_off path=%s bytes=%d", path, len(body))


async def serve(
    host: str,
    port: int,
    handler: Handler,
    *,
    limits: Limits = LIMITS,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port through ``task_status`` (port 0 picks one)."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio, not Django)
    log.info("exporter.http.listening host=%s port=%d", host, bound)
    task_status.started(bound)

    async def one(stream: anyio.abc.SocketStream, conn: Connection) -> None:
        await _serve_one(stream, conn, handler, limits)

    async with listener:
        await serve_connections(listener, one, limits, "exporter")
