"""Property: hostile strings in any plan field that reaches iptables are either rejected by validation
with an error naming the field, or render to rules that the REAL iptables-restore (legacy and nft, in a
throwaway namespace) accepts and stores with exactly the meaning we rendered (``iptables-save`` gives back
our lines), with names only inside sanitised ``--comment`` values."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shlex
from collections.abc import Iterator
from ipaddress import IPv4Address
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwplan import Exposure, Grant, Nat, Port, ReverseExposure
from initnat import rules, tables
from initnat.iptables import Completed, Iptables, run_process
from lab import netns

pytestmark = [pytest.mark.lab]

HOSTILE = [
    "198.18.0.10 -j ACCEPT",
    "198.18.0.10\n-A FORWARD -j DROP",
    '198.18.0.10" --comment "x',
    "198.18.0.10/32",
    "198.18.0.010",
    "0x0",
    "::1",
    "",
    " 198.18.0.10",
    "198.18.0.10\x00",
    "-j ACCEPT",
    "$(reboot)",
    "198.18.0.0/24 ! -s 0/0",
    "1.2.3.4/0.0.0.255",
]
texts = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40))
names = st.text(min_size=1, max_size=300)
any_value = st.one_of(texts, st.integers(-(2**33), 2**33), st.booleans(), st.none())


@st.composite
def hostile_nats(draw: st.DrawFn) -> tuple[Nat, dict[str, IPv4Address]]:
    n_exp = draw(st.integers(1, 3))
    exp_names = draw(st.lists(names, min_size=n_exp, max_size=n_exp, unique=True))
    exposures = [
        Exposure(
            name,
            f"198.18.0.{10 + i}",
            tuple(
                Port(p, draw(st.sampled_from(["TCP", "UDP"])))
                for p in draw(st.sets(st.integers(1, 65535), min_size=1, max_size=2))
            ),
            target_address=f"192.0.2.{66 + i}",
        )
        for i, name in enumerate(exp_names)
    ]
    grants = [
        Grant(
            draw(names),
            draw(st.sampled_from(exp_names)),
            "exposure",
            (f"203.0.113.{16 * i}/28",),
            (i + 1) << 16,
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    reverse = [ReverseExposure(draw(names), "198.18.0.200", "203.0.113.5", (Port(5432),))]
    grants.append(Grant(draw(names), reverse[0].name, "reverse", ("10.0.0.0/8",), 0x7F0000))
    nat = Nat(
        service_cidr="198.18.0.0/24",
        source_address="198.18.0.1",
        internal_source_cidrs=("10.0.0.0/8",),
        exposures=tuple(exposures),
        reverse_exposures=tuple(reverse),
        grants=tuple(grants),
    )
    # Then corrupt (at most) one more field that reaches iptables with a hostile value.
    where = draw(st.sampled_from(["none", "vip", "target", "host", "port", "proto", "source", "mark", "cidr",
                                  "src-addr", "internal", "rev-target", "kind"]))  # fmt: skip
    bad: Any = draw(any_value)
    e0 = exposures[0]
    resolved: dict[str, IPv4Address] = {}
    if where == "vip":
        nat = dataclasses.replace(nat, exposures=(dataclasses.replace(e0, virtual_ip=bad), *exposures[1:]))
    elif where == "target":
        nat = dataclasses.replace(
            nat, exposures=(dataclasses.replace(e0, target_address=bad), *exposures[1:])
        )
    elif where == "host":
        host = draw(st.one_of(texts, st.from_regex(r"\A[a-z]{1,10}(\.[a-z]{1,10}){0,3}\Z")))
        with_host = dataclasses.replace(e0, target_address=None, target_host=host)
        nat = dataclasses.replace(nat, exposures=(with_host, *exposures[1:]))
        with contextlib.suppress(rules.NatConfigError):  # valid names resolve; the rest must be refused
            resolved[rules.hostname(host, "x")] = IPv4Address("192.0.2.99")
    elif where in ("port", "proto"):
        port = Port(bad, "TCP") if where == "port" else Port(80, bad)
        nat = dataclasses.replace(nat, exposures=(dataclasses.replace(e0, ports=(port,)), *exposures[1:]))
    elif where in ("source", "mark", "kind"):
        g0 = nat.grants[0]
        field = {"source": ("sources", (bad,)), "mark": ("mark", bad), "kind": ("kind", bad)}[where]
        nat = dataclasses.replace(
            nat, grants=(dataclasses.replace(g0, **{field[0]: field[1]}), *nat.grants[1:])
        )
    elif where == "cidr":
        nat = dataclasses.replace(nat, service_cidr=bad)
    elif where == "src-addr":
        nat = dataclasses.replace(nat, source_address=bad)
    elif where == "internal":
        nat = dataclasses.replace(nat, internal_source_cidrs=(bad,))
    elif where == "rev-target":
        nat = dataclasses.replace(
            nat, reverse_exposures=(dataclasses.replace(reverse[0], target_address=bad),)
        )
    return nat, resolved


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-prop"
    netns.add_ns(name, netns.POD_SYSCTLS)  # as a pod's namespace: no forwarding, strict rp_filter
    try:
        yield name
    finally:
        netns.destroy_ns(name)


_PLAIN_TOKEN = re.compile(r"^[A-Za-z0-9./:,!_-]+$")
_COMMENT = re.compile(r"^[A-Za-z0-9._:/@=+ -]{1,255}$")


def rejected_or_rendered_faithfully(ns: str, case: tuple[Nat, dict[str, Any]]) -> str:
    """One hostile plan: ``"rejected"`` with an error naming the field, or ``"accepted"`` with every rule
    token plain and both real iptables variants storing exactly the ruleset."""
    nat, resolved = case
    try:
        policy = rules.validate(nat, nic2_address=IPv4Address("192.0.2.2"), resolved=resolved)
    except rules.NatConfigError as exc:
        assert re.match(r"^nat\.[A-Za-z]+", str(exc)), f"the error must name the field: {exc}"
        assert "\n" not in str(exc)
        return "rejected"
    ruleset = rules.render(policy)
    for line in (r for t in ruleset.tables for r in t.rules):
        tokens = shlex.split(line)
        for i, tok in enumerate(tokens):
            if i and tokens[i - 1] == "--comment":
                assert _COMMENT.match(tok), (line, tok)
            else:
                assert _PLAIN_TOKEN.match(tok), (line, tok)

    def run(argv: Any, input: str | None = None) -> Completed:
        return run_process(netns.ns_exec(ns, *argv), input)

    for variant in ("legacy", "nft"):
        ipt = Iptables(variant, run)
        ipt.apply(ruleset)  # raises IptablesError if the real iptables-restore refuses it
        assert tables.in_sync(ipt.saved(), ruleset), f"{variant} stored something other than we meant"
    return "accepted"


def test_hostile_plan_values_are_rejected_or_rendered_faithfully_and_both_outcomes_are_exercised(
    ns: str,
) -> None:
    """The property, and proof that both of its branches were really taken (not just one): the counts
    belong to this test's own run of the property, whatever ran before it."""
    seen = {"accepted": 0, "rejected": 0}

    @settings(max_examples=120, deadline=None)
    @given(case=hostile_nats())
    def prop(case: tuple[Nat, dict[str, Any]]) -> None:
        seen[rejected_or_rendered_faithfully(ns, case)] += 1

    prop()
    assert seen["accepted"] >= 10 and seen["rejected"] >= 10, seen
