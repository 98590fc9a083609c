"""Two ways to read and program a WireGuard device, behind one small interface.

* ``UapiBackend``: the cross-platform userspace API socket ``<uapi_dir>/<interface>.sock`` of
  wireguard-go or boringtun (text, hex keys; see ``uapi.py``).
* ``NetlinkBackend``: the kernel module's generic netlink family through pyroute2's ``AsyncWireGuard``
  (base64 keys, one peer per ``set()`` call). This machine's kernel has NO WireGuard module, so here the
  netlink backend is exercised only at the pyroute2 boundary, against a fake of pyroute2's object
  (tests/component/test_wireguard_backend.py); the real pyroute2 raises ``NetlinkError(2)`` when it looks
  up the family, which ``NetlinkBackend.open`` translates into ``BackendUnavailable``.

``detect`` picks one: a UAPI socket present -> UAPI; else the kernel family -> netlink; else (neither
yet) the UAPI backend when a UAPI directory was given explicitly (the daemon may still be starting),
otherwise ``BackendUnavailable``.

Errors are translated here, once: ``DeviceUnavailable`` (daemon or device gone: reconnect and re-apply
later) and ``ApplyRejected`` (the device refused the request: retrying the same input will not help).
No message ever contains a key.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from pyroute2 import AsyncWireGuard
from pyroute2.netlink.exceptions import NetlinkError

from gwkit.wireguard import uapi
from gwkit.wireguard.model import DeviceState, DeviceUpdate, PeerState, PeerUpdate
from gwkit.wireguard.netdev import IpRouteLinks

log = logging.getLogger(__name__)


class WireGuardError(Exception):
    """Reading or programming a WireGuard device failed."""


class BackendUnavailable(WireGuardError):
    """No way to reach WireGuard at all (no UAPI socket, no kernel module)."""


class DeviceUnavailable(WireGuardError):
    """The device or its daemon is gone (socket refused, interface missing): retry, then re-apply."""


class ApplyRejected(WireGuardError):
    """The device answered but refused the change (bad value): the same input will fail again."""


class WireGuardBackend(Protocol):
    name: str
    """``uapi`` or ``netlink`` (for logs and status)."""

    async def ensure_device(self, interface: str) -> None:
        """Make sure the interface exists: the kernel backend creates it, userspace only checks that the
        daemon answers (it owns the TUN device). Raises DeviceUnavailable."""
        ...

    async def get(self, interface: str) -> DeviceState:
        """The device's current state. Raises DeviceUnavailable."""
        ...

    async def apply(self, interface: str, update: DeviceUpdate) -> None:
        """Perform exactly ``update`` (see ``diff.diff``). Raises DeviceUnavailable or ApplyRejected."""
        ...

    async def aclose(self) -> None: ...


# --- UAPI ---------------------------------------------------------------------------------------------


class UapiBackend:
    """wireguard-go / boringtun over ``<uapi_dir>/<interface>.sock``."""

    name = "uapi"

    def __init__(self, uapi_dir: Path = uapi.DEFAULT_DIR, timeout: float = 5.0) -> None:
        self.uapi_dir = uapi_dir
        self.timeout = timeout

    def socket(self, interface: str) -> Path:
        return uapi.socket_path(interface, self.uapi_dir)

    async def ensure_device(self, interface: str) -> None:
        await self.get(interface)

    async def get(self, interface: str) -> DeviceState:
        try:
            return await uapi.get(self.socket(interface), timeout=self.timeout)
        except uapi.UapiUnavailable as exc:
            raise DeviceUnavailable(f"{interface} (uapi): {exc}") from exc
        except uapi.UapiRejected as exc:
            raise ApplyRejected(f"{interface} (uapi): {exc}") from exc

    async def apply(self, interface: str, update: DeviceUpdate) -> None:
        if update.empty:
            return
        try:
            lines = uapi.update_lines(update)
        except ValueError as exc:  # KeyError_: names the key's role, never its value
            raise ApplyRejected(f"{interface}: {exc}") from exc
        try:
            await uapi.set_(self.socket(interface), lines, timeout=self.timeout)
        except uapi.UapiUnavailable as exc:
            raise DeviceUnavailable(f"{interface} (uapi): {exc}") from exc
        except uapi.UapiRejected as exc:
            raise ApplyRejected(f"{interface} (uapi): {exc}") from exc

    async def aclose(self) -> None:
        return None


# --- kernel generic netlink (pyroute2) --------------------------------------------------------------


class PyrouteWireGuard(Protocol):
    """The part of pyroute2's ``AsyncWireGuard`` we use (a fake of it lives in the component tests)."""

    async def info(self, interface: str) -> AsyncIterator[Any]: ...

    async def set(
        self,
        interface: str,
        listen_port: int | None = None,
        fwmark: int | None = None,
        private_key: str | None = None,
        peer: dict[str, Any] | None = None,
    ) -> Any: ...

    def close(self) -> Any: ...


