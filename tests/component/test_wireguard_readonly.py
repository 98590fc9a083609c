"""The read-only UAPI socket (agent.wireguard.readonly) over a real UNIX socket, the device behind it a
fake: pyroute2's real AsyncWireGuard over the in-memory kernel model (the netlink backend, which this
machine's kernel cannot run) or FakeDevice. The exporter's own WireGuardSource reads it. Live
wireguard-go behind it, and the exporter as an unprivileged process: tests/integration/
test_exporter_readonly.py."""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import time
from pathlib import Path

import anyio
import anyio.abc
import pytest

from agent.wireguard.diff import diff
from agent.wireguard.readonly import BackendText, DeviceText, Limits, ReadOnlyServer, serve
from exporter.collector import Snapshot, WireGuardSnapshot, families
from exporter.family import Renderer
from exporter.sources import WireGuardSource
from gwkit.wireguard.backend import NetlinkBackend, WireGuardBackend
from gwkit.wireguard.fakes import FakeDevice, FakeKernelWireGuard, FakeLinks
from gwkit.wireguard.model import DesiredDevice, DesiredPeer, PeerState
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


PRIV, A, B, PSK = key(), key(), key(), key()
WANT = DesiredDevice(
    PRIV,
    51820,
    (
        DesiredPeer(A, ("10.99.0.2/32", "203.0.113.0/28"), "198.51.100.2:51820", PSK, 25),
        DesiredPeer(B, ("10.99.0.3/32",)),
    ),
)
SECRETS = (PRIV, PSK, base64.b64decode(PRIV).hex(), base64.b64decode(PSK).hex())


async def kernel_device() -> tuple[NetlinkBackend, FakeKernelWireGuard]:
    kernel = FakeKernelWireGuard(per_message=2)
    backend = NetlinkBackend(kernel, FakeLinks({"wg0"}, kernel=kernel))
    await backend.apply("wg0", diff(WANT, await backend.get("wg0")))
    alice = kernel.devices["wg0"]["peers"][A]
    alice.handshake, alice.rx, alice.tx = (1_790_000_000, 250_000_000), 10**12, 92
    return backend, kernel


async def start(
    tg: anyio.abc.TaskGroup, directory: Path, backend: WireGuardBackend, limits: Limits | None = None
) -> ReadOnlyServer:
    async def open_device(interface: str) -> DeviceText:
        return BackendText(backend)

    server = ReadOnlyServer("wg0", open_device, limits)
    listener = await anyio.create_unix_listener(directory / "wg0.sock")
    tg.start_soon(server.serve, listener)
    return server


async def exchange(path: Path, request: bytes, timeout: float = 5.0) -> bytes:
    data = b""
    with anyio.fail_after(timeout):
        async with await anyio.connect_unix(str(path)) as s:
            await s.send(request)
            try:
                while True:
                    data += await s.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return data


async def serving(path: Path) -> bytes:
    """The reply to a get once ``path`` accepts connections (it exists a moment before it listens)."""

    async def answered() -> tuple[bytes]:  # a 1-tuple: an empty reply (b"") is an answer too
        return (await exchange(path, b"get=1\n\n"),)

    (reply,) = await wait_for_async(
        answered, 5, f"{path} to accept connections and answer a get", interval=0.01, ignoring=(OSError,)
    )
    return reply


def metrics(snap: WireGuardSnapshot) -> bytes:
    """The exporter's text, with what may differ between two ways of reading taken out (the scrape's
    duration, the backend label)."""
    views = tuple(dataclasses.replace(v, backend="-") for v in snap.interfaces)
    return Renderer().render(families(Snapshot(wireguard=WireGuardSnapshot(0.0, views))))


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path


async def test_the_exporter_reads_every_metric_through_it_and_never_a_key(directory: Path) -> None:
    backend, _ = await kernel_device()
    names = {"wg0": {A: "alice", B: "bob", key(): "absent"}}
    async with anyio.create_task_group() as tg:
        await start(tg, directory, backend)
        raw = (await exchange(directory / "wg0.sock", b"get=1\n\n")).decode()
        via_agent = await WireGuardSource(directory).scrape(5, ["wg0"], names)

        async def same(interface: str, uapi_dir: Path | None) -> WireGuardBackend:
            return backend

        direct = await WireGuardSource(detect_backend=same).scrape(5, ["wg0"], names)
        tg.cancel_scope.cancel()
    assert raw.endswith("errno=0\n\n") and "public_key=" in raw
    for secret in SECRETS:
        assert secret not in raw
    assert "private_key" not in raw and "preshared_key" not in raw
    assert via_agent.interfaces[0].backend == "uapi" and direct.interfaces[0].backend == "netlink"
    body = metrics(via_agent)
    assert body == metrics(direct)
    for series in (
        b'wireguard_up{interface="wg0"} 1',
        b'wireguard_peer_receive_bytes_total{interface="wg0",peer="alice"} 1000000000000',
        b'wireguard_peer_last_handshake_timestamp_seconds{interface="wg0",peer="alice"} 1790000000.25',
        b'wireguard_peer_present{interface="wg0",peer="absent"} 0',
        b'endpoint="198.51.100.2:51820"} 1',
    ):
        assert series in body, series


