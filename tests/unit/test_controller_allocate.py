"""Sticky allocation of virtual IPs and conntrack marks. Pure; properties checked with hypothesis."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.plan.allocate import (
    DEFAULT_MARK_MASK,
    AllocationError,
    BadMask,
    GrantKey,
    MarksExhausted,
    Pool,
    _slot,
    marks,
    virtual_ips,
)

NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), unique=True, max_size=40)


def test_first_host_is_reserved_and_network_broadcast_never_used() -> None:
    ips = virtual_ips("10.0.0.0/30", ["only"], {})
    assert Pool.of("10.0.0.0/30").source_address == "10.0.0.1"
    assert ips == {"only": "10.0.0.2"}  # /30: .0 network, .1 gateway, .3 broadcast
    with pytest.raises(AllocationError, match=r"2 needed, only 1 available"):
        virtual_ips("10.0.0.0/30", ["a", "b"], {})


def test_same_input_same_result_and_hash_based_without_previous() -> None:
    names = [f"svc{i}" for i in range(50)]
    assert virtual_ips("198.18.0.0/24", names, {}) == virtual_ips("198.18.0.0/24", list(reversed(names)), {})


def _colliding_pair(size: int) -> tuple[str, str]:
    seen: dict[int, str] = {}
    for i in range(10_000):
        name = f"n{i}"
        slot = _slot(name, size)
        if slot in seen:
            return seen[slot], name
        seen[slot] = name
    raise AssertionError("no collision found")


def test_hashing_alone_moves_a_name_when_its_collider_goes_but_previous_keeps_it() -> None:
    pool = Pool.of("198.18.0.0/24")
    first, second = sorted(_colliding_pair(len(pool)))  # fresh names are placed in sorted order
    both = virtual_ips("198.18.0.0/24", [first, second], {})
    alone = virtual_ips("198.18.0.0/24", [second], {})
    assert both[second] != alone[second], "without history the survivor of a collision moves"
    kept = virtual_ips("198.18.0.0/24", [second], both)
    assert kept[second] == both[second], "with the previous plan it stays"


@settings(max_examples=200, deadline=None)
@given(before=NAMES, added=NAMES, removed=st.data())
def test_previous_allocations_survive_unrelated_changes(
    before: list[str], added: list[str], removed: st.DataObject
) -> None:
    cidr = "198.18.0.0/24"
    first = virtual_ips(cidr, before, {})
    gone = set(removed.draw(st.lists(st.sampled_from(before), unique=True)) if before else [])
    after_names = [n for n in before if n not in gone] + [n for n in added if n not in before]
    second = virtual_ips(cidr, after_names, first)
    for name in after_names:
        if name in first:
            assert second[name] == first[name]
    assert len(set(second.values())) == len(second), "no IP handed out twice"
    net = ipaddress.IPv4Network(cidr)
    for ip in second.values():
        addr = ipaddress.IPv4Address(ip)
        assert addr in net and addr not in (
            net.network_address,
            net.network_address + 1,
            net.broadcast_address,
        )


def test_invalid_previous_entries_are_reallocated() -> None:
    previous = {"a": "10.9.9.9", "b": "198.18.0.1", "c": "not-an-ip", "d": "198.18.0.77", "e": "198.18.0.77"}
    got = virtual_ips("198.18.0.0/24", ["a", "b", "c", "d", "e"], previous)
    assert got["d"] == "198.18.0.77"  # the first keeper (sorted by name) wins
    assert got["e"] != "198.18.0.77"
    assert got["b"] != "198.18.0.1"  # the reserved gateway address is never kept
    assert ipaddress.IPv4Address(got["a"]) in ipaddress.IPv4Network("198.18.0.0/24")
    assert len(set(got.values())) == 5


KEYS = st.lists(
    st.tuples(
        st.sampled_from(["exposure", "reverse"]),
        st.from_regex(r"p[0-9]{1,3}", fullmatch=True),
        st.from_regex(r"e[0-9]{1,2}", fullmatch=True),
    ),
    unique=True,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(before=KEYS, after=KEYS)
def test_marks_are_unique_inside_the_mask_and_sticky(before: list[GrantKey], after: list[GrantKey]) -> None:
    first = marks(before, {})
    keys = list(dict.fromkeys(before[: len(before) // 2] + after))
    second = marks(keys, first)
    for key, mark in second.items():
        assert mark & ~DEFAULT_MARK_MASK == 0 and mark != 0
        if key in first:
            assert mark == first[key]
    assert len(set(second.values())) == len(second), "a mark is never shared by two grants"


def test_mark_capacity_is_enforced() -> None:
    keys: list[GrantKey] = [("exposure", f"p{i}", "web") for i in range(4096)]
    with pytest.raises(AllocationError, match=r"4096 needed, only 4095 available"):
        marks(keys, {})
    assert len(set(marks(keys[:4095], {}).values())) == 4095


def test_previous_marks_outside_the_mask_are_not_kept() -> None:
    key: GrantKey = ("exposure", "p1", "web")
    assert marks([key], {key: 0x1}) != {key: 0x1}
    assert marks([key], {key: 0x00050000}) == {key: 0x00050000}


@pytest.mark.parametrize(
    "mask, rule",
    [
        (0, "is empty"),
        (-1, "is empty"),
        (0x0F0F0000, "contiguous"),
        (1 << 32, "32 bits"),
        (0xFFFFFFFF, "all 32 bits"),
    ],
)
def test_bad_masks_are_refused(mask: int, rule: str) -> None:
    with pytest.raises(BadMask, match=rule):
        marks([("exposure", "p", "e")], {}, mask)


def test_an_exhausted_pool_names_the_fresh_names_left_without() -> None:
    kept = virtual_ips("10.0.0.0/29", ["old"], {})  # a /29 has 5 usable virtual IPs
    with pytest.raises(AllocationError) as info:
        virtual_ips("10.0.0.0/29", ["old", "a", "b", "c", "d", "e", "f"], kept)
    assert (info.value.needed, info.value.available, info.value.unplaced) == (7, 5, ("e", "f"))
    keys: list[GrantKey] = [("exposure", "p", "x"), ("reverse", "p", "y")]
    with pytest.raises(MarksExhausted) as marks_info:
        marks(keys, {}, 0x1)
    assert marks_info.value.grants == (("reverse", "p", "y"),)


def test_a_freed_mark_or_virtual_ip_is_not_reused_in_the_same_render() -> None:
    """Revoking one grant and adding another in one edit must not hand the new grant the old mark: its
    old conntrack entries would look like the new grant's."""
    old = ("exposure", "hq", "db")
    first = marks([old], {})
    # A new grant whose hash prefers exactly the freed mark (found by search, so the test is exact).
    new = next(k for n in range(100_000) if marks([k := ("exposure", "hq", f"e{n}")], {})[k] == first[old])
    assert marks([new], first)[new] != first[old]
    assert marks([new], {})[new] == first[old], "premise: without the previous plan it would take it"
    ips = virtual_ips("198.18.0.0/29", ["db"], {})
    name = next(x for n in range(10_000) if virtual_ips("198.18.0.0/29", [x := f"x{n}"], {})[x] == ips["db"])
    assert virtual_ips("198.18.0.0/29", [name], ips)[name] != ips["db"]


def test_a_freed_value_is_reused_when_the_pool_has_nothing_else() -> None:
    ips = virtual_ips("198.18.0.0/30", ["db"], {})  # a /30 has exactly one usable virtual IP
    assert virtual_ips("198.18.0.0/30", ["web"], ips) == {"web": ips["db"]}
