"""The three HTTP servers under a flood of slow clients, over real TCP on 127.0.0.1: the agent's probe
server (``agent.health.serve``), the controller's (``gwkit.httpd.serve`` with the operator's own ``http``
handler, as ``Operator.run`` serves it) and the exporter's (``exporter.http.serve`` with ``MetricsApp``
over a charon socket nobody listens on).

Hundreds of connections that send nothing or half a request head, and never read: the probe still gets
its 200 while they are open, the server holds at most its cap of them (counted in this process's
descriptors), and every one is closed without an answer, displaced or at its head deadline. A client
that asks for a large reply and never reads is cut off at the send deadline; one that reads slowly but
steadily gets the whole body. Deadlines are injected short; the only timing checks are generous
bounds on a wait.
"""

from __future__ import annotations

import functools
import os
import resource
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from agent.health import HealthState
from agent.health import serve as serve_probes
from controller.cloud import StaticCloud
from controller.leader import AlwaysLeader
from controller.run import Operator
from controller.settings import Settings
from exporter.app import MetricsApp
from exporter.http import Response
from exporter.http import serve as serve_exporter
from exporter.service import Exporter
from exporter.sources import StrongswanSource
from gwkit import httpd
from gwkit.kube import ClusterConfig, KubeClient
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio

SLOW = 300
CAP = 32
BIG = 16 * 1024 * 1024  # past what the kernel's socket buffers on loopback absorb (tcp_wmem max 4 MiB)
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
REPO = Path(__file__).resolve().parents[2]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_budget(needed: int) -> None:
    """The flood runs in this process (clients and server): it must fit the soft descriptor limit, which
    may be 1024. A limit too low is a failure that says so, never a skip."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < open_fds() + needed:
        pytest.fail(f"RLIMIT_NOFILE soft limit {soft} < {open_fds()} open + {needed} for this test")


async def get(port: int, path: str) -> tuple[int, bytes]:
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = await read_to_end(s)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def read_to_end(s: anyio.abc.SocketStream) -> bytes:
    data = bytearray()
    try:
        while True:
            data += await s.receive(65536)
    except (anyio.EndOfStream, anyio.BrokenResourceError):  # FIN, or RST for unread bytes: closed
        return bytes(data)


Start = Callable[[anyio.abc.TaskGroup, httpd.Limits], Awaitable[int]]


async def start_agent(tg: anyio.abc.TaskGroup, limits: httpd.Limits) -> int:
    state = HealthState(stale_after=60)
    state.beat()
    port: int = await tg.start(functools.partial(serve_probes, "127.0.0.1:0", state, limits=limits))
    return port


async def start_controller(tg: anyio.abc.TaskGroup, limits: httpd.Limits) -> int:
    # A client for an API nobody serves: /healthz and /metrics read only the operator's own state.
    kube = KubeClient(ClusterConfig("https://127.0.0.1:9", False))
    operator = Operator(kube, Settings(), StaticCloud({}), AlwaysLeader())
    port: int = await tg.start(functools.partial(httpd.serve, "127.0.0.1:0", operator.http, limits=limits))
    return port


async def start_exporter(tg: anyio.abc.TaskGroup, limits: httpd.Limits, tmp: Path) -> int:
    app = MetricsApp(Exporter(strongswan=StrongswanSource(tmp / "no-charon.vici")))
    port: int = await tg.start(functools.partial(serve_exporter, "127.0.0.1", 0, app, limits=limits))
    return port


SERVERS = [
    pytest.param("agent", "/healthz", b"ok\n", id="agent-probes"),
    pytest.param("controller", "/healthz", b"ok\n", id="controller-healthz"),
    pytest.param("controller", "/metrics", b"vpngw_controller_", id="controller-metrics"),
    pytest.param("exporter", "/healthz", b"ok\n", id="exporter-healthz"),
    pytest.param("exporter", "/metrics", b"\nstrongswan_up 0\n", id="exporter-metrics"),
]


@asynccontextmanager
async def running(which: str, limits: httpd.Limits, tmp: Path) -> AsyncIterator[int]:
    async with anyio.create_task_group() as tg:
        if which == "agent":
            port = await start_agent(tg, limits)
        elif which == "controller":
            port = await start_controller(tg, limits)
        else:
            port = await start_exporter(tg, limits, tmp)
        yield port
        tg.cancel_scope.cancel()


async def open_slow(port: int) -> list[anyio.abc.SocketStream]:
    """SLOW connections: half send nothing, half half a request head; none reads."""
    slow: list[anyio.abc.SocketStream] = []
    for i in range(SLOW):
        s = await anyio.connect_tcp("127.0.0.1", port)
        slow.append(s)
        if i % 2:
            await s.send(PARTIAL_HEAD)
    return slow


async def probe_while_open(port: int, path: str, expected: bytes) -> None:
    for _ in range(5):  # every slow connection is open on our side, none has been read from
        code, body = await get(port, path)
        assert code == 200 and expected in body


@pytest.mark.parametrize(("which", "path", "expected"), SERVERS)
async def test_over_the_cap_slow_clients_give_way_and_the_probe_is_answered(
    which: str, path: str, expected: bytes, tmp_path: Path
) -> None:
    """Ten times the cap: the server holds at most CAP of them, the rest are closed at once (the head
    deadline, 60 s, is not what closes them), and the probe is answered meanwhile."""
    fd_budget(SLOW + CAP + 64)
    limits = httpd.Limits(connections=CAP, head_seconds=60.0)
    async with running(which, limits, tmp_path) as port:
        base = open_fds()
        slow = await open_slow(port)
        try:
            await probe_while_open(port, path, expected)
            # Ours: SLOW. The server's: at most CAP (the probes' are closed by now, or about to be).
            await wait_for_async(
                lambda: open_fds() <= base + SLOW + CAP, 10, "the server holding at most CAP", 0.02
            )
            with anyio.fail_after(10):  # the oldest SLOW - CAP: displaced by the newer ones
                replies = [await read_to_end(s) for s in slow[: SLOW - CAP]]
            assert replies == [b""] * (SLOW - CAP), "a slow client was answered instead of closed"
        finally:
            for s in slow:
                await s.aclose()


@pytest.mark.parametrize(("which", "path", "expected"), SERVERS)
async def test_below_the_cap_slow_clients_are_held_and_closed_at_the_head_deadline(
    which: str, path: str, expected: bytes, tmp_path: Path
) -> None:
    """Under the cap every slow client is held, costs the probe nothing, and is closed without an answer
    when its 1 s for the request head is up: all of it, not per read."""
    fd_budget(2 * SLOW + 64)
    limits = httpd.Limits(connections=SLOW + 16, head_seconds=1.0)
    async with running(which, limits, tmp_path) as port:
        slow = await open_slow(port)
        try:
            await probe_while_open(port, path, expected)
            with anyio.fail_after(20):
                replies = [await read_to_end(s) for s in slow]
            assert replies == [b""] * SLOW, "a slow client was answered instead of closed"
        finally:
            for s in slow:
                await s.aclose()


@pytest.mark.parametrize("which", ["agent", "controller", "exporter"])
async def test_the_head_deadline_is_for_the_whole_head_not_per_read(which: str, tmp_path: Path) -> None:
    """A client that trickles its head a byte every 0.1 s never waits a whole second between reads, yet
    is closed once its second for the whole head is up."""
    async with running(which, httpd.Limits(head_seconds=1.0), tmp_path) as port:
        with anyio.fail_after(20):
            async with await anyio.connect_tcp("127.0.0.1", port) as s:
                for byte in PARTIAL_HEAD * 200:
                    try:
                        await s.send(bytes([byte]))
                        with anyio.move_on_after(0.1):
                            assert await s.receive() == b"", "answered a request never completed"
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
                else:
                    pytest.fail("still open after 200 trickled bytes")


async def connect_small_window(port: int) -> socket.socket:
    """A plain socket whose receive window stays small (a receive buffer set before connecting is not
    auto-tuned), so a large reply it does not read backs up into the server. Not an anyio stream: its
    transport would read everything into memory whether or not the test asks for it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    with anyio.fail_after(10):
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            await anyio.wait_writable(sock)
    return sock


