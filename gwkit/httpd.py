"""A tiny HTTP/1.0 server for probes and metrics (``GET``/``HEAD`` only, one request per connection), and
the connection handling it shares with the exporter's streaming server (``serve_connections``).

Programs answer a path with ``(status, content type, body)``; this module reads the request head, calls
them, writes the answer and closes. Enough for the kubelet's probes and Prometheus' scrapes; not a web
framework (the exporter has its own, streaming server).

Hardened against hostile clients (a tenant can reach the pod's ports), with ``Limits``:

* at most ``connections`` connections at once (1024: a held connection costs a descriptor and ~13 KB
  of the server's memory, measured, so 1024 of them ~14 MB), of them at most ``replies`` past their
  request head. When the server is full, a newcomer is still let in and takes the slot of the
  connection that has been reading its request head longest, else sending its reply longest, else being
  answered longest (the rule and why: ``gwkit.admission``). So a flood of clients that never send a
  head, or never read, costs a bounded number of descriptors and bytes, and ``/healthz`` keeps
  answering through it (bench/bench_httpd.py, numbers in docs/agent.md). Before, every connection was
  held until its deadline: past the descriptor limit the accept loop died with EMFILE and took the agent
  or the controller with it;
* the soft ``RLIMIT_NOFILE`` is raised to ``connections`` + 256 when it is lower (containers often start
  at 1024) and the hard limit allows; when it does not, fewer connections are held (logged), so the
  server itself never exhausts the process's descriptors;
* reading the request head has ``head_seconds`` in total, not per read (a client that trickles a byte a
  second gets no more time); on the deadline the connection is closed without an answer;
* sending the reply has ``send_seconds + size / send_rate`` in total: a client that does not read is cut
  off, one that reads at least ``send_rate`` bytes a second gets its reply however large (the exporter
  streams megabytes; a probe's answer is a few bytes, so for it this is ``send_seconds``);
* an accept that fails (out of descriptors or memory, EMFILE/ENFILE/ENOBUFS/ENOMEM) is retried after
  5 ms doubling to 1 s, as Go's net/http does, instead of ending the server.

Why displace rather than refuse, and why a large cap: the kernel's accept queue is first come, first
served, so a probe waits behind every connection a flood has queued, and a refused probe fails as
surely as a late one. Below the cap slow clients are simply held and cost the probe nothing; above it
every displaced client that reconnects at once re-queues ahead of the next probe, so the probe's wait
grows with the excess over the cap (measured in docs/agent.md: with a cap of 32, 100 such clients
already cost a p50 of 50-90 ms, against under 1 ms below the cap). Hence a cap as large as memory
allows, and displacement beyond it, which degrades the probe instead of killing the process.
"""

from __future__ import annotations

import itertools
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import anyio
import anyio.abc
from anyio.streams.stapled import MultiListener

from gwkit.admission import Admission, Phase
from gwkit.logs import Reminder

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


@dataclass(frozen=True)
class Limits:
    """What clients may cost a server (the module docstring says why these)."""

    connections: int = 1024
    """Connections held at once; over it a newcomer displaces a slow one (``gwkit.admission``)."""
    replies: int | None = None
    """Of them, connections past their request head (each may hold its reply in memory); None: any."""
    head_seconds: float = 5.0
    """Total time to send the request head, from the accept."""
    send_seconds: float = 5.0
    """Time to take a reply, on top of ``size / send_rate``."""
    send_rate: float = 256 * 1024
    """Bytes per second a client must at least read: slower than that, a large reply is cut off."""

    def send_deadline(self, size: int) -> float:
        """Seconds to send ``size`` bytes (pure)."""
        return self.send_seconds + size / self.send_rate


LIMITS = Limits()
"""The probes' and the controller's: replies of a few bytes (the controller's /metrics a few KB)."""

FD_RESERVE = 256
"""Descriptors a program needs besides its server's connections (API and daemon sockets, files, the
event loop's own): generous, the agent and the exporter use under 30."""


def open_files(connections: int, soft: int, hard: int) -> tuple[int, int]:
    """(soft limit to set, connections to hold) for a server of ``connections`` under the process's
    descriptor limits (pure): the soft limit is raised as far as the connections need and the hard limit
    allows; if it cannot be raised far enough, fewer connections are held, so the process never runs
    out of descriptors because of its server."""
    need = connections + FD_RESERVE
    if soft >= need:
        return soft, connections
    if hard == resource.RLIM_INFINITY or hard >= need:
        return need, connections
    return hard, max(1, min(connections, hard - FD_RESERVE))