class LinkControl(Protocol):
    """Creating the kernel device (rtnetlink), kept apart from the genl family."""

    async def exists(self, interface: str) -> bool: ...

    async def create_wireguard(self, interface: str) -> None: ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name) if hasattr(msg, "get_attr") else msg.get(name)


def _format_endpoint(ep: Any) -> str | None:
    if ep is None:
        return None
    addr, port = ep.get("addr"), ep.get("port")
    if not addr or addr in ("0.0.0.0", "::") or not port:
        return None
    return f"[{addr}]:{port}" if ":" in str(addr) else f"{addr}:{port}"


def parse_netlink(messages: Iterable[Any]) -> DeviceState:
    """pyroute2 ``info()`` messages -> DeviceState (pure). A large device comes back in several messages:
    the peer list, and even one peer's allowed IPs, continue in the next message (same public key)."""
    listen_port = fwmark = 0
    private_key: str | None = None
    public_key: str | None = None
    order: list[str] = []
    peers: dict[str, dict[str, Any]] = {}
    for msg in messages:
        listen_port = _attr(msg, "WGDEVICE_A_LISTEN_PORT") or listen_port
        fwmark = _attr(msg, "WGDEVICE_A_FWMARK") or fwmark
        if (k := _attr(msg, "WGDEVICE_A_PRIVATE_KEY")) is not None:
            private_key = _text(k)
        if (k := _attr(msg, "WGDEVICE_A_PUBLIC_KEY")) is not None:
            public_key = _text(k)
        for p in _attr(msg, "WGDEVICE_A_PEERS") or ():
            key = _text(_attr(p, "WGPEER_A_PUBLIC_KEY"))
            if key not in peers:
                order.append(key)
                peers[key] = {"allowed": []}
            cur = peers[key]
            for name in (
                "WGPEER_A_PRESHARED_KEY",
                "WGPEER_A_ENDPOINT",
                "WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL",
                "WGPEER_A_LAST_HANDSHAKE_TIME",
                "WGPEER_A_RX_BYTES",
                "WGPEER_A_TX_BYTES",
            ):
                value = _attr(p, name)
                if value is not None:
                    cur[name] = value
            for a in _attr(p, "WGPEER_A_ALLOWEDIPS") or ():
                if a.get("addr"):
                    cur["allowed"].append(str(a["addr"]))
    zero = "A" * 43 + "="
    out: list[PeerState] = []
    for key in order:
        cur = peers[key]
        psk = _text(cur["WGPEER_A_PRESHARED_KEY"]) if "WGPEER_A_PRESHARED_KEY" in cur else None
        psk = None if psk in (None, zero) else psk
        hs = cur.get("WGPEER_A_LAST_HANDSHAKE_TIME")
        sec = int(hs.get("tv_sec", 0)) if hs is not None else 0
        nsec = int(hs.get("tv_nsec", 0)) if hs is not None else 0
        out.append(
            PeerState(
                public_key=key,
                endpoint=_format_endpoint(cur.get("WGPEER_A_ENDPOINT")),
                allowed_ips=tuple(cur["allowed"]),
                last_handshake=(sec + nsec / 1e9) if sec else None,
                rx_bytes=int(cur.get("WGPEER_A_RX_BYTES", 0)),
                tx_bytes=int(cur.get("WGPEER_A_TX_BYTES", 0)),
                persistent_keepalive=int(cur.get("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", 0)),
                has_preshared_key=psk is not None,
                preshared_key=psk,
            )
        )
    private_key = None if private_key in (None, zero) else private_key
    return DeviceState(
        listen_port=int(listen_port),
        fwmark=int(fwmark),
        has_private_key=private_key is not None,
        public_key=public_key,
        peers=tuple(out),
        private_key=private_key,
    )


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``1.2.3.4:51820`` / ``[fd00::1]:51820`` -> (address, port). The address must be literal."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r}: expected address:port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"endpoint {endpoint!r}: expected address:port with an IP address") from None
    return host, int(port)


def netlink_peer(p: PeerUpdate) -> dict[str, Any]:
    """A PeerUpdate as the one-peer dict pyroute2's ``set(peer=...)`` takes (pure)."""
    if p.remove:
        return {"public_key": p.public_key, "remove": True}
    peer: dict[str, Any] = {"public_key": p.public_key}
    if not p.new:
        peer["update_only"] = True
    if p.preshared_key is not None:
        peer["preshared_key"] = p.preshared_key
    if p.endpoint is not None:
        peer["endpoint_addr"], peer["endpoint_port"] = split_endpoint(p.endpoint)
    if p.persistent_keepalive is not None:
        peer["persistent_keepalive"] = p.persistent_keepalive
    if p.allowed_ips is not None:
        peer["replace_allowed_ips"] = True
        peer["allowed_ips"] = list(p.allowed_ips)
    return peer