async def recv(sock: socket.socket) -> bytes:
    """One read: b"" at the end (FIN, or RST for bytes the server never read)."""
    while True:
        try:
            return sock.recv(65536)
        except BlockingIOError:
            await anyio.wait_readable(sock)
        except ConnectionResetError:
            return b""


BIG_SERVERS = ["gwkit.httpd", "exporter.http"]


@asynccontextmanager
async def big_reply_server(which: str, limits: httpd.Limits) -> AsyncIterator[int]:
    body = b"x" * BIG

    async def probes(path: str) -> httpd.Answer:
        return 200, "text/plain", body

    async def exporter(method: str, path: str, headers: dict[str, str]) -> Response:
        return Response(200, "text/plain", body)

    async with anyio.create_task_group() as tg:
        if which == "gwkit.httpd":
            serve = functools.partial(httpd.serve, "127.0.0.1:0", probes, limits=limits)
        else:
            serve = functools.partial(serve_exporter, "127.0.0.1", 0, exporter, limits=limits)
        yield await tg.start(serve)
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("which", BIG_SERVERS)
async def test_a_client_that_never_reads_its_reply_is_cut_off(which: str) -> None:
    limits = httpd.Limits(connections=CAP, send_seconds=0.5, send_rate=1e12)  # 0.5 s whatever the size
    async with big_reply_server(which, limits) as port:
        base = open_fds()
        with await connect_small_window(port) as s:
            s.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            await wait_for_async(lambda: open_fds() == base + 2, 20, "the connection open on both ends", 0.02)
            await wait_for_async(lambda: open_fds() == base + 1, 20, "the server's end closed: cut off", 0.02)
            received = bytearray()
            with anyio.fail_after(20):
                while chunk := await recv(s):
                    received += chunk
    assert received.startswith(b"HTTP/1.")
    assert len(received) < BIG, "the whole reply was sent to a client that did not read"