def raise_open_files(limits: Limits, name: str) -> Limits:
    """Raise ``RLIMIT_NOFILE``'s soft limit for ``limits.connections`` (containers often start at 1024;
    the hard limit is the ceiling) and return the limits the server can keep."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new_soft, connections = open_files(limits.connections, soft, hard)
    if new_soft != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        log.info("httpd.open_files server=%s soft=%d->%d hard=%d", name, soft, new_soft, hard)
    if connections == limits.connections:
        return limits
    log.warning(
        "httpd.connections_lowered server=%s connections=%d->%d open_files_hard=%d",
        name,
        limits.connections,
        connections,
        hard,
    )
    replies = None if limits.replies is None else min(limits.replies, connections)
    return replace(limits, connections=connections, replies=replies)


class Connection:
    """What a connection's handler reports to the server: which phase it is in."""

    def __init__(self, server: _Connections, key: int) -> None:
        self._server = server
        self._key = key

    def answering(self) -> None:
        """The head is read; the server works on the answer."""
        self._server.move(self._key, Phase.ANSWER)

    def sending(self) -> None:
        """The answer is ready; the client has to take it."""
        self._server.move(self._key, Phase.SEND)


ServeOne = Callable[[anyio.abc.SocketStream, Connection], Awaitable[None]]


async def send_all(stream: anyio.abc.ByteSendStream, limits: Limits, *parts: bytes) -> bool:
    """Send ``parts`` within ``limits.send_deadline`` of their total size; False if the client went away
    or did not take them in time (the caller closes the connection either way)."""
    with anyio.move_on_after(limits.send_deadline(sum(len(p) for p in parts))) as scope:
        try:
            for part in parts:
                await stream.send(part)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return False
    return not scope.cancelled_caught


ACCEPT_RETRY_FIRST = 0.005
ACCEPT_RETRY_MAX = 1.0
REPORT_EVERY = 10.0


class _Connections:
    """The connections one server holds: its ``Admission`` and a cancel scope per connection, which
    closes the connection the admission names."""

    def __init__(self, limits: Limits, name: str) -> None:
        self.admission: Admission[int] = Admission(limits.connections, limits.replies)
        self.scopes: dict[int, anyio.CancelScope] = {}
        self.name = name
        self.displaced = 0
        self._keys = itertools.count()
        self._report = Reminder(REPORT_EVERY)

    def admit(self) -> tuple[int, anyio.CancelScope]:
        key = next(self._keys)
        self._close(self.admission.admit(key))
        scope = self.scopes[key] = anyio.CancelScope()
        return key, scope

    def move(self, key: int, phase: Phase) -> None:
        self._close(self.admission.move(key, phase))

    def leave(self, key: int) -> None:
        self.scopes.pop(key, None)
        self.admission.leave(key)

    def _close(self, victim: int | None) -> None:
        if victim is None:
            return
        self.scopes.pop(victim).cancel()  # every admitted key has its scope until it leaves
        self.displaced += 1
        if self._report.due("full"):
            log.warning(
                "httpd.full server=%s held=%d displaced=%d", self.name, len(self.admission), self.displaced
            )


async def serve_connections(
    listener: anyio.abc.Listener[anyio.abc.SocketStream], serve_one: ServeOne, limits: Limits, name: str
) -> None:
    """Accept on every socket of ``listener`` until cancelled and run ``serve_one`` for each connection
    (which closes when it returns), within ``limits`` (the soft descriptor limit is raised for them
    first). ``name`` is for the log."""
    held = _Connections(raise_open_files(limits, name), name)

    async def run(key: int, stream: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                async with stream:
                    await serve_one(stream, Connection(held, key))
        except Exception as exc:  # one bad client must not stop the server
            log.debug("httpd.request_failed server=%s error=%r", name, exc)
        finally:
            held.leave(key)

    async def accept(sub: anyio.abc.SocketListener, tg: anyio.abc.TaskGroup) -> None:
        retry = ACCEPT_RETRY_FIRST
        while True:
            try:
                stream = await sub.accept()
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED: wait, do not die
                log.warning("httpd.accept_failed server=%s error=%r retry_in=%.3fs", name, str(exc), retry)
                await anyio.sleep(retry)
                retry = min(ACCEPT_RETRY_MAX, retry * 2)
                continue
            retry = ACCEPT_RETRY_FIRST
            key, scope = held.admit()
            tg.start_soon(run, key, stream, scope)

    subs = listener.listeners if isinstance(listener, MultiListener) else [listener]
    async with anyio.create_task_group() as tg:
        for sub in subs:
            if not isinstance(sub, anyio.abc.SocketListener):
                raise TypeError(f"{sub!r} is not a socket listener")
            tg.start_soon(accept, sub, tg)


async def _handle(stream: anyio.abc.SocketStream, conn: Connection, handler: Handler, limits: Limits) -> None:
    head = b""
    with anyio.move_on_after(limits.head_seconds) as reading:  # total, not per read
        while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < MAX_REQUEST:
            try:
                head += await stream.receive(1024)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    if reading.cancelled_caught:
        return
    conn.answering()
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
    conn.sending()
    await send_all(stream, limits, reply)


async def serve(
    listen: str,
    handler: Handler,
    *,
    limits: Limits = LIMITS,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound port."""
    host, port = split_listen(listen)
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = int(listener.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610 - anyio, not Django
    task_status.started(bound)

    async def one(stream: anyio.abc.SocketStream, conn: Connection) -> None:
        await _handle(stream, conn, handler, limits)

    async with listener:
        await serve_connections(listener, one, limits, f"{host}:{bound}")
