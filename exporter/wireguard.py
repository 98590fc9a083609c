"""WireGuard peers as the metrics show them (pure): named by the plan, no key but the public one.

``peer`` is the VPNPeer name from the plan (matched by public key), else the public key itself. Peers the
plan configures but the device does not have appear with ``present`` False, so a missing peer is a row
with a value, not a hole. ``last_handshake`` stays None for a peer that never completed a handshake (the
UAPI says 0): the metric is then absent, never 0 (a 0 would read as "1970", i.e. infinitely stale).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from agent.wireguard.model import DeviceState


class PeerView(NamedTuple):
    """A NamedTuple, not a frozen dataclass: 10,000 of these per scrape, and a frozen dataclass's
    ``__init__`` (``object.__setattr__`` per field) measured several times slower."""

    peer: str
    public_key: str
    present: bool
    endpoint: str = ""
    rx_bytes: int = 0
    tx_bytes: int = 0
    last_handshake: float | None = None


@dataclass(frozen=True)
class InterfaceView:
    interface: str
    up: bool
    backend: str = ""
    listen_port: int = 0
    peers: tuple[PeerView, ...] = ()


def interface_view(
    interface: str,
    state: DeviceState | None,
    names: Mapping[str, str],
    *,
    backend: str = "",
) -> InterfaceView:
    """``names``: public key (base64) -> VPNPeer name, for the peers the plan configures on this
    interface. ``state`` None: the device did not answer this scrape."""
    if state is None:
        configured = tuple(PeerView(peer=n, public_key=k, present=False) for k, n in sorted(names.items()))
        return InterfaceView(interface, False, backend, 0, configured)
    seen: set[str] = set()
    peers: list[PeerView] = []
    for p in state.peers:
        seen.add(p.public_key)
        peers.append(
            PeerView(
                peer=names.get(p.public_key, p.public_key),
                public_key=p.public_key,
                present=True,
                endpoint=p.endpoint or "",
                rx_bytes=p.rx_bytes,
                tx_bytes=p.tx_bytes,
                last_handshake=p.last_handshake if p.last_handshake else None,
            )
        )
    for key, name in sorted(names.items()):
        if key not in seen:
            peers.append(PeerView(peer=name, public_key=key, present=False))
    return InterfaceView(interface, True, backend, state.listen_port, tuple(peers))
