"""Allocation of virtual IPs (from serviceCIDR) and per-grant conntrack marks. Pure.

Both are *sticky*: an allocation from the previous plan is kept as long as it is still valid (the name or
grant still exists, the value is still inside the pool, no earlier keeper took it). New names get a
preferred slot from a hash of the name and probe linearly to the next free one. Hashing alone cannot be
stable under collisions (a removed name could un-collide another and shift it), so the controller passes
the current plan as ``previous``: with it, adding or removing an unrelated exposure never moves another.

* The first host of serviceCIDR is reserved: it is the gateway's own address (``Nat.source_address``,
  the SNAT source of reverse exposures; the pod puts it on ``lo``). Network and broadcast addresses are
  never handed out either.
* Marks live inside ``mark_mask`` (contiguous bits); 0 is "no mark". A mark is never given to two grants
  of one render, and a grant keeps its mark while it exists. A value freed by this render (its name is
  gone) is not reused in the same render while the pool has others.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_MARK_MASK = 0x0FFF0000

GrantKey = tuple[str, str, str]
"""(kind, peer, exposure) with kind ``exposure`` or ``reverse``."""


class AllocationError(ValueError):
    """The pool is too small. The message says which pool and how many were needed; ``unplaced`` lists
    the names that got no value (fresh names in sorted order past the room left after every kept one), so
    the caller can point at the objects and fields that asked for them."""

    def __init__(self, pool: str, needed: int, available: int, unplaced: tuple[str, ...]) -> None:
        self.pool = pool
        self.needed = needed
        self.available = available
        self.unplaced = unplaced
        super().__init__(f"{pool}: {needed} needed, only {available} available")


class MarksExhausted(AllocationError):
    """The mark mask has fewer marks than there are grants; ``grants`` are the ones left without."""

    def __init__(self, exc: AllocationError, grants: tuple[GrantKey, ...]) -> None:
        super().__init__(exc.pool, exc.needed, exc.available, exc.unplaced)
        self.grants = grants


class BadMask(ValueError):
    """A mark mask the allocator cannot use; the message is the rule it breaks."""


def _slot(name: str, size: int) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % size


def _sticky(
    wanted: Iterable[str], previous: Mapping[str, int], valid: range, size: int, what: str
) -> dict[str, int]:
    names = sorted(set(wanted))
    taken: dict[int, str] = {}
    out: dict[str, int] = {}
    for name in names:
        value = previous.get(name)
        if value is not None and value in valid and value not in taken:
            taken[value] = name
            out[name] = value
    fresh = [n for n in names if n not in out]
    if len(taken) + len(fresh) > size:
        raise AllocationError(what, len(names), size, tuple(fresh[size - len(taken) :]))
    # Values the previous plan gave to names that are gone are not handed out in the same render (unless
    # the pool needs them): a revoked grant's mark or a removed exposure's virtual IP taken over at once by
    # a new one would make its old conntrack entries look like the new one's.
    freed = {v for n, v in previous.items() if n not in out and v in valid} - taken.keys()
    avoid = freed if len(taken) + len(fresh) + len(freed) <= size else set()
    for name in fresh:
        i = _slot(name, size)
        while valid[i] in taken or valid[i] in avoid:
            i = (i + 1) % size
        taken[valid[i]] = name
        out[name] = valid[i]
    return out


@dataclass(frozen=True)
class Pool:
    """The usable virtual IPs of a serviceCIDR."""

    network: ipaddress.IPv4Network

    @classmethod
    def of(cls, service_cidr: str) -> Pool:
        return cls(ipaddress.IPv4Network(service_cidr, strict=False))

    @property
    def source_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def range(self) -> range:
        base = int(self.network.network_address)
        return range(base + 2, int(self.network.broadcast_address))

    def __len__(self) -> int:
        return len(self.range)


def virtual_ips(service_cidr: str, names: Iterable[str], previous: Mapping[str, str]) -> dict[str, str]:
    """Name -> virtual IP for every name, keeping every still-valid previous allocation."""
    pool = Pool.of(service_cidr)
    prev: dict[str, int] = {}
    for name, ip in previous.items():
        try:
            prev[name] = int(ipaddress.IPv4Address(ip))
        except ValueError:
            continue  # a hand-edited previous plan: just allocate afresh
    got = _sticky(names, prev, pool.range, len(pool), f"serviceCIDR {pool.network} (exposures)")
    return {name: str(ipaddress.IPv4Address(v)) for name, v in got.items()}


def mask_bits(mask: int) -> tuple[int, int]:
    """(shift, width) of a contiguous 32-bit mark mask; ``BadMask`` says which rule it breaks."""
    if mask <= 0:
        raise BadMask("is empty: no bits left for conntrack marks")
    if mask > 0xFFFFFFFF:
        raise BadMask("does not fit in 32 bits (conntrack marks are 32-bit)")
    if mask == 0xFFFFFFFF:  # init-nat refuses it too
        raise BadMask(
            "takes all 32 bits: iptables-save prints such a mark without its mask, so init-nat "
            "could not read its own rules back (and kube-proxy's mark bits would be ours)"
        )
    shift = (mask & -mask).bit_length() - 1
    width = mask >> shift
    if width & (width + 1):
        raise BadMask("is not one contiguous run of bits")
    return shift, width


def grant_key_text(key: GrantKey) -> str:
    return "/".join(key)


def marks(
    keys: Iterable[GrantKey], previous: Mapping[GrantKey, int], mask: int = DEFAULT_MARK_MASK
) -> dict[GrantKey, int]:
    """Grant -> conntrack mark (inside ``mask``, never 0), keeping every still-valid previous mark."""
    shift, width = mask_bits(mask)
    by_text = {grant_key_text(k): k for k in keys}
    prev: dict[str, int] = {}
    for key, mark in previous.items():
        if mark & ~mask == 0 and mark >> shift:
            prev[grant_key_text(key)] = mark >> shift
    try:
        got = _sticky(by_text, prev, range(1, width + 1), width, f"conntrack marks in {mask:#x} (grants)")
    except AllocationError as exc:
        raise MarksExhausted(exc, tuple(by_text[t] for t in exc.unplaced)) from None
    return {by_text[t]: v << shift for t, v in got.items()}
