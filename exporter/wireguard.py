"""WireGuard peers as the metrics show them (pure): named by the plan, no key but the public one.

``peer`` is the VPNPeer name from the plan (matched by public key), else the public key itself. Peers the
plan configures but the device does not have are listed in ``missing``, so a missing peer is a row with
a value, not a hole. ``last_handshake`` stays None for a peer that never completed a handshake (the
UAPI says 0): the metric is then absent, never 0 (a 0 would read as "1970", i.e. infinitely stale).

Peers are held as columns (one sequence per field, same order), not one object per peer: at 10,000 peers
the collector and renderer then work with C-level ``zip``/``map`` instead of a Python loop per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.wireguard.model import DeviceState


@dataclass(frozen=True)
class Peers:
    """The peers on the device, column by column (all the same length)."""

    peer: Sequence[str] = ()
    public_key: Sequence[str] = ()
    endpoint: Sequence[str] = ()
    """"" when the device knows no endpoint yet."""
    rx_bytes: Sequence[int] = ()
    tx_bytes: Sequence[int] = ()
    last_handshake: Sequence[float | None] = ()

    def __len__(self) -> int:
        return len(self.public_key)


@dataclass(frozen=True)
class InterfaceView:
    interface: str
    up: bool
    backend: str = ""
    listen_port: int = 0
    peers: Peers = field(default_factory=Peers)
    missing: tuple[str, ...] = ()
    """Names of peers the plan configures that the device does not have (all of them when down)."""


def missing_names(names: Mapping[str, str], present: set[str] | frozenset[str]) -> tuple[str, ...]:
    return tuple(name for key, name in sorted(names.items()) if key not in present)


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
        return InterfaceView(interface, False, backend, 0, Peers(), missing_names(names, frozenset()))
    ps = state.peers
    keys = [p.public_key for p in ps]
    peers = Peers(
        peer=[names.get(k, k) for k in keys],
        public_key=keys,
        endpoint=[p.endpoint or "" for p in ps],
        rx_bytes=[p.rx_bytes for p in ps],
        tx_bytes=[p.tx_bytes for p in ps],
        last_handshake=[p.last_handshake if p.last_handshake else None for p in ps],
    )
    return InterfaceView(interface, True, backend, state.listen_port, peers, missing_names(names, set(keys)))