async def test_set_is_refused_and_the_device_is_untouched(directory: Path) -> None:
    backend, kernel = await kernel_device()
    before = await backend.get("wg0")
    requests = len(kernel.requests)
    async with anyio.create_task_group() as tg:
        await start(tg, directory, backend)
        for request in (
            f"set=1\npublic_key={base64.b64decode(A).hex()}\nremove=true\n\n".encode(),
            b"set=1\nlisten_port=1\n\n",
            b"set=1\n" + b"x" * 200_000,  # over the read limit: refused all the same
        ):
            assert await exchange(directory / "wg0.sock", request) == b"errno=1\n\n"
        tg.cancel_scope.cancel()
    after = await backend.get("wg0")
    assert after == before and len(kernel.requests) == requests, "nothing reached the device"


@pytest.mark.parametrize("request_", [b"bogus=1\n\n", b"private_key=00\n\n", b"\n\n", b"GET=1\n\n"])
async def test_anything_else_is_closed_without_a_reply(directory: Path, request_: bytes) -> None:
    device = FakeDevice(private_key=PRIV)
    async with anyio.create_task_group() as tg:
        await start(tg, directory, device)
        assert await exchange(directory / "wg0.sock", request_) == b""
        tg.cancel_scope.cancel()
    assert device.gets == 0


async def test_a_device_that_does_not_answer_closes_the_connection_and_comes_back(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "agent.wireguard.readonly")
    device = FakeDevice(private_key=PRIV, up=False)
    async with anyio.create_task_group() as tg:
        await start(tg, directory, device)
        assert await exchange(directory / "wg0.sock", b"get=1\n\n") == b""
        snap = await WireGuardSource(directory).scrape(5, ["wg0"], {})
        assert not snap.interfaces[0].up
        device.up = True
        assert (await exchange(directory / "wg0.sock", b"get=1\n\n")).endswith(b"errno=0\n\n")
        tg.cancel_scope.cancel()
    text = caplog.text
    assert text.count("wireguard.readonly.device_down") == 1 and "wireguard.readonly.device_up" in text


@pytest.mark.parametrize("limits", [Limits(request_timeout=0.3)])
async def test_a_client_that_sends_no_whole_line_is_cut_off(directory: Path, limits: Limits) -> None:
    async with anyio.create_task_group() as tg:
        await start(tg, directory, FakeDevice(private_key=PRIV), limits)
        t0 = time.monotonic()
        assert await exchange(directory / "wg0.sock", b"get=") == b""
        assert 0.2 < time.monotonic() - t0 < 2
        tg.cancel_scope.cancel()


async def test_one_client_over_the_cap_is_closed_at_once_and_a_stuck_one_holds_no_one_else(
    directory: Path,
) -> None:
    device = FakeDevice(private_key=PRIV)
    for i in range(20_000):  # a reply of a few MB, more than a socket buffer holds
        k = base64.b64encode(i.to_bytes(32, "big")).decode()
        device.peers[k] = PeerState(public_key=k, endpoint="192.0.2.1:1", allowed_ips=("10.0.0.1/32",))
    async with anyio.create_task_group() as tg:
        server = await start(tg, directory, device, Limits(max_clients=2, send_timeout=0.5))
        stuck = await anyio.connect_unix(str(directory / "wg0.sock"))
        await stuck.send(b"get=1\n\n")  # never read: the server's write stalls, then times out
        idle = await anyio.connect_unix(str(directory / "wg0.sock"))  # sends nothing
        with anyio.fail_after(5):
            await wait_for_async(lambda: server.clients >= 2, 10, "the server to take both", 0.01)
        assert await exchange(directory / "wg0.sock", b"get=1\n\n") == b"", "over the cap: closed"
        with anyio.fail_after(5):  # the idle one after request_timeout, the stuck one after send_timeout
            await wait_for_async(lambda: not server.clients, 10, "the server to drop both", 0.05)
        reply = await exchange(directory / "wg0.sock", b"get=1\n\n")
        assert reply.endswith(b"errno=0\n\n") and reply.count(b"public_key=") == 20_000
        await stuck.aclose()
        await idle.aclose()
        tg.cancel_scope.cancel()


async def test_the_socket_follows_the_interface_the_plan_names(directory: Path) -> None:
    device = FakeDevice(interface="wg1", private_key=PRIV)

    async def open_device(interface: str) -> DeviceText:
        return BackendText(device)

    send, receive = anyio.create_memory_object_stream[str](10)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, directory, receive, open_device)
        await send.send("wg0")
        assert await serving(directory / "wg0.sock") == b"", "wg0 is not the device's name: no reply"
        await send.send("wg1")
        assert (await serving(directory / "wg1.sock")).endswith(b"errno=0\n\n")
        with pytest.raises(OSError):
            await exchange(directory / "wg0.sock", b"get=1\n\n")  # the old one no longer listens
        tg.cancel_scope.cancel()
