"""WireGuard peers as the metrics show them (pure): named by the plan, no key but the public one.

``peer`` is the VPNPeer name from the plan (matched by public key), else the public key itself. Peers the
plan configures but the device does not have are listed in ``missing``, so a missing peer is a row with
a value, not a hole. ``last_handshake`` stays None for a peer that never completed a handshake (the
UAPI says 0): the metric is then absent, never 0 (a 0 would read as "1970", i.e. infinitely stale).

Peers are held as columns (one sequence per field, same order), not one object per peer: at 10,000 peers
the collector and renderer then work with C-level ``zip``/``map`` instead of a Python loop per sample.
Byte counters are ints (netlink) or the decimal text the UAPI wrote (``exporter.uapifast``: digits only,
checked by its parser); the renderer writes both as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from gwkit.wireguard.model import DeviceState


@dataclass(frozen=True)
class Peers:
    """The peers on the device, column by column (all the same length)."""

    peer: Sequence[str] = ()
    public_key: Sequence[str] = ()
    endpoint: Sequence[str] = ()
    """"" when the device knows no endpoint yet."""
    rx_bytes: Sequence[int] | Sequence[str] = ()
    tx_bytes: Sequence[int] | Sequence[str] = ()
    handshakes: Sequence[int] = ()
    """Indices (into the columns above) of the peers that completed a handshake."""
    last_handshake: Sequence[float] = ()
    """Unix time of the latest handshake of each peer in ``handshakes``, same order."""

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


def missing_names(names: Mapping[str, str], present: AbstractSet[str]) -> tuple[str, ...]:
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
    shook = [i for i, p in enumerate(ps) if p.last_handshake]
    peers = Peers(
        peer=[names.get(k, k) for k in keys],
        public_key=keys,
        endpoint=[p.endpoint or "" for p in ps],
        rx_bytes=[p.rx_bytes for p in ps],
        tx_bytes=[p.tx_bytes for p in ps],
        handshakes=shook,
        last_handshake=[ps[i].last_handshake or 0.0 for i in shook],
    )
    return InterfaceView(interface, True, backend, state.listen_port, peers, missing_names(names, set(keys)))
