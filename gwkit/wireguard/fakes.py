"""Fakes of the WireGuard boundaries, next to the Protocols they stand in for (STYLE 7).

* ``FakeDevice``: a ``WireGuardBackend`` holding a device in memory with WireGuard's set semantics
  (remove, update_only, replace_allowed_ips, zero preshared key clears), and fault switches (daemon down,
  daemon restarted, request rejected).
* ``FakeNetDev``: a ``NetDev`` that records the address/route configuration it was asked for.
* ``FakeKernelWireGuard``: pyroute2's real ``AsyncWireGuard`` with only its socket replaced. Requests are
  encoded by pyroute2 itself and decoded back with pyroute2's ``wgmsg``, then applied with the kernel
  module's semantics (drivers/net/wireguard/netlink.c); dumps are encoded as ``wgmsg`` replies, split over
  several messages like the kernel does for big devices, and decoded by pyroute2. It exists because this
  machine's kernel has no WireGuard module: the netlink backend is tested at the pyroute2 boundary only.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyroute2 import AsyncWireGuard
from pyroute2.netlink import nlmsgerr
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic.wireguard import (
    WGPEER_F_REMOVE_ME,
    WGPEER_F_REPLACE_ALLOWEDIPS,
    WGPEER_F_UPDATE_ONLY,
    wgmsg,
)

from gwkit.wireguard.backend import ApplyRejected, DeviceUnavailable, LinkControl, WireGuardBackend
from gwkit.wireguard.model import ZERO_KEY, DeviceState, DeviceUpdate, PeerState
from gwkit.wireguard.netdev import NetDev, NetDevError

# --- an in-memory device --------------------------------------------------------------------------


def _norm(cidr: str) -> str:
    return str(ipaddress.ip_network(cidr, strict=False))


@dataclass
class FakeDevice:
    """``WireGuardBackend`` in memory. ``up=False``: the daemon is gone (DeviceUnavailable)."""

    name: str = "fake"
    interface: str = "wg0"
    up: bool = True
    reject: str | None = None
    """When set, ``apply`` raises ApplyRejected with this message."""
    listen_port: int = 0
    fwmark: int = 0
    private_key: str | None = field(default=None, repr=False)
    peers: dict[str, PeerState] = field(default_factory=dict)
    applied: list[DeviceUpdate] = field(default_factory=list)
    gets: int = 0
    closed: bool = False

    def restart(self) -> None:
        """The daemon came back empty (as wireguard-go after a crash)."""
        self.up = True
        self.listen_port, self.fwmark, self.private_key, self.peers = 0, 0, None, {}

    def handshake(self, public_key: str, when: float, rx: int = 0, tx: int = 0) -> None:
        p = self.peers[public_key]
        self.peers[public_key] = replace(
            p, last_handshake=when, rx_bytes=p.rx_bytes + rx, tx_bytes=p.tx_bytes + tx
        )

    def _check(self, interface: str) -> None:
        if not self.up or interface != self.interface:
            raise DeviceUnavailable(f"{interface} (fake): no such device")

    async def ensure_device(self, interface: str) -> None:
        self._check(interface)

    async def get(self, interface: str) -> DeviceState:
        self._check(interface)
        self.gets += 1
        return DeviceState(
            listen_port=self.listen_port,
            fwmark=self.fwmark,
            has_private_key=self.private_key is not None,
            peers=tuple(self.peers.values()),
            private_key=self.private_key,
        )

    async def apply(self, interface: str, update: DeviceUpdate) -> None:
        self._check(interface)
        if self.reject:
            raise ApplyRejected(self.reject)
        self.applied.append(update)
        if update.private_key is not None:
            self.private_key = update.private_key
        if update.listen_port is not None:
            self.listen_port = update.listen_port
        if update.fwmark is not None:
            self.fwmark = update.fwmark
        for u in update.peers:
            have = self.peers.get(u.public_key)
            if u.remove:
                self.peers.pop(u.public_key, None)
                continue
            if have is None:
                if not u.new:  # update_only on a missing peer: ignored, as WireGuard does
                    continue
                have = PeerState(public_key=u.public_key)
            if u.preshared_key is not None:
                psk = None if u.preshared_key == ZERO_KEY else u.preshared_key
                have = replace(have, preshared_key=psk, has_preshared_key=psk is not None)
            if u.endpoint is not None:
                have = replace(have, endpoint=u.endpoint)
            if u.persistent_keepalive is not None:
                have = replace(have, persistent_keepalive=u.persistent_keepalive)
            if u.allowed_ips is not None:
                have = replace(have, allowed_ips=tuple(_norm(a) for a in u.allowed_ips))
            self.peers[u.public_key] = have

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class FakeNetDev:
    """``NetDev`` that remembers what it was told; ``fail`` makes it raise NetDevError."""

    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    routes: tuple[str, ...] = ()
    fail: str | None = None
    up: bool | None = None
    """The link state last asked for."""

    async def configure(
        self, interface: str, address: str, routes: tuple[str, ...], *, up: bool = True
    ) -> tuple[int, int]:
        if self.fail:
            raise NetDevError(self.fail)
        self.up = up
        if not up:
            routes = ()  # the kernel drops a down device's routes
        self.calls.append((interface, address, routes))
        added, removed = len(set(routes) - set(self.routes)), len(set(self.routes) - set(routes))
        self.routes = routes
        return added, removed


# --- pyroute2 with its socket replaced ----------------------------------------------------------------


@dataclass
class KernelPeer:
    public_key: str
    preshared_key: str = ZERO_KEY
    endpoint: tuple[str, int] | None = None
    keepalive: int = 0
    allowed: list[str] = field(default_factory=list)
    handshake: tuple[int, int] = (0, 0)
    rx: int = 0
    tx: int = 0


class FakeKernelWireGuard(AsyncWireGuard):  # type: ignore[misc]
    """pyroute2's AsyncWireGuard talking to an in-memory kernel module instead of a socket."""

    def __init__(self, *, interfaces: tuple[str, ...] = ("wg0",), per_message: int = 2) -> None:
        super().__init__()
        self.devices: dict[str, dict[str, Any]] = {
            name: {"private_key": ZERO_KEY, "listen_port": 0, "peers": {}} for name in interfaces
        }
        self.per_message = per_message
        """Peers per dump message (the kernel splits big devices; small here to exercise merging)."""
        self.requests: list[wgmsg] = []
        self._error: int | None = None
        self.closed = False

    @property
    def prid(self) -> int:
        return 0x20

    def close(self) -> None:
        self.closed = True

    # The request path: pyroute2 encodes, we decode with pyroute2 and apply kernel semantics.
    def sendto(self, data: bytes, addr: Any) -> None:
        msg = wgmsg(data)
        msg.decode()
        self.requests.append(msg)
        self._error = self._apply(msg)

    async def get(self, *argv: Any, **kwarg: Any) -> AsyncIterator[Any]:
        ack = nlmsgerr()
        ack["header"]["error"] = NetlinkError(self._error) if self._error else None
        yield ack

    def _apply(self, msg: wgmsg) -> int | None:
        dev = self.devices.get(msg.get_attr("WGDEVICE_A_IFNAME"))
        if dev is None:
            return 19  # ENODEV
        if (k := msg.get_attr("WGDEVICE_A_PRIVATE_KEY")) is not None:
            dev["private_key"] = k.decode() if isinstance(k, bytes) else k
        if (port := msg.get_attr("WGDEVICE_A_LISTEN_PORT")) is not None:
            dev["listen_port"] = port
        if (mark := msg.get_attr("WGDEVICE_A_FWMARK")) is not None:
            dev["fwmark"] = mark
        peers: dict[str, KernelPeer] = dev["peers"]
        for p in msg.get_attr("WGDEVICE_A_PEERS") or ():
            key = p.get_attr("WGPEER_A_PUBLIC_KEY").decode()
            flags = p.get_attr("WGPEER_A_FLAGS") or 0
            if flags & WGPEER_F_REMOVE_ME:
                peers.pop(key, None)
                continue
            peer = peers.get(key)
            if peer is None:
                if flags & WGPEER_F_UPDATE_ONLY:
                    continue
                peer = peers[key] = KernelPeer(key)
            if (psk := p.get_attr("WGPEER_A_PRESHARED_KEY")) is not None:
                peer.preshared_key = psk.decode()
            if (ep := p.get_attr("WGPEER_A_ENDPOINT")) is not None:
                peer.endpoint = (ep["addr"], ep["port"])
            if (ka := p.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL")) is not None:
                peer.keepalive = ka
            if flags & WGPEER_F_REPLACE_ALLOWEDIPS:
                peer.allowed = []
            for a in p.get_attr("WGPEER_A_ALLOWEDIPS") or ():
                cidr = _norm(a["addr"])
                for other in peers.values():  # an allowed IP belongs to one peer: the last writer's
                    if cidr in other.allowed:
                        other.allowed.remove(cidr)
                peer.allowed.append(cidr)
        return None

    # The dump path: we encode wgmsg replies, pyroute2 decodes them.
    async def info(self, interface: str) -> AsyncIterator[Any]:
        dev = self.devices.get(interface)
        if dev is None:
            raise NetlinkError(19, "No such device")
        return self._dump(interface, dev)

    async def _dump(self, interface: str, dev: dict[str, Any]) -> AsyncIterator[Any]:
        peers = list(dev["peers"].values())
        chunks = [peers[i : i + self.per_message] for i in range(0, len(peers), self.per_message)] or [[]]
        for n, chunk in enumerate(chunks):
            msg = wgmsg()
            msg["cmd"] = 0
            msg["version"] = 1
            msg["attrs"] = [
                ["WGDEVICE_A_IFINDEX", 7],
                ["WGDEVICE_A_IFNAME", interface],
                ["WGDEVICE_A_PRIVATE_KEY", dev["private_key"]],
                ["WGDEVICE_A_LISTEN_PORT", dev["listen_port"]],
                ["WGDEVICE_A_FWMARK", dev.get("fwmark", 0)],
            ]
            if chunk:
                msg["attrs"].append(["WGDEVICE_A_PEERS", [self._peer_attrs(p, n) for p in chunk]])
            msg.encode()
            out = wgmsg(msg.data)
            out.decode()
            yield out
            # A peer with many allowed IPs continues in the next message under the same public key.
            for p in chunk:
                if len(p.allowed) > 2:
                    more = wgmsg()
                    more["cmd"] = 0
                    more["version"] = 1
                    rest = [{"attrs": _allowed_attrs(a)} for a in p.allowed[2:]]
                    cont_peer = {
                        "attrs": [["WGPEER_A_PUBLIC_KEY", p.public_key], ["WGPEER_A_ALLOWEDIPS", rest]]
                    }
                    more["attrs"] = [["WGDEVICE_A_IFNAME", interface], ["WGDEVICE_A_PEERS", [cont_peer]]]
                    more.encode()
                    cont = wgmsg(more.data)
                    cont.decode()
                    yield cont

    @staticmethod
    def _peer_attrs(p: KernelPeer, n: int) -> dict[str, Any]:
        attrs: list[list[Any]] = [
            ["WGPEER_A_PUBLIC_KEY", p.public_key],
            ["WGPEER_A_PRESHARED_KEY", p.preshared_key],
            ["WGPEER_A_LAST_HANDSHAKE_TIME", {"tv_sec": p.handshake[0], "tv_nsec": p.handshake[1]}],
            ["WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", p.keepalive],
            ["WGPEER_A_RX_BYTES", p.rx],
            ["WGPEER_A_TX_BYTES", p.tx],
            ["WGPEER_A_PROTOCOL_VERSION", 1],
        ]
        if p.endpoint is not None:
            attrs.append(["WGPEER_A_ENDPOINT", {"addr": p.endpoint[0], "port": p.endpoint[1]}])
        attrs.append(["WGPEER_A_ALLOWEDIPS", [{"attrs": _allowed_attrs(a)} for a in p.allowed[:2]]])
        return {"attrs": attrs}


def _allowed_attrs(cidr: str) -> list[list[Any]]:
    net = ipaddress.ip_network(cidr)
    family = socket.AF_INET if net.version == 4 else socket.AF_INET6
    return [
        ["WGALLOWEDIP_A_FAMILY", family],
        ["WGALLOWEDIP_A_IPADDR", net.network_address.packed],
        ["WGALLOWEDIP_A_CIDR_MASK", net.prefixlen],
    ]


@dataclass
class FakeLinks:
    """``LinkControl`` for the kernel backend: which links exist, and which were created."""

    existing: set[str] = field(default_factory=set)
    created: list[str] = field(default_factory=list)
    kernel: FakeKernelWireGuard | None = None

    async def exists(self, interface: str) -> bool:
        return interface in self.existing

    async def create_wireguard(self, interface: str) -> None:
        self.existing.add(interface)
        self.created.append(interface)
        if self.kernel is not None:
            self.kernel.devices[interface] = {"private_key": ZERO_KEY, "listen_port": 0, "peers": {}}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_conforms_backend: WireGuardBackend = FakeDevice()
_conforms_netdev: NetDev = FakeNetDev()
_conforms_links: LinkControl = FakeLinks()
