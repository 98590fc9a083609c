"""What a WireGuard device reports and what we ask of it; backend-neutral, pure.

Keys are handled as base64 text (as ``wg`` and the CRs spell them); the UAPI speaks hex, the netlink
backend bytes; each backend converts at its edge. ``Device.private_key`` is a secret: it is excluded
from ``repr`` so it cannot reach a log line or an exception by accident.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field


class KeyError_(ValueError):
    """Not a WireGuard key (32 bytes, base64). The message never contains the value."""


def key_from_b64(text: str, what: str = "key") -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyError_(f"{what}: not valid base64") from exc
    if len(raw) != 32:
        raise KeyError_(f"{what}: must decode to 32 bytes, got {len(raw)}")
    return raw


def clamped(private_b64: str | None) -> str | None:
    """The Curve25519-clamped form of a private key. Both the kernel and wireguard-go clamp what they are
    given and report the clamped key, so comparisons must clamp too (``wg genkey`` output already is)."""
    if private_b64 is None:
        return None
    try:
        raw = bytearray(key_from_b64(private_b64))
    except KeyError_:
        return private_b64
    raw[0] &= 248
    raw[31] = (raw[31] & 127) | 64
    return base64.b64encode(bytes(raw)).decode()


def b64_from_hex(hexkey: str) -> str:
    return base64.b64encode(bytes.fromhex(hexkey)).decode()


def hex_from_b64(b64key: str, what: str = "key") -> str:
    return key_from_b64(b64key, what).hex()


@dataclass(frozen=True)
class PeerState:
    public_key: str
    endpoint: str | None = None
    allowed_ips: tuple[str, ...] = ()
    last_handshake: float | None = None
    """Unix time of the latest handshake; None if there never was one (the UAPI reports 0)."""
    rx_bytes: int = 0
    tx_bytes: int = 0
    persistent_keepalive: int = 0
    has_preshared_key: bool = False
    preshared_key: str | None = field(default=None, repr=False, compare=False)
    """Base64 preshared key as the device reports it (a secret: kept out of repr, compared by diff only)."""


@dataclass(frozen=True)
class DeviceState:
    listen_port: int = 0
    fwmark: int = 0
    has_private_key: bool = False
    public_key: str | None = None
    peers: tuple[PeerState, ...] = ()
    private_key: str | None = field(default=None, repr=False, compare=False)


ZERO_KEY = base64.b64encode(bytes(32)).decode()
"""Setting a peer's preshared key to 32 zero bytes removes it (kernel and userspace implementations)."""


@dataclass(frozen=True)
class DesiredPeer:
    """A peer as the plan wants it, secrets resolved, endpoint resolved to ``ip:port`` (or None)."""

    public_key: str
    allowed_ips: tuple[str, ...] = ()
    endpoint: str | None = None
    """``ip:port`` (``[ip]:port`` for IPv6); None: the peer roams, whatever the device learnt stays."""
    preshared_key: str | None = field(default=None, repr=False)
    persistent_keepalive: int = 0


@dataclass(frozen=True)
class DesiredDevice:
    private_key: str = field(repr=False)
    listen_port: int
    peers: tuple[DesiredPeer, ...] = ()
    fwmark: int = 0
    """The mark on the device's own (encapsulated) packets; 0: none. In a gateway pod the plan's NIC2 reply
    mark, so that init-nat's fwmark rules route handshakes and data to peers out through NIC2, not eth0."""

    def __repr__(self) -> str:  # the private key must never reach a log line
        return (
            f"DesiredDevice(listen_port={self.listen_port}, fwmark={self.fwmark:#x}, peers={len(self.peers)})"
        )


@dataclass(frozen=True)
class PeerUpdate:
    """One peer operation. ``remove`` alone, or the fields to set (None: leave as the device has it)."""

    public_key: str
    remove: bool = False
    endpoint: str | None = None
    preshared_key: str | None = field(default=None, repr=False)
    """Base64; ``ZERO_KEY`` clears it."""
    persistent_keepalive: int | None = None
    allowed_ips: tuple[str, ...] | None = None
    """Replace the peer's allowed IPs with exactly these."""
    new: bool = False
    """The peer is not on the device yet."""


@dataclass(frozen=True)
class DeviceUpdate:
    """The minimal change that turns the device's state into the desired one."""

    private_key: str | None = field(default=None, repr=False)
    listen_port: int | None = None
    peers: tuple[PeerUpdate, ...] = ()
    fwmark: int | None = None

    @property
    def empty(self) -> bool:
        return (
            self.private_key is None and self.listen_port is None and self.fwmark is None and not self.peers
        )

    def summary(self) -> str:
        """Counts only (safe to log)."""
        added = sum(1 for p in self.peers if p.new)
        removed = sum(1 for p in self.peers if p.remove)
        return (
            f"private_key_changed={self.private_key is not None} listen_port={self.listen_port} "
            f"fwmark={'-' if self.fwmark is None else hex(self.fwmark)} "
            f"added={added} updated={len(self.peers) - added - removed} removed={removed}"
        )