@pytest.mark.parametrize("which", BIG_SERVERS)
async def test_a_slow_but_steady_reader_gets_the_whole_reply(which: str) -> None:
    """The reply may take ``send_seconds`` + its size at ``send_rate``: here 0.2 s + 16 s. The client
    takes at most 32 KiB (its receive buffer) every 2 ms, at most 16 MB/s, so the server's send of what
    the kernel's buffers do not hold (12 of the 16 MiB) lasts at least 0.8 s: past a flat 0.2 s."""
    limits = httpd.Limits(connections=CAP, send_seconds=0.2, send_rate=1024 * 1024)
    async with big_reply_server(which, limits) as port:
        with await connect_small_window(port) as s:
            s.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            data = bytearray()
            with anyio.fail_after(60):
                while chunk := await recv(s):
                    data += chunk
                    await anyio.sleep(0.002)
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    assert head.split()[1] == b"200" and len(body) == BIG


def test_the_server_outlives_running_out_of_descriptors(tmp_path: Path) -> None:
    """EMFILE at accept used to end the accept loop and the program with it. Here the process runs out
    of descriptors with a client waiting: the server says so, retries, and answers once some are free.
    In a child process: exhausting this one's descriptors would break the test run."""
    script = textwrap.dedent(
        """
        import logging, os, socket, sys, time, anyio
        from gwkit import httpd
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")

        async def answer(path):
            return 200, "text/plain", b"ok\\n"

        async def main():
            async with anyio.create_task_group() as tg:
                limits = httpd.Limits(connections=8)
                port = await tg.start(lambda task_status: httpd.serve("127.0.0.1:0", answer, limits=limits,
                                                                      task_status=task_status))
                client = socket.socket()
                hog = []
                try:
                    while True:
                        hog.append(os.open("/dev/null", os.O_RDONLY))
                except OSError:
                    pass
                client.connect(("127.0.0.1", port))
                client.sendall(b"GET /healthz HTTP/1.0\\r\\n\\r\\n")
                await anyio.sleep(0.5)  # the server's accept fails with EMFILE meanwhile, and retries
                for fd in hog:
                    os.close(fd)
                client.setblocking(False)
                stream = await anyio.abc.SocketStream.from_socket(client)
                data = b""
                with anyio.fail_after(10):
                    try:
                        while True:
                            data += await stream.receive()
                    except anyio.EndOfStream:
                        pass
                print("reply", data.split(b"\\r\\n", 1)[0].decode())
                tg.cancel_scope.cancel()

        anyio.run(main)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "httpd.accept_failed" in out.stdout and "Too many open files" in out.stdout, out.stdout
    assert "reply HTTP/1.0 200 OK" in out.stdout, out.stdout
