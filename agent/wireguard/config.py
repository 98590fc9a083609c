"""Plan + secret values + resolved endpoints -> the desired device (pure: no I/O, no clock).

Everything the plan and the secret files can get wrong is checked here, before anything touches the
device, and reported as ``ConfigError`` naming the field (``wireguard.peers[2].publicKey``) or the Secret
and key, and the rule, never a key's value. What fails for the whole gateway (a bad plan field, the
gateway's own private key) makes the caller keep running the last good configuration. What fails for one
peer (its preshared key's Secret missing or unusable) leaves that peer out (``Desired.left_out``) and the
rest is applied: one tenant's missing Secret must not hold up another peer's removal.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gwkit.wireguard.model import DesiredDevice, DesiredPeer, KeyError_, key_from_b64
from gwplan import DEVICE_NAME_RULE, SecretRef, WireGuard, is_device_name

MAX_PEERS = 10_000


class ConfigError(ValueError):
    """The plan or a secret is unusable; the message names the field or Secret/key and the rule."""


@dataclass(frozen=True)
class Desired:
    """The device the plan asks for, less the peers that cannot be configured as it says."""

    device: DesiredDevice
    left_out: Mapping[str, str]
    """Peer name -> why it is not on the device (its key material is missing or unusable)."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def literal(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def with_address(self, address: str) -> str:
        return f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}"


def parse_endpoint(text: str, where: str) -> Endpoint:
    """``host:port`` / ``[v6]:port``; host is an IP literal or a DNS name."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: {text!r} must be host:port with a port 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{where}: {text!r}: [...] must hold an IPv6 address") from None
    elif not host or not all(
        part and len(part) < 64 and part.replace("-", "").isalnum() for part in host.split(".")
    ):
        raise ConfigError(f"{where}: {text!r}: host must be an IP address or a DNS name")
    return Endpoint(host, int(port))


def secret_key(raw: bytes, ref: SecretRef) -> str:
    """A key file's value (``wg genkey`` output, trailing newline allowed) -> canonical base64."""
    where = f"secret {ref.name} key {ref.key}"
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a WireGuard key (must be base64 text)") from None
    try:
        return base64.b64encode(key_from_b64(text, where)).decode()  # canonical form
    except KeyError_ as exc:
        raise ConfigError(str(exc)) from None


def validate(wg: WireGuard) -> None:
    """Plan-only checks (no secrets needed)."""
    if not 0 < wg.listen_port < 65536:
        raise ConfigError(f"wireguard.listenPort: {wg.listen_port} must be 1-65535")
    if not is_device_name(wg.interface):
        raise ConfigError(
            f"wireguard.interface: {wg.interface!r} must be an interface name ({DEVICE_NAME_RULE})"
        )
    try:
        ipaddress.ip_interface(wg.address)
        if "/" not in wg.address:
            raise ValueError
    except ValueError:
        raise ConfigError(f"wireguard.address: {wg.address!r} must be an address with prefix") from None
    if len(wg.peers) > MAX_PEERS:
        raise ConfigError(f"wireguard.peers: {len(wg.peers)} peers, at most {MAX_PEERS}")
    names: set[str] = set()
    keys: set[bytes] = set()
    for i, p in enumerate(wg.peers):
        where = f"wireguard.peers[{i}]"
        if not p.name or p.name in names:
            raise ConfigError(f"{where}.name: {p.name!r} must be non-empty and unique")
        names.add(p.name)
        try:
            canonical = key_from_b64(p.public_key, f"{where}.publicKey")
        except KeyError_ as exc:
            raise ConfigError(str(exc)) from None
        if canonical in keys:
            raise ConfigError(f"{where}.publicKey: the same key is used by another peer")
        keys.add(canonical)
        for j, cidr in enumerate(p.allowed_ips):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(f"{where}.allowedIps[{j}]: {cidr!r} is not a CIDR") from None
        if p.endpoint is not None:
            parse_endpoint(p.endpoint, f"{where}.endpoint")
        if p.persistent_keepalive is not None and not 0 <= p.persistent_keepalive <= 65535:
            raise ConfigError(f"{where}.persistentKeepalive: {p.persistent_keepalive} must be 0-65535")


def hostnames(wg: WireGuard) -> frozenset[str]:
    """The endpoint hosts that need DNS (pure; the plan must be valid)."""
    out = set()
    for p in wg.peers:
        if p.endpoint is not None:
            ep = parse_endpoint(p.endpoint, p.name)
            if not ep.literal:
                out.add(ep.host)
    return frozenset(out)


def desired(
    wg: WireGuard,
    read_key: Callable[[SecretRef], str],
    resolved: Mapping[str, str],
    fwmark: int = 0,
) -> Desired:
    """The device the plan asks for. ``read_key`` returns a secret's canonical base64 key (see
    ``secret_key``) or raises ConfigError; ``resolved`` maps hostnames to addresses; an unresolved
    hostname leaves that peer's endpoint unset (the device keeps what it has).

    Raises ConfigError for the plan or the gateway's private key (gateway-level: nothing of it can be
    applied). A peer whose preshared key cannot be read is left out of the device (``left_out``)."""
    validate(wg)
    private_key = read_key(wg.private_key_ref)
    peers = []
    left_out: dict[str, str] = {}
    for p in wg.peers:
        psk = None
        if p.preshared_key_ref:
            try:
                psk = read_key(p.preshared_key_ref)
            except ConfigError as exc:
                # The plan says this peer authenticates with the key in that Secret; without it the peer
                # cannot be configured as planned. Keeping it on the device would keep the key it had
                # (a rotated or revoked one: the plan moved to a new Secret) or none at all (a weaker
                # session than the plan asks for). So it is left out, which removes it from the device
                # if it was there (diff removes peers not wanted), and reported; it comes back once its
                # Secret is readable.
                left_out[p.name] = f"preshared key: {exc}"
                continue
        endpoint = None
        if p.endpoint is not None:
            ep = parse_endpoint(p.endpoint, p.name)
            address = ep.host if ep.literal else resolved.get(ep.host)
            endpoint = ep.with_address(address) if address else None
        peers.append(
            DesiredPeer(
                public_key=base64.b64encode(key_from_b64(p.public_key)).decode(),
                allowed_ips=p.allowed_ips,
                endpoint=endpoint,
                preshared_key=psk,
                persistent_keepalive=p.persistent_keepalive or 0,
            )
        )
    device = DesiredDevice(
        private_key=private_key, listen_port=wg.listen_port, peers=tuple(peers), fwmark=fwmark
    )
    return Desired(device, left_out)
