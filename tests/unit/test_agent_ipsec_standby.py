"""The IPsec backend's HA standby decisions (pure): what a standby loads (``plan.for_role``), which SAs it
cuts (``link.standby_sweep``) and how its tunnels are reported (``status.tunnel_status``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent.ipsec.link import standby_sweep
from agent.ipsec.plan import Desired, Loaded, conn_digest, cuts, diff, for_role
from agent.ipsec.status import STANDBY_REASON, Carry, tunnel_status
from gwplan import Child, Tunnel

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def tunnel(start_action: str | None = "none") -> Tunnel:
    child: dict[str, Any] = {"remote_ts": ["10.1.0.0/24"], "dpd_action": "clear"}
    if start_action is not None:
        child["start_action"] = start_action
    conn = {"s1": {"version": "2", "remote": {"auth": "psk", "id": "s1"}, "children": {"s1-0": child}}}
    return Tunnel("s1", True, (Child("s1-0", "10.1.0.0/24"),), conn)


def want(start_action: str | None = "none") -> Desired:
    t = tunnel(start_action)
    return Desired({t.name: t.conn}, {}, (t,))


@pytest.mark.parametrize("start_action", ["none", None], ids=["none", "absent-charon-default-none"])
def test_a_plan_that_starts_nothing_loads_the_same_payload_in_both_roles(start_action: str | None) -> None:
    """The controller renders ``start_action none``: promotion then reloads nothing."""
    w = want(start_action)
    assert for_role(w, standby=True).conns == w.conns
    assert for_role(w, standby=False) is w


@pytest.mark.parametrize("start_action", ["start", "trap"])
def test_a_standby_loads_children_that_charon_never_starts_by_itself(start_action: str) -> None:
    w = want(start_action)
    quiet = for_role(w, standby=True)
    child = quiet.conns["s1"]["s1"]["children"]["s1-0"]
    assert child == {"remote_ts": ["10.1.0.0/24"], "dpd_action": "clear", "start_action": "none"}
    assert w.conns["s1"]["s1"]["children"]["s1-0"]["start_action"] == start_action, "the plan is not changed"
    assert quiet.tunnels == w.tunnels and quiet.secrets == w.secrets
    # The role change reloads the conn (its digest differs) and cuts nothing.

    loaded = Loaded(conns={"s1": conn_digest(w.conns["s1"])}, bodies={"s1": w.conns["s1"]["s1"]})
    assert diff(loaded, quiet, {}).load_conns == ("s1",)
    assert cuts(loaded, quiet, {}) == ()


def ike(state: str, children: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "s1", "state": state, "child-sas": children or {}}


def test_a_standby_sweeps_every_ike_sa_that_is_not_already_being_destroyed() -> None:
    sas = {
        "3": ike("ESTABLISHED"),
        "4": ike("CONNECTING"),
        "5": ike("DELETING"),
        "6": ike("DESTROYING"),
        "7": {"name": "other", "state": "PASSIVE"},
    }
    assert standby_sweep(sas) == ["3", "4", "5", "7"]
    assert standby_sweep({}) == []


def test_a_standby_tunnel_without_sa_is_standby_not_down_nor_connecting() -> None:
    st, carry = tunnel_status(
        tunnel(), [], now=NOW, error="peer not responding", in_flight=False, carry=Carry(), standby=True
    )
    assert st.state == "Standby" and st.last_error == STANDBY_REASON
    assert [c.state for c in st.children] == ["Down"] and carry == Carry()
    active, _ = tunnel_status(tunnel(), [], now=NOW, error=None, in_flight=False, carry=Carry())
    assert active.state == "Down" and active.last_error is None


def test_a_standby_reports_an_sa_it_still_has_as_it_is() -> None:
    """One being swept (a late initiation, an answered peer) is not hidden behind "Standby"."""
    child = {"name": "s1-0", "state": "INSTALLED", "uniqueid": "9"}
    st, _ = tunnel_status(
        tunnel(), [ike("ESTABLISHED", {"s1-0-9": child})], now=NOW, error=None, in_flight=False,
        carry=Carry(), standby=True,
    )  # fmt: skip
    assert st.state == "Established"
