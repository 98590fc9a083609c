"""The backends at their boundaries.

NETLINK: here at the pyroute2 boundary: ``FakeKernelWireGuard`` is pyroute2's real ``AsyncWireGuard`` with
its socket replaced by an in-memory model of the kernel module. Requests are encoded by pyroute2 and
decoded with pyroute2's ``wgmsg``; dumps are ``wgmsg`` replies decoded by pyroute2 (split over several
messages, as the kernel does). The real kernel's answers: tests/integration/test_kernel_vm.py runs
``NetlinkBackend.open()`` and the agent against the module in Debian's kernel (a VM; this machine's kernel
may have no WireGuard module, so nothing here depends on whether it has one).
UAPI: against a missing socket here; the live wireguard-go cases are in tests/integration.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from agent.wireguard.diff import diff
from gwkit.wireguard.backend import (
    ApplyRejected,
    BackendUnavailable,
    DeviceUnavailable,
    NetlinkBackend,
    UapiBackend,
    WireGuardBackend,
    detect,
)
from gwkit.wireguard.fakes import FakeDevice, FakeKernelWireGuard, FakeLinks
from gwkit.wireguard.model import DesiredDevice, DesiredPeer, DeviceUpdate, PeerUpdate

pytestmark = pytest.mark.anyio


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


PRIV, A, B, C, PSK = key(), key(), key(), key(), key()
WANT = DesiredDevice(
    PRIV,
    51820,
    (
        DesiredPeer(
            A,
            ("10.99.0.2/32", "203.0.113.0/28", "198.19.1.16/28", "198.19.1.32/28"),
            "198.51.100.2:51820",
            PSK,
            25,
        ),
        DesiredPeer(B, ("10.99.0.3/32",)),
        DesiredPeer(C, ("10.99.0.4/32",), "[fd00::4]:51820"),
    ),
)


def netlink() -> tuple[NetlinkBackend, FakeKernelWireGuard]:
    kernel = FakeKernelWireGuard(per_message=2)
    return NetlinkBackend(kernel, FakeLinks({"wg0"}, kernel=kernel)), kernel


async def test_netlink_apply_then_get_round_trips_through_pyroute2() -> None:
    backend, kernel = netlink()
    await backend.apply("wg0", diff(WANT, await backend.get("wg0")))
    state = await backend.get("wg0")
    assert diff(WANT, state).empty  # everything landed, including the peer split over two messages
    assert state.listen_port == 51820 and state.private_key == PRIV
    a = {p.public_key: p for p in state.peers}[A]
    assert a.preshared_key == PSK and a.endpoint == "198.51.100.2:51820" and a.persistent_keepalive == 25
    assert {p.public_key: p for p in state.peers}[C].endpoint == "[fd00::4]:51820"
    # one set() per peer (pyroute2 takes one peer per call), the device fields in their own call first
    assert len(kernel.requests) == 4
    assert kernel.requests[0].get_attr("WGDEVICE_A_LISTEN_PORT") == 51820


async def test_netlink_unchanged_peer_is_not_in_any_request_and_keeps_its_counters() -> None:
    backend, kernel = netlink()
    await backend.apply("wg0", diff(WANT, await backend.get("wg0")))
    peer_a = kernel.devices["wg0"]["peers"][A]
    peer_a.handshake, peer_a.rx, peer_a.tx = (1_800_000_000, 5), 1234, 5678
    kernel.requests.clear()
    reload = DesiredDevice(PRIV, 51820, (WANT.peers[0], DesiredPeer(B, ("10.99.0.3/32", "198.19.2.0/28"))))
    update = diff(reload, await backend.get("wg0"))
    assert update.peers == (
        PeerUpdate(C, remove=True),
        PeerUpdate(B, allowed_ips=("10.99.0.3/32", "198.19.2.0/28")),
    )
    await backend.apply("wg0", update)
    touched = {
        p.get_attr("WGPEER_A_PUBLIC_KEY").decode()
        for m in kernel.requests
        for p in m.get_attr("WGDEVICE_A_PEERS")
    }
    assert touched == {B, C}
    flags = {
        p.get_attr("WGPEER_A_PUBLIC_KEY").decode(): p.get_attr("WGPEER_A_FLAGS")
        for m in kernel.requests
        for p in m.get_attr("WGDEVICE_A_PEERS")
    }
    assert flags[C] == 0x1 and flags[B] == 0x2 | 0x4  # REMOVE_ME; REPLACE_ALLOWEDIPS | UPDATE_ONLY
    a = {p.public_key: p for p in (await backend.get("wg0")).peers}[A]
    assert a.last_handshake == pytest.approx(1_800_000_000.000000005) and (a.rx_bytes, a.tx_bytes) == (
        1234,
        5678,
    )


async def test_netlink_creates_a_missing_device() -> None:
    kernel = FakeKernelWireGuard(interfaces=())
    links = FakeLinks(kernel=kernel)
    backend = NetlinkBackend(kernel, links)
    with pytest.raises(DeviceUnavailable, match="ENODEV"):
        await backend.get("wg0")
    await backend.ensure_device("wg0")
    await backend.ensure_device("wg0")
    assert links.created == ["wg0"]
    assert (await backend.get("wg0")).peers == ()


async def test_netlink_errors_are_translated_without_keys() -> None:
    backend, _ = netlink()
    with pytest.raises(DeviceUnavailable, match=r"wg1 \(netlink\): set: ENODEV"):
        await backend.apply("wg1", DeviceUpdate(listen_port=1))
    with pytest.raises(ApplyRejected, match=r"expected address:port with an IP address") as exc:
        await backend.apply(
            "wg0", DeviceUpdate(peers=(PeerUpdate(A, new=True, endpoint="vpn.example.net:1"),))
        )
    assert A not in str(exc.value)


async def test_netlink_close_closes_the_pyroute2_socket() -> None:
    backend, kernel = netlink()
    await backend.aclose()
    assert kernel.closed


async def test_uapi_missing_socket_is_device_unavailable(tmp_path: Path) -> None:
    backend = UapiBackend(tmp_path)
    with pytest.raises(DeviceUnavailable, match=r"wg0 \(uapi\):"):
        await backend.get("wg0")
    with pytest.raises(DeviceUnavailable):
        await backend.ensure_device("wg0")
    with pytest.raises(DeviceUnavailable):
        await backend.apply("wg0", DeviceUpdate(listen_port=1))
    await backend.apply("wg0", DeviceUpdate())  # nothing to do: no I/O at all


async def test_detect_prefers_a_present_uapi_socket(tmp_path: Path) -> None:
    (tmp_path / "wg0.sock").touch()

    async def must_not_open() -> WireGuardBackend:
        raise AssertionError("netlink must not be tried when the UAPI socket exists")

    backend = await detect("wg0", tmp_path, open_netlink=must_not_open)
    assert isinstance(backend, UapiBackend) and backend.socket("wg0") == tmp_path / "wg0.sock"


async def test_detect_falls_back_to_netlink_then_to_an_explicit_uapi_dir(tmp_path: Path) -> None:
    fake = FakeDevice(name="netlink")

    async def kernel() -> WireGuardBackend:
        return fake

    async def no_module() -> WireGuardBackend:
        raise BackendUnavailable("no wireguard module")

    assert await detect("wg0", tmp_path, open_netlink=kernel) is fake
    waiting = await detect("wg0", tmp_path, open_netlink=no_module)
    assert isinstance(waiting, UapiBackend)  # the daemon may still be starting: keep trying its socket
    with pytest.raises(
        BackendUnavailable, match="no UAPI socket in /var/run/wireguard and no wireguard module"
    ):
        await detect("wg-none", None, open_netlink=no_module)