def _netlink_error(exc: Exception, interface: str, what: str) -> WireGuardError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    if code in (errno.ENODEV, errno.ENOENT, errno.ENXIO):
        return DeviceUnavailable(f"{interface} (netlink): {what}: {errno.errorcode.get(code, code)}")
    if code is not None:
        return ApplyRejected(f"{interface} (netlink): {what}: {errno.errorcode.get(code, code)}")
    return ApplyRejected(f"{interface} (netlink): {what}: {type(exc).__name__}")


class NetlinkBackend:
    """The kernel module through pyroute2's AsyncWireGuard. Construct with ``await NetlinkBackend.open()``
    (or pass a fake ``wg`` and ``links`` in tests)."""

    name = "netlink"

    def __init__(self, wg: PyrouteWireGuard, links: LinkControl | None = None) -> None:
        self.wg = wg
        self.links = links

    @classmethod
    async def open(cls, links: LinkControl | None = None) -> NetlinkBackend:
        wg = AsyncWireGuard()
        try:
            await wg.setup_endpoint()  # resolves the "wireguard" genl family: fails without the module
        except NetlinkError as exc:
            wg.close()
            raise BackendUnavailable(
                f"kernel WireGuard generic netlink family not found (errno {exc.code}): no wireguard module"
            ) from exc
        except Exception as exc:  # detect() retries every step: never leak the socket
            wg.close()
            raise BackendUnavailable(f"kernel WireGuard generic netlink: {exc}") from exc
        return cls(wg, links)

    async def ensure_device(self, interface: str) -> None:
        if self.links is None:
            return
        try:
            if not await self.links.exists(interface):
                await self.links.create_wireguard(interface)
                log.info("wireguard.device.created interface=%s", interface)
        except (NetlinkError, OSError) as exc:
            raise _netlink_error(exc, interface, "create device") from exc

    async def get(self, interface: str) -> DeviceState:
        try:
            msgs = [m async for m in await self.wg.info(interface)]
        except (NetlinkError, OSError) as exc:
            raise _netlink_error(exc, interface, "get") from exc
        return parse_netlink(msgs)

    async def apply(self, interface: str, update: DeviceUpdate) -> None:
        if update.empty:
            return
        device: dict[str, Any] = {}
        if update.private_key is not None:
            device["private_key"] = update.private_key
        if update.listen_port is not None:
            device["listen_port"] = update.listen_port
        if update.fwmark is not None:
            device["fwmark"] = update.fwmark
        try:
            peers = [netlink_peer(p) for p in update.peers]
        except ValueError as exc:
            raise ApplyRejected(f"{interface}: {exc}") from exc
        try:
            if device:
                await self.wg.set(interface, **device)
            for peer in peers:
                await self.wg.set(interface, peer=peer)
        except (NetlinkError, OSError) as exc:
            raise _netlink_error(exc, interface, "set") from exc
        except ValueError as exc:  # pyroute2's own key check: its message carries no value
            raise ApplyRejected(f"{interface} (netlink): set: invalid key") from exc

    async def aclose(self) -> None:
        self.wg.close()


# --- choosing ---------------------------------------------------------------------------------------

NetlinkOpener = Callable[[], Awaitable[WireGuardBackend]]


async def _open_netlink() -> WireGuardBackend:
    return await NetlinkBackend.open(IpRouteLinks())


async def detect(
    interface: str,
    uapi_dir: Path | None = None,
    *,
    open_netlink: NetlinkOpener = _open_netlink,
) -> WireGuardBackend:
    """UAPI socket present -> UAPI; else the kernel family -> netlink; else, when ``uapi_dir`` was given
    explicitly, UAPI anyway (its daemon may be starting: the caller retries); else BackendUnavailable."""
    directory = uapi_dir or uapi.DEFAULT_DIR
    if uapi.socket_path(interface, directory).exists():
        log.info("wireguard.backend.detected backend=uapi interface=%s dir=%s", interface, directory)
        return UapiBackend(directory)
    try:
        backend = await open_netlink()
    except BackendUnavailable as exc:
        if uapi_dir is not None:
            log.info("wireguard.backend.detected backend=uapi interface=%s waiting=1", interface)
            return UapiBackend(uapi_dir)
        raise BackendUnavailable(f"{interface}: no UAPI socket in {directory} and {exc}") from exc
    log.info("wireguard.backend.detected backend=netlink interface=%s", interface)
    return backend
