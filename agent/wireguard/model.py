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


@dataclass(frozen=True)
class DeviceState:
    listen_port: int = 0
    fwmark: int = 0
    has_private_key: bool = False
    public_key: str | None = None
    peers: tuple[PeerState, ...] = ()
    private_key: str | None = field(default=None, repr=False, compare=False)
