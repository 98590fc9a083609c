"""The HA standby's rules (rules.standby_rules) and the role file's verdict (rules.role_of): pure."""

from __future__ import annotations

import dataclasses

import pytest

from initnat import rules, tables
from tests.unit.test_initnat_rules import NIC2, RESOLVED, nat

IPSEC = rules.Guard("ens7", ipsec=True)
WG = rules.Guard("ens7", wireguard=("wg0", 51821))
STANDBY = '-m comment --comment "vpngw HA standby: not serving" -j DROP'


def input_lines(guard: rules.Guard) -> list[str]:
    p = rules.validate(nat(), nic2_address=NIC2, resolved=RESOLVED, guard=guard)
    return [r for t in rules.render(p).tables for r in t.rules if r.startswith("-A VPNGW-INPUT ")]


@pytest.mark.parametrize(
    "guard, drops",
    [
        pytest.param(
            IPSEC,
            [
                f"-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 500 {STANDBY}",
                f"-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 4500 {STANDBY}",
                f"-A VPNGW-INPUT -i ens7 -p esp {STANDBY}",
            ],
            id="ipsec-ike-and-esp",
        ),
        pytest.param(
            WG, [f"-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 51821 {STANDBY}"], id="wireguard-listen-port"
        ),
    ],
)
def test_a_standby_drops_what_its_tunnels_need_on_nic2_before_anything_else(
    guard: rules.Guard, drops: list[str]
) -> None:
    active = input_lines(guard)
    standby = input_lines(dataclasses.replace(guard, standby=True))
    assert standby == [*drops, *active], "first, ahead of the replies rule (a flow served while active)"
    assert "RELATED,ESTABLISHED" in standby[len(drops)]


def test_active_renders_exactly_what_a_gateway_without_ha_has() -> None:
    assert rules.standby_rules(IPSEC) == () and rules.standby_rules(WG) == ()
    assert input_lines(dataclasses.replace(IPSEC, standby=False)) == input_lines(
        rules.Guard("ens7", ipsec=True)
    )


def test_the_standby_keeps_grants_dnat_and_revocation_as_they_are() -> None:
    """The drop is the only difference: exposures stay DNATed (only tunnel traffic is, and a standby has
    none), and switching role revokes nothing."""
    active = rules.validate(nat(), nic2_address=NIC2, resolved=RESOLVED, guard=IPSEC)
    standby = rules.validate(
        nat(), nic2_address=NIC2, resolved=RESOLVED, guard=dataclasses.replace(IPSEC, standby=True)
    )
    a, s = rules.render(active), rules.render(standby)
    only_standby = {r for t in s.tables for r in t.rules} - {r for t in a.tables for r in t.rules}
    only_active = {r for t in a.tables for r in t.rules} - {r for t in s.tables for r in t.rules}
    assert only_active == set() and all(r.endswith(STANDBY) for r in only_standby) and len(only_standby) == 3
    assert rules.revoked(active, standby) == () and rules.revoked(standby, active) == ()
    kernel = tables.admissions(r for t in s.tables for r in t.rules)
    assert tables.revoked_in_kernel(kernel, a) == frozenset()


@pytest.mark.parametrize(
    "content, role, error",
    [
        pytest.param(b"active", "active", False, id="active"),
        pytest.param(b"active\n", "active", False, id="active-newline"),
        pytest.param(b"standby\n", "standby", False, id="standby"),
        pytest.param(b"  standby  ", "standby", False, id="standby-spaces"),
        pytest.param(b"", "standby", True, id="empty-half-written-stands-by"),
        pytest.param(b"Active", "standby", True, id="case-matters"),
        pytest.param(b"leader", "standby", True, id="garbage-stands-by"),
        pytest.param(b"\xff\xfe", "standby", True, id="binary-stands-by"),
    ],
)
@pytest.mark.parametrize("ha", [True, False], ids=["plan-with-ha", "plan-without-ha"])
def test_the_role_file_fails_closed(content: bytes, role: str, error: bool, ha: bool) -> None:
    got = rules.role_of(content, ha=ha)
    assert got.role == role and (got.error is not None) == error and not got.absent
    if got.error:
        assert "standing by" in got.error


def test_a_missing_role_file_is_standby_when_the_plan_has_ha_and_active_without() -> None:
    """Fail closed: a pod whose plan has ``ha`` and whose agent has not written (or could not write) the
    role file does not serve; a gateway without HA never has the file and serves."""
    assert rules.role_of(None, ha=True) == rules.RoleReading("standby", absent=True)
    assert rules.role_of(None, ha=False) == rules.RoleReading("active", absent=True)
